"""gnomon.retrying.Retry: attempts, waits, the predicate, the injected sleep (no real waits)."""

from __future__ import annotations

import doctest
import threading
from typing import Any

import pytest

import gnomon.retrying
from gnomon.retrying import Retry


class Flaky:
    """Fails with ``errors`` in turn, then returns ``"ok"``."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


def test_succeeds_after_retriable_failures_waiting_base_doubling_to_cap() -> None:
    waits: list[float] = []
    retry = Retry(attempts_max=6, base_s=0.5, cap_s=2.0, sleep=waits.append)
    fn = Flaky(*[OSError(str(i)) for i in range(5)])
    assert retry.call(fn) == "ok"
    assert fn.calls == 6 and waits == [0.5, 1.0, 2.0, 2.0, 2.0]


def test_gives_up_after_attempts_max_raising_the_last_error() -> None:
    waits: list[float] = []
    fn = Flaky(OSError("1"), OSError("2"), OSError("3"), OSError("4"))
    with pytest.raises(OSError, match="3"):
        Retry(attempts_max=3, base_s=0.1, cap_s=1.0, sleep=waits.append).call(fn)
    assert fn.calls == 3 and waits == [0.1, 0.2]


def test_one_attempt_never_sleeps() -> None:
    waits: list[float] = []
    with pytest.raises(OSError):
        Retry(attempts_max=1, sleep=waits.append).call(Flaky(OSError()))
    assert waits == []


def test_a_failure_the_predicate_refuses_is_raised_at_once() -> None:
    waits: list[float] = []
    seen: list[BaseException] = []

    def retriable(exc: BaseException) -> bool:
        seen.append(exc)
        return isinstance(exc, TimeoutError)

    fn = Flaky(TimeoutError("t"), KeyError("k"))
    with pytest.raises(KeyError):
        Retry(attempts_max=5, base_s=0.1, cap_s=1.0, retriable=retriable, sleep=waits.append).call(fn)
    assert fn.calls == 2 and waits == [0.1] and [type(e) for e in seen] == [TimeoutError, KeyError]


def test_on_retry_sees_attempt_error_and_wait() -> None:
    log: list[tuple[int, str, float]] = []
    retry = Retry(attempts_max=3, base_s=1.0, cap_s=1.5, sleep=lambda _: None)
    assert retry.call(Flaky(OSError("a"), OSError("b")), on_retry=lambda n, e, d: log.append((n, str(e), d))) == "ok"
    assert log == [(1, "a", 1.0), (2, "b", 1.5)]


def test_base_exceptions_are_not_retried() -> None:
    fn = Flaky(KeyboardInterrupt())  # type: ignore[arg-type]
    with pytest.raises(KeyboardInterrupt):
        Retry(attempts_max=3, sleep=lambda _: None).call(fn)
    assert fn.calls == 1


def test_an_event_wait_as_sleep_and_a_stop_predicate() -> None:
    stop = threading.Event()
    waits: list[float] = []

    def sleep(s: float) -> bool:
        waits.append(s)
        stop.set()  # stopped while waiting: the next failure is not retried
        return True

    fn = Flaky(OSError("1"), OSError("2"), OSError("3"))
    with pytest.raises(OSError, match="2"):
        Retry(attempts_max=5, base_s=0.0, cap_s=0.0, retriable=lambda _: not stop.is_set(), sleep=sleep).call(fn)
    assert fn.calls == 2 and waits == [0.0]


def test_delay_schedule_and_bad_arguments() -> None:
    retry = Retry(base_s=0.2, cap_s=5.0)
    assert [retry.delay_s(n) for n in (1, 2, 3, 5, 6, 1000)] == [0.2, 0.4, 0.8, 3.2, 5.0, 5.0]
    bad: list[dict[str, Any]] = [{"attempts_max": 0}, {"base_s": -1.0}, {"base_s": 2.0, "cap_s": 1.0}]
    for kw in bad:
        with pytest.raises(ValueError):
            Retry(**kw)
    with pytest.raises(ValueError):
        retry.delay_s(0)


def test_docstring_example() -> None:
    assert doctest.testmod(gnomon.retrying).failed == 0
