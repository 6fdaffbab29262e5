"""A worker's start reads where its inbox ends; a broker that cannot answer yet (still
starting, credentials not yet on every broker) is asked again, a bounded number of times."""

from __future__ import annotations

from typing import Any

import pytest

import gnomon.worker.worker as worker_mod
from gnomon.core.clock import FakeClock
from gnomon.core.errors import EventLogError
from gnomon.eventlog.memory import MemoryEventLog, MemoryReader
from gnomon.retrying import Retry
from gnomon.topology import load_topology
from gnomon.worker import Worker


class FlakyLog(MemoryEventLog):
    """Watermark reads fail ``failures`` times, as a broker rejecting SASL at start does."""

    def __init__(self, failures: int) -> None:
        super().__init__(FakeClock())
        self.failures = failures
        self.calls = 0

    def reader(self, group_id: str, *, client_id: str | None = None, config: Any = None) -> MemoryReader:
        log = self

        class Flaky(MemoryReader):
            def watermarks(self, tp: Any, timeout_s: float = 10.0, *, cached: bool = False) -> tuple[int, int]:
                if cached:  # the metrics' local read, no broker round trip
                    return super().watermarks(tp, timeout_s, cached=True)
                log.calls += 1
                if log.calls <= log.failures:
                    raise EventLogError(f"cannot read the watermarks of {tp[0]}[{tp[1]}]: Authentication failure")
                return super().watermarks(tp, timeout_s, cached=cached)

        return Flaky(self, group_id)


@pytest.fixture(autouse=True)
def fast_retry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker_mod, "INBOX_OPEN_RETRY",
                        Retry(attempts_max=3, base_s=0.0, cap_s=0.0, retriable=lambda e: isinstance(e, EventLogError)))


def _worker(log: MemoryEventLog) -> Worker:
    return Worker("default", worker_id="w1", clock=log.clock, topology=load_topology(), tenants=["t"], log=log)


def test_start_asks_again_until_the_inbox_end_is_known() -> None:
    log = FlakyLog(failures=2)
    topo = load_topology()
    w = _worker(log)
    w.start()
    assert log.calls == 3
    assert w._inbox_tp is not None and w._inbox_tp[0] == topo.worker_inbox
    assert w._inbox is not None and w._inbox.position([w._inbox_tp]) == {w._inbox_tp: 0}  # read from its end


def test_start_fails_with_the_brokers_error_once_attempts_run_out() -> None:
    log = FlakyLog(failures=10)
    with pytest.raises(EventLogError, match="Authentication failure"):
        _worker(log).start()
    assert log.calls == 3
