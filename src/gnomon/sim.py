"""Simulate a gnomon cluster in one thread: the real ``Processor`` and ``Worker`` loops on
the in-memory event log (``gnomon.eventlog.memory``), with seeded faults.

``SimCluster(seed)`` runs N processors (one consumer group, transactions, standbys,
checkpoints, restore from the changelogs) and M workers (inbox, local timer, adverts,
heartbeats, hand-backs) against a ``MemoryEventLog`` and a ``FakeClock``. Nothing runs
on another thread and nothing reads the wall clock, so a seed replays exactly:

* processors and workers are stepped in an order drawn from the seed's RNG, after the
  clock moved by ``step_ms``;
* a worker's attempts go through a ``StepRunner`` (the ``AttemptRunner`` the worker
  takes by injection): it calls the handler at once, in process (``SimExecutor``, no
  thread), and delivers its result when the simulated duration has passed (or the
  attempt was told to stop, or reached its timeout). The worker itself is the real one:
  it reports the start at once and heartbeats while the attempt "runs";
* the standbys' work per step is bounded by a constant clock, not by elapsed time.

Faults (``SimFaults``), drawn per step from ``random.Random(seed)`` during ``run_for``:

* ``abort``: a processor's next commit fails; it aborts and rewinds state and positions;
* ``kill``: a processor dies (no close, its state store possibly dropped); its session
  lapses, its partitions move; it comes back later and restores from the changelogs;
* ``rebalance``: a processor stops cleanly (checkpoints, leaves the group) and rejoins;
* ``zombie``: a processor stalls past its session timeout, then serves one more batch
  as if nothing happened: its commit must be refused (fencing), then it learns it lost
  its partitions;
* ``duplicate`` / ``reorder``: plain producers (workers, the client) deliver a record
  of run-events or job-commands twice, or after records sent later;
* ``worker_crash``: a worker vanishes with its staged and running attempts; a new one
  starts later;
* ``skew_ms``: each worker's clock is off the cluster's by up to this, either way;
* ``slow_markers``: a processor's next commit is answered but its records become
  readable 1-8 s later (Kafka's PrepareCommit whose markers wait for a coordinator cut
  off or moving); a new owner's restore must wait for them, not decide again;
* ``late_records``: a processor's next transaction sends its offsets while its records
  are still on their way (unless it flushed them first), commits, and stalls past its
  session: the records land 1-8 s later, after the group moved its partitions on;
* with ``history=True`` the history projector runs too (``gnomon.history.projector``, on
  the same log, into an in-memory history store, publishing run exports), and two more
  faults apply to it: ``projector_crash`` (it vanishes without a commit; a new one in
  its group takes over once the session lapses and replays from the last commit) and
  ``history_outage`` (the store refuses writes for up to ``history_outage_ms``: the
  batch is rewound and replayed; the processor does not purge what history lacks);
* with ``alerts=True`` the alerter runs too (``gnomon.alerts.Alerter``, group
  ``gnomon-alerter`` on the same log, its configs read from the alert-configs topic) and
  calls a simulated webhook (``SimWebhook``). Its deliveries are queued and run at its
  next step (``StepExecutor``, no thread; the waits between a delivery's calls are not
  slept), so a crash between steps loses deliveries in flight, as a kill -9 does. Three
  more faults: ``alerter_crash`` (it vanishes without a commit; a new one replays from
  the group's last commit once the session lapses), ``webhook_fail`` (per call) and
  ``webhook_outage`` (every call fails for up to ``webhook_outage_ms``).

``history_report()`` runs ``gnomon.checker.HistoryChecker`` over what was committed to
the run ledger and the worker inbox (as the chaos suite reads Kafka); ``history_gaps()``
compares the projected history with the committed ledger and job states;
``alert_gaps()`` compares the alerts the webhook saw with those the committed ledger
raises (``gnomon.core.alerts.decide`` over each run's states in order).
"""

from __future__ import annotations

import hashlib
import heapq
import json
import random
from collections import deque
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gnomon import codec
from gnomon.alerts.sender import AlertDeliveryError
from gnomon.alerts.service import Alerter
from gnomon.checker import STUCK_MS, CheckReport, HistoryChecker
from gnomon.core import jobs as J
from gnomon.core import runs as R
from gnomon.core.alerts import Alert, AlertBook, AlertConfig, AlertMemory, DeliveryPolicy
from gnomon.core.clock import Clock, FakeClock
from gnomon.core.command_auth import OPERATOR, CommandKey, Headers, MemoryKeyring
from gnomon.core.command_auth import sign as sign_command
from gnomon.core.errors import HistoryStoreError
from gnomon.core.model import OverlapPolicy, Schedule, Target, Upstream
from gnomon.eventlog.memory import MemoryEventLog, MemoryGroupConsumer, MemoryProducer, PlainFaults
from gnomon.history.base import HistoryBatch
from gnomon.history.export import RunExportPublisher
from gnomon.history.memory import InMemoryHistoryStore
from gnomon.history.projector import HistoryProjector
from gnomon.processor import growth
from gnomon.processor.runtime import Processor, ProcessorConfig
from gnomon.processor.stores import MemoryStores
from gnomon.topology import Topology, load_topology
from gnomon.worker.attempt import AttemptContext, AttemptResult, encode_output
from gnomon.worker.executors import Handler
from gnomon.worker.worker import Worker

TENANT = "sim"
HANDLER = "sim"


class OffsetClock:
    """A clock that is off another one by a fixed amount (a worker's skewed clock)."""

    def __init__(self, base: Clock, offset_ms: int) -> None:
        self.base = base
        self.offset_ms = offset_ms

    def now_ms(self) -> int:
        return self.base.now_ms() + self.offset_ms


class SimExecutor:
    """Calls the worker's registered handler in process, on the caller's thread."""

    def __init__(self, handlers: dict[str, Handler]) -> None:
        self.handlers = handlers

    def execute(self, target: Target, ctx: AttemptContext) -> AttemptResult:
        fn = self.handlers.get(target.handler or "")
        if fn is None:
            return AttemptResult(R.Outcome.FAILED, None, f"no handler {target.handler!r}")
        try:
            value = fn(ctx)
        except Exception as exc:
            return AttemptResult(R.Outcome.FAILED, 1, f"{type(exc).__name__}: {exc}")
        output, _why = encode_output(value)
        return AttemptResult(R.Outcome.SUCCEEDED, 0, None, output)


