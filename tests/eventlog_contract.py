"""The event-log port's contract (``gnomon.eventlog.port``) as a pytest suite, for both
logs: the in-memory one (``tests/unit/test_eventlog_contract.py``) and Kafka
(``tests/integration/test_eventlog_contract.py``).

Subclass ``EventLogContract`` and provide two fixtures: ``log`` (an ``EventLog``) and
``new_topic`` (a factory ``new_topic(partitions) -> name`` of a fresh, empty topic on that
log). Every test uses topics of its own. What the processor, the feeds and the API's
answer reader rely on is what is checked here: order within a partition, read_committed
(an aborted or open transaction is never read), fencing by transactional id, end offsets,
reading to the end (once no transaction is open), the compacted-feed reader on top of a reader, and a group member
starting where its group committed (the history projector).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from gnomon.core.errors import EventLogError
from gnomon.eventlog.port import OFFSET_BEGINNING, EventLog, GroupConsumer, Reader, Record
from gnomon.feeds.compacted import CompactedFeed

WAIT_S = 20.0  # how long a read may take on a real broker (the in-memory log answers at once)
TXN_TIMEOUT_MS = 10_000


def read(reader: Reader, n: int, timeout_s: float = WAIT_S) -> list[Record]:
    """Exactly ``n`` records from ``reader`` (fewer if the deadline passes)."""
    out: list[Record] = []
    deadline = time.monotonic() + timeout_s
    while len(out) < n and time.monotonic() < deadline:
        out += reader.consume(n - len(out), 0.2)
    return out


class EventLogContract:
    @pytest.fixture
    def log(self) -> EventLog:
        raise NotImplementedError

    @pytest.fixture
    def new_topic(self) -> Callable[[int], str]:
        raise NotImplementedError

    def test_plain_records_come_back_in_order_with_their_keys(self, log: EventLog,
                                                             new_topic: Callable[[int], str]) -> None:
        topic = new_topic(1)
        producer = log.producer(client_id="contract-plain")
        reports: list[tuple[str | None, int, int]] = []
        for i in range(5):
            producer.produce(topic, b"k%d" % i, b"v%d" % i, on_delivery=lambda *r: reports.append(r))
        assert producer.flush(WAIT_S) == 0
        assert [(err, p) for err, p, _ in reports] == [(None, 0)] * 5  # where each went
        assert sorted(o for _, _, o in reports) == [o for _, _, o in sorted(reports, key=lambda r: r[2])]
        assert len({o for _, _, o in reports}) == 5
        reader = log.reader("contract-reader")
        assert reader.partitions(topic) == [0]
        reader.assign([(topic, 0, OFFSET_BEGINNING)])
        got = read(reader, 5)
        assert [(r.key, r.value) for r in got] == [(b"k%d" % i, b"v%d" % i) for i in range(5)]
        assert [r.offset for r in got] == sorted(r.offset for r in got)
        assert all(r.topic == topic and r.partition == 0 for r in got)
        assert reader.position([(topic, 0)])[(topic, 0)] == got[-1].offset + 1
        reader.close()

    def test_an_aborted_transaction_is_never_read_a_committed_one_is(self, log: EventLog,
                                                                    new_topic: Callable[[int], str]) -> None:
        topic = new_topic(1)
        txn = log.transactional_producer(f"contract-{topic}", client_id="contract-txn",
                                         transaction_timeout_ms=TXN_TIMEOUT_MS)
        txn.init_transactions(WAIT_S)
        txn.begin()
        txn.produce(topic, b"k", b"aborted", 0)
        txn.flush(WAIT_S)
        txn.abort(WAIT_S)
        txn.begin()
        txn.produce(topic, b"k", b"committed", 0)
        txn.commit(WAIT_S)
        reader = log.reader("contract-reader")
        reader.assign([(topic, 0, OFFSET_BEGINNING)])
        got = read(reader, 1)
        assert [r.value for r in got] == [b"committed"]
        assert read(reader, 1, timeout_s=1.0) == []  # nothing after it, the abort's record least of all

    def test_a_newer_producer_with_the_same_id_fences_the_older(self, log: EventLog,
                                                               new_topic: Callable[[int], str]) -> None:
        topic = new_topic(1)
        tid = f"contract-fence-{topic}"
        old = log.transactional_producer(tid, client_id="contract-old", transaction_timeout_ms=TXN_TIMEOUT_MS)
        old.init_transactions(WAIT_S)
        old.begin()
        old.produce(topic, b"k", b"zombie", 0)
        new = log.transactional_producer(tid, client_id="contract-new", transaction_timeout_ms=TXN_TIMEOUT_MS)
        new.init_transactions(WAIT_S)
        with pytest.raises(EventLogError):
            old.commit(WAIT_S)
        new.begin()
        new.produce(topic, b"k", b"fresh", 0)
        new.commit(WAIT_S)
        reader = log.reader("contract-reader")
        reader.assign([(topic, 0, OFFSET_BEGINNING)])
        assert [r.value for r in read(reader, 1)] == [b"fresh"]
        assert read(reader, 1, timeout_s=1.0) == []

    def test_end_offsets_and_reading_to_the_end(self, log: EventLog, new_topic: Callable[[int], str]) -> None:
        topic = new_topic(2)
        producer = log.producer(client_id="contract-end")
        assert log.end_offset(topic, 0) == 0
        for i in range(4):
            producer.produce(topic, b"same-key", b"%d" % i)
        assert producer.flush(WAIT_S) == 0
        reader = log.reader("contract-reader")
        assert reader.partitions(topic) == [0, 1]
        ends = {p: log.end_offset(topic, p) for p in (0, 1)}
        assert sorted(ends.values()) == [0, 4]  # one key: one partition
        p = max(ends, key=lambda q: ends[q])
        assert reader.watermarks((topic, p), WAIT_S) == (0, 4)
        assert [r.value for r in log.read_to_end(topic, p, WAIT_S)] == [b"0", b"1", b"2", b"3"]
        assert [r.value for r in log.read_to_end(topic, p, WAIT_S, start=2)] == [b"2", b"3"]

    def test_reads_one_after_another_return_their_own_partition_only(self, log: EventLog,
                                                                     new_topic: Callable[[int], str]) -> None:
        """A log may reuse its clients from read to read (on Kafka: one consumer per
        thread): after a read given up part-way, reads of the other partition and of the
        same one again return their own records, all of them."""
        topic = new_topic(2)
        producer = log.producer(client_id="contract-reuse")
        for i in range(40):
            producer.produce(topic, b"k%d" % i, b"%d" % i)
        assert producer.flush(WAIT_S) == 0
        want = {p: [(r.partition, r.value) for r in log.read_to_end(topic, p, WAIT_S)] for p in (0, 1)}
        assert all(want.values()) and sum(len(v) for v in want.values()) == 40, want
        assert all(part == p for p, got in want.items() for part, _ in got)
        first = iter(log.read_to_end(topic, 0, WAIT_S))
        assert next(first) == next(iter(log.read_to_end(topic, 0, WAIT_S)))
        for p in (1, 0, 1):
            assert [(r.partition, r.value) for r in log.read_to_end(topic, p, WAIT_S)] == want[p]
        assert [log.end_offset(topic, p) for p in (0, 1)] == [len(want[0]), len(want[1])]

    def test_reading_to_the_end_waits_out_an_open_transaction_and_never_skips_it(
            self, log: EventLog, new_topic: Callable[[int], str]) -> None:
        """A new owner restores a changelog only once no transaction is open on it: a
        previous owner's commit in flight is read, not skipped (the restore is retried)."""
        topic = new_topic(1)
        txn = log.transactional_producer(f"contract-{topic}", client_id="contract-open",
                                         transaction_timeout_ms=TXN_TIMEOUT_MS)
        txn.init_transactions(WAIT_S)
        txn.begin()
        txn.produce(topic, b"k", b"in flight", 0)
        txn.flush(WAIT_S)
        began = time.monotonic()
        with pytest.raises(EventLogError, match="still open"):
            list(log.read_to_end(topic, 0, 5.0))
        assert time.monotonic() - began < WAIT_S  # bounded by its timeout
        txn.commit(WAIT_S)
        assert [r.value for r in log.read_to_end(topic, 0, WAIT_S)] == [b"in flight"]

    def test_the_compacted_feed_reader_loads_to_the_end_then_polls(self, log: EventLog,
                                                                  new_topic: Callable[[int], str]) -> None:
        topic, empty = new_topic(2), new_topic(1)
        producer = log.producer(client_id="contract-feed")
        for i in range(3):
            producer.produce(topic, b"k%d" % i, b"v%d" % i)
        assert producer.flush(WAIT_S) == 0
        seen: dict[bytes | None, bytes | None] = {}

        def apply(r: Record) -> int:
            seen[r.key] = r.value
            return 1

        feed = CompactedFeed(log, "contract-feed", [topic, empty], apply, now_ms=lambda: 7)
        assert feed.load(WAIT_S) == 3 and len(seen) == 3 and feed.last_poll_ms == 7
        producer.produce(topic, b"k0", None)  # a tombstone
        assert producer.flush(WAIT_S) == 0
        deadline = time.monotonic() + WAIT_S
        polled = 0
        while polled == 0 and time.monotonic() < deadline:
            polled = feed.poll()
            time.sleep(0.05)
        assert polled == 1 and seen[b"k0"] is None
        feed.close()

    def test_a_group_member_starts_where_the_group_committed(self, log: EventLog,
                                                            new_topic: Callable[[int], str]) -> None:
        """The plain commit (the history projector's): the next member of the group reads
        from the committed offset, and the group's committed offsets show it."""
        topic = new_topic(1)
        group = f"contract-group-{topic}"
        producer = log.producer(client_id="contract-group")
        for i in range(5):
            producer.produce(topic, b"k", b"%d" % i)
        assert producer.flush(WAIT_S) == 0

        def none(_tps: list[tuple[str, int]]) -> None:
            return None

        def member() -> GroupConsumer:
            c = log.group_consumer(group, client_id="contract-member", session_timeout_ms=10_000)
            c.subscribe([topic], on_assign=none, on_revoke=none, on_lost=none)
            return c

        first = member()
        got: list[Record] = []
        deadline = time.monotonic() + WAIT_S
        while len(got) < 3 and time.monotonic() < deadline:
            got += first.consume(3 - len(got), 0.2)
        assert [r.value for r in got] == [b"0", b"1", b"2"]
        first.commit({(topic, 0): got[-1].offset + 1}, WAIT_S)
        assert first.committed([(topic, 0)], WAIT_S) == {(topic, 0): 3}
        first.close()
        second = member()
        rest: list[Record] = []
        deadline = time.monotonic() + WAIT_S
        while len(rest) < 2 and time.monotonic() < deadline:
            rest += second.consume(2 - len(rest), 0.2)
        assert [r.value for r in rest] == [b"3", b"4"]
        second.close()

    def test_a_commit_made_in_on_assign_is_where_reading_starts(self, log: EventLog,
                                                               new_topic: Callable[[int], str]) -> None:
        """The alerter's start at the end: a member new to the group commits the end in
        its assignment callback, and reads from there (not from the reset policy's
        earliest), as both logs read start positions after the callback returns."""
        topic = new_topic(1)
        producer = log.producer(client_id="contract-start")
        for i in range(3):
            producer.produce(topic, b"k", b"old%d" % i)
        assert producer.flush(WAIT_S) == 0
        c = log.group_consumer(f"contract-start-{topic}", client_id="contract-start", session_timeout_ms=10_000)

        def at_end(tps: list[tuple[str, int]]) -> None:
            c.commit({tp: log.end_offset(*tp) for tp in tps}, WAIT_S)

        def none(_tps: list[tuple[str, int]]) -> None:
            return None

        c.subscribe([topic], on_assign=at_end, on_revoke=none, on_lost=none)
        deadline = time.monotonic() + WAIT_S
        while not c.assignment() and time.monotonic() < deadline:
            assert c.consume(10, 0.2) == []  # nothing old
        producer.produce(topic, b"k", b"new")
        assert producer.flush(WAIT_S) == 0
        got: list[Record] = []
        deadline = time.monotonic() + WAIT_S
        while not got and time.monotonic() < deadline:
            got += c.consume(10, 0.2)
        assert [r.value for r in got] == [b"new"]
        c.close()
