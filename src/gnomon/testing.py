"""Ship the harness: run gnomon's whole core in memory, deterministically.

``InMemoryCluster`` wires the same ``PartitionTask`` the Kafka runtime uses to
in-memory queues, a ``FakeClock`` and fake workers whose behaviour is drawn from a
seeded RNG. Every record that would have gone to Kafka is kept in ``log`` so a test
can run a history checker over it. Any scenario replays exactly from its seed.

    cluster = InMemoryCluster(seed=7)
    cluster.submit(RegisterJob(...))
    cluster.run_for(60_000)

``SimCluster`` (``gnomon.sim``, exported here) goes further: the real ``Processor`` and
``Worker`` loops on an in-memory event log, with seeded faults.
"""

from __future__ import annotations

import random
import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from gnomon import codec
from gnomon.adapters.floors import FloorKV
from gnomon.adapters.kafka import partition_for
from gnomon.adapters.kv import MemoryKV
from gnomon.checker import CheckReport, HistoryChecker
from gnomon.core import jobs as J
from gnomon.core import runs as R
from gnomon.core.calendars import CalendarBook
from gnomon.core.clock import FakeClock, SystemClock
from gnomon.core.errors import GnomonError
from gnomon.core.messages import Grant, Stop
from gnomon.core.priorities import WeightedPicker
from gnomon.core.quota import QuotaBook
from gnomon.core.replies import CommandResult
from gnomon.core.tenants import TenantBook
from gnomon.core.workers import WorkerAdvert, WorkerDirectory
from gnomon.processor.output import Output
from gnomon.processor.task import PartitionTask
from gnomon.processor.waiting import assign_waiting
from gnomon.topology import Topology, load_topology

# What a fake worker does with an attempt it was granted.
SUCCEED, FAIL, CRASH, ZOMBIE = "succeed", "fail", "crash", "zombie"


@dataclass
class FakeWorkerPolicy:
    """Probabilities of each behaviour and how long an attempt takes (ms)."""

    p_fail: float = 0.0
    p_crash: float = 0.0  # never completes, never heartbeats: the lease must lapse
    p_zombie: float = 0.0  # stops heartbeating (SIGSTOP), then completes late with its old token
    duration_ms: tuple[int, int] = (100, 2000)


@dataclass
class _Attempt:
    grant: Grant
    ends_at_ms: int
    behaviour: str
    last_heartbeat_ms: int = 0
    starts_at_ms: int = 0  # staged until then (the grant's not_before)
    started: bool = False


class ListProducer:
    """Kafka in a list, for API tests: (topic, key, decoded value or None for a tombstone)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, Any]] = []

    def send(self, topic: str, key: str, value: bytes | None, **_: Any) -> tuple[int, int] | None:
        """None: a list does not say where a record went (``DecidingProducer`` does)."""
        self.sent.append((topic, key, None if value is None else codec.decode(value, topic=topic)))
        return None


class _KeptAnswers:
    """``api.answers.CommandAnswers``' reading side over a dict (answers are there at once)."""

    def __init__(self, results: dict[tuple[int, int], CommandResult]) -> None:
        self._results = results

    def get(self, pos: tuple[int, int]) -> CommandResult | None:
        return self._results.get(pos)

    def wait(self, pos: tuple[int, int], timeout_s: float) -> CommandResult | None:
        return self._results.get(pos)


