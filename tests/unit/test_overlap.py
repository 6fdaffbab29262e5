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


# ---- bufferOne ---------------------------------------------------------------------------


def test_buffer_one_keeps_one_slot_waiting_and_skips_the_rest() -> None:
    """25 s runs every 10 s: while one runs, the next slot waits (buffered, started when
    it ends), the one after is skipped "overlap: ..."; never two attempts at once."""
    c = run_for(OverlapPolicy.BUFFER_ONE, 25_000, 120)
    runs = c.runs_of("job")
    skipped = [r for r in runs if r.status is RunStatus.SKIPPED]
    assert skipped and all((r.reason or "").startswith("overlap:") and "bufferOne" in (r.reason or "")
                           for r in skipped), [r.reason for r in skipped]
    waited = [r for r in runs if (r.note or "").startswith("overlap: buffered behind")]
    assert waited, "some slot waited for the active run"
    for r in waited:
        if r.started_at_ms is not None:
            assert r.started_at_ms > r.not_before_ms + 1_000, "a buffered run starts late, when the other ended"
    assert any(r.status is RunStatus.SUCCEEDED for r in waited)
    assert max_concurrent(c) == 1
    assert c.history_report(["job"]).ok


def test_buffer_one_with_short_runs_buffers_nothing() -> None:
    c = run_for(OverlapPolicy.BUFFER_ONE, 2_000, 90)
    assert not [r for r in c.runs_of("job") if r.status is RunStatus.SKIPPED or r.note]


def _buffered_now(c: InMemoryCluster) -> int:
    return sum(1 for r in c.runs_of("job") if r.buffered)


@settings(max_examples=15, deadline=None)
@given(st.integers(5_000, 40_000), st.integers(0, 1000))
def test_buffer_one_never_holds_more_than_one_run(duration_ms: int, seed: int) -> None:
    c = InMemoryCluster(seed=seed, policy=FakeWorkerPolicy(duration_ms=(duration_ms, duration_ms)))
    c.submit(J.RegisterJob("job", "t", spec(OverlapPolicy.BUFFER_ONE), c.clock.now_ms()))
    for _ in range(40):  # look between steps, not only at the end
        c.run_for(2_000)
        assert _buffered_now(c) <= 1
    assert max_concurrent(c) <= 1
    assert c.history_report(["job"]).ok
    assert not [r for r in c.runs_of("job") if r.status is RunStatus.CANCELLED]  # bufferOne never cancels


def _job(overlap: OverlapPolicy) -> J.JobState:
    return J.JobState("job", "t", spec(overlap), J.JobStatus.ACTIVE, 40_000, 1, 0, 0)


def _run(run_id: str, slot: int, status: RunStatus, overlap: OverlapPolicy, **kw: object) -> R.RunState:
    return R.RunState(run_id, "job", "t", spec(overlap), slot, slot, False, status, 0, 0, **kw)  # type: ignore[arg-type]


def test_buffer_one_pure_decisions() -> None:
    b1 = OverlapPolicy.BUFFER_ONE
    job = _job(b1)
    running = _run("job@1", 10_000, RunStatus.RUNNING, b1, lease_until_ms=10**12, deadline_ms=10**12)
    second = _run("job@2", 20_000, RunStatus.SCHEDULED, b1)
    third = _run("job@3", 30_000, RunStatus.SCHEDULED, b1)
    assert second.timer_ms() == 20_000, "released at its start, like forbid"
    (ev,) = R.decide_timer(second, 20_000, job=job, active=running)
    assert isinstance(ev, R.RunBuffered) and ev.recheck_at_ms == 20_000 + R.RunConfig().redispatch_after_ms
    waiting = R.evolve(second, ev)
    assert waiting.buffered and waiting.status is RunStatus.SCHEDULED
    assert waiting.reason == waiting.note == "overlap: buffered behind job@1 (bufferOne)"
    assert waiting.timer_ms() == ev.recheck_at_ms
    # the next slot finds one waiting: skipped, recorded why
    (ev3,) = R.decide_timer(third, 30_000, job=job, active=running, buffered=waiting)
    assert isinstance(ev3, R.RunWithdrawn) and ev3.reason.startswith("overlap: job@1 is still running")
    assert "job@2 already waits" in ev3.reason
    # still active at the re-check: waits on (another re-check), even though it is itself "buffered"
    (again,) = R.decide_timer(waiting, 21_000, job=job, active=running, buffered=waiting)
    assert isinstance(again, R.RunBuffered) and again.recheck_at_ms == 22_000
    # the active run ended: released, and the note stays when it finishes
    (rel,) = R.decide_timer(R.evolve(waiting, again), 22_000, job=job, active=None)
    assert isinstance(rel, R.RunReleased)
    released = R.evolve(R.evolve(waiting, again), rel)
    assert released.status is RunStatus.READY and not released.buffered and released.note
    # paused or deleted while waiting: withdrawn as any scheduled run
    paused = J.JobState("job", "t", spec(b1), J.JobStatus.PAUSED, 40_000, 2, 0, 0)
    (w,) = R.decide_timer(waiting, 21_000, job=paused, active=running)
    assert isinstance(w, R.RunWithdrawn) and w.reason == "paused"
    assert not R.evolve(waiting, w).buffered
    # manual runs ignore the policy
    manual = R.RunState("job@manual:k", "job", "t", spec(b1), 20_000, 20_000, True, RunStatus.SCHEDULED, 0, 0)
    assert isinstance(R.decide_timer(manual, 20_000, job=job, active=running)[0], R.RunReleased)


