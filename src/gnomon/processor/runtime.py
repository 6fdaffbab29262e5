"""The processor runtime on confluent-kafka's transactional API.

One loop per process: consume a batch from the co-partitioned input topics, apply each
record to its partition's ``PartitionTask`` (the pure core plus RocksDB state), run the
partitions' ticks, then produce every output, the changelog records and the consumed
offsets in ONE Kafka transaction. A zombie that lost its partitions cannot commit:
``send_offsets_to_transaction`` carries the consumer group generation (KIP-447), so the
broker refuses it; the records are flushed before it, so that offsets the group accepts
come with every record already in its log (``_commit``). Why not Faust:
docs/adr/0001-stack.md.

State is restored from the compacted changelogs (gnomon.jobs, gnomon.runs) when a
partition is assigned, and after an aborted transaction.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from gnomon import codec, region
from gnomon.core import jobs as J
from gnomon.core import runs as R
from gnomon.core.calendars import CalendarBook
from gnomon.core.clock import Clock, SystemClock
from gnomon.core.command_auth import (
    CommandKey,
    Keyring,
    Unauthenticated,
    sign_origin,
    verify,
    verify_origin,
)
from gnomon.core.control import ORIGIN_HEADER
from gnomon.core.errors import (
    EventLogError,
    GnomonError,
    InfraError,
    StateStoreError,
    ValidationError,
)
from gnomon.core.messages import PoisonRecord
from gnomon.core.overload import OverloadGovernor, TickBudget
from gnomon.core.priorities import WeightedPicker
from gnomon.core.quota import QuotaBook
from gnomon.core.tenants import TenantBook
from gnomon.core.workers import WorkerDirectory
from gnomon.eventlog.kafka import KafkaEventLog
from gnomon.eventlog.kafka import read_end_offset as read_end_offset
from gnomon.eventlog.kafka import read_partition_to_end as read_partition_to_end
from gnomon.eventlog.port import (
    TP,
    EventLog,
    GroupConsumer,
    Reader,
    Record,
    TransactionalProducer,
    TransactionError,
)
from gnomon.feeds.tenants import TenantFeed
from gnomon.gate import RegionGate
from gnomon.metrics.processor import ProcessorMetrics
from gnomon.ports import KeyValueStore
from gnomon.processor import growth
from gnomon.processor.adverts import AdvertFeed
from gnomon.processor.attempts import RecordAttempts
from gnomon.processor.catch_up import CatchUpGate
from gnomon.processor.history_mark import HistoryWatermark
from gnomon.processor.output import Output
from gnomon.processor.standby import StandbySet
from gnomon.processor.stores import RocksStores, StateStores
from gnomon.processor.task import PartitionTask, RecordFailed, TickPhase, tick_near
from gnomon.processor.usage import UsagePublisher
from gnomon.processor.waiting import assign_waiting
from gnomon.topology import Topology, load_topology

log = logging.getLogger("gnomon.processor")

GROUP_ID = "gnomon-processor"
ROLE = "processor"  # Kafka principal User:processor (ACLs: gnomon.infra.acls)
_WRITTEN_AT = "written_at_ms"  # checkpoint file: when it was written (processor clock)
MEMBERSHIP_CHECK_TIMEOUT_S = 5.0  # a stop's check that the group still counts it the owner
CONFIRM_WITHIN_S = 6.0  # an assignment with a region gate: how long failed reads of the regions topic are retried


# the overload governor hears no start lags for this long after a gap in this processor's
# work (a recovery, an assignment, ticks further apart than OVERLOAD_GAP_MS): core.overload
OVERLOAD_QUIET_MS = 60_000
# a command naming a calendar this processor has not read re-reads the calendars to their
# end, unless a read that began after the command was made has done so (clocks of the
# API and the processor may differ by up to the skew); at most this many reads a second
CALENDARS_CATCH_UPS_PER_S_MAX = 10
CALENDARS_CLOCK_SKEW_MS = 1_000
CALENDARS_CATCH_UP_TIMEOUT_S = 2.0
OVERLOAD_GAP_MS = 5_000
LOST_WORKERS_KEPT = 1_000  # workers found lost, remembered for partitions restored later
_GROW_KEY = growth.GROW_KEY.encode()
HANDOVER_GROUP = "gnomon-restore"  # (never joined, never committed: as the restores' readers)
HANDOVER_POLL_MS = 500  # how often a partition born in a grow asks whether its handover has come
HANDOVER_WARN_MS = 60_000  # a partition waiting longer than this for its handover is logged (once)
TXN_TIMES_KEPT = 200  # transaction durations kept for the 10 s status line
LOCAL_ROUNDS_MAX = 8  # dependency messages for owned partitions applied in process, rounds per transaction


@dataclass(frozen=True)
class ProcessorConfig:
    bootstrap: str
    state_dir: Path
    instance_id: str = field(default_factory=lambda: f"{socket.gethostname()}")
    batch_max: int = 500
    # normal/low triggers per tick across this processor's partitions, fixed (tests, the
    # simulation); None: the overload governor sets it from start lags (core.overload)
    overload_budget_per_tick: int | None = None
    poll_timeout_s: float = 0.05
    tick_interval_ms: int = 200
    restore_timeout_s: float = 120.0
    transaction_timeout_ms: int = 5_000  # a killed processor's open transaction blocks its partitions this long
    session_timeout_ms: int = 3_000  # a killed processor is noticed after this (the broker allows >= 1 s)
    producer_rebuilds_max: int = 20  # fatal producer errors survived (broker answering) before the process exits
    commit_timeout_s: float = 10.0  # one transaction (begin to commit), retriable errors retried within it
    abort_timeout_s: float = 5.0  # aborting a failed transaction; longer: the producer is rebuilt
    recover_timeout_s: float = 5.0  # one recovery attempt's Kafka calls (new producer, committed offsets)
    recover_backoff_s: float = 1.0  # between recovery attempts while the broker does not answer
    record_attempts_max: int = 3  # processes one input record may stop before it is poisoned unapplied
    # A local checkpoint older than this is not trusted (full rebuild instead): a restore
    # from it could miss tombstones the log cleaner removed (delete.retention.ms, 1 h).
    checkpoint_max_age_ms: int = 1_800_000
    # keep warm copies of the partitions other processors own (docs/adr/0005): a takeover
    # reads only the changelog tail. Costs a second apply of every changelog record.
    standbys: bool = True
    sched: J.SchedulerConfig = field(default_factory=J.SchedulerConfig)
    runs: R.RunConfig = field(default_factory=R.RunConfig)


class Processor:
    """``log``: the event log (default: Kafka at ``cfg.bootstrap``, principal ``processor``);
    ``stores``: the partitions' state stores and checkpoints (default: RocksDB under
    ``cfg.state_dir``); ``monotonic``: the clock that bounds the standbys' work per step
    (the simulation passes a constant one so that work does not depend on speed);
    ``metrics``: where it counts (default: a registry of its own, served by the CLI)."""

    def __init__(self, cfg: ProcessorConfig, clock: Clock | None = None, topology: Topology | None = None, *,
                 log: EventLog | None = None, stores: StateStores | None = None,
                 monotonic: Callable[[], float] = time.monotonic,
                 metrics: ProcessorMetrics | None = None,
                 keyring: Keyring | Literal["settings"] | None = "settings",
                 gate: RegionGate | None = None) -> None:
        self.cfg = cfg
        # regions (gnomon.gate): run only while this region runs the namespace; None: one region
        self.gate = gate
        self.fenced = False  # another region runs the namespace now: stop
        # every job command must be signed by a key of its tenant (core.command_auth), by
        # default one of the keys directory of the settings (gnomon.command_keys); None:
        # signatures are not checked (``gnomon processor --accept-unsigned-commands``)
        if keyring == "settings":
            from gnomon.command_keys import DirKeyring, keys_dir
            from gnomon.config import load

            keyring = DirKeyring(keys_dir(load()))
        self.keyring: Keyring | None = keyring
        self.clock = clock or SystemClock()
        self.topo = topology or load_topology()
        self.log: EventLog = log if log is not None else KafkaEventLog(cfg.bootstrap, role=ROLE)
        self.stores: StateStores = stores if stores is not None else RocksStores(cfg.state_dir, cfg.instance_id)
        self.tasks: dict[int, PartitionTask] = {}
        self._pickers: dict[str, WeightedPicker] = {}  # pool -> its priority tiers' round-robin state
        self.inputs = [self.topo.job_commands, self.topo.run_events, self.topo.dependencies]
        self.overload = OverloadGovernor(lookahead_ms=cfg.sched.lookahead_ms)  # normal/low runs in flight (core.overload)
        self.overload_quiet_until_ms = 0  # start lags are not an overload's until then (``_tick_budget``)
        self._last_budget_ms: int | None = None
        self._ticks = 0  # the partition that goes first in a tick's phases turns with it
        self.metrics = metrics if metrics is not None else ProcessorMetrics(self.topo, cfg.instance_id,
                                                                            group_id=GROUP_ID)
        self._stop = threading.Event()
        self._last_tick_ms = 0
        self._clean = True  # False while local state may hold writes not yet committed
        self._read_ts: dict[int, int] = {}  # run-events partition -> timestamp of the last record read
        self.poisoned = 0
        self.forwarded = 0  # records for jobs handed over in a grow, written to their new partition
        self._handover_checked_ms: dict[int, int] = {}  # partition born in a grow -> when last asked
        self._handover_reader: Reader | None = None  # asks the jobs changelog's end for them (made on need)
        self._awaiting_since_ms: dict[int, int] = {}  # partition born in a grow -> when first seen waiting
        self._awaiting_warned: set[int] = set()
        self._producer_knows = self.topo.partitions  # partitions the producer was asked to know (``_know_partitions``)
        # a record the last processes died in is tried at most record_attempts_max times
        self.attempts = RecordAttempts(self.stores.marker(), cfg.record_attempts_max)
        if self.attempts.carried is not None:
            logging.getLogger("gnomon.processor").warning(  # (``log`` is the event log here)
                "the last processor of %s stopped while applying %s[%d]@%d (attempt %d)",
                cfg.instance_id, *self.attempts.carried)
        self.transactions = 0
        self.txn_ms: deque[float] = deque(maxlen=TXN_TIMES_KEPT)  # the latest transactions' durations (the log)
        self.aborts = 0  # transactions aborted (state and positions rewound)
        self.restores: dict[str, int] = {}  # partitions restored, by how (a rollback, a standby, ...)
        self.consumer: GroupConsumer = self.log.group_consumer(
            region.group_id(GROUP_ID, self.topo.region), client_id=f"proc-{cfg.instance_id}",
            # a killed processor's partitions move after session_timeout_ms (infra sets
            # the broker's group.min.session.timeout.ms to 1 s; Kafka's default is 6 s)
            session_timeout_ms=cfg.session_timeout_ms,
            config={"partition.assignment.strategy": "range",
                    "heartbeat.interval.ms": max(100, cfg.session_timeout_ms // 3)})
        self._fatal_count = 0
        self._need_producer = False  # the producer is unusable: build a new one (``_recover``)
        self._need_rewind = False  # local state and positions may be ahead of the last commit
        self._next_producer: TransactionalProducer | None = None  # being initialised by the recovery
        self._recover_at_ms = 0  # no recovery attempt before (processor clock)
        self._recovering_since_ms: int | None = None
        self.progress_at_s = time.monotonic()  # the last step that ended at a commit, or idle
        self.producer = self._new_producer()
        self.directory = WorkerDirectory()
        self._lost_workers: dict[str, int] = {}  # worker -> when found lost (the latest LOST_WORKERS_KEPT)
        self._restored: set[int] = set()  # partitions restored since the last tick
        self.adverts: AdvertFeed | None = None
        # tenants' limits (gnomon.tenants) and this instance's counts against them (ADR 0008)
        self.tenants = TenantBook()
        self.quota = QuotaBook(self.tenants, self.topo.partitions)
        self.tenant_feed: TenantFeed | None = None
        self.calendars = CalendarBook()  # the tenants' exclusion calendars (gnomon.calendars)
        self._calendars_gate = CatchUpGate(skew_ms=CALENDARS_CLOCK_SKEW_MS,
                                           reads_per_s_max=CALENDARS_CATCH_UPS_PER_S_MAX)
        self.usage = UsagePublisher(self.topo, self.quota)
        self.history: HistoryWatermark | None = None
        self.standbys: StandbySet | None = None
        self._saturated = False  # the last batch was full: input is waiting
        self._joined = False  # the group gave this processor its first assignment
        if cfg.standbys:
            self.standbys = StandbySet(self.log, (self.topo.jobs, self.topo.runs), lambda p: self._open_store(p),
                                       self.clock, max_age_ms=cfg.checkpoint_max_age_ms, monotonic=monotonic)

    def _calendars_catch_up(self, made_at_ms: int) -> None:
        """Read the tenant feed (calendars included) up to the topics' end offsets as of
        now, for a command made at ``made_at_ms`` that names a calendar this processor has
        not read: it may have been sent right after the calendar's PUT (acknowledged by
        Kafka, so below the end offsets read here). Not again if a read that began after
        the command was made has done it; at most ``CALENDARS_CATCH_UPS_PER_S_MAX`` a
        second (a producer naming unknown calendars cannot stall the loop)."""
        if self.tenant_feed is None or not self._calendars_gate.should_read(made_at_ms, time.monotonic()):
            return
        start_ms = self.clock.now_ms()
        try:
            self.tenant_feed.load(CALENDARS_CATCH_UP_TIMEOUT_S)
        except EventLogError as exc:
            log.warning("could not read the calendars to their end: %s", exc)
            return
        self._calendars_gate.read_done(start_ms)

    def _new_producer(self) -> TransactionalProducer:
        # in a region, an id its region's site coordinates (gnomon.region.transactional_id)
        tid = region.transactional_id(region.group_id(f"gnomon-processor-{self.cfg.instance_id}", self.topo.region),
                                      (region.runs_in() or self.topo.region) if self.topo.region is not None else None)
        return self.log.transactional_producer(tid, client_id=f"proc-{self.cfg.instance_id}",
                                               transaction_timeout_ms=self.cfg.transaction_timeout_ms)

    # ---- lifecycle ---------------------------------------------------------------------

    def stop(self) -> None:
        self._stop.set()

    def start(self) -> None:
        """Claim the transactional id, open the feeds, join the group (no step yet)."""
        try:
            self.producer.init_transactions(30)
        except EventLogError as exc:
            raise EventLogError(f"cannot initialise Kafka transactions: {exc}") from exc
        self.adverts = AdvertFeed(self.log, self.topo.workers, self.directory, self.clock)
        self.history = HistoryWatermark(self.log, self.topo.runs, self.clock, region=self.topo.region)
        self.tenant_feed = TenantFeed(self.cfg.bootstrap, self.topo, self.tenants, None, self.clock, role=ROLE,
                                      log=self.log, calendars=self.calendars)
        self.tenant_feed.load(30)
        self.adverts.poll()
        self.consumer.subscribe(self.inputs, on_assign=self._on_assign, on_revoke=self._on_revoke,
                                on_lost=self._on_lost)
        log.info("processor %s started; inputs %s", self.cfg.instance_id, self.inputs)

    def run(self) -> None:
        if self.gate is not None:
            while not self.gate.wait_until_mine(self._stop, max_wait_s=5.0):
                self.progress_at_s = time.monotonic()  # a standby is waiting, not stuck
                if self._stop.is_set():
                    self._close()
                    return
            self.gate.start_background()  # (its reads never hold up the loop)
        self.start()
        last_report = time.monotonic()
        try:
            while not self._stop.is_set() and not self.fenced:
                if self.gate is not None and not self.gate.still_mine():
                    self.fenced = True
                    break
                self.step()
                if time.monotonic() - last_report > 10:
                    last_report = time.monotonic()
                    free = self.directory.snapshot(self.clock.now_ms())
                    times = sorted(self.txn_ms)
                    log.info("partitions=%s standbys=%s txns=%d (latest %d: p50 %.0f ms, max %.0f ms) poisoned=%d "
                             "workers=%d free_slots=%d purged=%d state=%s", sorted(self.tasks),
                             self.standbys.lag() if self.standbys is not None else "off",
                             self.transactions, len(times), times[len(times) // 2] if times else 0,
                             times[-1] if times else 0, self.poisoned, len(free),
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

    def close(self) -> None:
        """A clean stop: checkpoint what it owns and leave the group."""
        self._close()

    def _close(self) -> None:
        self.attempts.clear()  # a stop, not a death in a record: nothing to count
        # Clean stop: checkpoint, so a restart only replays the tail. The checkpoint says
        # "this store holds the changelogs up to their ends", true only while no one else
        # has written them: the ends are read first, then the group must still count this
        # processor as the owner (a process stopped past its session, e.g. SIGSTOP, then
        # told to stop, has lost its partitions to another that wrote more; its store is
        # stale and is dropped, rebuilt on its next open).
        ends = {p: self._changelog_ends(p) for p in sorted(self.tasks)}
        if ends and not self._still_owner():
            log.warning("stopping after the group moved partitions %s away (a stalled process): no checkpoint, "
                        "their next open rebuilds them", sorted(ends))
            ends = dict.fromkeys(ends)
        for p, at in ends.items():
            self._release(p, checkpoint=at is not None, ends=at)
        if self.standbys is not None:
            checkpoints = self.standbys.checkpoints()
            self.standbys.close()
            for p, (pos, current_at) in checkpoints.items():
                self._write_checkpoint(p, pos, current_at)  # warm copies stay warm across a restart
        self.consumer.close()  # best-effort
        if self.adverts is not None:
            self.adverts.close()
        if self.history is not None:
            self.history.close()
        if self.tenant_feed is not None:
            self.tenant_feed.close()
        if self._handover_reader is not None:
            self._handover_reader.close()
        if self.gate is not None:
            self.gate.close()

    # ---- rebalance -----------------------------------------------------------------------

    def _on_assign(self, partitions: list[TP]) -> None:
        self.overload_quiet_until_ms = self.clock.now_ms() + OVERLOAD_QUIET_MS
        wanted = sorted({p for _, p in partitions})
        if self.gate is not None and not self.gate.confirmed_mine(within_s=CONFIRM_WITHIN_S):  # (re)joined
            log.warning("assigned partitions %s, but this region's ownership of the namespace is not confirmed "
                        "(region %s runs it, or the regions topic cannot be read): not restoring them",
                        wanted, self.gate.view.owner(self.gate.region).owner)
            self.gate.stop_reason = "assigned partitions while this region's ownership was not confirmed"
            self.fenced = True
            return
        self._joined = True
        log.info("assigned partitions %s; restoring state", wanted)
        for p in wanted:
            self._read_ts.pop(p, None)
            if self.history is not None:
                self.history.forget(p)  # samples from an earlier ownership say nothing of what others wrote
            if p not in self.tasks:
                try:
                    self.tasks[p] = self._restore(p)
                except EventLogError as exc:  # the broker went away again: restored by the recovery
                    log.warning("partition %d not restored (%s); recovering", p, exc)
                    self._need_rewind = True

    def _on_revoke(self, partitions: list[TP]) -> None:
        gone = sorted({p for _, p in partitions})
        log.info("revoked partitions %s", gone)
        for p in gone:
            self._release(p)

    def _on_lost(self, partitions: list[TP]) -> None:
        """Lost, not revoked (our session expired): another instance may already own and
        write these partitions, so no checkpoint: the next open rebuilds."""
        gone = sorted({p for _, p in partitions})
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

    def _changelog_ends(self, partition: int) -> dict[str, int] | None:
        try:
            return {t: self.log.end_offset(t, partition) for t in (self.topo.jobs, self.topo.runs)}
        except EventLogError as exc:
            log.warning("no checkpoint for partition %d (%s); next open rebuilds it", partition, exc)
            return None

    def _still_owner(self) -> bool:
        """Whether the group still counts this processor as its partitions' owner: its
        positions (what its last transaction committed, when clean; the group's commits
        where it has read nothing since its assignment) are committed again with its
        generation, which the group refuses from a member it has dropped."""
        if not self._clean:
            return False
        try:
            assigned = self.consumer.assignment()
            tps = {tp: off for tp, off in self.consumer.position(assigned).items() if off >= 0}
            if not tps:
                tps = {tp: off for tp, off in self.consumer.committed(assigned, MEMBERSHIP_CHECK_TIMEOUT_S).items()
                       if off is not None and off >= 0}
            if not tps:
                return False
            self.consumer.commit(tps, MEMBERSHIP_CHECK_TIMEOUT_S)
        except EventLogError as exc:
            log.warning("the group no longer counts this processor as the owner (%s)", exc)
            return False
        return True

    def _release(self, partition: int, *, checkpoint: bool = True, ends: dict[str, int] | None = None) -> None:
        """Give up an owned partition. Clean (revoked, stopping, after a commit): its store
        stays warm as a standby, or is checkpointed to disk with the changelog ``ends`` it
        holds (read now if not given). Otherwise it is dropped."""
        task = self.tasks.pop(partition, None)
        self.quota.close(partition)
        self.usage.forget(partition)
        if task is None:
            return
        if (not checkpoint or not self._clean) and self.standbys is not None and not task.awaiting:
            # lost, or with writes not committed: those undone, the store is at the last
            # commit, and stays warm from the offsets that commit reached at least (a new
            # owner's writes come after them: the copy reads them like any other)
            store = task.txn_rollback()
            if store is not None:
                log.info("partition %d released at its last commit (what was not committed undone): kept warm",
                         partition)
                self.standbys.adopt(partition, self._new_task(partition, store), dict(task.changelog_at))
                return
        task.txn_end()
        if checkpoint and not self._clean:
            log.warning("partition %d closed with uncommitted local writes; next open rebuilds it", partition)
            checkpoint = False
        if not checkpoint:
            ends = None
        elif ends is None:
            ends = self._changelog_ends(partition)
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
            self.stores.put_checkpoint(partition, {**positions, _WRITTEN_AT: current_at_ms})
        except OSError as exc:
            log.warning("no checkpoint for partition %d (%s); next open rebuilds it", partition, exc)

    def _open_store(self, partition: int, *, trust_checkpoint: bool = True,
                    ) -> tuple[PartitionTask, dict[str, int] | None, int | None]:
        """The partition's store and the changelog positions it holds, from its checkpoint
        (consumed: a crash before the next clean close means a rebuild). None: an empty
        store (no checkpoint, an untrusted or a too old one)."""
        raw = self.stores.take_checkpoint(partition)  # consumed whether trusted or not
        ckpt = raw if raw is not None and trust_checkpoint and self.stores.exists(partition) else None
        if raw is not None:
            age_ms = self.clock.now_ms() - int((ckpt or {}).get(_WRITTEN_AT, 0))
            if ckpt is not None and age_ms > self.cfg.checkpoint_max_age_ms:
                log.info("partition %d checkpoint is %d s old (tombstones may be gone); full rebuild",
                         partition, age_ms // 1000)
                ckpt = None
        if ckpt is not None and not {self.topo.jobs, self.topo.runs} <= set(ckpt):
            ckpt = None
        try:
            kv = self.stores.open(partition, fresh=ckpt is None)
        except StateStoreError as exc:
            if ckpt is None:
                raise
            # a store that does not open (e.g. RocksDB reports corruption) is a cache: its
            # checkpoint was consumed above, so rebuild it from the changelogs instead
            log.warning("partition %d: its store does not open (%s); rebuilding it from the changelogs",
                        partition, exc)
            ckpt = None
            kv = self.stores.open(partition, fresh=True)
        task = self._new_task(partition, kv)
        if ckpt is None:
            return task, None, None
        return task, {t: int(ckpt[t]) for t in (self.topo.jobs, self.topo.runs)}, int(ckpt.get(_WRITTEN_AT, 0))

    def _new_task(self, partition: int, kv: KeyValueStore) -> PartitionTask:
        task = PartitionTask(partition, kv, self.topo, self.cfg.sched, self.cfg.runs,
                             directory=self.directory, quota=self.quota, calendars=self.calendars,
                             calendars_catch_up=self._calendars_catch_up)
        task.on_progress = self._progressed  # a long restore is progress (liveness)
        if self.keyring is not None:  # (regions: a moved job's adoption is signed with the operator's key)
            task.operator_key = self.keyring.operator
        return task

    def _restore(self, partition: int, *, trust_checkpoint: bool = True,
                 rolled_back: tuple[KeyValueStore, dict[str, int]] | None = None) -> PartitionTask:
        """The partition's state at the changelogs' end: from a warm standby, a checkpoint
        and the tail after it, or in full; ``rolled_back``: its store put back at its last
        commit by the transaction's journal, and the changelog offsets that commit reached
        at least (the tail from there brings in whatever the failed transaction did commit)."""
        started = time.monotonic()
        self.quota.close(partition)  # counted again from the restored state, below
        self.usage.forget(partition)
        promoted = (self.standbys.promote(partition) if self.standbys is not None and trust_checkpoint
                    and rolled_back is None else None)
        ckpt: dict[str, int] | None
        if rolled_back is not None:
            task, ckpt = self._new_task(partition, rolled_back[0]), dict(rolled_back[1])
            source = "rolled back to its last commit"
        elif promoted is not None:
            task, ckpt = promoted
            source = "from a warm standby"
        else:
            task, ckpt, _ = self._open_store(partition, trust_checkpoint=trust_checkpoint)
            source = "full rebuild" if ckpt is None else "from checkpoint"
        n = 0
        # per changelog topic: past the last record read (every record before it is in the store)
        read_to = dict(ckpt) if ckpt is not None else {self.topo.jobs: 0, self.topo.runs: 0}
        if ckpt is None:  # full rebuild: keep the last value per key, then load once
            latest: dict[str, dict[str, bytes | None]] = {self.topo.jobs: {}, self.topo.runs: {}}
            for topic, table in latest.items():
                for rec in self.log.read_to_end(topic, partition, self.cfg.restore_timeout_s):
                    table[rec.key.decode() if rec.key else ""] = rec.value
                    read_to[topic] = rec.offset + 1
                    n += 1
                    if n % 10_000 == 0:
                        self.progress_at_s = time.monotonic()  # a long restore is progress
            try:
                task.bulk_load(latest[self.topo.jobs], latest[self.topo.runs])
            except GnomonError as exc:
                raise EventLogError(f"changelog of partition {partition} holds an undecodable record: {exc}") from exc
        else:  # the tail after a clean close or a standby's position: the last value per key
            for topic, apply in ((self.topo.jobs, task.restore_job), (self.topo.runs, task.restore_run)):
                tail: dict[str, bytes | None] = {}
                for rec in self.log.read_to_end(topic, partition, self.cfg.restore_timeout_s, ckpt[topic]):
                    tail[rec.key.decode() if rec.key else ""] = rec.value
                    read_to[topic] = rec.offset + 1
                    n += 1
                    if n % 10_000 == 0:
                        self.progress_at_s = time.monotonic()
                for key, value in tail.items():
                    try:
                        apply(key, value)
                    except GnomonError as exc:
                        log.error("changelog %s[%d] key %s undecodable, skipped: %s", topic, partition, key, exc)
        moved = task.migrate_due_index()
        if moved:
            log.info("partition %d: %d due-index entries moved to the per-priority indexes", partition, moved)
        counted = task.load_counts()
        self.progress_at_s = time.monotonic()
        self.metrics.restored("standby" if promoted is not None else "rebuild" if ckpt is None else "checkpoint",
                              time.monotonic() - started)
        log.info("partition %d restored: %d records in %.2fs (%s); %d tenant counting entries", partition, n,
                 time.monotonic() - started, source, counted)
        self._restored.add(partition)
        self.restores[source] = self.restores.get(source, 0) + 1
        self._know_partitions(task.partitions)
        task.changelog_at = read_to
        task.txn_begin()
        return task

    def _ask_partitions(self) -> dict[str, int]:
        """Each co-partitioned topic's partition count, asked through this processor's
        producer, which refreshes its metadata (it can write to all of them afterwards)."""
        return {topic: self.producer.partitions(topic, self.cfg.recover_timeout_s)
                for topic in self.topo.co_partitioned()}

    def _know_partitions(self, count: int) -> None:
        """A restored partition places jobs by ``count``: this processor's producer must
        know that many partitions of the co-partitioned topics it writes (forwarded records,
        dependency messages, a handover's records), or a produce there fails the
        transaction until its metadata refreshes. Asked once per count."""
        if count <= self._producer_knows:
            return
        try:
            self._ask_partitions()
        except EventLogError as exc:  # its periodic refresh catches up; a produce meanwhile is retried
            log.warning("the producer's metadata not refreshed for %d partitions (%s)", count, exc)
            return
        self._producer_knows = count

    def _staged_on_lost_workers(self, now: int) -> list[Output]:
        """A partition restored since the last tick (taken over, or rewound) may hold
        attempts staged on a worker this processor already found lost (each is reported
        once): they move now, not when their lease lapses."""
        restored, self._restored = self._restored, set()
        out: list[Output] = []
        for p in sorted(restored):
            task = self.tasks.get(p)
            if task is None:
                continue
            for worker in task.staged_workers():
                if worker in self._lost_workers and not self.directory.alive(worker, now):
                    log.info("partition %d holds runs staged on %s, lost before it was restored; moving them",
                             p, worker)
                    out.extend(task.worker_lost(worker, now))
        return out

    def _progressed(self) -> None:
        self.progress_at_s = time.monotonic()

    # ---- one step --------------------------------------------------------------------------

    def step(self) -> None:
        if self.recovering:
            self._recovery_step()
            if self.recovering:
                return
        if self.history is not None:
            self.history.poll(self.tasks)  # between transactions: everything before now is committed
        if self.standbys is not None and self._joined:  # (before the first assignment every partition looks free)
            self.standbys.track(set(range(self._partitions_known())) - set(self.tasks))
            if not self._saturated:
                self.standbys.poll()  # our own partitions first: standbys get the spare time
        msgs = self.consumer.consume(self.cfg.batch_max, self.cfg.poll_timeout_s)
        if self.fenced:  # another region runs the namespace (``_on_assign``): apply nothing
            return
        if self.recovering:
            # a rebalance in ``consume`` could not restore a partition: nothing of this batch
            # may be committed (its offsets would skip records never applied); the rewind
            # reads it again
            return
        self._saturated = len(msgs) >= self.cfg.batch_max
        now = self.clock.now_ms()
        due_tick = now - self._last_tick_ms >= self.cfg.tick_interval_ms
        if not msgs and not due_tick:
            self.progress_at_s = time.monotonic()  # nothing to do is not being stuck
            return
        outputs: list[Output] = []
        offsets: dict[tuple[str, int], int] = {}
        self._clean = False
        held: dict[TP, int] = {}
        for msg in msgs:
            task = self.tasks.get(msg.partition)
            if task is not None and task.awaiting:  # born in a grow, its handover not come: read again later
                held.setdefault((msg.topic, msg.partition), msg.offset)
                continue
            offsets[(msg.topic, msg.partition)] = msg.offset + 1
            if msg.topic == self.topo.run_events:
                self._read_ts[msg.partition] = msg.timestamp_ms
            outputs.extend(self._apply(msg, now))
        for tp, offset in held.items():
            self.consumer.seek(tp, offset)
        if self.adverts is not None:
            self.adverts.poll()
        if self.tenant_feed is not None:
            self.tenant_feed.poll()
        if due_tick:
            self._last_tick_ms = now
            self._handovers_come()
            known = self._partitions_known()
            self.quota.partitions_total = known  # tenant limits' units, homed across them
            self.metrics.partitions.set(known)
            for worker in self.directory.lost(now):
                log.warning("worker %s lost (no advert); moving its staged runs", worker)
                self._lost_workers.pop(worker, None)  # (latest loss last: the oldest are forgotten first)
                self._lost_workers[worker] = now
                while len(self._lost_workers) > LOST_WORKERS_KEPT:
                    self._lost_workers.pop(next(iter(self._lost_workers)))
                for task in list(self.tasks.values()):
                    outputs.extend(task.worker_lost(worker, now))
            outputs.extend(self._staged_on_lost_workers(now))
            behind = self._behind()
            budget = self._tick_budget(now)
            # One budget across the partitions: each phase (due now, backlog, lookahead)
            # in every partition before the next phase (the slots due now oldest first
            # across partitions), the first partition turning from tick to tick, so a
            # binding budget is shared, not spent by the lowest partitions' lookahead
            # while a later partition's slots due now wait.
            order = sorted(self.tasks.items())
            self._ticks += 1
            turn = self._ticks % len(order) if order else 0
            order = order[turn:] + order[:turn]
            for _, task in order:
                task.begin_tick(now)
            outputs.extend(tick_near([task for _, task in order], now, budget))
            for phase in (TickPhase.BACKLOG, TickPhase.FAR):
                for _, task in order:
                    outputs.extend(task.tick_due(phase, now, budget))
            for p, task in order:
                # a partition with unread run events judges leases by how far it has read
                outputs.extend(task.tick_timers(now, self._read_ts.get(p, 0) if p in behind else None,
                                                self.history.until_ms(p) if self.history is not None else None,
                                                assign_waiting=False))
            in_flight = sum(t.in_flight_runs for t in self.tasks.values())
            self.overload.after_tick(budget, in_flight, now, hold=now < self.overload_quiet_until_ms)
            overloaded = self.overload.overloaded or (self.cfg.overload_budget_per_tick is not None
                                                      and budget.deferred > 0)
            for task in self.tasks.values():
                task.overloaded = overloaded
            self.metrics.overloaded(self.overload.room_runs, in_flight, self.overload.last_deferred,
                                    self.overload.last_lag_ms)
            # waiting runs take free slots across all partitions, in the weighted mix
            outputs.extend(assign_waiting([task for _, task in order], now, self._pickers))
            outputs.extend(self.usage.changes(sorted(self.tasks), now))
        outputs = self._deliver_locally(outputs, now)
        if outputs or offsets:
            self._commit(outputs, offsets)
        if self.recovering:
            return
        self._clean = True
        self.progress_at_s = time.monotonic()
        self.metrics.sample(now, self.tasks, self.directory, len(self.standbys.copies) if self.standbys else 0,
                            self.consumer, self.inputs, self.history.lag if self.history is not None else None)

    def _deliver_locally(self, outputs: list[Output], now: int) -> list[Output]:
        """Dependency messages (gnomon.dependencies) for a partition this processor owns
        are applied here, in this transaction, instead of going round through Kafka: a
        downstream released by its upstream's end is granted in the same transaction as
        that end (bench/dependencies.py measures the difference). Exactly as if read: each
        under its own savepoint, a refused one poisoned with its reason; what one causes
        is delivered too (at most ``LOCAL_ROUNDS_MAX`` rounds, then the rest is produced)."""
        topic = self.topo.dependencies
        for _ in range(LOCAL_ROUNDS_MAX):
            outputs = [self._rerouted(o) if o.topic == topic else o for o in outputs]
            mine = {p for p, t in self.tasks.items() if not t.awaiting}
            local = [o for o in outputs if o.topic == topic and o.partition in mine]
            if not local:
                return outputs
            outputs = [o for o in outputs if not (o.topic == topic and o.partition in mine)]
            for o in local:
                assert o.partition is not None
                task = self.tasks[o.partition]
                try:
                    outputs.extend(task.apply_record(o.value, now, topic, -1))
                except InfraError:
                    raise
                except (RecordFailed, GnomonError) as exc:
                    why = exc.cause if isinstance(exc, RecordFailed) else exc
                    log.warning("local %s for %s refused: %s", type(o.value).__name__, o.key, why)
                    self.poisoned += 1
                    outputs.append(Output(self.topo.poison, topic, PoisonRecord(
                        topic, o.partition, -1, f"{type(why).__name__}: {str(why)[:1000]}", o.key.encode(),
                        codec.encode(o.value, topic), now)))
        return outputs

    def _rerouted(self, o: Output) -> Output:
        """A dependency message placed by an older count (its sender's partition had not
        read its grow marker) for a partition of ours that has: to the job's partition now,
        as a forward through Kafka would take it (``_forwarded``)."""
        task = self.tasks.get(o.partition) if o.partition is not None else None
        if task is None or not task.grown or task.owns(o.key):
            return o
        return replace(o, partition=growth.owner(o.key, task.partitions))

    def _tick_budget(self, now: int) -> TickBudget:
        """This tick's budget for normal and low triggers (core.overload), after feeding the
        governor the start lags the partitions saw since the last tick. Not after a gap:
        for ``OVERLOAD_QUIET_MS`` after a recovery, a (re)assignment or a pause of more than
        ``OVERLOAD_GAP_MS`` between ticks, start lags are an outage's, not an overload's
        (the window holds, neither grown nor cut, and still bounds what is triggered),
        and neither is the input lag ever (after an outage the processor reads a backlog:
        slowing the triggers then would make the return later, not the overload smaller)."""
        if self._last_budget_ms is not None and now - self._last_budget_ms > OVERLOAD_GAP_MS:
            self.overload_quiet_until_ms = now + OVERLOAD_QUIET_MS
        self._last_budget_ms = now
        quiet = now < self.overload_quiet_until_ms
        for task in self.tasks.values():
            for rank, lag_ms in task.start_lags:
                self.overload.observe_start(rank, lag_ms, judged=not quiet)
            task.start_lags.clear()
        if self.cfg.overload_budget_per_tick is not None:
            return TickBudget(left=self.cfg.overload_budget_per_tick)
        return self.overload.budget(sum(t.in_flight_runs for t in self.tasks.values()))

    def _behind(self) -> set[int]:
        """Partitions of run-events with unread records (cached high watermark and local
        position: no broker round trip)."""
        tps = [(self.topo.run_events, p) for p in self.tasks]
        behind = set()
        try:
            positions = self.consumer.position(tps)
        except EventLogError:
            return set(self.tasks)  # unknown: be conservative, expire nothing
        for tp, offset in positions.items():
            high = self.consumer.high_watermark(tp)  # -1: unknown
            if offset < 0 or high < 0 or high > offset:
                behind.add(tp[1])
        return behind

    def _apply(self, msg: Record, now: int) -> list[Output]:
        """One input record's outputs. Nothing a record holds stops the processor: a job
        command is answered (accepted, invalid, refused...); a record that cannot be
        decoded, is refused, or breaks the processor goes to the poison topic with the
        error, its writes undone (``PartitionTask.savepoint``), and the batch goes on. A
        record the last processes died in (``RecordAttempts``) is poisoned unapplied
        once it has had its attempts."""
        task = self.tasks.get(msg.partition)
        if task is None:  # revoked between fetch and apply
            return []
        attempt = self.attempts.begin(msg.topic, msg.partition, msg.offset)
        if attempt > self.attempts.attempts_max:
            log.error("%s[%d]@%d: the processor stopped %d times while applying it; poisoned unapplied",
                      msg.topic, msg.partition, msg.offset, attempt - 1)
            return self._poison(msg, f"the processor stopped {attempt - 1} times while applying it "
                                     f"(attempts_max {self.attempts.attempts_max}); not applied", now)
        out = self._applied(task, msg, now)
        self.attempts.done()  # applied, answered or poisoned: a death from here on is not this record's
        return out

    def _applied(self, task: PartitionTask, msg: Record, now: int) -> list[Output]:
        try:
            if msg.topic == self.topo.job_commands and msg.key == _GROW_KEY:
                return self._grow(task, msg)
            if (task.grown and msg.key is not None and not growth.is_control(msg.key)
                    and not task.owns(msg.key.decode("utf-8", "replace"))):
                return [self._forwarded(task, msg)]
            cmd = codec.decode(msg.value or b"")
            signed = None if self.keyring is None or msg.topic != self.topo.job_commands else self._signed(msg)
            return task.apply_record(cmd, now, msg.topic, msg.offset, signed=signed, origin=self._origin(task, msg))
        except InfraError:
            # the state store (or the log) failed, not the record: poisoning it would lose
            # it. The processor stops; its restart resumes from the last commit.
            raise
        except RecordFailed as exc:  # a bug the record reached: state as before it, kept for the operators
            log.error("%s[%d]@%d broke the processor (contained, state unchanged): %s", msg.topic, msg.partition,
                      msg.offset, exc, exc_info=exc.cause)
            out = self._poison(msg, f"{type(exc.cause).__name__}: {str(exc.cause)[:1000]}", now)
            return out if exc.answer is None else [exc.answer, *out]
        except GnomonError as exc:
            log.warning("poison %s[%d]@%d: %s", msg.topic, msg.partition, msg.offset, exc)
            return self._poison(msg, f"{type(exc).__name__}: {exc}", now)
        except Exception as exc:  # (the codec's own bug on hostile bytes) never the processor's end
            log.error("%s[%d]@%d could not be decoded: %s", msg.topic, msg.partition, msg.offset, exc,
                      exc_info=exc)
            return self._poison(msg, f"{type(exc).__name__}: {str(exc)[:1000]}", now)

    # ---- a grow (gnomon.processor.growth) ----------------------------------------------------

    def _grow(self, task: PartitionTask, msg: Record) -> list[Output]:
        """A grow marker on the job commands (``gnomon infra grow``); one whose value is
        not a count is poisoned. (Any other key starting with NUL is read as a command,
        refused and answered as one: job ids cannot contain NUL.)"""
        count = growth.decode_count(msg.value, f"grow marker {msg.topic}[{msg.partition}]@{msg.offset}")
        if count > task.partitions:
            # the heirs' partitions must exist, and this producer must know them (its
            # metadata is refreshed every few seconds; a produce to a partition it does not
            # know yet would fail the transaction): asked now, which refreshes it
            for topic, have in self._ask_partitions().items():  # EventLogError: recovery
                if have < count:
                    raise ValidationError("value", f"a grow to {count} partitions, but {topic} has {have}: "
                                                   "`gnomon infra grow` adds them before it writes its markers "
                                                   "(run it again: it writes them again)")
            self._producer_knows = max(self._producer_knows, count)
        return task.savepoint(lambda: task.grow(count))  # a failure leaves the partition as it was

    def _forwarded(self, task: PartitionTask, msg: Record) -> Output:
        """A record for a job handed to another partition in a grow (its producer placed
        it by the old count): written there as it came, with where it was read first."""
        key = (msg.key or b"").decode("utf-8", "replace")
        headers = msg.headers
        keyring = self.keyring
        operator = keyring.operator() if keyring is not None else None
        if keyring is not None and operator is not None:  # (signed: a producer's header takes no other answer)
            raw = growth.origin_value(headers)
            if raw is None or verify_origin(keyring, msg.topic, msg.key, msg.value, raw) is None:
                # not forwarded before (or a producer's header): where it was read first is here
                headers = (*(h for h in headers if h[0] != ORIGIN_HEADER),
                           (ORIGIN_HEADER, sign_origin(operator, msg.topic, msg.key, msg.value, msg.partition,
                                                       msg.offset)))
        elif growth.origin_of(headers) is None:
            headers = (*headers, growth.origin_header(msg.partition, msg.offset))
        self.forwarded += 1
        return Output(msg.topic, key, None, growth.owner(key, task.partitions), msg.value, headers=headers)

    def _origin(self, task: PartitionTask, msg: Record) -> tuple[int, int] | None:
        """Where a forwarded command was first written, if its ``gnomon-origin`` header can
        be a forward's: signed by an operator's key where commands are signed (a processor
        signs what it forwards), and naming a partition the record's key was placed on by
        an older count; otherwise ignored, and the command is answered at its own position."""
        if msg.topic != self.topo.job_commands:
            return None
        raw = growth.origin_value(msg.headers)
        if raw is None:
            return None
        if self.keyring is not None and self.keyring.operator() is not None:
            origin = verify_origin(self.keyring, msg.topic, msg.key, msg.value, raw)
        else:  # (no operator key to sign forwards with: the plausibility check alone, a documented gap)
            origin = growth.origin_of(msg.headers)
        if origin is None or msg.key is None or origin[1] < 0 or not 0 <= origin[0] < msg.partition:
            return None
        key = msg.key.decode("utf-8", "replace")
        birth = self.topo.partitions
        counts = [c for c in range(birth, task.partitions, birth) if task.partitions % c == 0]
        return origin if any(growth.owner(key, c) == origin[0] for c in counts) else None

    def _partitions_known(self) -> int:
        """The count of partitions as far as this processor knows: the topology's, or a
        grown count one of its partitions places jobs by."""
        return max([self.topo.partitions, *(t.partitions for t in self.tasks.values())])

    def _handovers_come(self) -> None:
        """A partition born in a grow waits for its handover (its jobs changelog is empty
        until the handover's transaction commits): once something is there, restore it."""
        now = self.clock.now_ms()
        for p, task in sorted(self.tasks.items()):
            if not task.awaiting or now - self._handover_checked_ms.get(p, -HANDOVER_POLL_MS) < HANDOVER_POLL_MS:
                continue
            self._handover_checked_ms[p] = now
            since = self._awaiting_since_ms.setdefault(p, now)
            if now - since >= HANDOVER_WARN_MS and p not in self._awaiting_warned:
                self._awaiting_warned.add(p)
                log.warning("partition %d has waited %d s for its handover (a grow's: docs/adr/0012); none comes "
                            "unless `gnomon infra grow` made this partition and its source partition's processor "
                            "runs; streams/topology.toml must keep the count the topics were created with (%d)",
                            p, (now - since) // 1000, self.topo.partitions)
            try:
                if self._handover_reader is None:  # one client for the asking (a new one each time costs a TLS handshake)
                    self._handover_reader = self.log.reader(HANDOVER_GROUP, client_id=f"proc-{self.cfg.instance_id}-handover")
                if self._handover_reader.watermarks((self.topo.jobs, p), self.cfg.recover_timeout_s)[1] <= 0:
                    continue
                del self.tasks[p]  # (a failed restore leaves it to the rewind, which restores what is assigned)
                task.kv.close()
                self.tasks[p] = self._restore(p, trust_checkpoint=False)
            except EventLogError as exc:
                log.warning("partition %d: its handover not read (%s); recovering", p, exc)
                self._need_rewind = True
                return
            if self.tasks[p].awaiting:  # (something other than a handover there)
                log.warning("partition %d: its changelog has records but no partitions record; still waiting", p)
            else:
                log.info("partition %d: handover restored (placing jobs by %d partitions)", p,
                         self.tasks[p].partitions)

    def _signed(self, msg: Record) -> CommandKey | Unauthenticated:
        """The key that signed this command record, or why none did (answered by the task)."""
        assert self.keyring is not None
        try:
            return verify(self.keyring, msg.topic, msg.key, msg.value, msg.headers)
        except Unauthenticated as exc:
            return exc

    def _poison(self, msg: Record, reason: str, now: int) -> list[Output]:
        self.poisoned += 1
        rec = PoisonRecord(msg.topic, msg.partition, msg.offset, reason, msg.key, msg.value, now)
        return [Output(self.topo.poison, msg.topic, rec)]

    def _commit(self, outputs: Iterable[Output], offsets: dict[TP, int]) -> None:
        """One transaction: outputs + changelogs + consumed offsets. Error handling follows
        the transactional producer's contract: retriable errors retry the same call,
        abortable ones abort and rewind state and positions to the last commit, fatal ones
        (e.g. fenced, or a coordinator lost mid-commit) rebuild the producer and rewind.
        Bounded: the whole transaction gets ``commit_timeout_s``; a failed one leaves the
        processor recovering (``_recover``) until the broker lets it rebuild and rewind."""
        began = time.monotonic()
        deadline = began + self.cfg.commit_timeout_s
        try:
            self._txn(lambda _t: self.producer.begin(), deadline)
            changelogs = (self.topo.jobs, self.topo.runs)
            written: dict[tuple[str, int], int] = {}  # changelog records of this transaction, per partition
            for o in outputs:
                value = o.encoded if o.encoded is not None else (
                    None if o.value is None else codec.encode(o.value, o.topic))
                self.producer.produce(o.topic, o.key.encode(), value, o.partition, o.headers)
                if o.partition is not None and o.topic in changelogs:
                    written[(o.topic, o.partition)] = written.get((o.topic, o.partition), 0) + 1
            tps = dict(offsets)
            if not tps:
                # a tick-only transaction still carries the group generation for fencing
                tps = {tp: off for tp, off in self.consumer.position(self.consumer.assignment()).items() if off >= 0}
            # Every record is in its partition's log before the offsets go: the offsets
            # are what the group refuses from a member it dropped (KIP-447), and offsets
            # it accepts come before any new owner's assignment, so that owner's restore
            # finds these records as an open transaction and waits for its end. Offsets
            # sent with records still on their way (a process starved, or a broker slow,
            # past the 3 s session) let those records land after the group had moved
            # their partitions and the new owner had restored without them; the commit
            # then made them count: a decision taken twice.
            unsent = self.producer.flush(max(0.1, deadline - time.monotonic()))
            if unsent:
                raise TransactionError(f"{unsent} records not acknowledged within the transaction's time")
            if tps:
                meta = self.consumer.group_metadata()
                self._txn(lambda t: self.producer.send_offsets(tps, meta, t), deadline)
            self._txn(lambda t: self.producer.commit(t), deadline)
            self._committed(written)
            self.transactions += 1
            self.txn_ms.append((time.monotonic() - began) * 1000)
            self.metrics.committed(outputs)
            self._fatal_count = 0
        except EventLogError as exc:
            self.aborts += 1
            if isinstance(exc, TransactionError) and exc.fatal:
                self._fatal(exc)
            else:
                log.warning("transaction failed (%s); aborting and restoring state", exc)
                try:
                    self._txn(lambda t: self.producer.abort(t), time.monotonic() + self.cfg.abort_timeout_s)
                except TransactionError as exc2:
                    self._fatal(exc2)
            self._need_rewind = True
            self._recover()

    def _committed(self, written: Mapping[tuple[str, int], int]) -> None:
        """A commit went through: each partition's journal starts afresh, and the changelog
        offsets its last commit reached at least move past the records it wrote (only an
        owner writes its changelog partitions; a record's offset is at least its count)."""
        for p, task in self.tasks.items():
            task.txn_committed()
            for topic in (self.topo.jobs, self.topo.runs):
                k = written.get((topic, p))
                if k:
                    task.changelog_at[topic] = task.changelog_at.get(topic, 0) + k

    def _txn(self, call: Callable[[float], None], deadline: float) -> None:
        """Run one transactional call (given the seconds left), retrying while the error
        says it is retriable and ``deadline`` (monotonic) is not reached."""
        attempt = 0
        while True:
            try:
                call(max(0.1, deadline - time.monotonic()))
                return
            except TransactionError as exc:
                pause_s = min(1.0, 0.05 * 2**attempt)
                attempt += 1
                if not exc.retriable or exc.fatal or time.monotonic() + pause_s >= deadline:
                    raise
                log.info("transactional call retriable error (%s); retry %d", exc, attempt)
                time.sleep(pause_s)

    def _fatal(self, err: EventLogError) -> None:
        """The producer is unusable: drop it; ``_recover`` builds a new one (same
        transactional id, which also aborts whatever the old one left open). Bounded: too
        many in a row while the broker answers exit."""
        self._fatal_count += 1
        log.error("fatal transactional producer error (%s); rebuilding the producer (%d)", err, self._fatal_count)
        if self._fatal_count > self.cfg.producer_rebuilds_max:
            self._stop.set()
            raise EventLogError(f"processor gave up after {self._fatal_count} fatal Kafka errors: {err}")
        with contextlib.suppress(Exception):
            self.producer.flush(1)
        self._need_producer = True

    @property
    def recovering(self) -> bool:
        """A transaction failed and the producer or the local state is not back yet."""
        return self._need_producer or self._need_rewind

    def _recover(self) -> bool:
        """One bounded attempt to get back to the last commit: a new producer if the old
        one is unusable, then state and positions rewound. False (logged) when the broker
        did not let it: the next step tries again, after ``recover_backoff_s``."""
        now_ms = self.clock.now_ms()  # (the simulation's clock: its steps take no real time)
        if now_ms < self._recover_at_ms:
            return False
        if self._recovering_since_ms is None:
            self._recovering_since_ms = now_ms
        try:
            if self._need_producer:
                # a timed-out init may be retried on the same producer; a fatal one needs a new one
                producer = self._next_producer or self._new_producer()
                self._next_producer = producer
                try:
                    producer.init_transactions(self.cfg.recover_timeout_s)
                except TransactionError as exc:
                    if exc.fatal or not exc.retriable:
                        self._next_producer = None
                    raise
                self.producer, self._next_producer = producer, None
                self._need_producer = False
            if self._need_rewind:
                self._rewind()
                self._need_rewind = False
        except EventLogError as exc:
            self._recover_at_ms = self.clock.now_ms() + int(self.cfg.recover_backoff_s * 1000)
            log.warning("recovery not possible yet (%s): %s; again in %.1f s",
                        "new producer" if self._need_producer else "rewind", exc, self.cfg.recover_backoff_s)
            return False
        log.info("recovered after %.1f s: producer ready, state and positions at the last commit",
                 (self.clock.now_ms() - self._recovering_since_ms) / 1000)
        self.overload_quiet_until_ms = self.clock.now_ms() + OVERLOAD_QUIET_MS
        self._recovering_since_ms = None
        return True

    def _recovery_step(self) -> None:
        """While recovering: serve the group (rebalance callbacks run in ``consume``: a
        lost assignment is given up and the group rejoined) and try to recover. Records
        read meanwhile are dropped: the rewind seeks back to the last commit."""
        self.consumer.consume(self.cfg.batch_max, self.cfg.poll_timeout_s)
        self._recover()

    def _rewind(self) -> None:
        """After an abort: state and positions go back to the last commit (every assigned
        partition, also one whose restore failed when it was assigned)."""
        self.attempts.clear()  # the records are read again by a process that survived them
        assignment = self.consumer.assignment()
        # (nothing assigned, e.g. lost with the session: nothing to read from the coordinator)
        committed = self.consumer.committed(assignment, self.cfg.recover_timeout_s) if assignment else {}
        assigned = {q for _, q in assignment}
        for p in sorted(assigned | set(self.tasks)):
            old = self.tasks.pop(p, None)
            store = old.txn_rollback() if old is not None and p in assigned and not old.awaiting else None
            if store is not None and old is not None:
                try:
                    self.tasks[p] = self._restore(p, trust_checkpoint=False, rolled_back=(store, old.changelog_at))
                except BaseException:
                    store.close()  # the next rewind rebuilds it
                    raise
                continue
            if old is not None:
                old.kv.close()
            if p in assigned:
                self.tasks[p] = self._restore(p, trust_checkpoint=False)
        for tp, offset in committed.items():
            self.consumer.seek(tp, offset if offset is not None else 0)



__all__ = ["Processor", "ProcessorConfig", "read_end_offset", "read_partition_to_end"]
