"""Fuzzing on the decider (issue 21, part 3): hostile records, each one the real codec
encodes (or raw bytes that do not decode), appended to the processor's input topics in
the simulation (``gnomon.sim.SimCluster``: the real Processor and Worker loops on the
in-memory event log), while good per-second jobs run.

Every example starts a cluster with three good jobs of the good tenant running, and a
victim job of another tenant on every partition (hostile commands of that tenant reach
deep into the decider), then appends a group of hostile records, each followed on its
partition by a good command (a fresh registration of the good tenant). Then:

* the processor never crashes (a record it cannot apply is answered or poisoned);
* every record of the job-commands topic gets exactly one answer on the
  command-results topic (one that does not decode: one answer or one poison record),
  and every good command is accepted, so the processor went on past each hostile record;
* a worker message on run-events (claim, heartbeat, start, completion) is answered in
  the worker's inbox (a stop, or a grant/ack when it was valid) or poisoned; the API's
  cancel and replay, read from run-events, are poisoned; undecodable bytes are poisoned;
* no poison record says the processor broke on a record or a tick step (contained, but
  a bug: a refusal is a GnomonError, anything else is a value that reached a bug);
* the history checker finds no slot missed or doubled, no stale report accepted, and
  every slot of the good jobs started on time.

What the strategies never draw (the topics' trust boundary, not input validation) is
listed in tests/fuzz_strategies.py.

The default (CI) profile is derandomized and draws at least 10,000 hostile records in
all; ``GNOMON_FUZZ_SCALE=n`` runs n times as many examples, ``GNOMON_FUZZ_RANDOM=1``
draws new ones each run, ``GNOMON_FUZZ_SHRINK=1`` shrinks a failure to its minimal
records (slow: every shrink step replays a cluster). Strategies: tests/fuzz_strategies.py.
"""

from __future__ import annotations

import os
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import fuzz_strategies as F
from gnomon import codec
from gnomon.checker import CheckReport, HistoryChecker
from gnomon.core import jobs as J
from gnomon.core import runs as R
from gnomon.core.command_auth import sign
from gnomon.core.cron import CronSchedule
from gnomon.core.errors import GnomonError
from gnomon.core.messages import Grant, LeaseAck, PoisonRecord, Stop
from gnomon.core.model import JobSpec, Schedule
from gnomon.core.replies import CommandResult, ResultCode
from gnomon.sim import TENANT, SimCluster

SCALE = max(1, int(os.environ.get("GNOMON_FUZZ_SCALE", "1")))
RANDOM = os.environ.get("GNOMON_FUZZ_RANDOM") == "1"
SHRINK = os.environ.get("GNOMON_FUZZ_SHRINK") == "1"

WARM_MS = 1_500  # the good jobs run before the first hostile record
AFTER_MS = 2_000  # and after the last one, before the checks
GROUP = 25  # hostile records per example (each followed by a good command)
LATE_MAX_MS = 500  # a good run starts at most this long after its start time
PROBE_SPEC = JobSpec(name="probe", schedule=Schedule(cron="0 0 1 1 *"), target=F.HANDLER_TARGET)  # yearly: never due here
assert TENANT == F.GOOD_TENANT

# the run-events messages that the processor answers in the sender's inbox
_ANSWERED = (R.ClaimRun, R.Heartbeat, R.CompleteAttempt, R.AttemptStarted)


def fuzz_settings(examples: int) -> settings:
    phases = [Phase.explicit, Phase.reuse, Phase.generate] + ([Phase.shrink] if SHRINK else [])
    return settings(max_examples=examples * SCALE, derandomize=not RANDOM, database=None, deadline=None,
                    phases=phases, print_blob=False, suppress_health_check=list(HealthCheck))


# pure CPU and the slowest of the unit suite (~40 s): `make test` runs it with the seed
# sweeps, at idle priority beside integration and e2e, not on the path to the services
pytestmark = [pytest.mark.usefixtures("quiet_logs"), pytest.mark.sweep]


@dataclass
class Sent:
    hostile: F.Hostile | None  # None: a good command
    topic: str
    partition: int
    offset: int
    decoded: Any = None  # the record as its topic's schema reads it (None: it does not)


def _gnomon_errors() -> frozenset[str]:
    """The names of every exception gnomon raises on purpose (a refusal, not a bug)."""
    out: set[str] = set()
    todo: list[type[BaseException]] = [GnomonError]
    while todo:
        cls = todo.pop()
        out.add(cls.__name__)
        todo.extend(cls.__subclasses__())
    return frozenset(out - {"InternalError", "RecordFailed"})