_POLICIES = st.sampled_from(list(OverlapPolicy))
_ACTIVE = st.sampled_from([RunStatus.READY, RunStatus.RUNNING, RunStatus.RETRY_WAIT])


@settings(max_examples=200, deadline=None)
@given(_POLICIES, st.one_of(st.none(), _ACTIVE), st.booleans(), st.integers(20_000, 10**9))
def test_overlap_decision_properties(overlap: OverlapPolicy, active_status: RunStatus | None,
                                     other_waits: bool, now: int) -> None:
    """forbid never releases while a run is active; bufferOne releases only when none is,
    and holds a second run only if none waits yet; replace always cancels the active run
    it releases past; allow always releases."""
    job = _job(overlap)
    sched = _run("job@2", 20_000, RunStatus.SCHEDULED, overlap)
    active = None if active_status is None else _run(
        "job@1", 10_000, active_status, overlap, lease_until_ms=10**12, deadline_ms=10**12, next_attempt_at_ms=10**12)
    waiting = _run("job@0", 15_000, RunStatus.SCHEDULED, overlap, recheck_at_ms=now + 1) if other_waits else None
    (ev,) = R.decide_timer(sched, now, job=job, active=active, buffered=waiting)
    if active is None or overlap in (OverlapPolicy.ALLOW, OverlapPolicy.REPLACE):
        assert isinstance(ev, R.RunReleased)
    elif overlap is OverlapPolicy.FORBID:
        assert isinstance(ev, R.RunWithdrawn) and ev.reason.startswith("overlap:")
    elif waiting is not None:
        assert isinstance(ev, R.RunWithdrawn) and ev.reason.startswith("overlap:")  # never a second buffered run
    else:
        assert isinstance(ev, R.RunBuffered) and R.evolve(sched, ev).buffered
    if isinstance(ev, R.RunReleased) and active is not None:
        cancel = R.replacement_cancel(R.evolve(sched, ev), active, now)
        assert (cancel is not None) == (overlap is OverlapPolicy.REPLACE)
        if cancel is not None:
            assert cancel.run_id == active.run_id and "overlap: replace" in cancel.reason


def test_a_buffered_run_is_not_held_again_by_its_upstreams() -> None:
    """A run released by its upstreams and then buffered (bufferOne) keeps that release:
    while it waits, more ends of its upstream may push the one that covered its slot out
    of the job's latest ends, and a fresh verdict would say "wait"; it is not held again
    (it would wait to its bound, then be skipped though its upstream succeeded)."""
    from gnomon.core import dependencies as D

    b1 = OverlapPolicy.BUFFER_ONE
    job = _job(b1)
    running = _run("job@1", 10_000, RunStatus.RUNNING, b1, lease_until_ms=10**12, deadline_ms=10**12)
    waiting = R.evolve(_run("job@2", 20_000, RunStatus.SCHEDULED, b1),
                       R.RunBuffered("job@2", "job@1", 21_000, 20_000))
    forgot = D.Wait(("up",), 99_000)
    (ev,) = R.decide_timer(waiting, 21_000, job=job, active=running, buffered=waiting, upstreams=forgot)
    assert isinstance(ev, R.RunBuffered), ev
    (rel,) = R.decide_timer(waiting, 21_000, job=job, active=None, upstreams=forgot)
    assert isinstance(rel, R.RunReleased), rel
    # a run held after all leaves no buffered recheck behind (its timer is the hold's end)
    held = R.evolve(waiting, R.RunHeld("job@2", ("up",), 99_000, 21_000))
    assert not held.buffered and held.timer_ms() == 99_000


def test_replace_never_lets_an_older_slot_cancel_a_newer_run() -> None:
    """Upstreams may end out of order: the run of slot T+10 released first, then T's. With
    ``replace`` the older is withdrawn, the newer keeps running."""
    from gnomon.core.model import Upstream
    from gnomon.core.records import replace

    rep = OverlapPolicy.REPLACE
    plain = _job(rep)
    job = replace(plain, spec=replace(plain.spec, after=(Upstream("up"),)))
    newer = _run("job@3", 30_000, RunStatus.RUNNING, rep, lease_until_ms=10**12, deadline_ms=10**12)
    older = _run("job@2", 20_000, RunStatus.SCHEDULED, rep)
    (ev,) = R.decide_timer(older, 31_000, job=job, active=newer)
    assert isinstance(ev, R.RunWithdrawn) and ev.reason.startswith("overlap: superseded by job@3"), ev
    # in slot order it replaces, as before; and without upstreams a late release replaces too
    oldest = _run("job@1", 10_000, RunStatus.RUNNING, rep, lease_until_ms=10**12, deadline_ms=10**12)
    (rel,) = R.decide_timer(older, 20_000, job=job, active=oldest)
    assert isinstance(rel, R.RunReleased)
    (late,) = R.decide_timer(older, 31_000, job=plain, active=newer)
    assert isinstance(late, R.RunReleased)
