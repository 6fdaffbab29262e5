"""The supervisor ``gnomon dev`` runs its children under: a child that exits is started
again after a backoff (doubling from ``backoff_s`` to ``backoff_max_s``; back to the
start once a child has run ``stable_s``), and each restart is logged, as systemd or
Kubernetes would. Pure enough to test: ``spawn`` starts a child, ``now_s`` is the clock."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

log = logging.getLogger("gnomon.dev")


class Handle(Protocol):
    """What the supervisor needs of a started child (``subprocess.Popen`` is one)."""

    @property
    def pid(self) -> int: ...
    def poll(self) -> int | None: ...
    def terminate(self) -> None: ...
    def kill(self) -> None: ...
    def wait(self, timeout: float | None = None) -> int: ...


Spawn = Callable[[str, Sequence[str]], Handle]


@dataclass
class Child:
    name: str
    args: tuple[str, ...]
    handle: Handle | None = None
    started_s: float = 0.0
    restarts: int = 0
    backoff_s: float = 0.0  # the wait before the next restart (0: none yet)
    start_at_s: float | None = None  # exited: start again at this time


class Supervisor:
    def __init__(self, spawn: Spawn, now_s: Callable[[], float], *, backoff_s: float = 1.0,
                 backoff_max_s: float = 60.0, stable_s: float = 60.0,
                 say: Callable[[str], None] | None = None) -> None:
        if not 0 < backoff_s <= backoff_max_s:
            raise ValueError("need 0 < backoff_s <= backoff_max_s")
        self._spawn = spawn
        self._now_s = now_s
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self.stable_s = stable_s
        self._say = say or log.warning
        self.children: dict[str, Child] = {}
        self.stopped = False

    def start(self, name: str, args: Sequence[str]) -> Child:
        child = Child(name, tuple(args))
        self.children[name] = child
        self._launch(child)
        return child

    def _launch(self, child: Child) -> None:
        child.handle = self._spawn(child.name, child.args)
        child.started_s = self._now_s()
        child.start_at_s = None

    def tick(self) -> None:
        """Notice children that exited (schedule their restart) and start those due."""
        if self.stopped:
            return
        now = self._now_s()
        for child in self.children.values():
            if child.handle is not None:
                code = child.handle.poll()
                if code is None:
                    continue
                ran_s = now - child.started_s
                if ran_s >= self.stable_s:
                    child.backoff_s = 0.0  # it had been running well: restart soon
                child.backoff_s = self.backoff_s if child.backoff_s == 0 else min(self.backoff_max_s,
                                                                                  child.backoff_s * 2)
                child.handle = None
                child.start_at_s = now + child.backoff_s
                self._say(f"{child.name} exited with code {code} after {ran_s:.0f} s; restarting it in "
                          f"{child.backoff_s:.0f} s (restart {child.restarts + 1})")
            elif child.start_at_s is not None and now >= child.start_at_s:
                child.restarts += 1
                self._launch(child)
                self._say(f"{child.name} restarted (restart {child.restarts}, pid {child.handle.pid if child.handle else '?'})")

    def stop_all(self, timeout_s: float = 15.0) -> None:
        """Terminate every running child, wait up to ``timeout_s`` each, then kill."""
        running = [c.handle for c in self.children.values() if c.handle is not None and c.handle.poll() is None]
        for h in running:
            h.terminate()
        for h in running:
            try:
                h.wait(timeout_s)
            except Exception:  # subprocess.TimeoutExpired, or whatever a handle raises
                h.kill()
        for c in self.children.values():
            c.handle, c.start_at_s = None, None
        self.stopped = True
