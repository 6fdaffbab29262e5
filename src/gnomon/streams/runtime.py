"""The processor runtime on confluent-kafka's transactional API.

One loop per process: consume a batch from the co-partitioned input topics, apply each
record to its partition's ``PartitionTask`` (the pure core plus RocksDB state), run the
partitions' ticks, then produce every output, the changelog records and the consumed
offsets in ONE Kafka transaction. A zombie that lost its partitions cannot commit:
``send_offsets_to_transaction`` carries the consumer group generation (KIP-447), so the
broker refuses it. Why not Faust: docs/adr/0001-stack.md.

State is restored from the compacted changelogs (gnomon.jobs, gnomon.runs) when a
partition is assigned, and after an aborted transaction.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from gnomon import codec
from gnomon.adapters.kafka import consumer_config, kafka_role, producer_config
from gnomon.adapters.kv import RocksKV
from gnomon.core import jobs as J
from gnomon.core import runs as R
from gnomon.core.clock import Clock, SystemClock
from gnomon.core.errors import EventLogError, GnomonError
from gnomon.core.messages import PoisonRecord
from gnomon.core.priorities import WeightedPicker
from gnomon.core.quota import QuotaBook
from gnomon.core.tenants import TenantBook
from gnomon.core.workers import WorkerDirectory
from gnomon.streams.adverts import AdvertFeed
from gnomon.streams.history_mark import HistoryWatermark
from gnomon.streams.standby import StandbySet
from gnomon.streams.task import Output, PartitionTask
from gnomon.streams.tenant_feed import TenantFeed
from gnomon.streams.usage import UsagePublisher
from gnomon.streams.waiting import assign_waiting
from gnomon.topology import Topology, load_topology

log = logging.getLogger("gnomon.processor")

GROUP_ID = "gnomon-processor"
ROLE = "processor"  # Kafka principal User:processor (ACLs: gnomon.infra.acls)
_WRITTEN_AT = "written_at_ms"  # checkpoint file: when it was written (processor clock)


@dataclass(frozen=True)
class ProcessorConfig:
    bootstrap: str
    state_dir: Path
    instance_id: str = field(default_factory=lambda: f"{socket.gethostname()}")
    batch_max: int = 500
    poll_timeout_s: float = 0.05
    tick_interval_ms: int = 200
    restore_timeout_s: float = 120.0
    transaction_timeout_ms: int = 5_000  # a killed processor's open transaction blocks its partitions this long
    session_timeout_ms: int = 3_000  # a killed processor is noticed after this (the broker allows >= 1 s)
    producer_rebuilds_max: int = 20  # fatal producer errors survived before the process exits
    # A local checkpoint older than this is not trusted (full rebuild instead): a restore
    # from it could miss tombstones the log cleaner removed (delete.retention.ms, 1 h).
    checkpoint_max_age_ms: int = 1_800_000
    # keep warm copies of the partitions other processors own (docs/adr/0005): a takeover
    # reads only the changelog tail. Costs a second apply of every changelog record.
    standbys: bool = True
    sched: J.SchedulerConfig = field(default_factory=J.SchedulerConfig)
    runs: R.RunConfig = field(default_factory=R.RunConfig)


class Processor:
    def __init__(self, cfg: ProcessorConfig, clock: Clock | None = None, topology: Topology | None = None) -> None:
        self.cfg = cfg
        self.clock = clock or SystemClock()
        self.topo = topology or load_topology()
        self.tasks: dict[int, PartitionTask] = {}
        self._pickers: dict[str, WeightedPicker] = {}  # pool -> its priority tiers' round-robin state
        self.inputs = [self.topo.job_commands, self.topo.run_events]
        self._stop = threading.Event()
        self._last_tick_ms = 0
        self._clean = True  # False while local state may hold writes not yet committed
        self._read_ts: dict[int, int] = {}  # run-events partition -> timestamp of the last record read
        self.poisoned = 0
        self.transactions = 0
        self.consumer = Consumer(
            consumer_config(
                cfg.bootstrap, GROUP_ID, role=ROLE,
                **{"partition.assignment.strategy": "range", "client.id": f"proc-{cfg.instance_id}",
                   # a killed processor's partitions move after session_timeout_ms (infra sets
                   # the broker's group.min.session.timeout.ms to 1 s; Kafka's default is 6 s)
                   "session.timeout.ms": cfg.session_timeout_ms,
                   "heartbeat.interval.ms": max(100, cfg.session_timeout_ms // 3)},
            )
        )
        self._fatal_count = 0
        self.producer = self._new_producer()
        self.directory = WorkerDirectory()
        self.adverts: AdvertFeed | None = None
        # tenants' limits (gnomon.tenants) and this instance's counts against them (ADR 0008)
        self.tenants = TenantBook()
        self.quota = QuotaBook(self.tenants, self.topo.partitions)
        self.tenant_feed: TenantFeed | None = None
        self.usage = UsagePublisher(self.topo, self.quota)
        self.history: HistoryWatermark | None = None
        self.standbys: StandbySet | None = None
        self._saturated = False  # the last batch was full: input is waiting
        self._joined = False  # the group gave this processor its first assignment
        if cfg.standbys:
            with kafka_role(ROLE):
                self.standbys = StandbySet(cfg.bootstrap, (self.topo.jobs, self.topo.runs),
                                           lambda p: self._open_store(p), self.clock,
                                           max_age_ms=cfg.checkpoint_max_age_ms)

    def _new_producer(self) -> Producer:
        return Producer(
            producer_config(
                self.cfg.bootstrap,
                role=ROLE,
                **{
                    "transactional.id": f"gnomon-processor-{self.cfg.instance_id}",
                    "transaction.timeout.ms": self.cfg.transaction_timeout_ms,
                    "message.timeout.ms": self.cfg.transaction_timeout_ms,
                    "client.id": f"proc-{self.cfg.instance_id}",
                },
            )
        )

    # ---- lifecycle ---------------------------------------------------------------------

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        try:
            self.producer.init_transactions(30)
        except KafkaException as exc:
            raise EventLogError(f"cannot initialise Kafka transactions: {exc}") from exc
        with kafka_role(ROLE):
            self.adverts = AdvertFeed(self.cfg.bootstrap, self.topo.workers, self.directory, self.clock)
            self.history = HistoryWatermark(self.cfg.bootstrap, self.topo.runs, self.clock)
            self.tenant_feed = TenantFeed(self.cfg.bootstrap, self.topo, self.tenants, None, self.clock, role=ROLE)
        self.tenant_feed.load(30)
        self.adverts.poll()
        self.consumer.subscribe(self.inputs, on_assign=self._on_assign, on_revoke=self._on_revoke,
                                on_lost=self._on_lost)
        log.info("processor %s started; inputs %s", self.cfg.instance_id, self.inputs)
        last_report = time.monotonic()
        try:
            while not self._stop.is_set():
                self.step()
                if time.monotonic() - last_report > 10:
                    last_report = time.monotonic()
                    free = self.directory.snapshot(self.clock.now_ms())
                    log.info("partitions=%s standbys=%s txns=%d poisoned=%d workers=%d free_slots=%d purged=%d "
                             "state=%s", sorted(self.tasks),
                             self.standbys.lag() if self.standbys is not None else "off",
                             self.transactions, self.poisoned, len(free),
                             sum(max(0, f) for f in free.values()),
                             sum(t.stats.purged for t in self.tasks.values()), self._state_sizes())
        finally:
            self._close()

    def _state_sizes(self) -> str:
        """Per partition: keys and bytes of its state store (RocksDB estimates)."""
        parts = []
        for p, task in sorted(self.tasks.items()):
            try:
                keys, size = task.kv.size()
            except GnomonError:
                continue
            parts.append(f"p{p}:{keys}keys/{size // 1024}KiB")
        return " ".join(parts) or "-"

    def _close(self) -> None:
        for p in list(self.tasks):
            self._release(p)  # clean stop: checkpoint, so a restart only replays the tail
        if self.standbys is not None:
            checkpoints = self.standbys.checkpoints()
            self.standbys.close()
            for p, (pos, current_at) in checkpoints.items():
                self._write_checkpoint(p, pos, current_at)  # warm copies stay warm across a restart
        with contextlib.suppress(Exception):  # closing is best-effort
            self.consumer.close()
        if self.adverts is not None:
            self.adverts.close()
        if self.history is not None:
            self.history.close()
        if self.tenant_feed is not None:
            self.tenant_feed.close()

    # ---- rebalance -----------------------------------------------------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        wanted = sorted({tp.partition for tp in partitions})
        self._joined = True
        log.info("assigned partitions %s; restoring state", wanted)
        for p in wanted:
            self._read_ts.pop(p, None)
            if self.history is not None:
                self.history.forget(p)  # samples from an earlier ownership say nothing of what others wrote
            if p not in self.tasks:
                self.tasks[p] = self._restore(p)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        gone = sorted({tp.partition for tp in partitions})
        log.info("revoked partitions %s", gone)
        for p in gone:
            self._release(p)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Lost, not revoked (our session expired): another instance may already own and
        write these partitions, so no checkpoint: the next open rebuilds."""
        gone = sorted({tp.partition for tp in partitions})
        log.warning("lost partitions %s", gone)
        for p in gone:
            self._release(p, checkpoint=False)

    # ---- state restore and checkpoints ---------------------------------------------------
    #
    # Like Kafka Streams under exactly-once: a partition's RocksDB is trusted only if it was
    # closed cleanly (revoke or graceful stop) right after a commit, which writes a
    # checkpoint with the changelog end offsets. Opening consumes the checkpoint (deletes
    # it), so after a crash (kill -9, a failed commit) the state is rebuilt from the start
    # of the compacted changelogs instead.

    def _state_path(self, partition: int) -> Path:
        return self.cfg.state_dir / "processor" / self.cfg.instance_id / f"p{partition:03d}"

    def _release(self, partition: int, *, checkpoint: bool = True) -> None:
        """Give up an owned partition. Clean (revoked, stopping, after a commit): its store
        stays warm as a standby, or is checkpointed to disk. Otherwise it is dropped."""
        task = self.tasks.pop(partition, None)
        self.quota.close(partition)
        self.usage.forget(partition)
        if task is None:
            return
        if checkpoint and not self._clean:
            log.warning("partition %d closed with uncommitted local writes; next open rebuilds it", partition)
            checkpoint = False
        ends: dict[str, int] | None = None
        if checkpoint:
            try:
                ends = {t: read_end_offset(self.cfg.bootstrap, t, partition, role=ROLE) for t in (self.topo.jobs, self.topo.runs)}
            except EventLogError as exc:
                log.warning("no checkpoint for partition %d (%s); next open rebuilds it", partition, exc)
        if ends is not None and self.standbys is not None:
            self.standbys.adopt(partition, task, ends)
            return
        task.kv.close()
        if ends is not None:
            self._write_checkpoint(partition, ends, self.clock.now_ms())

    def _write_checkpoint(self, partition: int, positions: dict[str, int], current_at_ms: int) -> None:
        """The partition's (closed) store held the changelogs up to ``positions`` at
        ``current_at_ms`` (its age decides whether it is trusted later)."""
        try:
            ckpt = self._state_path(partition).with_suffix(".checkpoint")
            tmp = ckpt.with_suffix(".tmp")
            tmp.write_text(json.dumps({**positions, _WRITTEN_AT: current_at_ms}))
            tmp.replace(ckpt)
        except OSError as exc:
            log.warning("no checkpoint for partition %d (%s); next open rebuilds it", partition, exc)

    def _open_store(self, partition: int, *, trust_checkpoint: bool = True,
                    ) -> tuple[PartitionTask, dict[str, int] | None, int | None]:
        """The partition's store and the changelog positions it holds, from its checkpoint
        (consumed: a crash before the next clean close means a rebuild). None: an empty
        store (no checkpoint, an untrusted or a too old one)."""
        path = self._state_path(partition)
        ckpt_file = path.with_suffix(".checkpoint")
        ckpt: dict[str, int] | None = None
        if ckpt_file.exists():
            with contextlib.suppress(OSError, ValueError):
                ckpt = json.loads(ckpt_file.read_text()) if trust_checkpoint and path.is_dir() else None
            ckpt_file.unlink(missing_ok=True)
            age_ms = self.clock.now_ms() - int((ckpt or {}).get(_WRITTEN_AT, 0))
            if ckpt is not None and age_ms > self.cfg.checkpoint_max_age_ms:
                log.info("partition %d checkpoint is %d s old (tombstones may be gone); full rebuild",
                         partition, age_ms // 1000)
                ckpt = None
        if ckpt is not None and not {self.topo.jobs, self.topo.runs} <= set(ckpt):
            ckpt = None
        task = PartitionTask(partition, RocksKV(path, fresh=ckpt is None), self.topo, self.cfg.sched, self.cfg.runs,
                             directory=self.directory, quota=self.quota)
        if ckpt is None:
            return task, None, None
        return task, {t: int(ckpt[t]) for t in (self.topo.jobs, self.topo.runs)}, int(ckpt.get(_WRITTEN_AT, 0))

    def _restore(self, partition: int, *, trust_checkpoint: bool = True) -> PartitionTask:
        started = time.monotonic()
        self.quota.close(partition)  # counted again from the restored state, below
        self.usage.forget(partition)
        promoted = self.standbys.promote(partition) if self.standbys is not None and trust_checkpoint else None
        if promoted is not None:
            task, ckpt = promoted
            source = "from a warm standby"
        else:
            task, ckpt, _ = self._open_store(partition, trust_checkpoint=trust_checkpoint)
            source = "full rebuild" if ckpt is None else "from checkpoint"
        n = 0
        if ckpt is None:  # full rebuild: keep the last value per key, then load once
            latest: dict[str, dict[str, bytes | None]] = {self.topo.jobs: {}, self.topo.runs: {}}
            for topic, table in latest.items():
                for msg in read_partition_to_end(self.cfg.bootstrap, topic, partition, self.cfg.restore_timeout_s,
                                                 role=ROLE):
                    table[msg.key().decode() if msg.key() else ""] = msg.value()
                    n += 1
            try:
                task.bulk_load(latest[self.topo.jobs], latest[self.topo.runs])
            except GnomonError as exc:
                raise EventLogError(f"changelog of partition {partition} holds an undecodable record: {exc}") from exc
        else:  # the tail after a clean close or a standby's position: the last value per key
            for topic, apply in ((self.topo.jobs, task.restore_job), (self.topo.runs, task.restore_run)):
                tail: dict[str, bytes | None] = {}
                for msg in read_partition_to_end(self.cfg.bootstrap, topic, partition, self.cfg.restore_timeout_s,
                                                 ckpt[topic], role=ROLE):
                    tail[msg.key().decode() if msg.key() else ""] = msg.value()
                    n += 1
                for key, value in tail.items():
                    try:
                        apply(key, value)
                    except GnomonError as exc:
                        log.error("changelog %s[%d] key %s undecodable, skipped: %s", topic, partition, key, exc)
        counted = task.load_counts()
        log.info("partition %d restored: %d records in %.2fs (%s); %d tenant counting entries", partition, n,
                 time.monotonic() - started, source, counted)
        return task

    # ---- one step --------------------------------------------------------------------------

    def step(self) -> None:
        if self.history is not None:
            self.history.poll(self.tasks)  # between transactions: everything before now is committed
        if self.standbys is not None and self._joined:  # (before the first assignment every partition looks free)
            self.standbys.track(set(range(self.topo.partitions)) - set(self.tasks))
            if not self._saturated:
                self.standbys.poll()  # our own partitions first: standbys get the spare time
        msgs = self.consumer.consume(self.cfg.batch_max, self.cfg.poll_timeout_s)
        self._saturated = len(msgs) >= self.cfg.batch_max
        now = self.clock.now_ms()
        due_tick = now - self._last_tick_ms >= self.cfg.tick_interval_ms
        if not msgs and not due_tick:
            return
        outputs: list[Output] = []
        offsets: dict[tuple[str, int], int] = {}
        self._clean = False
        for msg in msgs:
            if msg.error():
                if msg.error().code() != KafkaError._PARTITION_EOF:
                    log.warning("consume error: %s", msg.error())
                continue
            offsets[(msg.topic(), msg.partition())] = msg.offset() + 1
            if msg.topic() == self.topo.run_events:
                self._read_ts[msg.partition()] = msg.timestamp()[1]
            outputs.extend(self._apply(msg, now))
        if self.adverts is not None:
            self.adverts.poll()
        if self.tenant_feed is not None:
            self.tenant_feed.poll()
        if due_tick:
            self._last_tick_ms = now
            for worker in self.directory.lost(now):
                log.warning("worker %s lost (no advert); moving its staged runs", worker)
                for task in list(self.tasks.values()):
                    outputs.extend(task.worker_lost(worker, now))
            behind = self._behind()
            for p, task in list(self.tasks.items()):
                # a partition with unread run events judges leases by how far it has read
                outputs.extend(task.tick(now, self._read_ts.get(p, 0) if p in behind else None,
                                         self.history.until_ms(p) if self.history is not None else None,
                                         assign_waiting=False))
            # waiting runs take free slots across all partitions, in the weighted mix
            outputs.extend(assign_waiting(list(self.tasks.values()), now, self._pickers))
            outputs.extend(self.usage.changes(sorted(self.tasks), now))
        if outputs or offsets:
            self._commit(outputs, offsets)
        self._clean = True

    def _behind(self) -> set[int]:
        """Partitions of run-events with unread records (cached high watermark and local
        position: no broker round trip)."""
        tps = [TopicPartition(self.topo.run_events, p) for p in self.tasks]
        behind = set()
        try:
            positions = self.consumer.position(tps)
        except KafkaException:
            return set(self.tasks)  # unknown: be conservative, expire nothing
        for tp in positions:
            try:
                _, high = self.consumer.get_watermark_offsets(tp, cached=True)
            except KafkaException:
                behind.add(tp.partition)
                continue
            if tp.offset < 0 or high < 0 or high > tp.offset:
                behind.add(tp.partition)
        return behind

    def _apply(self, msg: Message, now: int) -> list[Output]:
        task = self.tasks.get(msg.partition())
        if task is None:  # revoked between fetch and apply
            return []
        try:
            cmd = codec.decode(msg.value() or b"")
            return task.handle(cmd, now, msg.topic())
        except GnomonError as exc:
            self.poisoned += 1
            log.warning("poison %s[%d]@%d: %s", msg.topic(), msg.partition(), msg.offset(), exc)
            rec = PoisonRecord(msg.topic(), msg.partition(), msg.offset(), f"{type(exc).__name__}: {exc}",
                               msg.key(), msg.value(), now)
            return [Output(self.topo.poison, msg.topic(), rec)]

    def _commit(self, outputs: Iterable[Output], offsets: dict[tuple[str, int], int]) -> None:
        """One transaction: outputs + changelogs + consumed offsets. Error handling follows
        the transactional producer's contract: retriable errors retry the same call,
        abortable ones abort and rewind state and positions to the last commit, fatal ones
        (e.g. a coordinator lost mid-commit) rebuild the producer and rewind."""
        try:
            self._txn(self.producer.begin_transaction)
            for o in outputs:
                value = o.encoded if o.encoded is not None else (
                    None if o.value is None else codec.encode(o.value, o.topic))
                kwargs: dict[str, Any] = {"key": o.key.encode(), "value": value}
                if o.partition is not None:
                    kwargs["partition"] = o.partition
                self._produce(o.topic, kwargs)
            tps = [TopicPartition(t, p, off) for (t, p), off in offsets.items()]
            if not tps:
                # a tick-only transaction still carries the group generation for fencing
                tps = [tp for tp in self.consumer.position(self.consumer.assignment()) if tp.offset >= 0]
            if tps:
                meta = self.consumer.consumer_group_metadata()
                self._txn(lambda: self.producer.send_offsets_to_transaction(tps, meta, 30))
            self._txn(lambda: self.producer.commit_transaction(30))
            self.transactions += 1
            self._fatal_count = 0
        except KafkaException as exc:
            err = exc.args[0]
            if err.fatal():
                self._fatal(err)
                return
            log.warning("transaction failed (%s); aborting and restoring state", err)
            try:
                self._txn(lambda: self.producer.abort_transaction(30))
            except KafkaException as exc2:
                self._fatal(exc2.args[0])
                return
            self._rewind()

    def _txn(self, call: Any, attempts: int = 8) -> Any:
        """Run one transactional call, retrying while the error says it is retriable."""
        for attempt in range(attempts):
            try:
                return call()
            except KafkaException as exc:
                err = exc.args[0]
                if not err.retriable() or err.fatal() or attempt == attempts - 1:
                    raise
                log.info("transactional call retriable error (%s); retry %d", err, attempt + 1)
                time.sleep(min(2.0, 0.1 * 2**attempt))
        raise AssertionError("unreachable")

    def _fatal(self, err: KafkaError) -> None:
        """The producer is unusable: build a new one (same transactional id, which also
        aborts whatever the old one left open) and rewind. Bounded: too many in a row exit."""
        self._fatal_count += 1
        log.error("fatal transactional producer error (%s); rebuilding the producer (%d)", err, self._fatal_count)
        if self._fatal_count > self.cfg.producer_rebuilds_max:
            self._stop.set()
            raise EventLogError(f"processor gave up after {self._fatal_count} fatal Kafka errors: {err}")
        with contextlib.suppress(Exception):
            self.producer.flush(1)
        self.producer = self._new_producer()
        self._txn(lambda: self.producer.init_transactions(30))
        self._rewind()

    def _produce(self, topic: str, kwargs: dict[str, Any]) -> None:
        while True:
            try:
                self.producer.produce(topic, **kwargs)
                return
            except BufferError:
                self.producer.poll(0.05)

    def _rewind(self) -> None:
        """After an abort: state and positions go back to the last commit."""
        assignment = self.consumer.assignment()
        committed = self.consumer.committed(assignment, 30)
        for p in list(self.tasks):
            self.tasks[p].kv.close()
            self.tasks[p] = self._restore(p, trust_checkpoint=False)
        for tp in committed:
            if tp.offset >= 0:
                self.consumer.seek(tp)
            else:
                self.consumer.seek(TopicPartition(tp.topic, tp.partition, 0))


def read_end_offset(bootstrap: str, topic: str, partition: int, *, role: str | None = None) -> int:
    c = Consumer(consumer_config(bootstrap, "gnomon-restore", role=role))
    try:
        return int(c.get_watermark_offsets(TopicPartition(topic, partition), 10)[1])
    except KafkaException as exc:
        raise EventLogError(f"cannot read the end offset of {topic}[{partition}]: {exc}") from exc
    finally:
        c.close()


def read_partition_to_end(bootstrap: str, topic: str, partition: int, timeout_s: float,
                          start: int | None = None, *, role: str | None = None) -> Iterable[Message]:
    """Every committed record of one partition, from ``start`` (default: the beginning)
    to the current end."""
    c = Consumer(consumer_config(bootstrap, "gnomon-restore", role=role,
                                 **{"enable.partition.eof": True, "fetch.wait.max.ms": 10}))
    try:
        low, high = c.get_watermark_offsets(TopicPartition(topic, partition), 10)
        low = max(low, start) if start is not None else low
        if high <= low:
            return
        c.assign([TopicPartition(topic, partition, low)])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            batch = c.consume(5000, 0.05)
            if not batch:
                pos = c.position([TopicPartition(topic, partition)])[0].offset
                if pos >= high:
                    return
                continue
            for msg in batch:
                if msg.error():
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        return
                    raise EventLogError(f"restoring {topic}[{partition}]: {msg.error()}")
                yield msg
                if msg.offset() + 1 >= high:
                    return
        raise EventLogError(f"restoring {topic}[{partition}] did not reach offset {high} in {timeout_s}s")
    finally:
        c.close()
