"""Warm standbys: local copies of the partitions this processor does not own.

Each processor tails the changelogs (gnomon.jobs, gnomon.runs) of every partition it does
not own into that partition's RocksDB store, as Kafka Streams' standby replicas do. When
a rebalance hands it one of them (another processor died or left), it only has to read
the changelog from where its copy stands instead of rebuilding from the start; when a
partition is taken from it cleanly, its store stays open as a standby.

A copy is built from committed changelog records only (``read_committed``):

* **Building** (an empty store): records are buffered, last value per key, up to the end
  offsets seen when the copy was opened, then loaded at once with ``bulk_load`` (as a
  full rebuild does, one partition per call).
* **Tailing** (warm): records are buffered per key and applied with the same
  ``PartitionTask.restore_*`` as a restore, within a time budget per call. A run
  changes state several times within seconds, so buffering per key saves most applies.

``positions`` are the changelog offsets the store is consistent with: the oldest
unapplied change, or the consumed offsets when the buffer is empty. A store may hold some records beyond its
positions (applied from the buffer); a tail restore from the positions re-applies them,
last value per key, so a promoted copy is exactly a checkpointed store.

A copy is only as good as the tombstones still on the log after its positions: the
cleaner removes them ``delete.retention.ms`` (1 h) after they are cleaned. So each copy
knows since when it may be missing records (``fresh_ms``: the time of its oldest
unapplied change, or of the last record it read, or when it was adopted), and a copy
older than ``max_age_ms`` is neither promoted nor checkpointed as fresh: the new owner
rebuilds in full instead.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gnomon.core.clock import Clock
from gnomon.core.errors import EventLogError, GnomonError, StateStoreError
from gnomon.eventlog.port import OFFSET_BEGINNING, EventLog, Reader, Record
from gnomon.processor.task import PartitionTask

log = logging.getLogger("gnomon.processor.standby")

# open_store(partition) -> (task on the partition's store, changelog positions it holds or None (an empty
# store), when those positions were current (ms))
OpenStore = Callable[[int], tuple[PartitionTask, dict[str, int] | None, int | None]]


@dataclass
class _Copy:
    task: PartitionTask
    positions: dict[str, int]  # the store is consistent with the changelogs up to these offsets
    consumed: dict[str, int]  # next offset read (buffered or applied)
    building_until: dict[str, int] | None  # set: an empty store, loaded in bulk once these ends are read
    current_at_ms: int  # the store held every record up to its positions at this time (adopted, checkpoint)
    # topic -> key -> (offset, record time, value) of its last change not applied yet, oldest change first
    pending: dict[str, dict[str, tuple[int, int, bytes | None]]] = field(default_factory=dict)
    last_read_ms: int = 0  # time of the last record read
    paused: bool = False

    @property
    def warm(self) -> bool:
        return self.building_until is None

    def buffered(self) -> int:
        return sum(len(keys) for keys in self.pending.values())

    def fresh_ms(self) -> int:
        """Records written after this time are all still after its positions, unread or
        buffered: no tombstone it lacks can have been cleaned away before then."""
        oldest = [next(iter(keys.values()))[1] for keys in self.pending.values() if keys]
        if oldest:
            return min(oldest)
        return max(self.current_at_ms, self.last_read_ms)

    def settle_positions(self) -> None:
        """Records below the oldest unapplied change of a topic are all in the store (or
        superseded by a buffered one, which a tail restore from there re-applies)."""
        for t in self.consumed:
            keys = self.pending.get(t)
            self.positions[t] = next(iter(keys.values()))[0] if keys else self.consumed[t]


class StandbySet:
    def __init__(self, log: EventLog | None, topics: tuple[str, str], open_store: OpenStore, clock: Clock, *,
                 max_age_ms: int = 1_800_000,
                 records_per_poll_max: int = 5_000, poll_budget_ms: int = 25, pending_max: int = 200_000,
                 applies_per_poll_max: int = 100_000, timeout_s: float = 5.0, reader: Reader | None = None,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        """``log``: where the changelogs are (or ``reader``, a reader on them); ``monotonic``
        bounds the work per ``poll`` (``poll_budget_ms``)."""
        self.topics = topics  # (jobs changelog, runs changelog)
        self.open_store = open_store
        self.clock = clock
        self.max_age_ms = max_age_ms  # a copy whose fresh_ms is older is not trusted (tombstones may be gone)
        self.broken: set[int] = set()  # partitions whose changelog a copy cannot load: not tracked again
        self.records_per_poll_max = records_per_poll_max
        self.poll_budget_ms = poll_budget_ms
        self.pending_max = pending_max  # buffered keys per copy; reading pauses beyond it
        self.applies_per_poll_max = applies_per_poll_max
        self.timeout_s = timeout_s
        self.monotonic = monotonic
        self.copies: dict[int, _Copy] = {}
        if reader is None:
            assert log is not None, "a standby set needs an event log or a reader"
            reader = log.reader("gnomon-standby", config={
                "enable.auto.commit": False, "enable.partition.eof": False, "fetch.wait.max.ms": 50})
        self._consumer: Reader = reader
        self._assigned: set[int] = set()

    # ---- which partitions ----------------------------------------------------------------

    def track(self, wanted: set[int]) -> None:
        """Keep copies of exactly ``wanted`` (the partitions this processor does not own)."""
        for p in sorted(set(self.copies) - wanted):
            self.copies.pop(p).task.kv.close()
        for p in sorted(wanted - set(self.copies) - self.broken):
            task, positions, current_at = self.open_store(p)
            if positions is not None:
                self.copies[p] = _Copy(task, dict(positions), dict(positions), None, current_at or 0)
                log.info("standby for partition %d from its checkpoint %s", p, positions)
                continue
            try:
                ends = {t: self._consumer.watermarks((t, p), self.timeout_s)[1] for t in self.topics}
            except EventLogError as exc:
                task.kv.close()
                log.warning("standby for partition %d not started (%s); will retry", p, exc)
                continue
            start = dict.fromkeys(self.topics, 0)
            # once built, its store holds every record up to those ends, read now (an empty
            # partition's copy is never marked current later: librdkafka gives no position
            # where nothing was fetched, and a copy of time 0 was never promoted)
            self.copies[p] = _Copy(task, dict(start), dict(start), ends, self.clock.now_ms())
            log.info("standby for partition %d: building from the changelogs up to %s", p, ends)
        self._reassign()

    def adopt(self, partition: int, task: PartitionTask, positions: dict[str, int]) -> None:
        """A partition taken from us cleanly: its store, current to ``positions``, stays warm."""
        old = self.copies.pop(partition, None)
        if old is not None:
            old.task.kv.close()
        self.copies[partition] = _Copy(task, dict(positions), dict(positions), None, self.clock.now_ms())
        self._reassign(force=True)

    def promote(self, partition: int) -> tuple[PartitionTask, dict[str, int]] | None:
        """Hand over the copy of ``partition`` (it is ours now) with the positions its store
        is consistent with. None: no copy, or one still being built (a full rebuild is
        as fast)."""
        copy = self.copies.pop(partition, None)
        if copy is None:
            return None
        self._reassign()
        if not copy.warm:
            copy.task.kv.close()
            return None
        age_ms = self.clock.now_ms() - copy.fresh_ms()
        if age_ms > self.max_age_ms:
            log.warning("standby for partition %d is %d s behind (tombstones may be gone); not used", partition,
                        age_ms // 1000)
            copy.task.kv.close()
            return None
        return copy.task, copy.positions  # the owner's tail restore applies what is buffered

    def checkpoints(self) -> dict[int, tuple[dict[str, int], int]]:
        """For each warm copy: the changelog positions its store is consistent with, and
        its ``fresh_ms`` (what a checkpoint of it must claim as its time)."""
        return {p: (dict(c.positions), c.fresh_ms()) for p, c in self.copies.items() if c.warm}

    def lag(self) -> dict[int, int]:
        """Buffered records not yet applied, per copy (-1: still building)."""
        return {p: c.buffered() if c.warm else -1 for p, c in self.copies.items()}

    def _reassign(self, force: bool = False) -> None:
        if set(self.copies) == self._assigned and not force:
            return
        tps = [(t, p, copy.consumed[t] or OFFSET_BEGINNING)
               for p, copy in sorted(self.copies.items()) for t in self.topics]
        try:
            self._consumer.assign(tps)
        except EventLogError as exc:
            log.warning("standby assignment failed (%s); will retry", exc)
            return
        self._assigned = set(self.copies)

    # ---- tailing -------------------------------------------------------------------------

    def poll(self) -> int:
        """Read what the changelogs have for our copies and apply some of it, within the
        per-call budget. Returns the records read."""
        if not self.copies:
            return 0
        self._reassign()
        deadline = self.monotonic() + self.poll_budget_ms / 1000
        n = 0
        self._pause_full()
        while n < self.records_per_poll_max and self.monotonic() < deadline:
            try:
                msgs = self._consumer.consume(min(1_000, self.records_per_poll_max - n), 0)
            except EventLogError as exc:
                log.warning("standby consume failed: %s", exc)
                break
            if not msgs:
                self._mark_current()
                break
            for msg in msgs:
                n += self._buffer(msg)
        self._build_one()
        self._apply(deadline)
        return n

    def _mark_current(self) -> None:
        """Nothing left to read: a copy whose positions reached the ends last fetched (and
        whose buffer is empty) is current now."""
        now = self.clock.now_ms()
        for p, copy in self.copies.items():
            if copy.pending and any(copy.pending.values()):
                continue
            try:
                read = self._consumer.position([(t, p) for t in self.topics])
                ends = [self._consumer.watermarks((t, p), cached=True)[1] for t in self.topics]
            except EventLogError:
                continue
            if all(read[(t, p)] >= 0 and read[(t, p)] >= end >= 0 for t, end in zip(self.topics, ends, strict=True)):
                copy.current_at_ms = now

    def _pause_full(self) -> None:
        """A warm copy whose buffer is full stops reading until it has applied half of it
        (a copy being built is never paused: it must reach its ends, as a rebuild does)."""
        for p, copy in self.copies.items():
            full = copy.warm and copy.buffered() >= self.pending_max
            if full != copy.paused and (full or copy.buffered() < self.pending_max // 2):
                tps = [(t, p) for t in self.topics]
                try:
                    (self._consumer.pause if full else self._consumer.resume)(tps)
                    copy.paused = full
                except EventLogError as exc:
                    log.warning("standby pause/resume of partition %d failed: %s", p, exc)

    def _buffer(self, msg: Record) -> int:
        topic, partition, offset = msg.topic, msg.partition, msg.offset
        copy = self.copies.get(partition)
        if copy is None or offset < copy.consumed[topic]:
            return 0  # promoted meanwhile, or a record the copy already holds
        keys = copy.pending.setdefault(topic, {})
        key = (msg.key or b"").decode()
        keys.pop(key, None)  # keep the buffer in order of last change
        ts = msg.timestamp_ms
        keys[key] = (offset, ts, msg.value)
        copy.consumed[topic] = offset + 1
        copy.last_read_ms = max(copy.last_read_ms, ts)
        return 1

    def _build_one(self) -> None:
        """Load one copy whose build has read up to its target ends (a bulk load)."""
        for p, copy in self.copies.items():
            ends = copy.building_until
            if ends is None:
                continue
            # the consumer's position moves past commit markers and aborted records, which
            # are never delivered: the end of a transactional changelog is one of those
            try:
                read = {t: off for (t, _), off in self._consumer.position([(t, p) for t in self.topics]).items()}
            except EventLogError:
                continue
            for t in self.topics:
                copy.consumed[t] = max(copy.consumed[t], read.get(t) or 0)
            if any(copy.consumed[t] < ends[t] for t in self.topics):
                continue
            started = self.monotonic()
            jobs_t, runs_t = self.topics
            jobs = {k: v for k, (_, _, v) in copy.pending.get(jobs_t, {}).items()}
            runs = {k: v for k, (_, _, v) in copy.pending.get(runs_t, {}).items()}
            try:
                loaded = copy.task.bulk_load(jobs, runs)
            except StateStoreError:
                raise
            except GnomonError as exc:
                log.error("standby for partition %d: undecodable changelog record (%s); no standby for it "
                          "(a takeover rebuilds it, and fails as loudly)", p, exc)
                self.copies.pop(p).task.kv.close()
                self.broken.add(p)
                self._reassign()
                return
            copy.pending.clear()
            copy.positions = dict(copy.consumed)
            copy.building_until = None
            log.info("standby for partition %d built: %d live keys in %.2fs, at %s", p, loaded,
                     self.monotonic() - started, copy.positions)
            return  # one per call: a bulk load takes a while

    def _apply(self, deadline: float) -> None:
        """Apply buffered changes of warm copies, oldest first, until the deadline."""
        budget = self.applies_per_poll_max
        for copy in self.copies.values():
            if not copy.warm:
                continue
            for topic, keys in copy.pending.items():
                apply = copy.task.restore_job if topic == self.topics[0] else copy.task.restore_run
                while keys and budget > 0 and self.monotonic() < deadline:
                    key, (_, _, value) = next(iter(keys.items()))
                    del keys[key]
                    budget -= 1
                    try:
                        apply(key, value)
                    except StateStoreError:
                        raise  # the store itself failed: never skip past that
                    except GnomonError as exc:
                        log.error("standby %s[%d] key %s undecodable, skipped: %s", topic, copy.task.partition, key,
                                  exc)
            copy.settle_positions()

    def close(self) -> None:
        for copy in self.copies.values():
            copy.task.kv.close()
        self.copies.clear()
        self._consumer.close()