class StepRunner:
    """Deterministic attempts (``worker.AttemptRunner``): started at once, ended when the
    simulated duration is over, at the timeout, or when the attempt is told to stop."""

    def __init__(self, clock: Clock, duration_ms: Callable[[AttemptContext], int]) -> None:
        self.clock = clock
        self.duration_ms = duration_ms
        self._pending: list[tuple[int, int, AttemptContext, AttemptResult, Callable[[AttemptResult], None]]] = []
        self._seq = 0
        self.started = 0
        self.launched: list[tuple[str, int]] = []  # (run id, at ms) of every attempt started here

    def start(self, ctx: AttemptContext, begin: Callable[[], None], work: Callable[[], AttemptResult],
              end: Callable[[AttemptResult], None]) -> None:
        begin()
        self.started += 1
        self.launched.append((ctx.run_id, self.clock.now_ms()))
        result = work()
        took = self.duration_ms(ctx)
        limit = int(ctx.timeout_s * 1000)
        if took >= limit:
            took, result = limit, AttemptResult(R.Outcome.FAILED, None, f"timed out after {ctx.timeout_s:g} s")
        self._seq += 1
        heapq.heappush(self._pending, (self.clock.now_ms() + took, self._seq, ctx, result, end))

    def step(self) -> int:
        now = self.clock.now_ms()
        due = [p for p in self._pending if p[0] <= now or p[2].stop.is_set()]
        if not due:
            return 0
        self._pending = [p for p in self._pending if not (p[0] <= now or p[2].stop.is_set())]
        heapq.heapify(self._pending)
        for at, _, ctx, result, end in sorted(due, key=lambda p: (p[0], p[1])):
            if at > now:  # stopped before its end
                result = AttemptResult(R.Outcome.FAILED, None, f"stopped: {ctx.stop_reason}")
            end(result)
        return len(due)

    def running(self) -> int:
        return len(self._pending)


def sim_handler(ctx: AttemptContext) -> Any:
    """The handler every simulated job calls. Payload: ``{"fail_attempts": k}`` fails the
    first k attempts of each run."""
    payload = ctx.payload if isinstance(ctx.payload, dict) else {}
    if ctx.attempt <= int(payload.get("fail_attempts", 0)):
        raise RuntimeError(f"attempt {ctx.attempt} fails on purpose")
    return {"run": ctx.run_id, "attempt": ctx.attempt}


@dataclass
class SimFaults:
    """Per-step probabilities of each fault (see the module doc)."""

    abort: float = 0.0
    kill: float = 0.0
    rebalance: float = 0.0
    zombie: float = 0.0
    worker_crash: float = 0.0
    duplicate: float = 0.0  # per record of run-events / job-commands from a plain producer
    reorder: float = 0.0
    skew_ms: int = 0
    projector_crash: float = 0.0  # with history=True
    history_outage: float = 0.0
    history_outage_ms: int = 5_000
    alerter_crash: float = 0.0  # with alerts=True
    webhook_fail: float = 0.0  # per webhook call
    webhook_outage: float = 0.0
    webhook_outage_ms: int = 5_000
    slow_markers: float = 0.0  # a processor's next commit answered, its records readable 1-8 s later
    late_records: float = 0.0  # a processor's next transaction's records on their way 1-8 s; it stalls

    @classmethod
    def mixed(cls) -> SimFaults:
        return cls(abort=0.02, kill=0.01, rebalance=0.01, zombie=0.01, worker_crash=0.01, duplicate=0.05,
                   reorder=0.05, skew_ms=1_500, projector_crash=0.01, history_outage=0.01, alerter_crash=0.01,
                   webhook_fail=0.1, webhook_outage=0.005, slow_markers=0.01)


@dataclass
class _Proc:
    name: str
    stores: MemoryStores = field(default_factory=MemoryStores)
    proc: Processor | None = None
    down_until_ms: int | None = None  # dead or stopped; restarts then
    paused_until_ms: int | None = None  # stalled (a zombie to be)
    stall_after_commit_ms: int | None = None  # stalls this long once its next commit is answered


@dataclass
class _Worker:
    index: int
    generation: int = 0
    worker: Worker | None = None
    runner: StepRunner | None = None
    down_until_ms: int | None = None


def _zero() -> float:
    return 0.0


def _no_wait(_s: float) -> None:
    """The wait between a simulated delivery's calls: none (the simulation steps time)."""


class SimHistoryStore(InMemoryHistoryStore):
    """The in-memory history store with outages: ``write_batch`` fails until ``down_until_ms``."""

    def __init__(self, clock: Clock) -> None:
        super().__init__()
        self.clock = clock
        self.down_until_ms = 0
        self.refused = 0

    def write_batch(self, batch: HistoryBatch) -> None:
        if self.clock.now_ms() < self.down_until_ms:
            self.refused += 1
            raise HistoryStoreError("history store down (simulated outage)")
        super().write_batch(batch)


class StepExecutor(Executor):
    """The alerter's deliveries, queued at submit and run, in order, when the simulation
    steps the alerter (``run_pending``); a crash drops what is queued."""

    def __init__(self) -> None:
        self._queue: deque[tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]] = deque()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        self._queue.append((future, fn, args, kwargs))
        return future

    def run_pending(self) -> int:
        """Run what was queued before this call (a delivery's follow-up runs next time)."""
        n = len(self._queue)
        for _ in range(n):
            future, fn, args, kwargs = self._queue.popleft()
            try:
                future.set_result(fn(*args, **kwargs))
            except Exception as exc:  # the alerter's delivery handles its own errors; kept as the pool would
                future.set_exception(exc)
        return n

    def pending(self) -> int:
        return len(self._queue)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._queue.clear()  # a clean stop: what was not delivered is read again after a restart