GNOMON_ERRORS = _gnomon_errors()


@dataclass
class Scenario:
    """One cluster with the good jobs running, victims registered, and what was appended.
    ``processors`` 2: with standbys (they apply every state the owner writes)."""

    processors: int = 1
    misrouted: bool = False  # every hostile job command is on another partition than its job's
    c: SimCluster = field(init=False)
    sent: list[Sent] = field(default_factory=list)
    probes: int = 0

    def __post_init__(self) -> None:
        self.c = c = SimCluster(21, processors=self.processors, workers=2, partitions=F.PARTITIONS,
                                standbys=self.processors > 1)
        assert c.topo == F.TOPO, "the strategies' topology is the sim's"
        for job_id in F.GOOD_JOBS:
            c.register(job_id, "* * * * * *")
        now = c.clock.now_ms()
        for i, job_id in enumerate(F.VICTIM_JOBS):
            c.submit(J.RegisterJob(job_id, F.VICTIM_TENANT, F.victim_spec(i), now))
            for key in F.MANUAL_KEYS:
                c.submit(J.TriggerJob(job_id, F.VICTIM_TENANT, key, now))
        c.submit(J.PauseJob(F.VICTIM_JOBS[-1], F.VICTIM_TENANT, now))
        c.run_for(WARM_MS, faults=False)

    def append(self, h: F.Hostile) -> None:
        # signed with the operator's key, so a hostile command reaches the decider (the
        # signature's own refusals: tests/unit/test_command_auth.py)
        headers = sign(self.c.keys.operator, h.topic, h.key, h.value) if h.topic == self.c.topo.job_commands else ()
        offset = self.c.log.append(h.topic, h.key, h.value, h.partition, headers=headers)
        try:  # a record of the topic's own schema (any version); another topic's record is not one
            decoded = codec.decode(h.value or b"", topic=h.topic)
        except codec.DecodeError:
            decoded = None
        self.sent.append(Sent(h, h.topic, h.partition, offset, decoded))

    def probe(self, partition: int) -> None:
        """A good command on ``partition``: a fresh job of the good tenant."""
        while True:
            self.probes += 1
            job_id = f"{F.PROBE_PREFIX}{self.probes}"
            if F.key_partition(job_id) == partition:
                break
        cmd = J.RegisterJob(job_id, TENANT, PROBE_SPEC, self.c.clock.now_ms())
        topic = self.c.topo.job_commands
        value = codec.encode(cmd, topic)
        offset = self.c.log.append(topic, job_id.encode(), value, partition,
                                   headers=self.c.keys.sign(TENANT, topic, job_id.encode(), value))
        self.sent.append(Sent(None, topic, partition, offset, cmd))

    def run(self, ms: int) -> None:
        self.c.run_for(ms, faults=False)

    # ---- checks ---------------------------------------------------------------------------

    def check(self) -> None:
        c, topo = self.c, self.c.topo
        results: dict[tuple[int, int], list[CommandResult]] = defaultdict(list)
        for r in c.log.records(topo.command_results):
            res = codec.decode(r.value or b"", topic=topo.command_results)
            results[(res.source_partition, res.source_offset)].append(res)
        poison: dict[tuple[str, int, int], list[PoisonRecord]] = defaultdict(list)
        for r in c.log.records(topo.poison):
            rec = codec.decode(r.value or b"", topic=topo.poison)
            poison[(rec.source_topic, rec.partition, rec.offset)].append(rec)
        inbox: Counter[tuple[str, str]] = Counter()
        for r in c.log.records(topo.worker_inbox):
            msg = codec.decode(r.value or b"", topic=topo.worker_inbox)
            assert isinstance(msg, Grant | Stop | LeaseAck)
            inbox[(msg.worker_id, msg.run_id)] += 1
        owed: Counter[tuple[str, str]] = Counter()
        problems: list[str] = []
        for s in self.sent:
            answers = results.get((s.partition, s.offset), [])
            poisoned = poison.get((s.topic, s.partition, s.offset), [])
            what = "good command" if s.hostile is None else repr(s.hostile)
            if s.topic == topo.job_commands:
                if s.decoded is not None and (len(answers), len(poisoned)) != (1, 0):
                    problems.append(f"{what}: {len(answers)} answers, {len(poisoned)} poison records "
                                    f"(want 1 answer) {[p.reason for p in poisoned][:1]}")
                elif s.decoded is None and len(answers) + len(poisoned) != 1:
                    problems.append(f"{what}: undecodable, {len(answers)} answers + {len(poisoned)} poison records")
                if s.hostile is None and answers and answers[0].code is not ResultCode.ACCEPTED:
                    problems.append(f"good command at {s.partition}@{s.offset} answered {answers[0]}")
                if self.misrouted and s.hostile is not None and answers and answers[0].accepted:
                    problems.append(f"{what}: accepted by partition {s.partition}, which does not own its job")
            elif s.topic == topo.run_events:
                if len(poisoned) > 1:
                    problems.append(f"{what}: poisoned {len(poisoned)} times")
                if s.decoded is None and not poisoned:
                    problems.append(f"{what}: undecodable and not poisoned")
                elif isinstance(s.decoded, R.CancelRun | R.ReplayRun) and not poisoned:
                    problems.append(f"{what}: the API's command read from run-events, not refused (poison)")
                elif isinstance(s.decoded, _ANSWERED) and not poisoned:
                    owed[(s.decoded.worker_id, s.decoded.run_id)] += 1
        for (worker, run_id), n in owed.items():
            if inbox[(worker, run_id)] < n:
                problems.append(f"{n} messages of worker {worker!r} about run {run_id!r}, "
                                f"{inbox[(worker, run_id)]} answers in its inbox")
        problems.extend(self.contained_bugs(poison))
        ledger = c.ledger()
        rep = self.report(ledger)
        if not rep.ok:
            problems.append(f"history: {rep.summary()}: {rep.problems[:5]}")
        problems.extend(self.late_good_runs(ledger))
        problems = list(dict.fromkeys(problems))  # (the first example repeats one record)
        assert not problems, "\n".join(problems[:20])

    def contained_bugs(self, poison: dict[tuple[str, int, int], list[PoisonRecord]]) -> list[str]:
        """Poison records that say the processor broke (and contained it): a record whose
        application raised something that is no refusal (a bug a value reached), or a
        job's or run's tick step that raised. Each is a bug to fix at its cause."""
        by_offset = {(s.topic, s.partition, s.offset): s for s in self.sent}
        out = []
        for key, recs in poison.items():
            for rec in recs:
                kind = rec.reason.partition(":")[0]
                if rec.offset >= 0 and kind in GNOMON_ERRORS:
                    continue
                sent = by_offset.get(key)
                what = repr(sent.hostile) if sent is not None and sent.hostile is not None else \
                    f"{rec.source_topic}[{rec.partition}]@{rec.offset}"
                out.append(f"contained bug: {rec.reason[:300]} <- {what}")
        return out

    def report(self, ledger: list[R.RunState]) -> CheckReport:
        """``SimCluster.history_report`` with the slot accounting limited to the good jobs
        and the victims whose schedule is still their own (the checker judges every slot
        by a job's final schedule), each from its first slot after its registration (a
        backfill may run slots from before it), and whose slots stayed near now (a
        hostile "now" can move a schedule by centuries, and the checker walks every slot
        in between)."""
        c = self.c
        checker = HistoryChecker()
        for state in ledger:
            checker.observe(state)
        for r in c.log.records(c.topo.worker_inbox):
            if r.value is not None:
                checker.observe(codec.decode(r.value))
        lo, hi = F.T0 - 3_600_000, F.T0 + 3_600_000
        slots: dict[str, list[int]] = defaultdict(list)
        for s in ledger:
            slots[s.job_id] += [s.slot_ms, s.skipped_from_ms if s.skipped_from_ms is not None else s.slot_ms]
        own = {job_id: F.victim_spec(i).schedule for i, job_id in enumerate(F.VICTIM_JOBS)}
        jobs, first = [], {}
        for j in c.jobs().values():
            if j.job_id in F.GOOD_JOBS or (own.get(j.job_id) == j.spec.schedule and j.tenant == F.VICTIM_TENANT
                                           and all(lo <= ms <= hi for ms in slots[j.job_id])
                                           and lo <= (j.next_run_at_ms or F.T0) <= hi):
                jobs.append(j)
                start = J.first_slot_after(j.spec, j.created_at_ms - 1)
                if start is not None:
                    first[j.job_id] = start
        return checker.check(jobs, c.clock.now_ms(), first_slots=first, registered=F.GOOD_JOBS)

    def late_good_runs(self, ledger: list[R.RunState]) -> list[str]:
        """Every slot of a good job from the warm-up on, up to a second ago, started on time."""
        final: dict[str, R.RunState] = {}
        for s in ledger:
            final[s.run_id] = s
        now = self.c.clock.now_ms()
        out = []
        for job_id in F.GOOD_JOBS:
            for slot in CronSchedule("* * * * * *", "UTC").iter_after(F.T0 + WARM_MS // 2):
                if slot > now - 1_000:
                    break
                run = final.get(f"{job_id}@{_iso(slot)}")
                if run is None or run.started_at_ms is None:
                    out.append(f"good run {job_id} slot {_iso(slot)} not started: {run and run.status}")
                elif run.started_at_ms - run.not_before_ms > LATE_MAX_MS:
                    out.append(f"good run {run.run_id} started {run.started_at_ms - run.not_before_ms} ms late")
        return out


def _iso(ms: int) -> str:
    from gnomon.core.clock import ms_to_iso

    return ms_to_iso(ms)


def play(records: list[F.Hostile], processors: int = 1, misrouted: bool = False) -> Scenario:
    """A scenario: each record, then a good command on its partition; the processor
    applies them; the checks. A crash names the records it was given."""
    sc = Scenario(processors, misrouted)
    for h in records:
        sc.append(h)
        sc.probe(h.partition)
    try:
        sc.run(AFTER_MS)
    except Exception as exc:
        raise AssertionError(f"the simulation crashed ({type(exc).__name__}: {exc}) on one of:\n  "
                             + "\n  ".join(map(repr, records))) from exc
    try:
        sc.check()
    except AssertionError as exc:
        listed = Counter(map(repr, records))
        raise AssertionError(f"{exc}\n-- the records:\n  " + "\n  ".join(
            f"{r}{f' (x{n})' if n > 1 else ''}" for r, n in listed.items())) from None
    return sc


def fuzz(strategy: st.SearchStrategy[F.Hostile], examples: int, kinds: Callable[[F.Hostile], str],
         processors: int = 1, misrouted: bool = False) -> tuple[Counter[str], float]:
    """Run ``examples`` groups of GROUP hostile records of ``strategy``; the records played
    by kind, and the seconds it took."""
    seen: Counter[str] = Counter()

    @fuzz_settings(examples)
    @given(st.lists(strategy, min_size=GROUP, max_size=GROUP))
    def one_group(records: list[F.Hostile]) -> None:
        play(records, processors, misrouted)
        seen.update(kinds(h) for h in records)

    started = time.perf_counter()
    one_group()
    return seen, time.perf_counter() - started


def _kind(h: F.Hostile) -> str:
    return h.kind


# Examples per test: 418 groups of 25 = 10,450 hostile records (and as many good commands).
def test_every_job_command_is_answered_once_and_the_next_good_command_too() -> None:
    seen, _ = fuzz(F.job_commands(), 180, _kind)
    assert sum(seen.values()) == 180 * GROUP * SCALE, seen
    assert set(seen) == set(F.JOB_COMMAND_KINDS) and min(seen.values()) >= 200, seen


def test_every_worker_message_is_refused_answered_or_poisoned() -> None:
    seen, _ = fuzz(F.run_events(), 130, _kind)
    assert sum(seen.values()) == 130 * GROUP * SCALE, seen
    assert set(seen) == set(F.RUN_EVENT_KINDS) and min(seen.values()) >= 150, seen


def test_tenant_limits_adverts_and_raw_bytes_stop_nothing() -> None:
    seen, _ = fuzz(st.one_of(F.feeds(), F.raw_records()), 60, lambda h: h.kind)
    assert sum(seen.values()) == 60 * GROUP * SCALE, seen
    assert {"TenantLimits", "WorkerAdvert"} <= set(seen) and sum(k.startswith("raw:") for k in seen) >= 10, seen


def test_everything_mixed_on_two_processors_with_standbys() -> None:
    """Standbys apply every state the owner writes, so a hostile value that reached a
    state record is decoded and indexed a second time."""
    seen, _ = fuzz(F.everything(), 40, lambda h: h.role, processors=2)
    assert sum(seen.values()) == 40 * GROUP * SCALE, seen
    assert set(seen) == {"job_commands", "run_events", "tenants", "workers"}, seen


def test_a_job_command_on_another_partition_than_its_job_is_refused() -> None:
    """Only the partition that owns a job decides about it (docs: the one decider): a job
    command read from another partition (its producer partitioned it by itself) must be
    answered and refused there. Applied there, a RegisterJob makes a second job of the same
    id in another partition, whose runs share the first job's run ids."""
    seen, _ = fuzz(F.misrouted(F.job_commands()), 8, _kind, misrouted=True)
    assert sum(seen.values()) == 8 * GROUP * SCALE, seen
