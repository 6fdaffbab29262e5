"""One retry helper: call again after a failure the predicate calls retriable, waiting
``base_s``, then twice that, ... at most ``cap_s`` between attempts, at most
``attempts_max`` calls in all. Deterministic (no jitter) and clock-free: ``sleep`` is
injected (``time.sleep`` by default; a ``threading.Event().wait`` makes a stop interrupt
the wait; tests pass a recorder).

    >>> waits = []
    >>> retry = Retry(attempts_max=3, base_s=0.1, cap_s=1.0, sleep=waits.append)
    >>> calls = iter([OSError("a"), OSError("b"), "done"])
    >>> def flaky():
    ...     step = next(calls)
    ...     if isinstance(step, Exception):
    ...         raise step
    ...     return step
    >>> retry.call(flaky), waits
    ('done', [0.1, 0.2])

(Not ``core.retry``: that one is the runs' retry schedule, with jitter, as data.)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

__all__ = ["Retry", "always"]

T = TypeVar("T")


def always(_: BaseException) -> bool:
    """The default predicate: every ``Exception`` is worth another attempt."""
    return True


@dataclass(frozen=True)
class Retry:
    attempts_max: int = 5
    base_s: float = 0.1
    cap_s: float = 5.0
    # Whether a failure is worth another attempt (asked only while attempts are left).
    retriable: Callable[[BaseException], bool] = always
    sleep: Callable[[float], object] = time.sleep

    def __post_init__(self) -> None:
        if self.attempts_max < 1:
            raise ValueError("attempts_max must be >= 1")
        if self.base_s < 0 or self.cap_s < self.base_s:
            raise ValueError("need 0 <= base_s <= cap_s")

    def delay_s(self, failures: int) -> float:
        """The wait after the ``failures``-th failure in a row (1-based): base_s * 2**(failures-1),
        at most cap_s. Also for loops that retry for ever (a supervisor's backoff)."""
        if failures < 1:
            raise ValueError("failures must be >= 1")
        return min(self.cap_s, self.base_s * float(2 ** min(failures - 1, 60)))

    def call(self, fn: Callable[[], T],
             on_retry: Callable[[int, BaseException, float], None] | None = None) -> T:
        """``fn()``; after a failure, again while attempts are left and ``retriable(exc)``.
        The last failure (or the first not retriable) is raised as it is. ``on_retry``
        (attempt that failed, its exception, the wait) is called before each wait, e.g. to log."""
        attempt = 1
        while True:
            try:
                return fn()
            except Exception as exc:
                if attempt >= self.attempts_max or not self.retriable(exc):
                    raise
                delay = self.delay_s(attempt)
                if on_retry is not None:
                    on_retry(attempt, exc, delay)
                self.sleep(delay)
                attempt += 1