class SimWebhook:
    """The tenants' alert receiver. Counts each call and each delivery by the alert's
    idempotency key; a call fails with probability ``p_fail`` (drawn from the seed) or
    while the receiver is down (``down_until_ms``)."""

    def __init__(self, clock: Clock, rng: random.Random, p_fail: float = 0.0) -> None:
        self.clock = clock
        self.rng = rng
        self.p_fail = p_fail
        self.down_until_ms = 0
        self.calls: dict[str, int] = {}
        self.delivered: dict[str, Alert] = {}
        self.repeats = 0  # deliveries of a key already delivered (at-least-once; receivers drop them)

    def send(self, alert: Alert, url: str, timeout_s: float) -> int:
        self.calls[alert.key] = self.calls.get(alert.key, 0) + 1
        if self.clock.now_ms() < self.down_until_ms:
            raise AlertDeliveryError("HTTP 503 (simulated outage)")
        if self.p_fail and self.rng.random() < self.p_fail:
            raise AlertDeliveryError("HTTP 500 (simulated)")
        if alert.key in self.delivered:
            self.repeats += 1
        self.delivered[alert.key] = alert
        return 200


SIM_WEBHOOK_URL = "https://hooks.sim.invalid/gnomon"
SIM_DELIVERY = DeliveryPolicy(attempts_max=3, backoff_base_s=0.5, backoff_cap_s=2.0, in_flight_max=1_000,
                              tenant_in_flight_max=1_000, tenant_backlog_max=10_000)


class _LogSink:
    """The API's producer on the in-memory log: each send is written (committed) at once
    and answers where it went, as Kafka's acknowledgement does."""

    def __init__(self, log: MemoryEventLog) -> None:
        self.log = log

    def send(self, topic: str, key: str, value: bytes | None, *, headers: Headers = (), **_: Any) -> tuple[int, int]:
        from gnomon.adapters.kafka import partition_for

        partition = partition_for(key, self.log.partitions_of(topic))
        return partition, self.log.append(topic, key.encode(), value, partition, headers=headers)


class SimKeys:
    """The simulation's command keys (core.command_auth): one per tenant, derived from
    the seed, made on first use, and the operator's. ``keyring`` is what the processors
    verify with; ``sign`` is what the API's sink and ``submit`` sign with."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._keys: dict[str, CommandKey] = {}
        self.keyring = MemoryKeyring(self._keys)
        self.operator = self.key(OPERATOR)

    def key(self, tenant: str) -> CommandKey:
        key_id = f"sim-{'operator' if tenant == OPERATOR else tenant}"
        found = self._keys.get(key_id)
        if found is None:
            secret = hashlib.sha256(f"{self.seed}/{tenant}".encode()).digest()
            found = self._keys[key_id] = CommandKey(key_id, tenant, secret)
        return found

    def sign(self, tenant: str, topic: str, key: bytes | None, value: bytes | None) -> Headers:
        return sign_command(self.key(tenant), topic, key, value)


class _OperatorSigned:
    """A producer whose job-command records are signed with the operator's key (the
    tests' raw commands), unless they carry headers of their own."""

    def __init__(self, inner: MemoryProducer, keys: SimKeys, topic: str) -> None:
        self.inner = inner
        self.keys = keys
        self.topic = topic

    def produce(self, topic: str, key: bytes | None, value: bytes | None, *, on_delivery: Any = None,
                headers: Headers = ()) -> None:
        if topic == self.topic and not headers:
            headers = sign_command(self.keys.operator, topic, key, value)
        self.inner.produce(topic, key, value, on_delivery=on_delivery, headers=headers)

    def poll(self, timeout_s: float) -> int:
        return self.inner.poll(timeout_s)

    def flush(self, timeout_s: float) -> int:
        return self.inner.flush(timeout_s)

    def pending(self) -> int:
        return self.inner.pending()