class DecidingProducer(ListProducer):
    """Kafka in a list with the processors' decisions in process, for API tests: a
    command written to the job-commands topic is applied at once by its partition's
    real ``PartitionTask`` (the decider: state machine, admission, its answer), whose
    answer ``answers`` returns; the jobs and runs it wrote go to ``history`` when one is
    given (a projector with no lag). ``send`` returns where the command went, as Kafka's
    acknowledgement does. ``hold()``: answers stop coming (a processor away)."""

    def __init__(self, history: Any = None, *, tenants: TenantBook | None = None, clock: Any = None,
                 topology: Topology | None = None) -> None:
        super().__init__()
        self.history = history
        self.clock = clock or SystemClock()  # the processors' time: give the API's clock
        self.topo = topology or load_topology()
        self.partitions = partitions = self.topo.partitions
        self.quota = QuotaBook(tenants or TenantBook(), partitions)
        self.calendars = CalendarBook()  # what the processors read from the calendars topic
        self.tasks = {p: PartitionTask(p, FloorKV(MemoryKV()), self.topo, J.SchedulerConfig(), R.RunConfig(),
                                       quota=self.quota, calendars=self.calendars) for p in range(partitions)}
        for task in self.tasks.values():
            task.load_counts()
        self.results: dict[tuple[int, int], CommandResult] = {}
        self.answers = _KeptAnswers(self.results)
        self._next = dict.fromkeys(range(partitions), 0)
        self.held: list[tuple[int, int, Any]] = []  # (partition, offset, command) not decided yet
        self._lock = threading.RLock()  # an app served by uvicorn sends from its thread pool

    def hold(self) -> None:
        self.held_on = True

    def release(self) -> None:
        """Decide what was held, in order."""
        self.held_on = False
        held, self.held = self.held, []
        for p, off, cmd in held:
            self._decide(p, off, cmd)

    held_on = False

    def send(self, topic: str, key: str, value: bytes | None, **kw: Any) -> tuple[int, int] | None:
        with self._lock:
            super().send(topic, key, value, **kw)
            if topic == self.topo.calendars:
                self.calendars.apply(key, None if value is None else codec.decode(value, topic=topic))
            if topic != self.topo.job_commands or value is None:
                return None
            p = partition_for(key, self.partitions)
            off = self._next[p]
            self._next[p] += 1
            cmd = codec.decode(value, topic=topic)
            if self.held_on:
                self.held.append((p, off, cmd))
            else:
                self._decide(p, off, cmd)
            return p, off

    def _decide(self, p: int, off: int, cmd: Any) -> None:
        self._outputs(self.tasks[p].handle_command(cmd, self.clock.now_ms(), p, off), p, off)

    def _outputs(self, outs: list[Any], p: int, off: int) -> None:
        for o in outs:
            if o.topic == self.topo.dependencies:  # to the partition it names, at once
                self._outputs(self.tasks[o.partition].handle(o.value, self.clock.now_ms()), p, off)
            elif isinstance(o.value, CommandResult):
                self.results[(p, off)] = o.value
            elif self.history is not None and isinstance(o.value, J.JobState):
                self.history.put_job(o.value)
            elif self.history is not None and isinstance(o.value, R.RunState):
                self.history.put_run(o.value)

    def job(self, job_id: str) -> J.JobState | None:
        """The processor's state of a job."""
        return self.tasks[partition_for(job_id, self.partitions)].job(job_id)

    def run(self, run_id: str) -> R.RunState | None:
        """The processor's state of a run."""
        return self.tasks[partition_for(run_id.partition("@")[0], self.partitions)].run(run_id)

    def adopt_run(self, state: R.RunState) -> None:
        """Put a run into its partition's store as a changelog restore would (a test's
        given state); into history too, when there is one."""
        task = self.tasks[partition_for(state.job_id, self.partitions)]
        task.restore_run(state.run_id, codec.encode(state, self.topo.runs))
        if self.history is not None:
            self.history.put_run(state)


