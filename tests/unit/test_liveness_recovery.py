"""A broker outage in the simulation: while every transactional call and committed-offset
read fails, the real processor loop neither raises nor hangs; it stays recovering
(no progress reported, so its liveness watch would count only while the broker answers),
and when the broker is back it rebuilds its producer, rewinds to the last commit,
rejoins and schedules again, with every slot accounted for."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from gnomon.core.errors import EventLogError
from gnomon.eventlog.memory import MemoryGroupConsumer, MemoryTransactionalProducer
from gnomon.eventlog.port import TransactionError
from gnomon.sim import SimCluster

pytestmark = pytest.mark.usefixtures("quiet_logs")


class Broker:
    def __init__(self) -> None:
        self.away = False
        self.refused = 0


def broker_outages(monkeypatch: pytest.MonkeyPatch) -> Broker:
    broker = Broker()

    def guarded(cls: type, name: str, error: Callable[[str], Exception], when_away: Any = None) -> None:
        real = getattr(cls, name)

        def call(self: object, *args: Any, **kwargs: Any) -> Any:
            if broker.away:
                broker.refused += 1
                if when_away is not None:
                    return when_away
                raise error(name)
            return real(self, *args, **kwargs)

        monkeypatch.setattr(cls, name, call)

    # (a timed-out commit is retried within the commit's budget, in real time: the
    # simulation's broker refuses at once instead, as a broker connection reset does)
    for name in ("send_offsets", "commit", "abort"):
        guarded(MemoryTransactionalProducer, name, lambda n: TransactionError(f"{n}: Local: Broker transport failure"))
    guarded(MemoryTransactionalProducer, "init_transactions",
            lambda n: TransactionError(f"{n}: Local: Timed out", retriable=True))
    guarded(MemoryGroupConsumer, "committed", lambda n: EventLogError(f"{n}: Local: Timed out"))
    guarded(MemoryGroupConsumer, "consume", lambda n: EventLogError(n), when_away=[])
    return broker


def test_the_processor_rides_out_a_broker_outage_and_resumes(monkeypatch: pytest.MonkeyPatch) -> None:
    broker = broker_outages(monkeypatch)
    c = SimCluster(3, processors=1, workers=1)
    c.register("a", "* * * * * *")
    c.run_for(5_000, faults=False)
    p0 = c.processor("p0")
    txns, aborts = p0.transactions, p0.aborts
    assert txns > 0 and not p0.recovering
    broker.away = True
    c.run_for(30_000, faults=False)  # 30 s with the broker away: no exception out of the loop
    assert broker.refused > 0 and p0.recovering
    assert p0.transactions == txns and p0.aborts == aborts + 1  # one failed transaction, then waiting
    stalled_at = p0.progress_at_s
    c.run_for(2_000, faults=False)
    assert p0.progress_at_s == stalled_at  # no progress reported while recovering
    broker.away = False
    c.run_for(5_000, faults=False)
    assert not p0.recovering and p0.transactions > txns  # back: committing again
    c.heal(10_000)
    rep = c.history_report()
    assert rep.ok and rep.missed == 0 and rep.duplicates == 0, rep.summary()


def test_a_producer_fenced_in_the_flush_before_the_offsets_is_rebuilt(monkeypatch: pytest.MonkeyPatch) -> None:
    # the region test: b's processor's transaction outlived its timeout mid-cut, the
    # coordinator bumped its epoch, and the flush that sends the records before the
    # offsets raised "fenced"; the processor must rebuild its producer, not stop
    real = MemoryTransactionalProducer.flush
    fenced = {"left": 1}

    def flush(self: MemoryTransactionalProducer, timeout_s: float) -> int:
        if fenced["left"] and self._txn is not None:
            fenced["left"] -= 1
            raise TransactionError("flush: This instance has been fenced by a newer instance", fatal=True)
        return real(self, timeout_s)

    monkeypatch.setattr(MemoryTransactionalProducer, "flush", flush)
    c = SimCluster(3, processors=1, workers=1)
    c.register("a", "* * * * * *")
    c.run_for(10_000, faults=False)
    p0 = c.processor("p0")
    assert fenced["left"] == 0 and p0.aborts >= 1 and not p0.recovering and p0.transactions > 0
    c.heal(10_000)
    rep = c.history_report()
    assert rep.ok and rep.missed == 0 and rep.duplicates == 0, rep.summary()
