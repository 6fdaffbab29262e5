"""The event-log port in memory: a deterministic stand-in for Kafka in the simulation.

* Partitioned append-only logs (no compaction, no retention): offsets as Kafka gives them,
  one control marker per partition a transaction touched when it ends.
* ``read_committed`` everywhere: a record of an open or aborted transaction is never
  delivered, and no reader goes past the first record of a still open transaction (the
  last stable offset).
* Consumer groups with the eager range assignor: a membership change (join, leave, a
  session that lapsed) starts a new generation; every member revokes what it holds at its
  next ``consume`` and gets its new partitions once all live members rejoined. A member
  not seen for its session timeout is expired (its partitions are *lost*, not revoked).
* Transactions: a transactional id has an epoch; ``init_transactions`` bumps it and aborts
  what the previous producer left open, so the older producer is fenced (fatal).
  ``send_offsets`` checks the group metadata (generation and member): a member whose
  generation is stale cannot commit (KIP-447). A transaction open longer than its
  timeout is aborted and its producer fenced.
* No threads and no wall clock: time is the injected ``Clock`` (a ``FakeClock``).

Faults are injected from outside (``gnomon.sim``): ``fail_next_commit`` makes a
transactional id's next commit fail (abortable), ``commit_answer_lost`` commits it but
answers with a fatal timeout, ``slow_markers`` answers a commit whose
records become readable later, ``late_records`` answers a commit whose records are still
on their way (in their logs only once flushed, or when it ends), ``stale_view`` makes an
expired member serve one more batch as if it had not noticed (a zombie), ``cut_writes_until_ms``
and ``cut_reads_until_ms`` cut a plain client off (its producer's records wait, unanswered;
its reader reads nothing: a host cut off from the brokers), and ``PlainFaults`` duplicate or reorder the records of plain producers (as producer retries
could).
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gnomon.adapters.kafka import partition_for
from gnomon.core.clock import Clock
from gnomon.core.errors import EventLogError
from gnomon.eventlog.port import (
    OFFSET_BEGINNING,
    OFFSET_END,
    TP,
    Delivery,
    Headers,
    Partitions,
    Record,
    TransactionError,
)

OPEN, COMMITTED, ABORTED = "open", "committed", "aborted"
# commit asked for and answered, markers not written yet (Kafka's PrepareCommit: the
# coordinator was cut off, or is moving): invisible, holds the LSO, commits later
PREPARED = "prepared"


@dataclass
class _Txn:
    tid: str
    epoch: int
    started_ms: int
    timeout_ms: int
    state: str = OPEN
    tps: set[TP] = field(default_factory=set)
    offsets: dict[TP, int] = field(default_factory=dict)
    group: str | None = None
    complete_at_ms: int | None = None  # PREPARED: when its markers are written
    # ``late_records``: its records are on their way, written at ``flush`` or when it ends
    late_ms: int | None = None
    held: list[tuple[str, bytes | None, bytes | None, int | None, Headers]] = field(default_factory=list)


@dataclass(slots=True)
class _Entry:
    record: Record | None  # None: a control marker
    txn: _Txn | None  # None: not transactional

    @property
    def visible(self) -> bool:
        return self.record is not None and (self.txn is None or self.txn.state == COMMITTED)

    @property
    def open(self) -> bool:
        return self.txn is not None and self.txn.state in (OPEN, PREPARED)


@dataclass
class PlainFaults:
    """What a plain producer's retries could do to ``topics``: deliver a record twice, or
    after records sent later. Drawn from ``rng``."""

    rng: random.Random
    topics: frozenset[str]
    p_duplicate: float = 0.0
    p_reorder: float = 0.0
    duplicated: int = 0
    reordered: int = 0


@dataclass
class _Member:
    member_id: str
    consumer: MemoryGroupConsumer
    session_ms: int
    last_seen_ms: int
    acked_gen: int = -1  # the generation it rejoined (revoked what it held)
    assigned_gen: int = -1  # the generation whose assignment it holds


@dataclass
class _Group:
    group_id: str
    topics: list[str] = field(default_factory=list)
    members: dict[str, _Member] = field(default_factory=dict)
    generation: int = 0
    assigned_gen: int = -1  # the generation whose assignment is decided
    assignment: dict[str, list[TP]] = field(default_factory=dict)
    pending: set[str] = field(default_factory=set)
    committed: dict[TP, int] = field(default_factory=dict)
    rebalances: int = 0


class _Partition:
    __slots__ = ("entries", "stable")

    def __init__(self) -> None:
        self.entries: list[_Entry] = []
        self.stable = 0  # no entry below this belongs to an open transaction

    def lso(self) -> int:
        while self.stable < len(self.entries) and not self.entries[self.stable].open:
            self.stable += 1
        return self.stable


class MemoryEventLog:
    def __init__(self, clock: Clock, partitions: int = 4, topic_partitions: Mapping[str, int] | None = None) -> None:
        self.clock = clock
        self.default_partitions = partitions
        self.topic_partitions = dict(topic_partitions or {})
        self._parts: dict[TP, _Partition] = {}
        self.groups: dict[str, _Group] = {}
        self._epochs: dict[str, int] = {}
        self._open: dict[str, _Txn] = {}
        self._member_seq = 0
        self.fail_next_commit: set[str] = set()  # transactional ids whose next commit fails (abortable)
        # transactional ids whose next commit goes through but is answered with a fatal
        # error (a timeout: the coordinator committed, its answer never came back)
        self.commit_answer_lost: set[str] = set()
        # transactional id -> ms: its next commit is answered, its markers written that much later
        self.slow_markers: dict[str, int] = {}
        # transactional id -> ms: its next transaction's records are still on their way when
        # its commit is answered (a process starved, a broker slow): each is in its log once
        # ``flush`` returned, or else only when the transaction ends, that much later
        self.late_records: dict[str, int] = {}
        self.plain_faults: PlainFaults | None = None
        self.refuse_writes: dict[str, str] = {}  # topic -> the error plain producers are told
        # client id -> ms: until then a plain producer's records wait unanswered (writes), a
        # reader reads nothing (reads): the client cut off from the brokers, each way alone
        self.cut_writes_until_ms: dict[str, int] = {}
        self.cut_reads_until_ms: dict[str, int] = {}
        self.fenced: list[str] = []  # what refused a commit, and why (for tests)
        self.commits = 0
        self.aborts = 0

    # ---- the logs -----------------------------------------------------------------------

    def partitions_of(self, topic: str) -> int:
        return self.topic_partitions.get(topic, self.default_partitions)

    def add_partitions(self, topics: Sequence[str], count: int) -> None:
        """Grow ``topics`` to ``count`` partitions (Kafka's CreatePartitions): keys placed
        by the partitioner move; every group reading one of them rebalances."""
        for topic in topics:
            if count < self.partitions_of(topic):
                raise EventLogError(f"{topic} has {self.partitions_of(topic)} partitions; they cannot shrink")
            self.topic_partitions[topic] = count
        for g in self.groups.values():
            if g.members and set(g.topics) & set(topics):
                self._rebalance(g)

    def _part(self, tp: TP) -> _Partition:
        part = self._parts.get(tp)
        if part is None:
            if not 0 <= tp[1] < self.partitions_of(tp[0]):
                raise EventLogError(f"{tp[0]} has no partition {tp[1]}")
            part = self._parts[tp] = _Partition()
        return part

    def append(self, topic: str, key: bytes | None, value: bytes | None, partition: int | None = None,
               txn: _Txn | None = None, headers: Headers = ()) -> int:
        if partition is None:
            partition = partition_for((key or b"").decode(), self.partitions_of(topic))
        part = self._part((topic, partition))
        offset = len(part.entries)
        part.entries.append(_Entry(Record(topic, partition, offset, key, value, self.clock.now_ms(), headers), txn))
        if txn is not None:
            txn.tps.add((topic, partition))
        return offset

    def records(self, topic: str, partition: int | None = None) -> list[Record]:
        """Every committed record of ``topic`` (one partition, or all in partition order)."""
        parts = [partition] if partition is not None else range(self.partitions_of(topic))
        out: list[Record] = []
        for p in parts:
            part = self._parts.get((topic, p))
            if part is not None:
                out.extend(e.record for e in part.entries if e.visible and e.record is not None)
        return out

    def fetch(self, tp: TP, pos: int, limit: int) -> tuple[list[Record], int]:
        """Committed records from ``pos`` up to the last stable offset, at most ``limit``;
        and the next position (past markers and aborted records)."""
        part = self._parts.get(tp)
        if part is None:
            return [], pos
        out: list[Record] = []
        lso = part.lso()
        while pos < lso and len(out) < limit:
            e = part.entries[pos]
            pos += 1
            if e.visible and e.record is not None:
                out.append(e.record)
        return out, pos

    def high(self, tp: TP) -> int:
        part = self._parts.get(tp)
        return len(part.entries) if part is not None else 0

    # ---- time: transaction timeouts, session expiry ---------------------------------------

    def tick(self) -> None:
        now = self.clock.now_ms()
        for tid, txn in list(self._open.items()):
            if txn.state == PREPARED:
                if txn.complete_at_ms is not None and now >= txn.complete_at_ms:
                    self._end(txn, COMMITTED)
            elif now - txn.started_ms > txn.timeout_ms:
                self._end(txn, ABORTED)
                self._epochs[tid] = self._epochs.get(tid, 0) + 1  # the producer is fenced
        for g in self.groups.values():
            for m in list(g.members.values()):
                if now - m.last_seen_ms > m.session_ms:
                    self._leave(g, m.member_id)

    # ---- groups ---------------------------------------------------------------------------

    def _group(self, group_id: str) -> _Group:
        return self.groups.setdefault(group_id, _Group(group_id))

    def _join(self, g: _Group, consumer: MemoryGroupConsumer, session_ms: int) -> _Member:
        self._member_seq += 1
        m = _Member(f"{consumer.client_id}-{self._member_seq}", consumer, session_ms, self.clock.now_ms())
        g.members[m.member_id] = m
        self._rebalance(g)
        return m

    def _leave(self, g: _Group, member_id: str) -> None:
        if g.members.pop(member_id, None) is not None:
            self._rebalance(g)

    def _rebalance(self, g: _Group) -> None:
        g.generation += 1
        g.rebalances += 1
        g.pending = set(g.members)
        g.assignment = {}

    def _assign(self, g: _Group) -> None:
        """The range assignor: per topic, consecutive partitions to members in id order."""
        members = sorted(g.members)
        g.assignment = {m: [] for m in members}
        for topic in sorted(g.topics):
            n = self.partitions_of(topic)
            per, extra = divmod(n, len(members)) if members else (0, 0)
            start = 0
            for i, m in enumerate(members):
                count = per + (1 if i < extra else 0)
                g.assignment[m].extend((topic, p) for p in range(start, start + count))
                start += count
        g.assigned_gen = g.generation

    def check_metadata(self, meta: Any) -> str | None:
        """Why a transaction with this group metadata may not commit offsets, or None."""
        group_id, generation, member_id = meta
        g = self.groups.get(group_id)
        if g is None or member_id not in g.members:
            return f"member {member_id} is not in group {group_id} (fenced)"
        if generation != g.generation or g.assigned_gen != g.generation:
            return f"generation {generation} of {member_id} is stale (group at {g.generation})"
        return None

    # ---- transactions ---------------------------------------------------------------------

    def _claim(self, tid: str) -> int:
        old = self._open.get(tid)
        if old is not None:  # (a prepared commit is completed, as Kafka's coordinator does)
            self._end(old, COMMITTED if old.state == PREPARED else ABORTED)
        self._epochs[tid] = self._epochs.get(tid, 0) + 1
        return self._epochs[tid]

    def _end(self, txn: _Txn, state: str) -> None:
        if state == COMMITTED:  # records still on their way land before the markers
            for topic, key, value, partition, headers in txn.held:
                self.append(topic, key, value, partition, txn, headers)
        txn.held.clear()
        txn.state = state
        self._open.pop(txn.tid, None)
        for topic, p in sorted(txn.tps):
            self._part((topic, p)).entries.append(_Entry(None, txn))  # the control marker
        if state == COMMITTED:
            self.commits += 1
            if txn.group is not None:
                self._group(txn.group).committed.update(txn.offsets)
        else:
            self.aborts += 1

    # ---- the port -------------------------------------------------------------------------

    def reader(self, group_id: str, *, client_id: str | None = None,
               config: Mapping[str, Any] | None = None) -> MemoryReader:
        return MemoryReader(self, group_id, client_id)

    def group_consumer(self, group_id: str, *, client_id: str, session_timeout_ms: int,
                       config: Mapping[str, Any] | None = None) -> MemoryGroupConsumer:
        return MemoryGroupConsumer(self, group_id, client_id, session_timeout_ms)

    def transactional_producer(self, transactional_id: str, *, client_id: str, transaction_timeout_ms: int,
                               config: Mapping[str, Any] | None = None) -> MemoryTransactionalProducer:
        return MemoryTransactionalProducer(self, transactional_id, transaction_timeout_ms)

    def producer(self, *, client_id: str, config: Mapping[str, Any] | None = None) -> MemoryProducer:
        return MemoryProducer(self, client_id)

    def is_cut(self, cuts: Mapping[str, int], client_id: str | None) -> bool:
        """``client_id`` is cut off now by ``cuts`` (``cut_writes_until_ms`` or ``cut_reads_until_ms``)."""
        until = cuts.get(client_id or "")
        return until is not None and self.clock.now_ms() < until

    def end_offset(self, topic: str, partition: int) -> int:
        if not 0 <= partition < self.partitions_of(topic):
            raise EventLogError(f"{topic} has no partition {partition}")  # as Kafka: unknown partition
        return self.high((topic, partition))

    def wait_stable(self, topic: str, partition: int) -> None:
        """As Kafka's ``wait_stable``: no transaction open (or prepared) on the partition.
        Nothing moves while a simulated process waits, so one that is open outlasts any
        wait: EventLogError at once (the processor's recovery tries again later)."""
        part = self._parts.get((topic, partition))
        if part is not None and part.lso() < len(part.entries):
            raise EventLogError(f"{topic}[{partition}]: a transaction is still open from offset {part.lso()}")

    def read_to_end(self, topic: str, partition: int, timeout_s: float, start: int | None = None) -> Iterator[Record]:
        self.wait_stable(topic, partition)
        pos = start or 0
        while True:
            batch, pos = self.fetch((topic, partition), pos, 10_000)
            if not batch:
                return
            yield from batch


class MemoryReader:
    def __init__(self, log: MemoryEventLog, group_id: str, client_id: str | None = None) -> None:
        self.log = log
        self.group_id = group_id
        self.client_id = client_id
        self._pos: dict[TP, int] = {}
        self._paused: set[TP] = set()

    def assign(self, positions: Sequence[tuple[str, int, int]]) -> None:
        self._pos = {}
        for t, p, o in positions:
            self._pos[(t, p)] = 0 if o == OFFSET_BEGINNING else self.log.high((t, p)) if o == OFFSET_END else max(o, 0)
        self._paused &= set(self._pos)

    def consume(self, max_records: int, timeout_s: float) -> list[Record]:
        out: list[Record] = []
        if self.log.is_cut(self.log.cut_reads_until_ms, self.client_id):
            return out
        for tp in sorted(self._pos):
            if tp in self._paused or len(out) >= max_records:
                continue
            got, self._pos[tp] = self.log.fetch(tp, self._pos[tp], max_records - len(out))
            out.extend(got)
        return out

    def position(self, tps: Sequence[TP]) -> dict[TP, int]:
        return {tp: self._pos.get(tp, -1) for tp in tps}

    def watermarks(self, tp: TP, timeout_s: float = 10.0, *, cached: bool = False) -> tuple[int, int]:
        return 0, self.log.high(tp)

    def committed(self, tps: Sequence[TP], timeout_s: float) -> dict[TP, int | None]:
        g = self.log.groups.get(self.group_id)
        return {tp: (g.committed.get(tp) if g is not None else None) for tp in tps}

    def partitions(self, topic: str, timeout_s: float = 10.0) -> list[int]:
        return list(range(self.log.partitions_of(topic)))

    def offsets_for_time(self, topic: str, partitions: Sequence[int], ts_ms: int,
                         timeout_s: float = 10.0) -> dict[int, int]:
        out: dict[int, int] = {}
        for p in partitions:
            part = self.log._parts.get((topic, p))
            found = -1
            for e in part.entries if part is not None else []:
                if e.record is not None and e.record.timestamp_ms >= ts_ms:
                    found = e.record.offset
                    break
            out[p] = found
        return out

    def pause(self, tps: Sequence[TP]) -> None:
        self._paused |= set(tps)

    def resume(self, tps: Sequence[TP]) -> None:
        self._paused -= set(tps)

    def close(self) -> None:
        self._pos = {}


class MemoryGroupConsumer:
    def __init__(self, log: MemoryEventLog, group_id: str, client_id: str, session_ms: int) -> None:
        self.log = log
        self.group_id = group_id
        self.client_id = client_id
        self.session_ms = session_ms
        self._member: _Member | None = None
        self._callbacks: tuple[Partitions, Partitions, Partitions] | None = None
        self._assignment: list[TP] = []
        self._pos: dict[TP, int] = {}
        self.stale_view = 0  # batches still served from a lost assignment before noticing (a zombie)
        self.closed = False

    @property
    def member_id(self) -> str | None:
        return self._member.member_id if self._member is not None else None

    def subscribe(self, topics: Sequence[str], *, on_assign: Partitions, on_revoke: Partitions,
                  on_lost: Partitions) -> None:
        g = self.log._group(self.group_id)
        g.topics = sorted(set(g.topics) | set(topics))
        self._callbacks = (on_assign, on_revoke, on_lost)
        self._member = self.log._join(g, self, self.session_ms)

    def _rejoin_and_fetch(self, max_records: int) -> list[Record]:
        assert self._callbacks is not None
        on_assign, on_revoke, on_lost = self._callbacks
        g = self.log._group(self.group_id)
        me = self._member
        if me is None or me.member_id not in g.members:  # our session lapsed: lost, then join again
            if self._assignment:
                if self.stale_view > 0:  # has not noticed yet: serves what it had prefetched
                    self.stale_view -= 1
                    return self._fetch(max_records)
                lost, self._assignment = self._assignment, []
                on_lost(lost)
            me = self._member = self.log._join(g, self, self.session_ms)
        me.last_seen_ms = self.log.clock.now_ms()
        if me.acked_gen != g.generation:
            if self._assignment:
                revoked, self._assignment = self._assignment, []
                on_revoke(revoked)
            me.acked_gen = g.generation
            g.pending.discard(me.member_id)
            if not g.pending:
                self.log._assign(g)
        if g.assigned_gen == g.generation and me.assigned_gen != g.generation:
            me.assigned_gen = g.generation
            self._assignment = list(g.assignment.get(me.member_id, []))
            if self._assignment:
                on_assign(list(self._assignment))
            # start positions are the group's commits as of after the callback (as Kafka
            # reads them once the callback returned): a commit made in it counts
            self._pos = {tp: g.committed.get(tp, 0) for tp in self._assignment}
        if me.assigned_gen != g.generation:
            return []  # the rebalance waits for other members
        return self._fetch(max_records)

    def _fetch(self, max_records: int) -> list[Record]:
        out: list[Record] = []
        for tp in self._assignment:
            if len(out) >= max_records:
                break
            got, self._pos[tp] = self.log.fetch(tp, self._pos.get(tp, 0), max_records - len(out))
            out.extend(got)
        return out

    def consume(self, max_records: int, timeout_s: float) -> list[Record]:
        if self.closed or self._callbacks is None:
            return []
        self.log.tick()
        return self._rejoin_and_fetch(max_records)

    def assignment(self) -> list[TP]:
        return list(self._assignment)

    def position(self, tps: Sequence[TP]) -> dict[TP, int]:
        return {tp: self._pos.get(tp, -1) for tp in tps}

    def high_watermark(self, tp: TP) -> int:
        return self.log.high(tp)

    def committed(self, tps: Sequence[TP], timeout_s: float) -> dict[TP, int | None]:
        g = self.log._group(self.group_id)
        return {tp: g.committed.get(tp) for tp in tps}

    def seek(self, tp: TP, offset: int) -> None:
        if tp in self._pos:
            self._pos[tp] = offset

    def commit(self, offsets: Mapping[TP, int], timeout_s: float) -> None:
        if self.closed:
            raise EventLogError(f"offset commit failed: {self.client_id} is closed")
        why = self.log.check_metadata(self.group_metadata())
        if why is not None:  # as Kafka refuses a commit from a stale generation
            raise EventLogError(f"offset commit failed: {why}")
        self.log._group(self.group_id).committed.update(offsets)

    def group_metadata(self) -> Any:
        me = self._member
        # what this member believes: the generation it holds its assignment from
        return (self.group_id, me.assigned_gen if me is not None else -1, me.member_id if me is not None else "")

    def close(self) -> None:
        """Leave the group (a clean stop). A killed process never calls this: its session lapses."""
        if self.closed:
            return
        self.closed = True
        g = self.log._group(self.group_id)
        if self._member is not None:
            self.log._leave(g, self._member.member_id)
        self._assignment = []


class MemoryTransactionalProducer:
    def __init__(self, log: MemoryEventLog, tid: str, timeout_ms: int) -> None:
        self.log = log
        self.tid = tid
        self.timeout_ms = timeout_ms
        self.epoch = -1
        self._txn: _Txn | None = None

    def _check(self) -> None:
        if self.epoch < 0:
            raise TransactionError("init_transactions not called", fatal=True)
        if self.log._epochs.get(self.tid) != self.epoch:
            raise TransactionError(f"producer {self.tid} epoch {self.epoch} fenced by a newer one", fatal=True)

    def init_transactions(self, timeout_s: float) -> None:
        self.epoch = self.log._claim(self.tid)

    def begin(self) -> None:
        self._check()
        if self._txn is not None and self._txn.state == OPEN:
            raise TransactionError("a transaction is already open", fatal=True)
        if self._txn is not None and self._txn.state == PREPARED:  # its markers first (Kafka retries)
            self.log._end(self._txn, COMMITTED)
        self._txn = _Txn(self.tid, self.epoch, self.log.clock.now_ms(), self.timeout_ms,
                         late_ms=self.log.late_records.pop(self.tid, None))
        self.log._open[self.tid] = self._txn

    def _current(self) -> _Txn:
        self._check()
        if self._txn is None or self._txn.state != OPEN:
            raise TransactionError("no open transaction", fatal=True)
        return self._txn

    def produce(self, topic: str, key: bytes | None, value: bytes | None, partition: int | None = None,
                headers: Headers = ()) -> None:
        txn = self._current()
        if txn.late_ms is not None:
            txn.held.append((topic, key, value, partition, headers))
            return
        self.log.append(topic, key, value, partition, txn, headers)

    def partitions(self, topic: str, timeout_s: float) -> int:
        return self.log.partitions_of(topic)

    def send_offsets(self, offsets: Mapping[TP, int], group_metadata: Any, timeout_s: float) -> None:
        txn = self._current()
        why = self.log.check_metadata(group_metadata)
        if why is not None:
            self.log.fenced.append(f"{self.tid}: {why}")
            raise TransactionError(f"send_offsets_to_transaction refused: {why}")
        txn.group = group_metadata[0]
        txn.offsets.update(offsets)

    def commit(self, timeout_s: float) -> None:
        txn = self._current()
        if self.tid in self.log.fail_next_commit:
            self.log.fail_next_commit.discard(self.tid)
            raise TransactionError(f"commit of {self.tid} failed (injected)")
        delay_ms = self.log.slow_markers.pop(self.tid, None)
        if txn.late_ms is not None:  # answered; its records still on their way, if not flushed
            delay_ms = txn.late_ms
        if delay_ms is not None:  # answered; visible only once its markers are written (tick)
            txn.state, txn.complete_at_ms = PREPARED, self.log.clock.now_ms() + delay_ms
            return
        self.log._end(txn, COMMITTED)
        self._txn = None
        if self.tid in self.log.commit_answer_lost:
            self.log.commit_answer_lost.discard(self.tid)
            raise TransactionError(f"commit of {self.tid} timed out (injected: it did commit)", fatal=True)

    def abort(self, timeout_s: float) -> None:
        txn = self._current()
        self.log._end(txn, ABORTED)
        self._txn = None

    def flush(self, timeout_s: float) -> int:
        txn = self._txn
        if txn is not None and txn.state == OPEN and txn.held:  # acknowledged: in their logs now
            for topic, key, value, partition, headers in txn.held:
                self.log.append(topic, key, value, partition, txn, headers)
            txn.held.clear()
        return 0


_Queued = tuple[str, bytes | None, bytes | None, Delivery | None, Headers]


class MemoryProducer:
    """Records wait in a local queue until ``poll``/``flush`` (as librdkafka's linger)."""

    def __init__(self, log: MemoryEventLog, client_id: str | None = None) -> None:
        self.log = log
        self.client_id = client_id
        self._queue: list[_Queued] = []
        self._held: list[_Queued] = []
        self.sent = 0

    def produce(self, topic: str, key: bytes | None, value: bytes | None, *, on_delivery: Delivery | None = None,
                headers: Headers = ()) -> None:
        self._queue.append((topic, key, value, on_delivery, headers))

    def _deliver(self) -> int:
        if self.log.is_cut(self.log.cut_writes_until_ms, self.client_id):
            return 0  # on their way, unanswered: delivered in order once the cut heals
        faults = self.log.plain_faults
        queue, self._queue = self._held + self._queue, []
        self._held = []
        n = 0
        for item in queue:
            if faults is not None and item[0] in faults.topics and faults.p_reorder \
                    and faults.rng.random() < faults.p_reorder:
                faults.reordered += 1
                self._held.append(item)  # delivered after what follows it
                continue
            n += self._write(item, may_duplicate=True)
        return n

    def _write(self, item: _Queued, *, may_duplicate: bool) -> int:
        """Write one record (1), or report the broker's refusal (0); the delivery report
        says where it went. ``may_duplicate``: the plain-producer fault may write it twice."""
        topic, key, value, report, headers = item
        refused = self.log.refuse_writes.get(topic)
        if refused is not None:  # the broker says no (e.g. not authorized): nothing written
            if report is not None:
                report(refused, -1, -1)
            return 0
        partition = partition_for((key or b"").decode(), self.log.partitions_of(topic))
        offset = self.log.append(topic, key, value, partition, headers=headers)
        faults = self.log.plain_faults
        if may_duplicate and faults is not None and topic in faults.topics and faults.p_duplicate \
                and faults.rng.random() < faults.p_duplicate:
            faults.duplicated += 1
            self.log.append(topic, key, value, partition, headers=headers)  # a retry whose first send did land
        self.sent += 1
        if report is not None:
            report(None, partition, offset)
        return 1

    def poll(self, timeout_s: float) -> int:
        return self._deliver()

    def flush(self, timeout_s: float) -> int:
        if self.log.is_cut(self.log.cut_writes_until_ms, self.client_id):
            return self.pending()  # timed out: nothing answered
        self._deliver()
        held, self._held = self._held, []
        for item in held:  # a flush waits for every record
            self._write(item, may_duplicate=False)
        return 0

    def pending(self) -> int:
        return len(self._queue) + len(self._held)
