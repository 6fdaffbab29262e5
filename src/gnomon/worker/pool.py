"""A bounded pool of daemon threads for attempts.

Threads are created on demand, up to ``threads_max``, and reused: starting an attempt
is a queue put, not a thread start (about 100 µs saved per start, which matters when
thousands of staged runs share one slot). They are daemon threads, so a worker that
gives up draining can still exit while a handler hangs. A body returns True when its
thread was given up while it ran (a handler past its deadline and grace, ``abandon``
already made room for another): that thread then leaves the pool.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

log = logging.getLogger("gnomon.worker")

PRESTART_PER_CALL_MAX = 200  # threads one prestart call may start (~60 µs each: a bounded pause of the loop)


class AttemptPool:
    def __init__(self, threads_max: int, name: str = "attempt") -> None:
        if threads_max < 1:
            raise ValueError("threads_max must be >= 1")
        self.threads_max = threads_max
        self.name = name
        self._tasks: queue.SimpleQueue[Callable[[], bool | None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0
        self._queued = 0

    @property
    def threads(self) -> int:
        return self._threads

    def abandon(self) -> None:
        """A thread is stuck in a body that was given up: start another in its place when
        needed (it leaves when its body returns True)."""
        with self._lock:
            self._threads -= 1

    def prestart(self, wanted: int, at_most: int = PRESTART_PER_CALL_MAX) -> int:
        """Start idle threads (at most ``at_most`` now) until ``wanted`` exist, up to
        ``threads_max``: the worker calls it as grants are staged, so that at a slot shared
        by thousands no thread is created on the way to a handler. The number started."""
        started = 0
        with self._lock:
            while self._threads < min(wanted, self.threads_max) and started < at_most:
                if not self._start_thread():
                    break
                started += 1
        return started

    def submit(self, fn: Callable[[], bool | None]) -> None:
        with self._lock:
            self._queued += 1
            if self._queued > self._idle and self._threads < self.threads_max:
                self._start_thread()  # (refused: it waits for a thread of the pool)
        self._tasks.put(fn)

    def _start_thread(self) -> bool:
        """Start one more thread (the lock held). When the operating system refuses one
        (the kernel's pid_max, ``ulimit -u``, the cgroup's pids.max, memory for stacks), the pool stops growing
        at the threads it has: ``threads_max`` comes down to them, which the worker then
        advertises as its slots, instead of the worker dying mid-spike (measured: five
        workers of 20,000 slots on a box whose kernel ``pid_max`` is 32,768 tasks)."""
        try:
            threading.Thread(target=self._serve, daemon=True, name=f"{self.name}-{self._threads + 1}").start()
        except RuntimeError as exc:
            cap = max(1, self._threads)
            if cap < self.threads_max:
                log.error("the operating system refused a new thread at %d threads (%s): this worker runs at "
                          "most %d attempts at once from now on; lower --concurrency or raise the limit "
                          "(kernel.pid_max, ulimit -u, pids.max)", self._threads, exc, cap)
                self.threads_max = cap
            return False
        self._threads += 1
        return True

    def _serve(self) -> None:
        while True:
            with self._lock:
                self._idle += 1
            fn = self._tasks.get()
            with self._lock:
                self._idle -= 1
                self._queued -= 1
            given_up = False
            try:
                given_up = fn() is True
            except Exception:  # an attempt body must not kill the thread
                log.exception("attempt body raised")
            if given_up:
                return  # abandon() counted it out already
