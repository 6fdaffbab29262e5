"""The in-memory event log (gnomon.eventlog.memory): read_committed visibility, the last
stable offset, consumer groups with the range assignor and eager rebalances, and
transactional fencing (producer epochs and group generations)."""

from __future__ import annotations

import pytest

from gnomon.core.clock import FakeClock
from gnomon.eventlog.memory import MemoryEventLog
from gnomon.eventlog.port import OFFSET_BEGINNING, OFFSET_END, TP, TransactionError

T, U = "in", "other"


def values(recs: list[object]) -> list[bytes | None]:
    return [r.value for r in recs]  # type: ignore[attr-defined]


class Member:
    def __init__(self, log: MemoryEventLog, name: str, session_ms: int = 3_000) -> None:
        self.events: list[tuple[str, list[TP]]] = []
        self.c = log.group_consumer("g", client_id=name, session_timeout_ms=session_ms)
        self.c.subscribe([T, U], on_assign=lambda tps: self.events.append(("assign", tps)),
                         on_revoke=lambda tps: self.events.append(("revoke", tps)),
                         on_lost=lambda tps: self.events.append(("lost", tps)))


def test_records_of_open_and_aborted_transactions_are_never_read() -> None:
    log = MemoryEventLog(FakeClock(), partitions=1)
    a = log.transactional_producer("a", client_id="a", transaction_timeout_ms=5_000)
    a.init_transactions(1)
    a.begin()
    a.produce(T, b"k", b"open", 0)
    log.append(T, b"k", b"plain", 0)  # behind the open transaction: not stable yet
    r = log.reader("r")
    r.assign([(T, 0, OFFSET_BEGINNING)])
    assert r.consume(10, 0) == []
    a.abort(1)
    assert values(r.consume(10, 0)) == [b"plain"]
    a.begin()
    a.produce(T, b"k", b"committed", 0)
    a.commit(1)
    assert values(r.consume(10, 0)) == [b"committed"]
    assert values(log.records(T)) == [b"plain", b"committed"]
    assert log.high((T, 0)) == 5  # 3 records and 2 control markers: offsets as Kafka gives them
    r.assign([(T, 0, OFFSET_END)])
    assert r.consume(10, 0) == []


def test_a_newer_producer_with_the_same_id_fences_the_older_and_aborts_its_transaction() -> None:
    log = MemoryEventLog(FakeClock(), partitions=1)
    old = log.transactional_producer("p", client_id="x", transaction_timeout_ms=5_000)
    old.init_transactions(1)
    old.begin()
    old.produce(T, b"k", b"zombie", 0)
    new = log.transactional_producer("p", client_id="y", transaction_timeout_ms=5_000)
    new.init_transactions(1)
    with pytest.raises(TransactionError) as exc:
        old.commit(1)
    assert exc.value.fatal
    assert log.records(T) == []


def test_a_transaction_open_past_its_timeout_is_aborted() -> None:
    clock = FakeClock()
    log = MemoryEventLog(clock, partitions=1)
    p = log.transactional_producer("p", client_id="x", transaction_timeout_ms=1_000)
    p.init_transactions(1)
    p.begin()
    p.produce(T, b"k", b"v", 0)
    clock.advance(1_001)
    log.tick()
    with pytest.raises(TransactionError) as exc:
        p.commit(1)
    assert exc.value.fatal and log.records(T) == []


def test_range_assignment_revokes_before_it_assigns() -> None:
    clock = FakeClock()
    log = MemoryEventLog(clock, partitions=4)
    a = Member(log, "a")
    assert a.c.consume(10, 0) == []
    assert a.events == [("assign", [(T, 0), (T, 1), (T, 2), (T, 3), (U, 0), (U, 1), (U, 2), (U, 3)])]
    b = Member(log, "b")
    b.c.consume(10, 0)  # rejoined first: waits for a
    assert b.events == []
    a.c.consume(10, 0)
    assert a.events[-2:] == [("revoke", a.events[0][1]), ("assign", [(T, 0), (T, 1), (U, 0), (U, 1)])]
    b.c.consume(10, 0)
    assert b.events == [("assign", [(T, 2), (T, 3), (U, 2), (U, 3)])]


def test_a_member_whose_session_lapsed_cannot_commit_offsets() -> None:
    clock = FakeClock()
    log = MemoryEventLog(clock, partitions=2)
    a, b = Member(log, "a"), Member(log, "b")
    for m in (a, b, a, b):
        m.c.consume(10, 0)
    prod = log.transactional_producer("pa", client_id="a", transaction_timeout_ms=60_000)
    prod.init_transactions(1)
    meta = a.c.group_metadata()
    clock.advance(3_001)
    b.c.consume(10, 0)  # the coordinator expires a; b rejoins alone
    b.c.consume(10, 0)
    assert ("assign", [(T, 0), (T, 1), (U, 0), (U, 1)]) in b.events
    prod.begin()
    with pytest.raises(TransactionError) as exc:
        prod.send_offsets({(T, 0): 1}, meta, 1)
    assert not exc.value.fatal  # abortable: abort, then rewind
    prod.abort(1)
    a.c.consume(10, 0)
    assert a.events[-1] == ("lost", [(T, 0), (U, 0)])  # lost, not revoked: no checkpoint
    b.c.consume(10, 0)
    a.c.consume(10, 0)
    assert a.events[-1][0] == "assign"  # joined again


def test_committed_offsets_are_those_of_committed_transactions() -> None:
    log = MemoryEventLog(FakeClock(), partitions=1)
    m = Member(log, "a")
    m.c.consume(10, 0)
    for v in (b"1", b"2"):
        log.append(T, b"k", v, 0)
    assert values(m.c.consume(10, 0)) == [b"1", b"2"]
    prod = log.transactional_producer("p", client_id="a", transaction_timeout_ms=5_000)
    prod.init_transactions(1)
    for ok in (False, True):
        prod.begin()
        prod.send_offsets({(T, 0): 2}, m.c.group_metadata(), 1)
        (prod.commit if ok else prod.abort)(1)
        assert m.c.committed([(T, 0)], 1) == {(T, 0): 2 if ok else None}
