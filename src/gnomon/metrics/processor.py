"""The processor's metrics: counted from what each transaction committed (so an aborted
and rewound batch counts nothing), and sampled from its partitions' state between steps.

* ``committed(outputs)``, after a transaction committed: runs that ended by outcome
  (the history stream carries each final state once), skipped slots by reason (a
  skipped range counts each of its slots), retries and lease expiries (the ledger record
  of an attempt that ended in RETRY_WAIT, or FAILED by the processor), dead letters,
  poison records;
* ``sample(...)``, at most every ``interval_ms``: partitions owned, standbys, runs
  waiting for a worker by pool and priority (the ``rw/`` index), attempts staged and
  running by pool (``ws/`` and ``tq/``), live workers and free slots (the worker
  directory), and the consumer group's lag on the owned partitions (local positions
  and cached high watermarks: no broker round trip). Index scans are bounded by
  ``scan_max`` per partition and family. Also the history projector's *committed* lag
  on the run ledger of the owned partitions, from the samples the processor takes
  anyway to decide purges (``HistoryWatermark``): it grows while the projector is down;
* ``restored(source, seconds)``: a partition's restore, by where it came from.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info

from gnomon import region
from gnomon.core.replies import CommandResult
from gnomon.core.runs import RunState, RunStatus
from gnomon.core.workers import WorkerDirectory
from gnomon.eventlog.port import GroupConsumer
from gnomon.metrics.reasons import SKIP_REASONS, expiry_kind, skip_reason
from gnomon.ports import KeyValueStore
from gnomon.topology import Topology


class PartitionState(Protocol):
    """What the gauges read of a partition's task (``gnomon.processor.task.PartitionTask``):
    its store. A protocol, so metrics never import the processor."""

    @property
    def kv(self) -> KeyValueStore: ...

OUTCOMES = ("succeeded", "failed", "cancelled", "skipped")
RESTORE_SOURCES = ("standby", "checkpoint", "rebuild")
RESTORE_BUCKETS_S = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
HISTORY_GROUP = "gnomon-history"  # the projector's group (processor.history_mark.HISTORY_GROUP)
PROCESSOR_GROUP = "gnomon-processor"  # the processors' group (processor.runtime.GROUP_ID)
_PRIORITY_OF_RANK = {b"0": "high", b"1": "normal", b"2": "low"}  # processor.task._PRIO_RANK


class ProcessorMetrics:
    def __init__(self, topology: Topology, instance_id: str, *, group_id: str = PROCESSOR_GROUP,
                 registry: CollectorRegistry | None = None, interval_ms: int = 5_000,
                 scan_max: int = 200_000) -> None:
        """``group_id``: the processors' group as named in the default namespace; the
        labels carry its id in ``topology``'s (gnomon.region.group_id)."""
        self.topo = topology
        self.group_id = region.group_id(group_id, topology.region)
        self.history_group = region.group_id(HISTORY_GROUP, topology.region)
        self.registry = registry if registry is not None else CollectorRegistry()
        self.interval_ms = interval_ms
        self.scan_max = scan_max
        self._sampled_at_ms = -(10**15)
        r = self.registry
        Info("gnomon_processor", "This processor instance", registry=r).info({"instance_id": instance_id})
        self.runs_finished = Counter("gnomon_runs_finished", "Runs that reached a final state, by outcome",
                                     ["outcome", "pool", "priority"], registry=r)
        self.slots_skipped = Counter("gnomon_slots_skipped", "Slots recorded skipped (a range counts each slot), "
                                     "by reason", ["reason", "pool"], registry=r)
        self.retries = Counter("gnomon_retries", "Attempts that ended unsuccessfully and will be retried",
                               ["pool"], registry=r)
        self.dead_letters = Counter("gnomon_dead_letters", "Runs that exhausted their retries (dead letters)",
                                    ["pool"], registry=r)
        self.lease_expiries = Counter("gnomon_lease_expiries", "Attempts the processor ended because their lease "
                                      "lapsed (kind=lease) or their deadline passed (kind=deadline)",
                                      ["pool", "kind"], registry=r)
        self.poison = Counter("gnomon_poison_records", "Input records that could not be decoded or applied",
                              ["topic"], registry=r)
        self.transactions = Counter("gnomon_processor_transactions", "Kafka transactions committed", registry=r)
        self.unsigned_commands = Counter(
            "gnomon_job_commands_unauthenticated", "Job commands refused because their signature did not prove "
            "their tenant (unsigned, tampered, an unknown key or another tenant's; ADR 0006)", registry=r)
        self.restore_seconds = Histogram("gnomon_partition_restore_seconds", "Time to restore a partition's state "
                                         "when it is assigned, by source", ["source"], buckets=RESTORE_BUCKETS_S,
                                         registry=r)
        self.partition_owned = Gauge("gnomon_processor_partition_owned", "1 for each partition this processor owns",
                                     ["partition"], registry=r)
        self.partitions = Gauge("gnomon_topology_partitions", "Partitions of the co-partitioned input topics",
                                registry=r)
        self.standbys = Gauge("gnomon_processor_standby_partitions", "Warm standby copies this processor keeps",
                              registry=r)
        self.queue_depth = Gauge("gnomon_queue_depth", "Runs ready and waiting for a worker with room, on this "
                                 "processor's partitions", ["pool", "priority"], registry=r)
        self.staged = Gauge("gnomon_attempts_staged", "Attempts granted to a worker and not started yet",
                            ["pool"], registry=r)
        self.running = Gauge("gnomon_attempts_running", "Attempts started and not ended", ["pool"], registry=r)
        self.workers_live = Gauge("gnomon_workers_live", "Live workers (advertising), as this processor sees them",
                                  ["pool"], registry=r)
        self.worker_slots_free = Gauge("gnomon_worker_slots_free", "Free worker slots now, as this processor sees "
                                       "them", ["pool"], registry=r)
        self.consumer_lag = Gauge("gnomon_consumer_lag_records", "Records not yet consumed by the group, on the "
                                  "partitions this process consumes", ["group", "topic"], registry=r)
        self.committed_lag = Gauge("gnomon_consumer_committed_lag_records", "Records after the group's committed "
                                   "offsets, on this processor's partitions (the history projector's on the run "
                                   "ledger)", ["group", "topic"], registry=r)
        self.overload_window = Gauge("gnomon_overload_window_runs", "Normal/low runs this processor lets be in "
                                     "flight (triggered, not started): its overload window plus the allowance for runs triggered "
                                     "ahead (core.overload)",
                                     registry=r)
        self.overload_in_flight = Gauge("gnomon_overload_in_flight_runs", "Normal/low runs in flight (triggered, "
                                        "not started) on this processor's partitions", registry=r)
        self.overload_deferred = Gauge("gnomon_overload_deferred_jobs", "Due normal/low jobs left for later in the "
                                       "governor's last 2 s period because the window was full (>0: overloaded)",
                                       registry=r)
        self.overload_lag = Gauge("gnomon_overload_signal_lag_seconds", "The governor's last signal: 90th "
                                  "percentile start lag of the most urgent priority that started runs", registry=r)
        self.partitions.set(topology.partitions)
        for pool in topology.pools:  # every series exists from the start (rate() from zero)
            for outcome in OUTCOMES:
                for prio in topology.priorities:
                    self.runs_finished.labels(outcome, pool, prio)
            for reason in SKIP_REASONS:
                self.slots_skipped.labels(reason, pool)
            self.retries.labels(pool)
            self.dead_letters.labels(pool)
            for kind in ("lease", "deadline"):
                self.lease_expiries.labels(pool, kind)
        for source in RESTORE_SOURCES:
            self.restore_seconds.labels(source)
        self._owned: set[int] = set()

    # ---- counted from committed transactions ------------------------------------------------

    def committed(self, outputs: Iterable[Any]) -> None:
        """Count what one committed transaction wrote (``processor.task.Output`` records);
        each label set is incremented once per transaction (a label lookup per run was
        ~5 % of the processor's CPU)."""
        self.transactions.inc()
        topo = self.topo
        finished: Tally[tuple[str, str, str]] = Tally()
        skipped: Tally[tuple[str, str]] = Tally()
        other: Tally[tuple[Any, tuple[str, ...]]] = Tally()
        unsigned = 0
        for o in outputs:
            value = o.value
            if o.topic == topo.poison:
                other[(self.poison, (o.key,))] += 1
                continue
            if o.topic == topo.command_results:
                unsigned += isinstance(value, CommandResult) and value.field == "signature" and not value.accepted
                continue
            if not isinstance(value, RunState):
                continue
            pool = value.spec.pool
            if o.topic == topo.runs and o.final:
                finished[(value.status.value, pool, value.spec.priority.value)] += 1
                if value.status is RunStatus.SKIPPED:
                    skipped[(skip_reason(value.reason), pool)] += max(1, value.skipped_count)
            if o.topic == topo.dead_letters:
                other[(self.dead_letters, (pool,))] += 1
            elif o.topic == topo.runs and value.status in (RunStatus.RETRY_WAIT, RunStatus.FAILED):
                if value.status is RunStatus.RETRY_WAIT:
                    other[(self.retries, (pool,))] += 1
                kind = expiry_kind(value.reason)
                if kind is not None:
                    other[(self.lease_expiries, (pool, kind))] += 1
        for key, n in finished.items():
            self.runs_finished.labels(*key).inc(n)
        for key2, n in skipped.items():
            self.slots_skipped.labels(*key2).inc(n)
        for (metric, labels), n in other.items():
            metric.labels(*labels).inc(n)
        if unsigned:
            self.unsigned_commands.inc(unsigned)

    def overloaded(self, window_runs: float, in_flight: int, deferred: int, lag_ms: int) -> None:
        """The overload governor after a tick."""
        self.overload_window.set(window_runs)
        self.overload_in_flight.set(in_flight)
        self.overload_deferred.set(deferred)
        self.overload_lag.set(lag_ms / 1000)

    def restored(self, source: str, seconds: float) -> None:
        """``source``: "standby", "checkpoint" or "rebuild"."""
        self.restore_seconds.labels(source).observe(seconds)

    # ---- sampled from state ---------------------------------------------------------------------

    def sample(self, now_ms: int, tasks: Mapping[int, PartitionState], directory: WorkerDirectory,
               standbys: int, consumer: GroupConsumer | None = None, inputs: Sequence[str] = (),
               history_lag: Mapping[int, int] | None = None, *, force: bool = False) -> bool:
        """Refresh the gauges if ``interval_ms`` passed (or ``force``); True if it did."""
        if not force and now_ms - self._sampled_at_ms < self.interval_ms:
            return False
        self._sampled_at_ms = now_ms
        owned = set(tasks)
        for p in self._owned - owned:
            self.partition_owned.remove(str(p))
        for p in owned:
            self.partition_owned.labels(str(p)).set(1)
        self._owned = owned
        self.standbys.set(standbys)
        waiting: dict[tuple[str, str], int] = {(pool, prio): 0 for pool in self.topo.pools
                                               for prio in self.topo.priorities}
        granted = {pool: 0 for pool in self.topo.pools}
        staged = {pool: 0 for pool in self.topo.pools}
        for task in tasks.values():
            self._scan_task(task, directory, waiting, granted, staged)
        for (pool, prio), n in waiting.items():
            self.queue_depth.labels(pool, prio).set(n)
        for pool in granted:
            self.staged.labels(pool).set(staged[pool])
            self.running.labels(pool).set(max(0, granted[pool] - staged[pool]))
            self.workers_live.labels(pool).set(directory.live(pool, now_ms))
            self.worker_slots_free.labels(pool).set(directory.free_slots(pool, now_ms))
        if consumer is not None:
            self._lag(consumer, sorted(owned), inputs)
        if history_lag is not None:
            self.committed_lag.labels(self.history_group, self.topo.runs).set(
                sum(n for p, n in history_lag.items() if p in owned))
        return True

    def _scan_task(self, task: PartitionState, directory: WorkerDirectory, waiting: dict[tuple[str, str], int],
                   granted: dict[str, int], staged: dict[str, int]) -> None:
        kv = task.kv
        # rw/<pool>\0<lane><prio>/<due>/<run_id>
        for key, _ in kv.scan(b"rw/", b"rw0", self.scan_max):
            pool_b, _, rest = key[3:].partition(b"\0")
            pool, prio = pool_b.decode(errors="replace"), _PRIORITY_OF_RANK.get(rest[1:2], "normal")
            if (pool, prio) in waiting:
                waiting[(pool, prio)] += 1
        # tq/<tenant>\0<pool>\0<run_id>: granted (staged or running)
        for key, _ in kv.scan(b"tq/", b"tq0", self.scan_max):
            parts = key[3:].split(b"\0", 2)
            if len(parts) == 3:
                pool = parts[1].decode(errors="replace")
                if pool in granted:
                    granted[pool] += 1
        # ws/<worker_id>\0<run_id>: staged on a worker, whose pool the directory knows
        for key, _ in kv.scan(b"ws/", b"ws0", self.scan_max):
            worker = key[3:].partition(b"\0")[0].decode(errors="replace")
            pool_of = directory.pool_of(worker)
            if pool_of in staged:
                staged[pool_of] += 1

    def _lag(self, consumer: GroupConsumer, partitions: list[int], inputs: Sequence[str]) -> None:
        tps = [(t, p) for t in inputs for p in partitions]
        lag = {t: 0 for t in inputs}
        try:
            positions = consumer.position(tps)
        except Exception:  # a consumer mid-rebalance: keep the last values
            return
        for (topic, p), pos in positions.items():
            high = consumer.high_watermark((topic, p))
            if high >= 0 and pos >= 0:
                lag[topic] += max(0, high - pos)
        for topic, n in lag.items():
            self.consumer_lag.labels(self.group_id, topic).set(n)
