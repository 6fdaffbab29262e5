"""The scheduler's pure state machine: decide / decide_tick / evolve."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gnomon.core import jobs as J
from gnomon.core.clock import iso_to_ms
from gnomon.core.cron import CronSchedule
from gnomon.core.errors import TransitionError
from gnomon.core.model import CatchUp, JobSpec, Schedule, Target, TargetType

T0 = iso_to_ms("2026-11-29T08:00:00Z")
CMD = Target(TargetType.COMMAND, argv=("true",))


def spec(cron: str = "*/5 * * * * *", catch_up: CatchUp = CatchUp.ONCE) -> JobSpec:
    return JobSpec(name="j", schedule=Schedule(cron=cron), target=CMD, catch_up=catch_up)


def register(s: JobSpec, at: int = T0) -> J.JobState:
    st_ = None
    for ev in J.decide(None, J.RegisterJob("job1", "t", s, at)):
        st_ = J.evolve(st_, ev)
    assert st_ is not None
    return st_


def apply(state: J.JobState, events: list[J.JobEvent]) -> J.JobState:
    for ev in events:
        new = J.evolve(state, ev)
        assert new is not None
        state = new
    return state


def test_register_computes_first_slot() -> None:
    s = register(spec(), T0 + 1)
    assert s.next_run_at_ms == T0 + 5000 and s.status is J.JobStatus.ACTIVE


def test_tick_triggers_within_lookahead_and_advances() -> None:
    s = register(spec())
    evs = J.decide_tick(s, T0, J.SchedulerConfig(lookahead_ms=12_000))
    trig = [e for e in evs if isinstance(e, J.RunTriggered)]
    assert [e.slot_ms - T0 for e in trig] == [0, 5000, 10000]
    assert next(e.run_id for e in trig) == "job1@2026-11-29T08:00:00Z"
    assert all(e.not_before_ms == e.slot_ms for e in trig)
    s2 = apply(s, evs)
    assert s2.next_run_at_ms == T0 + 15000
    assert J.decide_tick(s2, T0, J.SchedulerConfig(lookahead_ms=12_000)) == []


def test_paused_job_does_not_trigger_and_resume_records_skips() -> None:
    s = register(spec())
    s = apply(s, J.decide(s, J.PauseJob("job1", "t", T0)))
    assert J.decide_tick(s, T0 + 60_000) == []
    evs = J.decide(s, J.ResumeJob("job1", "t", T0 + 20_000))
    (skip,) = [e for e in evs if isinstance(e, J.RunSkipped)]  # one record for the whole range
    assert (skip.from_ms, skip.slot_ms, skip.count, skip.reason) == (T0, T0 + 15_000, 4, "paused")
    assert skip.run_id == "job1@2026-11-29T08:00:15Z"  # named by its last slot
    s = apply(s, evs)
    assert s.status is J.JobStatus.ACTIVE and s.next_run_at_ms == T0 + 20_000


def test_trigger_is_manual_and_keyed() -> None:
    s = register(spec())
    (ev,) = J.decide(s, J.TriggerJob("job1", "t", "k1", T0 + 7))
    assert isinstance(ev, J.RunTriggered) and ev.run_id == "job1@manual:k1" and ev.manual
    assert J.evolve(s, ev) == s  # manual triggers do not move the schedule


def test_commands_on_missing_or_foreign_jobs_are_refused() -> None:
    with pytest.raises(TransitionError):
        J.decide(None, J.PauseJob("nope", "t", T0))
    s = register(spec())
    with pytest.raises(TransitionError):
        J.decide(s, J.PauseJob("job1", "other-tenant", T0))
    assert J.evolve(s, J.decide(s, J.DeleteJob("job1", "t", T0))[0]) is None


def test_one_time_job_runs_once_then_done() -> None:
    s = register(JobSpec(name="once", schedule=Schedule(run_at_ms=T0 + 10_000), target=CMD))
    evs = J.decide_tick(s, T0)
    assert [type(e) for e in evs] == [J.RunTriggered]
    s = apply(s, evs)
    assert s.status is J.JobStatus.DONE and J.decide_tick(s, T0 + 100_000) == []


@pytest.mark.parametrize(("policy", "runs", "skipped"), [(CatchUp.SKIP, 0, 19), (CatchUp.ONCE, 1, 18), (CatchUp.ALL, 19, 0)])
def test_catch_up_policies_after_outage(policy: CatchUp, runs: int, skipped: int) -> None:
    s = register(spec("*/10 * * * * *", policy))  # slots every 10 s from T0
    # processors away 3 min: the job is behind by more than the 60 s grace, so the policy
    # decides over every slot up to now (19 of them), the grace's last minute included
    now = T0 + 180_000
    evs = J.decide_tick(s, now, J.SchedulerConfig(lookahead_ms=0))
    missed = [e for e in evs if e.slot_ms <= now]
    assert sum(isinstance(e, J.RunTriggered) for e in missed) == runs
    assert sum(e.count for e in missed if isinstance(e, J.RunSkipped)) == skipped
    assert sum(isinstance(e, J.RunSkipped) for e in missed) == (1 if skipped else 0)  # a range, not one each
    if policy is CatchUp.ONCE:
        assert [e.slot_ms for e in missed if isinstance(e, J.RunTriggered)] == [now]  # the latest
    s = apply(s, evs)
    assert s.next_run_at_ms is not None and s.next_run_at_ms > now


def test_a_job_late_by_less_than_the_grace_runs_every_slot() -> None:
    s = register(spec("*/10 * * * * *", CatchUp.SKIP))
    evs = J.decide_tick(s, T0 + 50_000, J.SchedulerConfig(lookahead_ms=0))  # 50 s late: within the grace
    assert [type(e) for e in evs] == [J.RunTriggered] * 6


@settings(max_examples=60, deadline=None)
@given(
    gaps=st.lists(st.integers(min_value=1, max_value=400_000), min_size=1, max_size=40),
    policy=st.sampled_from(list(CatchUp)),
    cron=st.sampled_from(["*/5 * * * * *", "*/7 * * * * *", "0 * * * * *", "*/1 * * * *"]),
)
def test_every_slot_is_accounted_for_exactly_once(gaps: list[int], policy: CatchUp, cron: str) -> None:
    """Whatever the tick times (incl. long outages), the triggered + skipped slots are
    exactly the cron's slots from the first one up to where the schedule now points."""
    s = register(spec(cron, policy))
    first = s.next_run_at_ms
    assert first is not None
    seen: list[int] = []
    now = T0
    cfg = J.SchedulerConfig(skip_count_max=50)
    ranges: list[tuple[int, int, int]] = []
    for gap in gaps:
        now += gap
        evs = J.decide_tick(s, now, cfg)
        skips = [e for e in evs if isinstance(e, J.RunSkipped)]
        assert len(skips) <= 1, "one skipped-range record per tick, not one per slot"
        for e in evs:
            if isinstance(e, J.RunSkipped):
                ranges.append((e.from_ms if e.from_ms is not None else e.slot_ms, e.slot_ms, e.count))
            else:
                seen.append(e.slot_ms)
        s = apply(s, evs)
    end = s.next_run_at_ms
    assert end is not None
    expected = [first]
    for x in CronSchedule(cron, "UTC").iter_after(first):
        if x >= end:
            break
        expected.append(x)
    for lo, hi, count in ranges:  # a range covers exactly the schedule's slots in it
        inside = [x for x in expected if lo <= x <= hi]
        assert lo in inside and hi in inside and count == min(len(inside), cfg.skip_count_max)
        seen.extend(inside)
    assert len(seen) == len(set(seen)), "a slot was doubled"
    assert sorted(seen) == expected, "a slot was silently skipped"
