"""Warm standbys: local copies of the partitions this processor does not own.

Each processor tails the changelogs (gnomon.jobs, gnomon.runs) of every partition it does
not own into that partition's RocksDB store, as Kafka Streams' standby replicas do. When
a rebalance hands it one of them (another processor died or left), it only has to read
the changelog from where its copy stands instead of rebuilding from the start; when a
partition is taken from it cleanly, its store stays open as a standby.

The copy is built only from committed changelog records (``read_committed``), applied in
offset order with the same ``PartitionTask.restore_*`` as a restore, so a promoted
standby is exactly a checkpointed store: the owner's tail restore finishes the job.

The work is bounded per call (``poll``): records and time, so tailing never delays the
processor's own partitions. Positions are next offsets to apply, per changelog topic.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from gnomon.adapters.kafka import consumer_config
from gnomon.core.errors import GnomonError
from gnomon.streams.task import PartitionTask

log = logging.getLogger("gnomon.processor.standby")

# open_store(partition) -> (task on the partition's store, changelog positions it holds or None: empty store)
OpenStore = Callable[[int], tuple[PartitionTask, dict[str, int] | None]]


@dataclass
class _Copy:
    task: PartitionTask
    positions: dict[str, int]  # changelog topic -> next offset to apply
    from_scratch: bool  # started on an empty store (offset 0)
    applied: int = 0


class StandbySet:
    def __init__(self, bootstrap: str, topics: tuple[str, str], open_store: OpenStore, *,
                 records_per_poll_max: int = 2_000, poll_budget_ms: int = 25) -> None:
        self.topics = topics  # (jobs changelog, runs changelog)
        self.open_store = open_store
        self.records_per_poll_max = records_per_poll_max
        self.poll_budget_ms = poll_budget_ms
        self.copies: dict[int, _Copy] = {}
        self._consumer = Consumer(consumer_config(bootstrap, "gnomon-standby", **{
            "enable.auto.commit": False, "enable.partition.eof": False, "fetch.wait.max.ms": 50}))
        self._assigned: set[int] = set()

    # ---- which partitions ----------------------------------------------------------------

    def track(self, wanted: set[int]) -> None:
        """Keep copies of exactly ``wanted`` (the partitions this processor does not own)."""
        for p in sorted(set(self.copies) - wanted):
            copy = self.copies.pop(p)
            copy.task.kv.close()
        for p in sorted(wanted - set(self.copies)):
            task, positions = self.open_store(p)
            self.copies[p] = _Copy(task, dict(positions or dict.fromkeys(self.topics, 0)), positions is None)
            log.info("standby for partition %d from %s", p, positions or "the beginning")
        self._reassign()

    def adopt(self, partition: int, task: PartitionTask, positions: dict[str, int]) -> None:
        """A partition taken from us cleanly: its store, current to ``positions``, stays warm."""
        old = self.copies.pop(partition, None)
        if old is not None:
            old.task.kv.close()
        self.copies[partition] = _Copy(task, dict(positions), from_scratch=False)
        self._reassign(force=True)

    def promote(self, partition: int) -> tuple[PartitionTask, dict[str, int]] | None:
        """Hand over the copy of ``partition`` (it is ours now) with the positions it holds.
        None: no copy, or one that has read nothing yet (a full rebuild is faster)."""
        copy = self.copies.pop(partition, None)
        if copy is None:
            return None
        self._reassign()
        if copy.from_scratch and copy.applied == 0:
            copy.task.kv.close()
            return None
        return copy.task, copy.positions

    def positions(self) -> dict[int, dict[str, int]]:
        """The changelog positions each copy holds (copies that have read nothing: left out)."""
        return {p: dict(c.positions) for p, c in self.copies.items() if not (c.from_scratch and c.applied == 0)}

    def _reassign(self, force: bool = False) -> None:
        if set(self.copies) == self._assigned and not force:
            return
        tps = [TopicPartition(t, p, copy.positions[t] or OFFSET_BEGINNING)
               for p, copy in sorted(self.copies.items()) for t in self.topics]
        try:
            self._consumer.assign(tps)
        except KafkaException as exc:
            log.warning("standby assignment failed (%s); will retry", exc)
            return
        self._assigned = set(self.copies)

    # ---- tailing -------------------------------------------------------------------------

    def poll(self) -> int:
        """Apply what the changelogs have for our copies, within the per-call budget."""
        if not self.copies:
            return 0
        self._reassign()
        deadline = time.monotonic() + self.poll_budget_ms / 1000
        n = 0
        while n < self.records_per_poll_max and time.monotonic() < deadline:
            try:
                msgs = self._consumer.consume(min(500, self.records_per_poll_max - n), 0)
            except KafkaException as exc:
                log.warning("standby consume failed: %s", exc)
                return n
            if not msgs:
                break
            for msg in msgs:
                n += self._apply(msg)
        return n

    def _apply(self, msg: object) -> int:
        err = msg.error()  # type: ignore[attr-defined]
        if err is not None:
            if err.code() != KafkaError._PARTITION_EOF:
                log.warning("standby consume error: %s", err)
            return 0
        topic, partition, offset = msg.topic(), msg.partition(), msg.offset()  # type: ignore[attr-defined]
        copy = self.copies.get(partition)
        if copy is None or offset < copy.positions[topic]:
            return 0  # promoted meanwhile, or a record the copy already holds
        key = (msg.key() or b"").decode()  # type: ignore[attr-defined]
        try:
            if topic == self.topics[0]:
                copy.task.restore_job(key, msg.value())  # type: ignore[attr-defined]
            else:
                copy.task.restore_run(key, msg.value())  # type: ignore[attr-defined]
        except GnomonError as exc:
            log.error("standby %s[%d]@%d undecodable, skipped: %s", topic, partition, offset, exc)
        copy.positions[topic] = offset + 1
        copy.applied += 1
        return 1

    def close(self) -> None:
        for copy in self.copies.values():
            copy.task.kv.close()
        self.copies.clear()
        try:
            self._consumer.close()
        except (KafkaException, RuntimeError) as exc:
            log.debug("standby consumer close: %s", exc)