@dataclass
class InMemoryCluster:
    partitions: int = 4
    seed: int = 0
    clock: FakeClock = field(default_factory=FakeClock)
    sched_cfg: J.SchedulerConfig = field(default_factory=J.SchedulerConfig)
    run_cfg: R.RunConfig = field(default_factory=R.RunConfig)
    policy: FakeWorkerPolicy = field(default_factory=FakeWorkerPolicy)
    workers: int = 3
    encode_through_codec: bool = True
    worker_slots: int = 100
    advert_interval_ms: int = 1000
    # history (the projector) has every ledger record older than this: finished runs past
    # their retention are purged. None: history never catches up, nothing is purged.
    history_lag_ms: int | None = 0
    # tenants' limits (quotas, admission); None: the built-in defaults
    tenants: TenantBook | None = None
    worker_tenants: tuple[str, ...] = ()  # the tenants the fake workers serve (adverts); (): any

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.topo = Topology(partitions=self.partitions, pools=("default", "batch"))
        self.directory = WorkerDirectory()
        self.tenants = self.tenants or TenantBook()
        self.quota = QuotaBook(self.tenants, self.partitions)
        self.tasks = {p: PartitionTask(p, FloorKV(MemoryKV()), self.topo, self.sched_cfg, self.run_cfg,
                                       directory=self.directory, quota=self.quota)
                      for p in range(self.partitions)}
        for task in self.tasks.values():
            task.load_counts()
        self._pickers: dict[str, WeightedPicker] = {}
        self.dead_workers: set[str] = set()
        self.started: list[tuple[str, int, str]] = []  # (run_id, start ms, worker) as a handler would see it
        self._last_advert_ms = -(10**15)
        self.inputs: dict[int, deque[Any]] = {p: deque() for p in range(self.partitions)}
        self.inbox: deque[Grant | Stop] = deque()
        self.attempts: dict[tuple[str, str], _Attempt] = {}
        self.log: list[tuple[int, Any]] = []  # (time, record) of every input and output
        self.rejected: list[tuple[Any, str]] = []
        self.stale_accepted: list[Any] = []  # completions/heartbeats with a stale token that changed a run
        self.hooks: list[Callable[[Output], None]] = []

    # ---- input -------------------------------------------------------------------------

    def submit(self, cmd: Any) -> None:
        job_id = cmd.job_id if hasattr(cmd, "job_id") else cmd.run_id.partition("@")[0]
        self._enqueue(partition_for(job_id, self.partitions), cmd)

    def _enqueue(self, partition: int, cmd: Any) -> None:
        if self.encode_through_codec:
            cmd = codec.decode(codec.encode(cmd))
        self.log.append((self.clock.now_ms(), cmd))
        self.inputs[partition].append(cmd)

    # ---- processing --------------------------------------------------------------------

    def _route(self, outs: list[Output]) -> None:
        for o in outs:
            for hook in self.hooks:
                hook(o)
            if o.topic in (self.topo.run_events, self.topo.dependencies):
                assert o.partition is not None
                self._enqueue(o.partition, o.value)
            elif o.topic == self.topo.worker_inbox:
                self.log.append((self.clock.now_ms(), o.value))
                self.inbox.append(o.value)
            elif o.topic in (self.topo.runs, self.topo.jobs, self.topo.dead_letters):
                self.log.append((self.clock.now_ms(), (o.topic, o.value)))

    def drain(self, max_rounds: int = 1000) -> None:
        """Process queued inputs and worker messages until quiet (bounded)."""
        for _ in range(max_rounds):
            busy = False
            for p, q in self.inputs.items():
                while q:
                    busy = True
                    cmd = q.popleft()
                    before = self.tasks[p].run(cmd.run_id) if isinstance(cmd, R.CompleteAttempt | R.Heartbeat) else None
                    try:
                        self._route(self.tasks[p].handle(cmd, self.clock.now_ms()))
                        if before is not None and (cmd.token != before.token or cmd.worker_id != before.worker_id):
                            after = self.tasks[p].run(cmd.run_id)
                            if after != before:
                                self.stale_accepted.append(cmd)
                    except GnomonError as exc:
                        self.rejected.append((cmd, str(exc)))
            busy |= self._workers_step()
            if not busy:
                return
        raise AssertionError("cluster did not quiesce")

    def tick(self) -> None:
        now = self.clock.now_ms()
        self._advertise(now)
        if self.directory is not None:
            for wid in self.directory.lost(now):
                for task in self.tasks.values():
                    self._route(task.worker_lost(wid, now))
        history = None if self.history_lag_ms is None else now - self.history_lag_ms
        for task in self.tasks.values():
            self._route(task.tick(now, history_until_ms=history, assign_waiting=False))
        # as a processor does: waiting runs take free slots across all partitions
        self._route(assign_waiting(list(self.tasks.values()), now, self._pickers))
        self.drain()

    def kill_worker(self, worker_id: str) -> None:
        """The worker dies: no more adverts, its attempts (staged or running) vanish."""
        self.dead_workers.add(worker_id)
        for key in [k for k in self.attempts if k[0] == worker_id]:
            del self.attempts[key]

    def _advertise(self, now: int) -> None:
        if now - self._last_advert_ms < self.advert_interval_ms:
            return
        self._last_advert_ms = now
        for i in range(self.workers):
            wid = f"w{i}"
            if wid in self.dead_workers:
                continue
            mine = [a for (w, _), a in self.attempts.items() if w == wid]
            running = sum(1 for a in mine if a.started)
            long_running = sum(1 for a in mine if a.started and now - a.starts_at_ms >= 10_000)
            self.directory.observe(WorkerAdvert(wid, "default", self.worker_slots, running, len(mine) - running,
                                                self.advert_interval_ms, now, long_running=long_running,
                                                tenants=self.worker_tenants), now)
            self.directory.observe(WorkerAdvert(wid + "-batch", "batch", self.worker_slots, 0, 0,
                                                self.advert_interval_ms, now), now)

    def run_for(self, duration_ms: int, step_ms: int = 100) -> None:
        end = self.clock.now_ms() + duration_ms
        while self.clock.now_ms() < end:
            self.clock.advance(step_ms)
            self.tick()

    # ---- fake workers ------------------------------------------------------------------

    def _workers_step(self) -> bool:
        now = self.clock.now_ms()
        busy = False
        while self.inbox:
            busy = True
            msg = self.inbox.popleft()
            if msg.worker_id.removesuffix("-batch") in self.dead_workers:
                continue
            if isinstance(msg, Grant):
                r = self.rng.random()
                pol = self.policy
                behaviour = (CRASH if r < pol.p_crash else ZOMBIE if r < pol.p_crash + pol.p_zombie
                             else FAIL if r < pol.p_crash + pol.p_zombie + pol.p_fail else SUCCEED)
                lo, hi = self.policy.duration_ms
                if behaviour == ZOMBIE:
                    lo, hi = self.run_cfg.lease_ms + 1000, self.run_cfg.lease_ms * 2
                starts = max(now, msg.not_before_ms)
                self.attempts[(msg.worker_id, msg.run_id)] = _Attempt(
                    msg, starts + self.rng.randint(lo, hi), behaviour, starts, starts)
            elif isinstance(msg, Stop):
                self.attempts.pop((msg.worker_id, msg.run_id), None)
        for key, att in list(self.attempts.items()):
            g = att.grant
            if not att.started:
                if now < att.starts_at_ms:
                    continue  # staged: the worker's local timer has not fired
                att.started = True
                busy = True
                self.started.append((g.run_id, now, g.worker_id))
                self.submit(R.AttemptStarted(g.run_id, g.worker_id, g.token, now, now))
            if att.behaviour == CRASH:
                continue
            if now >= att.ends_at_ms:
                del self.attempts[key]
                outcome = R.Outcome.FAILED if att.behaviour == FAIL else R.Outcome.SUCCEEDED
                self.submit(R.CompleteAttempt(g.run_id, g.worker_id, g.token, outcome, now,
                                              0 if outcome is R.Outcome.SUCCEEDED else 1))
                busy = True
            elif att.behaviour != ZOMBIE and now - att.last_heartbeat_ms >= self.run_cfg.lease_ms // 3:
                att.last_heartbeat_ms = now
                self.submit(R.Heartbeat(g.run_id, g.worker_id, g.token, now))
        return busy

    # ---- inspection --------------------------------------------------------------------

    def run_state(self, run_id: str) -> R.RunState | None:
        job_id = run_id.partition("@")[0]
        return self.tasks[partition_for(job_id, self.partitions)].run(run_id)

    def job_state(self, job_id: str) -> J.JobState | None:
        return self.tasks[partition_for(job_id, self.partitions)].job(job_id)

    def history_report(self, job_ids: list[str], *, never_due: list[str] | tuple[str, ...] = ()) -> CheckReport:
        """The history checker over every record of this run, for these jobs (the ones the
        scenario registered), each from its first slot (its first state's next run)."""
        checker = HistoryChecker()
        first: dict[str, int | None] = {}
        for _, rec in self.log:
            checker.observe(rec[1] if isinstance(rec, tuple) else rec)
            if isinstance(rec, tuple) and isinstance(rec[1], J.JobState):
                first.setdefault(rec[1].job_id, rec[1].next_run_at_ms)
        jobs = [s for s in (self.job_state(j) for j in job_ids) if s is not None]
        return checker.check(jobs, self.clock.now_ms(), first_slots=first, registered=job_ids, never_due=never_due)

    def runs_of(self, job_id: str) -> list[R.RunState]:
        out: dict[str, R.RunState] = {}
        for _, rec in self.log:
            if isinstance(rec, tuple) and rec[0] == self.topo.runs and rec[1] is not None and rec[1].job_id == job_id:
                out[rec[1].run_id] = rec[1]
        return sorted(out.values(), key=lambda r: r.slot_ms)


@contextmanager
def renewing(renewed: Callable[[], None], every_s: float) -> Iterator[None]:
    """Call ``renewed`` every ``every_s`` from a thread of its own while the block runs:
    a worker renewing an attempt's lease (``AttemptContext.renewed``), without the worker."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(every_s):
            renewed()

    t = threading.Thread(target=beat, name="renewing", daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join()


def __getattr__(name: str) -> Any:
    """``SimCluster`` and friends (``gnomon.sim``: the real Processor and Worker loops on an
    in-memory event log), imported on first use: they pull in the whole runtime."""
    if name in ("SimCluster", "SimFaults", "StepRunner", "SimExecutor"):
        from gnomon import sim

        return getattr(sim, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