class SimCluster:
    def __init__(self, seed: int, *, processors: int = 2, workers: int = 2, partitions: int = 4,
                 faults: SimFaults | None = None, standbys: bool = True, worker_slots: int = 8,
                 step_ms: int = 100, session_timeout_ms: int = 3_000,
                 run_cfg: R.RunConfig | None = None, sched_cfg: J.SchedulerConfig | None = None,
                 duration_ms: tuple[int, int] = (100, 3_000), topology: Topology | None = None,
                 overload_budget_per_tick: int | None = None, worker_stage_max: int | None = None,
                 history: bool = False, alerts: bool = False,
                 worker_tenants: tuple[str, ...] = (TENANT,),
                 shared: tuple[FakeClock, MemoryEventLog] | None = None) -> None:
        """``shared``: the clock and log of another cluster, for a second region's
        namespace on the same (stretched) cluster: give ``topology`` that region's
        (``gnomon.topology.regional``), and step the clusters in turn."""
        self.seed = seed
        self.rng = random.Random(seed)
        self.clock = FakeClock() if shared is None else shared[0]
        self.topo = replace(topology or load_topology(), partitions=partitions)
        self.log = MemoryEventLog(self.clock, partitions=partitions) if shared is None else shared[1]
        self.faults = faults or SimFaults()
        self.step_ms = step_ms
        self.worker_slots = worker_slots
        self.worker_stage_max = worker_stage_max  # None: the Worker's default
        # worker i serves worker_tenants[i % n] alone: a pool shared by tenants runs only
        # sandboxed targets, and the simulation's handlers run in process
        self.worker_tenants = worker_tenants
        self.duration_range = duration_ms
        self.job_durations: dict[str, tuple[int, int]] = {}  # per job, instead of duration_range
        self.run_cfg = run_cfg or R.RunConfig(lease_ms=8_000, stage_ahead_ms=3_000, timeout_grace_ms=5_000)
        self.sched_cfg = sched_cfg or J.SchedulerConfig(lookahead_ms=5_000)
        self.cfg = ProcessorConfig(bootstrap="memory", state_dir=Path("/nonexistent"), standbys=standbys,
                                   session_timeout_ms=session_timeout_ms, transaction_timeout_ms=5_000,
                                   tick_interval_ms=200, sched=self.sched_cfg, runs=self.run_cfg,
                                   overload_budget_per_tick=overload_budget_per_tick)
        self.procs = [_Proc(f"p{i}") for i in range(processors)]
        self.workers = [_Worker(i) for i in range(workers)]
        self.events: list[str] = []  # the faults injected, in order (for a failing seed's message)
        self.counts: dict[str, int] = {}
        self.registered: list[str] = []  # every job a RegisterJob was submitted for (the checker's roll)
        self.paused_at: dict[str, int] = {}  # job -> when the scenario last sent it a pause
        self.keys = SimKeys(seed)
        self.client = _OperatorSigned(self.log.producer(client_id="sim-client"), self.keys, self.topo.job_commands)
        self._faulting = False
        self._scheduled: list[tuple[int, int, Callable[[], None]]] = []  # (at, seq, action)
        self.log.plain_faults = PlainFaults(random.Random(f"{seed}/plain"),
                                            frozenset({self.topo.run_events, self.topo.job_commands}))
        for slot in self.procs:
            self._start_proc(slot)
        for w in self.workers:
            self._start_worker(w)
        # the history projector, when asked for: its store outlives it (Cassandra)
        self.history: SimHistoryStore | None = SimHistoryStore(self.clock) if history else None
        self.projector: HistoryProjector | None = None
        self.projector_down_until_ms: int | None = None
        self._projectors = 0
        if self.history is not None:
            self._start_projector()
        # the alerter and its webhook, when asked for
        self.webhook: SimWebhook | None = None
        self.alerter: Alerter | None = None
        self.alerter_down_until_ms: int | None = None
        self.given_up: dict[str, str] = {}  # alert key -> why, as the alerter logged it
        self._deliveries = StepExecutor()
        if alerts:
            self.webhook = SimWebhook(self.clock, random.Random(f"{seed}/webhook"), self.faults.webhook_fail)
            self._start_alerter()
            # its first poll joins the group and commits where it starts (the ledger's end,
            # now the start): a crash later resumes there. (A group that never committed
            # starts at the end, by design: the scenarios alert from their beginning.)
            assert self.alerter is not None
            self.alerter.run_once(0.0)

    # ---- members --------------------------------------------------------------------------

    def _start_proc(self, slot: _Proc) -> None:
        proc = Processor(replace(self.cfg, instance_id=slot.name), self.clock, self.topo, log=self.log,
                         stores=slot.stores, monotonic=_zero, keyring=self.keys.keyring)
        proc.start()
        slot.proc, slot.down_until_ms, slot.paused_until_ms = proc, None, None

    def _start_worker(self, w: _Worker) -> None:
        skew = self.rng.randint(-self.faults.skew_ms, self.faults.skew_ms) if self.faults.skew_ms else 0
        clock: Clock = OffsetClock(self.clock, skew) if skew else self.clock
        runner = StepRunner(clock, self._duration)
        executor = SimExecutor({})
        worker = Worker("default", worker_id=f"w{w.index}.{w.generation}", concurrency_max=self.worker_slots,
                        clock=clock, topology=self.topo, tenants=[self.worker_tenants[w.index % len(self.worker_tenants)]], log=self.log,
                        executor=executor, runner=runner, handback_after_ms=1_000,
                        stage_max=self.worker_stage_max)
        worker.handler(HANDLER)(sim_handler)
        executor.handlers = worker.handlers
        worker.start()
        w.worker, w.runner, w.down_until_ms = worker, runner, None
        if skew:
            self._event(f"worker {worker.worker_id} clock skew {skew:+d} ms")

    def _start_projector(self) -> None:
        assert self.history is not None
        self._projectors += 1
        exporter = RunExportPublisher(self.log.producer(client_id=f"sim-exports-{self._projectors}"),
                                      self.topo.run_exports)
        # write_attempts=1: a failed write rewinds at once (the sim steps; nothing sleeps)
        self.projector = HistoryProjector(self.history, self.log, write_attempts=1, poll_timeout_s=0.0,
                                          session_timeout_ms=self.cfg.session_timeout_ms, exporter=exporter)
        self.projector_down_until_ms = None

    def _project(self) -> None:
        self._project_once()

    def _project_once(self) -> int | None:
        """One batch of the projector: records read, or None when the store refused the
        write (rewound: the next call replays the batch) or the projector is down."""
        if self.projector is None:
            return None
        try:
            return self.projector.run_once(self.projector.batch_max, 0.0)
        except HistoryStoreError:
            self._count("history_write_failed")
            return None

    def project_all(self) -> bool:
        """Let the projector read everything committed so far, without a step (nothing
        else moves meanwhile). False when it could not: it is down, or the store refused
        a write (the batch is rewound, as in a step)."""
        for _ in range(10_000):  # bounded: each call reads a batch or returns 0
            n = self._project_once()
            if n is None or n == 0:
                return n == 0
        return False

    def crash_projector(self, *, down_ms: int) -> None:
        """The projector vanishes (no commit, no close): its session lapses, a new one replays."""
        self.projector = None
        self.projector_down_until_ms = self.clock.now_ms() + down_ms
        self._count("projector_crash")
        self._event("projector crashed")

    def history_outage(self, ms: int) -> None:
        assert self.history is not None
        self.history.down_until_ms = self.clock.now_ms() + ms
        self._count("history_outage")
        self._event(f"history store down for {ms} ms")

    def _start_alerter(self) -> None:
        from gnomon.alerts.feed import AlertFeed

        assert self.webhook is not None
        self._deliveries = StepExecutor()
        book = AlertBook()
        feed = AlertFeed("", self.topo, book, log=self.log)
        self.alerter = Alerter(book, self.webhook, SIM_DELIVERY, log=self.log, feed=feed, clock=self.clock,  # type: ignore[arg-type]
                               batch_max=200, poll_timeout_s=0.0, executor=self._deliveries, retry_sleep=_no_wait,
                               on_given_up=self._given_up)
        self.alerter.topology_partitions = self.topo.partitions  # (this cluster's count at creation)
        self.alerter_down_until_ms = None

    def _given_up(self, alert: Alert, why: str) -> None:
        self.given_up[alert.key] = why

    def _alert(self) -> None:
        """One step of the alerter: deliver what the last step queued, then read the
        ledger (queueing its alerts) and commit what is settled."""
        assert self.alerter is not None
        self._deliveries.run_pending()
        self.alerter.run_once(0.0)

    def alert_all(self) -> bool:
        """Let the alerter read everything committed so far and run every delivery it
        queues, without a step (nothing else moves meanwhile). False when it is down."""
        if self.alerter is None:
            return False
        for _ in range(10_000):  # bounded: each round reads a batch or delivers what is queued
            ran = self._deliveries.run_pending()
            if self.alerter.run_once(0.0) == 0 and ran == 0 and self._deliveries.pending() == 0:
                return True
        return False

    def set_alerts(self, late_s: int | None = None, tenant: str = TENANT) -> None:
        """The tenant's alert config, on the alert-configs topic (as ``PUT /v1/alerts``)."""
        from gnomon.adapters.kafka import partition_for

        config = AlertConfig(tenant=tenant, url=SIM_WEBHOOK_URL, late_s=late_s, updated_at_ms=self.clock.now_ms())
        topic = self.topo.alert_configs
        self.log.append(topic, tenant.encode(), codec.encode(config, topic),
                        partition_for(tenant, self.log.partitions_of(topic)))

    def crash_alerter(self, *, down_ms: int) -> None:
        """The alerter vanishes (no commit, no close, its queued deliveries lost)."""
        self.alerter = None
        self._deliveries = StepExecutor()
        self.alerter_down_until_ms = self.clock.now_ms() + down_ms
        self._count("alerter_crash")
        self._event("alerter crashed")

    def webhook_outage(self, ms: int) -> None:
        assert self.webhook is not None
        self.webhook.down_until_ms = self.clock.now_ms() + ms
        self._count("webhook_outage")
        self._event(f"webhook down for {ms} ms")

    def _duration(self, ctx: AttemptContext) -> int:
        lo, hi = self.job_durations.get(ctx.job_id, self.duration_range)
        return random.Random(f"{self.seed}/{ctx.run_id}/{ctx.attempt}").randint(lo, hi)

    def processor(self, name: str) -> Processor:
        proc = self._slot(name).proc
        assert proc is not None, f"{name} is down"
        return proc

    def live_processors(self) -> list[Processor]:
        return [s.proc for s in self.procs if s.proc is not None and s.paused_until_ms is None]

    def consumer_of(self, proc: Processor) -> MemoryGroupConsumer:
        assert isinstance(proc.consumer, MemoryGroupConsumer)
        return proc.consumer

    # ---- input ----------------------------------------------------------------------------

    def submit(self, cmd: Any) -> None:
        """A job command, as the API or the SDK would produce it."""
        if isinstance(cmd, J.RegisterJob):
            self.registered.append(cmd.job_id)
        elif isinstance(cmd, J.PauseJob):
            self.paused_at[cmd.job_id] = self.clock.now_ms()  # (its slots before are due, wherever it points)
        key, value = cmd.job_id.encode(), codec.encode(cmd)
        self.client.produce(self.topo.job_commands, key, value,
                            headers=self.keys.sign(cmd.tenant, self.topo.job_commands, key, value))

    def register(self, job_id: str, cron: str, *, fail_attempts: int = 0, max_attempts: int = 3,
                 timeout_s: int = 60, priority: str = "normal", late_max_s: int | None = None,
                 tenant: str = TENANT, run_at_ms: int | None = None, schedule: Schedule | None = None,
                 exclude_calendars: tuple[str, ...] = (), after: tuple[str | Upstream, ...] = (),
                 wait_max_s: int | None = None, overlap: OverlapPolicy = OverlapPolicy.ALLOW,
                 duration_ms: tuple[int, int] | None = None) -> None:
        """A job of ``tenant`` on ``cron`` (or, with ``run_at_ms``, one-time; with
        ``schedule``, that one: an interval, bounds), as the API registers it; ``after``:
        its upstream jobs (an id waits for success); ``cron`` "" with ``after``: no
        schedule of its own, it runs after them. ``duration_ms``: how long its attempts
        run (default: the cluster's range)."""
        from gnomon.core.model import JobSpec, Priority, RetryPolicy, TargetType

        if duration_ms is not None:
            self.job_durations[job_id] = duration_ms

        if schedule is None:
            # (cron "" with after: no schedule of its own, the job runs after its upstreams)
            schedule = (Schedule(run_at_ms=run_at_ms) if run_at_ms is not None
                        else Schedule(cron=cron) if cron or not after else Schedule())
        spec = JobSpec(name=job_id, schedule=schedule, target=Target(TargetType.HANDLER, handler=HANDLER),
                       payload_json=json.dumps({"fail_attempts": fail_attempts}), timeout_s=timeout_s,
                       retry=RetryPolicy(max_attempts=max_attempts, backoff_base_s=0.5, backoff_cap_s=2.0),
                       priority=Priority(priority), late_max_s=late_max_s, exclude_calendars=exclude_calendars,
                       after=tuple(Upstream(u) if isinstance(u, str) else u for u in after), wait_max_s=wait_max_s,
                       overlap=overlap)
        self.submit(J.RegisterJob(job_id, tenant, spec, self.clock.now_ms()))

    def put_calendar(self, name: str, dates: list[Any], *, tz: str = "UTC", tenant: str = TENANT) -> None:
        """The tenant's calendar on the calendars topic (as ``PUT /v1/calendars/{name}``);
        the processors read it between batches."""
        from gnomon.adapters.kafka import partition_for
        from gnomon.core.calendars import parse_calendar

        topic = self.topo.calendars
        cal = parse_calendar(tenant, name, {"timezone": tz, "dates": dates}, self.clock.now_ms())
        self.log.append(topic, cal.key.encode(), codec.encode(cal, topic),
                        partition_for(cal.key, self.log.partitions_of(topic)))

    def set_limits(self, tenant: str, **limits: int) -> None:
        """The tenant's limits on the tenants topic (as ``PUT /v1/tenants/{tenant}``);
        the processors read them between batches."""
        from gnomon.adapters.kafka import partition_for
        from gnomon.core.tenants import TenantLimits

        topic = self.topo.tenants
        record = TenantLimits(tenant, **limits, updated_at_ms=self.clock.now_ms())
        self.log.append(topic, tenant.encode(), codec.encode(record, topic),
                        partition_for(tenant, self.log.partitions_of(topic)))

    # ---- time -----------------------------------------------------------------------------

    def grow(self, count: int) -> None:
        """``gnomon infra grow --to count``: the co-partitioned topics get ``count``
        partitions (producers place keys by it at once), then each old partition of the
        job-commands topic gets its grow marker (``gnomon.processor.growth``)."""
        old = self.log.partitions_of(self.topo.job_commands)
        growth.check_grow(old, count)
        self.log.add_partitions(self.topo.co_partitioned(), count)
        for p in range(old):
            self.log.append(self.topo.job_commands, growth.GROW_KEY.encode(), growth.encode_count(count), p)
        self._event(f"partitions grown from {old} to {count}")

    def at(self, at_ms: int, action: Callable[[], None]) -> None:
        """Do ``action`` (e.g. submit a command) at the first step at or after ``at_ms``."""
        heapq.heappush(self._scheduled, (at_ms, len(self._scheduled) + len(self.events), action))

    def step(self, *, advance: bool = True) -> None:
        """One step of every member; ``advance`` False: at the same time as the step of
        the cluster whose clock this one shares (``shared``), after it."""
        if advance:
            self.clock.advance(self.step_ms)
        now = self.clock.now_ms()
        while self._scheduled and self._scheduled[0][0] <= now:
            heapq.heappop(self._scheduled)[2]()
        if self._faulting:
            self._inject(now)
        self._revive(now)
        members: list[Callable[[], None]] = []
        for s in self.procs:
            if s.proc is not None and s.paused_until_ms is None:
                members.append(self._proc_step(s))
        for w in self.workers:
            if w.worker is not None and w.runner is not None:
                members.append(self._worker_step(w.worker, w.runner))
        if self.projector is not None:
            members.append(self._project)
        if self.alerter is not None:
            members.append(self._alert)
        self.rng.shuffle(members)
        for member in members:
            member()
        self.client.poll(0)

    def _proc_step(self, s: _Proc) -> Callable[[], None]:
        def step() -> None:
            assert s.proc is not None
            before = s.proc.transactions
            s.proc.step()
            if s.stall_after_commit_ms is not None and s.proc is not None and s.proc.transactions != before:
                ms, s.stall_after_commit_ms = s.stall_after_commit_ms, None
                self.stall(s.name, ms)
        return step

    @staticmethod
    def _worker_step(worker: Worker, runner: StepRunner) -> Callable[[], None]:
        def step() -> None:
            runner.step()
            worker.step(0)
        return step

    def owner(self, partition: int) -> str | None:
        """The live processor that owns ``partition`` now, if one does."""
        for s in self.procs:
            if s.proc is not None and s.paused_until_ms is None and partition in s.proc.tasks:
                return s.name
        return None

    def run_for(self, duration_ms: int, *, faults: bool = True) -> None:
        self._faulting = faults
        self.log.plain_faults = replace(self.log.plain_faults, p_duplicate=self.faults.duplicate if faults else 0.0,
                                        p_reorder=self.faults.reorder if faults else 0.0) \
            if self.log.plain_faults is not None else None
        end = self.clock.now_ms() + duration_ms
        while self.clock.now_ms() < end:
            self.step()
        self._faulting = False

    def heal(self, settle_ms: int = 30_000) -> None:
        """Stop injecting, bring everything back, and let the cluster settle."""
        now = self.clock.now_ms()
        for s in self.procs:
            if s.down_until_ms is not None:
                s.down_until_ms = now
            if s.paused_until_ms is not None:
                s.paused_until_ms = now
        for w in self.workers:
            if w.down_until_ms is not None:
                w.down_until_ms = now
        if self.projector_down_until_ms is not None:
            self.projector_down_until_ms = now
        if self.history is not None:
            self.history.down_until_ms = 0
        if self.alerter_down_until_ms is not None:
            self.alerter_down_until_ms = now
        if self.webhook is not None:
            self.webhook.down_until_ms = 0
            self.webhook.p_fail = 0.0
        self.run_for(settle_ms, faults=False)

    # ---- faults ---------------------------------------------------------------------------

    def _event(self, what: str) -> None:
        self.events.append(f"t+{self.clock.now_ms() - FakeClock().now_ms()}ms {what}")

    def _count(self, kind: str) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1

    def _slot(self, name: str) -> _Proc:
        return next(s for s in self.procs if s.name == name)

    def fail_next_commit(self, name: str) -> None:
        """``name``'s next commit fails (abortable): it must abort and rewind."""
        self.log.fail_next_commit.add(f"gnomon-processor-{name}")
        self._count("abort")
        self._event(f"{name}: next commit fails")

    def delay_commit_markers(self, name: str, ms: int) -> None:
        """``name``'s next commit is answered but its records become visible ``ms`` later
        (Kafka's PrepareCommit with the markers not written: a coordinator cut off, or
        moving to another broker)."""
        self.log.slow_markers[f"gnomon-processor-{name}"] = ms
        self._event(f"{name}: next commit's markers land {ms} ms late")

    def delay_records(self, name: str, ms: int, *, stall_ms: int) -> None:
        """``name``'s next transaction's records are still on their way when it sends its
        offsets and commits (a process starved, a broker slow): in their logs once it
        flushes them, or else ``ms`` after its commit was answered, with its markers; and
        once that commit is answered, ``name`` stalls ``stall_ms`` (past its session: its
        partitions move while the records are on their way)."""
        self.log.late_records[f"gnomon-processor-{name}"] = ms
        self._slot(name).stall_after_commit_ms = stall_ms
        self._event(f"{name}: next transaction's records land {ms} ms late unless flushed, then it stalls")

    def kill(self, name: str, *, drop_state: bool, down_ms: int) -> None:
        """``name`` dies: no close, so its session lapses; ``drop_state``: its disk too."""
        s = self._slot(name)
        s.proc = None
        if drop_state:
            s.stores = MemoryStores()
        s.down_until_ms = self.clock.now_ms() + down_ms
        self._count("kill")
        self._event(f"{name}: killed{' with its state' if drop_state else ''}")

    def stop(self, name: str, *, down_ms: int) -> None:
        """``name`` stops cleanly (checkpoints, leaves the group) and rejoins later."""
        s = self._slot(name)
        assert s.proc is not None
        s.proc.close()
        s.proc = None
        s.down_until_ms = self.clock.now_ms() + down_ms
        self._count("rebalance")
        self._event(f"{name}: stopped cleanly")

    def stall(self, name: str, ms: int) -> None:
        """``name`` is not stepped for ``ms``; then it serves one more batch as if its session
        had not lapsed (a zombie)."""
        self._slot(name).paused_until_ms = self.clock.now_ms() + ms
        self._count("zombie")
        self._event(f"{name}: stalls for {ms} ms")

    def crash_worker(self, index: int, *, down_ms: int) -> None:
        w = self.workers[index]
        assert w.worker is not None
        self._event(f"worker {w.worker.worker_id} crashed")
        w.worker = w.runner = None
        w.generation += 1
        w.down_until_ms = self.clock.now_ms() + down_ms
        self._count("worker_crash")

    def cut_worker(self, index: int, *, writes_ms: int, reads_ms: int) -> None:
        """Worker ``index`` is cut off from the brokers but keeps running (its timers fire,
        it reports starts): what it sends waits unanswered for ``writes_ms``, then lands in
        order; its inbox reads nothing for ``reads_ms``."""
        w = self.workers[index]
        assert w.worker is not None
        client, now = f"worker-{w.worker.worker_id}", self.clock.now_ms()
        self.log.cut_writes_until_ms[client] = now + writes_ms
        self.log.cut_reads_until_ms[client] = now + reads_ms
        self._count("worker_cut")
        self._event(f"worker {w.worker.worker_id} cut off: writes for {writes_ms} ms, reads for {reads_ms} ms")

    def _inject(self, now: int) -> None:
        f, rng = self.faults, self.rng
        live = [s.name for s in self.procs if s.proc is not None and s.paused_until_ms is None]
        if live and rng.random() < f.abort:
            self.fail_next_commit(rng.choice(live))
        if len(live) > 1 and rng.random() < f.kill:
            name = rng.choice(live)
            live.remove(name)
            self.kill(name, drop_state=rng.random() < 0.5, down_ms=rng.randint(500, 6_000))
        if live and rng.random() < f.rebalance:
            name = rng.choice(live)
            live.remove(name)
            self.stop(name, down_ms=rng.randint(0, 3_000))
        if len(live) > 1 and rng.random() < f.zombie:
            self.stall(rng.choice(live), self.cfg.session_timeout_ms + rng.randint(500, 2_000))
        if f.slow_markers and live and rng.random() < f.slow_markers:  # (no draw when off: seeds replay)
            self.delay_commit_markers(rng.choice(live), rng.randint(1_000, 8_000))
        if f.late_records and len(live) > 1 and rng.random() < f.late_records:  # (no draw when off)
            self.delay_records(rng.choice(live), rng.randint(1_000, 8_000),
                               stall_ms=self.cfg.session_timeout_ms + rng.randint(500, 5_000))
        up = [i for i, w in enumerate(self.workers) if w.worker is not None]
        if up and rng.random() < f.worker_crash:
            self.crash_worker(rng.choice(up), down_ms=rng.randint(0, 5_000))
        if self.history is not None:  # (no draws without it: the other scenarios' seeds replay as before)
            if self.projector is not None and rng.random() < f.projector_crash:
                self.crash_projector(down_ms=rng.randint(0, 5_000))
            if rng.random() < f.history_outage and now >= self.history.down_until_ms:
                self.history_outage(rng.randint(500, max(500, f.history_outage_ms)))
        if self.webhook is not None:  # (no draws without it, as above)
            if self.alerter is not None and rng.random() < f.alerter_crash:
                self.crash_alerter(down_ms=rng.randint(0, 5_000))
            if rng.random() < f.webhook_outage and now >= self.webhook.down_until_ms:
                self.webhook_outage(rng.randint(500, max(500, f.webhook_outage_ms)))

    def _revive(self, now: int) -> None:
        for s in self.procs:
            if s.paused_until_ms is not None and now >= s.paused_until_ms:
                s.paused_until_ms = None
                if s.proc is not None:
                    self.consumer_of(s.proc).stale_view = 1  # it has not noticed its session lapsed
                    self._event(f"{s.name}: resumes (zombie)")
            if s.proc is None and s.down_until_ms is not None and now >= s.down_until_ms:
                self._start_proc(s)
                self._event(f"{s.name}: restarted")
        for w in self.workers:
            if w.worker is None and w.down_until_ms is not None and now >= w.down_until_ms:
                self._start_worker(w)
                self._event(f"worker w{w.index}.{w.generation} started")
        if self.projector is None and self.projector_down_until_ms is not None and now >= self.projector_down_until_ms:
            self._start_projector()
            self._event("projector restarted")
        if self.alerter is None and self.alerter_down_until_ms is not None and now >= self.alerter_down_until_ms:
            self._start_alerter()
            self._event("alerter restarted")

    # ---- inspection -----------------------------------------------------------------------

    def ledger(self) -> list[R.RunState]:
        """Every committed run-ledger state, in log order per partition."""
        return [codec.decode(r.value, topic=self.topo.runs) for r in self.log.records(self.topo.runs)
                if r.value is not None]

    def jobs(self) -> dict[str, J.JobState]:
        """The latest committed state of every job (deleted ones left out). After a grow a
        handed-over job's last state is on its new partition, read after its old one."""
        return {k: v for k, v in self.job_history()[1].items() if v.status is not J.JobStatus.DELETED}

    def job_history(self) -> tuple[dict[str, int | None], dict[str, J.JobState]]:
        """Each job's first slot (its first state's next run) and its last state, from every
        record of the jobs topic. A deleted job: its last state before the delete, DELETED,
        updated when its tombstone was written (the checker's account of it ends there)."""
        first: dict[str, int | None] = {}
        last: dict[str, J.JobState] = {}
        for r in self.log.records(self.topo.jobs):
            if growth.is_control(r.key):
                continue
            if r.value is None:
                job_id = (r.key or b"").decode()
                if job_id in last:
                    last[job_id] = replace(last[job_id], status=J.JobStatus.DELETED, updated_at_ms=r.timestamp_ms)
                continue
            state = codec.decode(r.value, topic=self.topo.jobs)
            first.setdefault(state.job_id, state.next_run_at_ms)
            last[state.job_id] = state
        return first, last

    def history_report(self, *, never_due: Collection[str] = (), due_until: Mapping[str, int] | None = None,
                       stuck_ms: int = STUCK_MS) -> CheckReport:
        """The history checker over every committed ledger and inbox record, for every job
        the scenario registered, each from its first slot (``never_due``: jobs the scenario
        expects no state of, e.g. refused registrations)."""
        checker = HistoryChecker()
        for state in self.ledger():
            checker.observe(state)
        for r in self.log.records(self.topo.worker_inbox):
            if r.value is not None:
                checker.observe(codec.decode(r.value))
        first, last = self.job_history()
        return checker.check(list(last.values()), self.clock.now_ms(), first_slots=first,
                             registered=self.registered, never_due=never_due,
                             due_until={**self.paused_at, **(due_until or {})}, stuck_ms=stuck_ms)

    def history_gaps(self) -> list[str]:
        """Where the projected history differs from what was committed: every run's last
        ledger state (a purged run's last state before its tombstone) and every job's
        last state (a deleted job: absent), once the projector has read everything
        committed so far (``project_all``). Empty when history holds exactly the
        committed states."""
        assert self.history is not None, "SimCluster(history=True) runs the projector"
        self.project_all()
        runs = {state.run_id: state for state in self.ledger()}  # the last state of each
        jobs: dict[str, J.JobState | None] = {}
        for rec in self.log.records(self.topo.jobs):
            if growth.is_control(rec.key):
                continue
            jobs[(rec.key or b"").decode()] = (None if rec.value is None
                                               else codec.decode(rec.value, topic=self.topo.jobs))
        gaps = []
        for run_id, state in runs.items():
            got = self.history.get_run(run_id)
            if got != state:
                gaps.append(f"run {run_id}: ledger {state.status.value} v{state.updated_at_ms}, history "
                            f"{'none' if got is None else f'{got.status.value} v{got.updated_at_ms}'}")
        for job_id, job in jobs.items():
            seen = self.history.get_job(job_id)
            if seen != job:
                gaps.append(f"job {job_id}: jobs topic {'deleted' if job is None else job.status.value}, "
                            f"history {'none' if seen is None else seen.status.value}")
        return gaps

    def expected_alerts(self) -> dict[str, Alert]:
        """The alerts the committed ledger raises, by key: each run's states in log
        order through one ``AlertMemory``, under the config each tenant has at the end
        (the scenarios set it before their first run)."""
        book = AlertBook()
        for rec in self.log.records(self.topo.alert_configs):
            book.apply((rec.key or b"").decode(), None if rec.value is None
                       else codec.decode(rec.value, topic=self.topo.alert_configs))
        memory, out = AlertMemory(), {}
        for rec in self.log.records(self.topo.runs):
            if rec.value is None:
                memory.forget((rec.key or b"").decode())
                continue
            state = codec.decode(rec.value, topic=self.topo.runs)
            for alert in memory.observe(state, book.get(state.tenant), self.clock.now_ms()):
                out[alert.key] = alert
        return out

    def alert_gaps(self) -> list[str]:
        """Where the alerts the webhook received (or the alerter gave up, logged) differ
        from those the committed ledger raises: missing ones, and ones no committed state
        raises. Empty when each was delivered or given up, and nothing else was sent."""
        assert self.webhook is not None, "SimCluster(alerts=True) runs the alerter"
        self.alert_all()
        expected = self.expected_alerts()
        seen = set(self.webhook.delivered) | set(self.given_up)
        gaps = [f"alert {key} ({a.kind.value}) neither delivered nor given up"
                for key, a in sorted(expected.items()) if key not in seen]
        gaps += [f"alert {key} sent but no committed state raises it" for key in sorted(seen - set(expected))]
        return gaps

    # ---- the API ----------------------------------------------------------------------------

    def api(self, tokens: dict[str, str] | None = None) -> Any:
        """The REST API in process on this cluster's log (an ASGI app: drive it with
        ``fastapi.testclient.TestClient``): its commands go to the job-commands topic and
        its answers come from the command-results topic, both on the in-memory log, so
        the cluster's real processors decide them under its faults. The simulation steps
        only when the test steps it, so a write answers 202 at once; step the cluster,
        then read the answer at its Location (``GET /v1/commands/{id}``). History: the
        projector's store with ``history=True``, else an in-memory store nothing
        writes (reads find only the API's own accepted writes)."""
        from gnomon.alerts.feed import AlertFeed
        from gnomon.api.alerts import AlertService
        from gnomon.api.answers import CommandAnswers
        from gnomon.api.app import CommandSink, create_app
        from gnomon.web.auth import Authenticator

        answers = CommandAnswers(self.log.reader("sim-api-answers"), self.topo.command_results, self.topo.partitions)
        answers.position_at_end()
        history = self.history if self.history is not None else InMemoryHistoryStore()
        feed = AlertFeed("", self.topo, AlertBook(), log=self.log)
        alerts = AlertService(feed.book, writer=_LogSink(self.log), topic=self.topo.alert_configs, feed=feed)
        return create_app(history=history, commands=CommandSink(_LogSink(self.log), self.topo.job_commands,
                                                                  sign=self.keys.sign),
                          auth=Authenticator(tokens or {"sim-token": TENANT}), topology=self.topo, clock=self.clock,
                          answers=answers, answer_timeout_s=0.0, alerts=alerts)

    def describe(self) -> str:
        """The seed, the faults injected and the counters: for a failing scenario's message."""
        procs = {s.name: (s.proc.transactions, s.proc.aborts) for s in self.procs if s.proc is not None}
        tail = "\n  ".join(self.events[-40:])
        return (f"seed={self.seed} faults={self.counts} fenced={len(self.log.fenced)} commits={self.log.commits} "
                f"aborts={self.log.aborts} duplicated={self.log.plain_faults.duplicated if self.log.plain_faults else 0} "
                f"reordered={self.log.plain_faults.reordered if self.log.plain_faults else 0} "
                f"procs(txns, aborts)={procs}\n  {tail}")
