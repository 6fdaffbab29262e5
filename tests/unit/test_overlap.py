"""Overlap policies through the real processor loop (in-memory cluster): ``forbid`` skips
a slot while an earlier run is active, ``replace`` cancels the active run, ``allow``
lets them overlap. And the pure decisions, property-tested."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gnomon.core import jobs as J
from gnomon.core import runs as R
from gnomon.core.model import JobSpec, OverlapPolicy, RetryPolicy, Schedule, Target, TargetType
from gnomon.core.runs import RunStatus
from gnomon.testing import FakeWorkerPolicy, InMemoryCluster

CMD = Target(TargetType.COMMAND, argv=("sleep", "25"))


def spec(overlap: OverlapPolicy) -> JobSpec:
    return JobSpec(name="o", schedule=Schedule(cron="*/10 * * * * *"), target=CMD, overlap=overlap,
                   timeout_s=120, retry=RetryPolicy(max_attempts=1))


def run_for(overlap: OverlapPolicy, duration_ms: int, seconds: int, seed: int = 0) -> InMemoryCluster:
    c = InMemoryCluster(seed=seed, policy=FakeWorkerPolicy(duration_ms=(duration_ms, duration_ms)))
    c.submit(J.RegisterJob("job", "t", spec(overlap), c.clock.now_ms()))
    c.run_for(seconds * 1000)
    return c


def max_concurrent(c: InMemoryCluster) -> int:
    """The most runs of the job running at one time (start to finish, as recorded)."""
    ends = [r.finished_at_ms or 10**15 for r in c.runs_of("job") if r.started_at_ms is not None]
    starts = [r.started_at_ms for r in c.runs_of("job") if r.started_at_ms is not None]
    events = sorted([(s, 1) for s in starts] + [(e, -1) for e in ends])
    level = peak = 0
    for _, d in events:
        level += d
        peak = max(peak, level)
    return peak


def test_forbid_skips_slots_while_a_run_is_active() -> None:
    c = run_for(OverlapPolicy.FORBID, 25_000, 120)
    runs = c.runs_of("job")
    skipped = [r for r in runs if r.status is RunStatus.SKIPPED]
    assert skipped and all((r.reason or "").startswith("overlap:") for r in skipped), [r.reason for r in skipped]
    assert max_concurrent(c) == 1
    assert any(r.status is RunStatus.SUCCEEDED for r in runs)
    assert c.history_report(["job"]).ok


def test_replace_cancels_the_active_run() -> None:
    c = run_for(OverlapPolicy.REPLACE, 25_000, 120)
    runs = c.runs_of("job")
    replaced = [r for r in runs if r.status is RunStatus.CANCELLED]
    assert replaced and all("overlap: replace" in (r.reason or "") for r in replaced), [r.reason for r in replaced]
    assert not [r for r in runs if r.status is RunStatus.SKIPPED and (r.reason or "").startswith("overlap")]
    assert c.history_report(["job"]).ok


def test_allow_overlaps() -> None:
    c = run_for(OverlapPolicy.ALLOW, 25_000, 120)
    assert max_concurrent(c) >= 2
    assert not [r for r in c.runs_of("job") if r.status in (RunStatus.SKIPPED, RunStatus.CANCELLED)]


def test_short_runs_never_overlap_so_forbid_skips_nothing() -> None:
    c = run_for(OverlapPolicy.FORBID, 2_000, 90)
    assert not [r for r in c.runs_of("job") if r.status is RunStatus.SKIPPED]


@settings(max_examples=25, deadline=None)
@given(st.sampled_from([OverlapPolicy.FORBID, OverlapPolicy.REPLACE]), st.integers(5_000, 40_000),
       st.integers(0, 1000))
def test_with_a_policy_at_most_one_run_is_ever_active(overlap: OverlapPolicy, duration_ms: int, seed: int) -> None:
    """forbid and replace both keep at most one attempt of the job running (replace: the
    cancel reaches the old attempt when the new one is released, before it starts)."""
    c = run_for(overlap, duration_ms, 80, seed)
    assert c.history_report(["job"]).ok  # every slot accounted for exactly once, whatever happened to it
    assert max_concurrent(c) <= 1
    if overlap is OverlapPolicy.REPLACE:  # replace never skips a slot for overlap
        assert not [r for r in c.runs_of("job") if (r.reason or "").startswith("overlap:")]


def test_the_pure_decisions() -> None:
    s = spec(OverlapPolicy.FORBID)
    job = J.JobState("job", "t", s, J.JobStatus.ACTIVE, 20_000, 1, 0, 0)
    sched = R.RunState("job@2", "job", "t", s, 20_000, 20_000, False, RunStatus.SCHEDULED, 0, 0)
    running = R.RunState("job@1", "job", "t", s, 10_000, 10_000, False, RunStatus.RUNNING, 0, 0,
                         lease_until_ms=10**12, deadline_ms=10**12)
    assert sched.timer_ms() == 20_000, "released at its start, not staged ahead"
    (ev,) = R.decide_timer(sched, 20_000, job=job, active=running)
    assert isinstance(ev, R.RunWithdrawn) and ev.reason.startswith("overlap: job@1")
    (ev,) = R.decide_timer(sched, 20_000, job=job, active=None)
    assert isinstance(ev, R.RunReleased)
    rep = spec(OverlapPolicy.REPLACE)
    released = R.RunState("job@2", "job", "t", rep, 20_000, 20_000, False, RunStatus.READY, 0, 0)
    cancel = R.replacement_cancel(released, running, 20_000)
    assert cancel is not None and cancel.run_id == "job@1" and cancel.tenant == "t"
    assert R.replacement_cancel(released, R.RunState("job@1", "job", "t", rep, 1, 1, False, RunStatus.SUCCEEDED, 0, 0),
                                20_000) is None
