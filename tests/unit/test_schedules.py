"""Intervals and bounds (issue 25): the slots of a schedule (``core.schedule``), the
scheduler's decisions over them (``core.jobs``: startAt, endAt, maxRuns end a job with a
reason), the API's rules (``core.validation``) and the fire-time preview (``core.fires``,
``GET /v1/jobs/{id}/fires``), DST cases included. The simulation test at the end runs the
real processor and worker loops under faults and accounts for every slot."""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gnomon.api.views import fires_view, job_view
from gnomon.core import jobs as J
from gnomon.core import runs as R
from gnomon.core import schedule as S
from gnomon.core.clock import iso_to_ms, ms_to_iso
from gnomon.core.errors import ValidationError
from gnomon.core.fires import preview
from gnomon.core.model import CatchUp, JobSpec, Schedule, Target, TargetType, jitter_offset_ms
from gnomon.core.validation import (
    apply_patch,
    format_duration_s,
    job_spec_to_json,
    parse_duration_s,
    parse_job_spec,
    parse_schedule,
)
from gnomon.sim import SimCluster, SimFaults

T0 = iso_to_ms("2026-01-01T00:00:00Z")
HANDLER = {"type": "handler", "name": "h"}


def spec_of(**when: object) -> JobSpec:
    return parse_job_spec({"name": "j", "target": HANDLER, **when}, T0)


def state_of(spec: JobSpec, at_ms: int = T0) -> J.JobState:
    (registered,) = J.decide(None, J.RegisterJob("j", "t", spec, at_ms))
    state = J.evolve(None, registered)
    assert state is not None
    return state


def run_ticks(state: J.JobState, until_ms: int, step_ms: int = 1_000,
              cfg: J.SchedulerConfig | None = None) -> tuple[J.JobState, list[J.RunTriggered], list[J.RunSkipped]]:
    """Tick the job every ``step_ms`` up to ``until_ms``: its state and what it decided."""
    cfg = cfg or J.SchedulerConfig(lookahead_ms=2_000)
    triggered: list[J.RunTriggered] = []
    skipped: list[J.RunSkipped] = []
    now = state.updated_at_ms
    while now <= until_ms:
        for ev in J.decide_tick(state, now, cfg):
            state = J.evolve(state, ev)  # type: ignore[assignment]
            (triggered if isinstance(ev, J.RunTriggered) else skipped).append(ev)  # type: ignore[arg-type]
        now += step_ms
    return state, triggered, skipped


# ---- durations and parsing --------------------------------------------------------------


@pytest.mark.parametrize(("text", "seconds"), [("90m", 5400), ("1h30m", 5400), ("7d", 604_800), ("45s", 45),
                                               ("1d2h3m4s", 93_784), ("366d", 366 * 86_400)])
def test_durations_read_and_print_back(text: str, seconds: int) -> None:
    assert parse_duration_s(text, "every") == seconds
    assert parse_duration_s(format_duration_s(seconds), "every") == seconds


@pytest.mark.parametrize("text", ["", "0s", "90", "1.5h", "m", "30m1h", "367d", "-5m", " 5m", 5, None])
def test_bad_durations_name_the_field(text: object) -> None:
    with pytest.raises(ValidationError) as err:
        parse_duration_s(text, "every")
    assert err.value.field == "every"


@pytest.mark.parametrize(("when", "field"), [
    ({"every": "90m", "schedule": "* * * * *"}, "schedule"),
    ({}, "schedule"),
    ({"schedule": "* * * * *", "from": "2026-01-01T00:00:00Z"}, "from"),
    ({"runAt": "2026-02-01T00:00:00Z", "endAt": "2026-03-01T00:00:00Z"}, "endAt"),
    ({"runAt": "2026-02-01T00:00:00Z", "maxRuns": 3}, "maxRuns"),
    ({"every": "1h", "startAt": "2026-03-01T00:00:00Z", "endAt": "2026-02-01T00:00:00Z"}, "endAt"),
    ({"every": "1h", "endAt": "2025-12-01T00:00:00Z"}, "endAt"),
    ({"every": "1h", "maxRuns": 0}, "maxRuns"),
    ({"every": "1h", "maxRuns": True}, "maxRuns"),
    ({"every": "1h", "from": "yesterday"}, "from"),
    ({"every": "1h", "startAt": "10000-01-01T00:00:00Z"}, "startAt"),
    ({"schedule": "0 0 1 1 *", "startAt": "2026-02-01T00:00:00Z", "endAt": "2026-03-01T00:00:00Z"}, "startAt"),
])
def test_bad_schedules_name_the_field(when: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError) as err:
        spec_of(**when)
    assert err.value.field == field, err.value


def test_a_local_date_time_is_read_in_the_jobs_zone() -> None:
    spec = spec_of(every="1d", **{"from": "2026-07-01T09:00"}, timezone="Europe/London",
                   startAt="2026-07-02", endAt="2026-07-10T09:00:00+01:00")
    assert spec.schedule.anchor_ms == iso_to_ms("2026-07-01T08:00:00Z")
    assert spec.schedule.start_at_ms == iso_to_ms("2026-07-01T23:00:00Z")
    assert spec.schedule.end_at_ms == iso_to_ms("2026-07-10T08:00:00Z")
    assert spec.schedule.every_s == 86_400 and spec.schedule.tz == "Europe/London"
    # the API's shape reads back to the same spec
    assert parse_job_spec(job_spec_to_json(spec), T0) == spec


def test_a_patch_switches_between_cron_interval_and_one_time() -> None:
    cron = spec_of(schedule="0 * * * *", maxRuns=5)
    interval = apply_patch(cron, {"every": "90m"}, T0)
    assert (interval.schedule.cron, interval.schedule.every_s, interval.schedule.max_runs) == (None, 5400, 5)
    anchored = apply_patch(interval, {"from": "2026-02-01T00:00:00Z"}, T0)
    assert anchored.schedule.anchor_ms == iso_to_ms("2026-02-01T00:00:00Z")
    back = apply_patch(anchored, {"schedule": "*/5 * * * *", "maxRuns": None}, T0)
    assert back.schedule == Schedule(cron="*/5 * * * *")
    with pytest.raises(ValidationError) as err:
        apply_patch(back, {"runAt": "2026-06-01T00:00:00Z", "startAt": "2026-05-01T00:00:00Z"}, T0)
    assert err.value.field == "startAt"


# ---- slots ----------------------------------------------------------------------------


def test_an_interval_without_anchor_counts_from_the_epoch() -> None:
    sched = Schedule(every_s=5400)
    assert [ms_to_iso(s) for s in S.next_n(sched, T0, 3)] == [
        "2026-01-01T01:30:00Z", "2026-01-01T03:00:00Z", "2026-01-01T04:30:00Z"]
    assert S.next_after(sched, T0 - 1) == T0  # 2026-01-01 00:00 is a multiple of 90 minutes
    assert S.last_at_or_before(sched, T0 + 5399, 2) == [T0, T0 - 5_400_000]
    assert S.is_slot(sched, T0 + 5_400_000) and not S.is_slot(sched, T0 + 1000)


def test_an_interval_is_absolute_time_across_dst_and_cron_keeps_the_wall_clock() -> None:
    # every 24 h from 09:00 London on 2026-03-28: the clocks go forward on the 29th, so
    # the interval's slots move to 10:00 BST; a cron "0 9 * * *" stays at 09:00
    every = parse_schedule({"every": "24h", "from": "2026-03-28T09:00", "timezone": "Europe/London"}, T0)
    fires = preview(every, after_ms=iso_to_ms("2026-03-28T00:00:00Z"), count=3).fires
    assert [f.local("Europe/London") for f in fires] == [
        "2026-03-28 09:00:00 GMT", "2026-03-29 10:00:00 BST", "2026-03-30 10:00:00 BST"]
    assert [b.slot_ms - a.slot_ms for a, b in itertools.pairwise(fires)] == [86_400_000] * 2
    cron = parse_schedule({"schedule": "0 9 * * *", "timezone": "Europe/London"}, T0)
    fires = preview(cron, after_ms=iso_to_ms("2026-03-28T00:00:00Z"), count=3).fires
    assert [f.local("Europe/London") for f in fires] == [
        "2026-03-28 09:00:00 GMT", "2026-03-29 09:00:00 BST", "2026-03-30 09:00:00 BST"]
    # fall back: 90 minutes stay 90 minutes through the repeated hour (New York, 2026-11-01)
    ny = parse_schedule({"every": "90m", "from": "2026-10-31T23:30", "timezone": "America/New_York"}, T0)
    fires = preview(ny, after_ms=iso_to_ms("2026-11-01T04:59:59Z"), count=4).fires
    assert [f.local("America/New_York") for f in fires] == [
        "2026-11-01 01:00:00 EDT", "2026-11-01 01:30:00 EST", "2026-11-01 03:00:00 EST", "2026-11-01 04:30:00 EST"]


def test_cron_next_fires_follow_the_zone_across_daylight_saving() -> None:
    # 02:30 every day in New York; DST starts 2026-03-08 (02:30 does not exist: runs at 03:00 EDT)
    cron = parse_schedule({"schedule": "30 2 * * *", "timezone": "America/New_York"}, T0)
    fires = preview(cron, after_ms=iso_to_ms("2026-03-06T12:00:00Z"), count=4).fires
    assert [f.local("America/New_York") for f in fires] == [
        "2026-03-07 02:30:00 EST", "2026-03-08 03:00:00 EDT", "2026-03-09 02:30:00 EDT", "2026-03-10 02:30:00 EDT"]


def test_bounds_cut_the_slots() -> None:
    sched = Schedule(every_s=3600, start_at_ms=T0 + 1_800_000, end_at_ms=T0 + 4 * 3_600_000)
    assert S.next_n(sched, T0 - 10_000_000, 10) == [T0 + h * 3_600_000 for h in (1, 2, 3, 4)]
    assert S.last_at_or_before(sched, T0 + 10 * 3_600_000, 10) == [T0 + h * 3_600_000 for h in (4, 3, 2, 1)]
    assert not S.is_slot(sched, T0) and not S.is_slot(sched, T0 + 5 * 3_600_000)


# ---- the scheduler ----------------------------------------------------------------------


def test_max_runs_ends_the_job_with_its_reason_and_manual_runs_do_not_count() -> None:
    state = state_of(spec_of(every="10s", maxRuns=3))
    (manual,) = J.decide(state, J.TriggerJob("j", "t", "k1", T0 + 1))
    state = J.evolve(state, manual)  # type: ignore[assignment]
    state, triggered, skipped = run_ticks(state, T0 + 120_000)
    assert [ev.slot_ms for ev in triggered] == [T0, T0 + 10_000, T0 + 20_000] and not skipped
    assert state.status is J.JobStatus.DONE and state.next_run_at_ms is None and state.scheduled_runs == 3
    assert J.ended_because(state) == "maxRuns reached (3 of 3 runs)"
    view = job_view(state)
    assert view["maxRuns"] == 3 and view["scheduledRuns"] == 3 and view["endedBecause"].startswith("maxRuns")
    assert fires_view(state, T0 + 200_000, 5)["fires"] == []
    # raising maxRuns gives the job its next slots back
    (more,) = J.decide(state, J.PatchJob("j", "t", '{"maxRuns":5}', None, T0 + 125_000))
    state = J.evolve(state, more)  # type: ignore[assignment]
    assert state.status is J.JobStatus.ACTIVE and state.next_run_at_ms == T0 + 130_000
    state, triggered, _ = run_ticks(state, T0 + 300_000)
    assert [ev.slot_ms for ev in triggered] == [T0 + 130_000, T0 + 140_000] and state.status is J.JobStatus.DONE


def test_end_at_ends_the_job_and_start_at_holds_it_back() -> None:
    state = state_of(spec_of(schedule="*/15 * * * * *", startAt="2026-01-01T00:01:00Z", endAt="2026-01-01T00:02:00Z"))
    assert state.next_run_at_ms == T0 + 60_000
    state, triggered, _ = run_ticks(state, T0 + 600_000)
    assert [ev.slot_ms - T0 for ev in triggered] == [60_000, 75_000, 90_000, 105_000, 120_000]
    assert state.status is J.JobStatus.DONE
    assert J.ended_because(state) == "endAt passed (2026-01-01T00:02:00Z)"


def test_catch_up_all_after_an_outage_stops_at_max_runs() -> None:
    spec = replace(spec_of(every="1m", maxRuns=4), catch_up=CatchUp.ALL)
    state = state_of(spec)
    # nobody ticked for ten minutes: catch-up all runs the oldest missed slots up to maxRuns
    events = J.decide_tick(state, T0 + 600_000, J.SchedulerConfig())
    runs = [ev for ev in events if isinstance(ev, J.RunTriggered)]
    assert [ev.slot_ms for ev in runs] == [T0 + m * 60_000 for m in range(4)]
    for ev in events:
        state = J.evolve(state, ev)  # type: ignore[assignment]
    assert state.status is J.JobStatus.DONE and state.scheduled_runs == 4


def test_backfill_takes_interval_slots_within_the_bounds() -> None:
    state = state_of(spec_of(every="1m", startAt="2026-01-01T00:02:00Z"), at_ms=T0)
    state, _, _ = run_ticks(state, T0 + 600_000, step_ms=5_000)
    J.check_backfill_slots(state, (T0 + 180_000,))
    with pytest.raises(ValidationError, match="not a slot"):
        J.check_backfill_slots(state, (T0 + 60_000,))  # before startAt
    assert R._is_slot_of(state.spec, T0 + 120_000) and not R._is_slot_of(state.spec, T0 + 60_000)


def test_the_preview_shows_jitter_bounds_and_the_end() -> None:
    state = state_of(spec_of(schedule="*/10 * * * * *", jitterS=5, maxRuns=4))
    shown = fires_view(state, T0, 10)
    assert [f["slot"] for f in shown["fires"]] == [ms_to_iso(T0 + s * 1000) for s in (10, 20, 30, 40)]
    for fire in shown["fires"]:
        slot = iso_to_ms(fire["slot"])
        assert iso_to_ms(fire["start"]) == slot + jitter_offset_ms("j", slot, 5)
    assert shown["ends"] == "maxRuns: the last run is 2026-01-01T00:00:40Z"
    assert shown["schedule"] == "cron '*/10 * * * * *' (UTC), at most 4 runs"
    once = state_of(spec_of(runAt="2026-05-01T09:00:00Z", timezone="Europe/London"))
    assert [f["local"] for f in fires_view(once, T0, 10)["fires"]] == ["2026-05-01 10:00:00 BST"]
    assert fires_view(once, iso_to_ms("2026-06-01T00:00:00Z"), 10)["fires"] == []
    # triggered in the lookahead, before its instant: done, but its run is still ahead,
    # so the preview shows it (as it did before the tick); once past, it says why it ended
    (ahead,) = J.decide_tick(once, iso_to_ms("2026-05-01T08:59:50Z"))
    done = J.evolve(once, ahead)
    assert done is not None and done.status is J.JobStatus.DONE
    shown = fires_view(done, iso_to_ms("2026-05-01T08:59:55Z"), 10)
    assert [f["local"] for f in shown["fires"]] == ["2026-05-01 10:00:00 BST"] and shown["ends"] == "one time"
    assert shown["endedBecause"] == "its one-time slot was triggered"
    shown = fires_view(done, iso_to_ms("2026-05-01T09:00:00Z"), 10)
    assert shown["fires"] == [] and shown["ends"] == shown["endedBecause"] == "its one-time slot was triggered"


@pytest.mark.parametrize("bounds", [{"maxRuns": 3}, {"endAt": "2026-01-01T00:00:20Z"}])
def test_a_job_done_in_the_lookahead_still_previews_its_runs_ahead(bounds: dict[str, Any]) -> None:
    # every 10 s, 3 runs (by maxRuns or by endAt): one tick at T0 with a 30 s lookahead
    # triggers all three and ends the job; the preview at T0 is the one it gave before
    state = state_of(spec_of(every="10s", **bounds))
    before = fires_view(state, T0 - 1, 10)
    state, triggered, _ = run_ticks(state, T0, cfg=J.SchedulerConfig(lookahead_ms=30_000))
    assert [ev.slot_ms - T0 for ev in triggered] == [0, 10_000, 20_000]
    assert state.status is J.JobStatus.DONE and state.last_slot_ms == T0 + 20_000
    after = fires_view(state, T0 - 1, 10)
    assert (after["fires"], after["ends"]) == (before["fires"], before["ends"]) and after["endedBecause"]
    assert [iso_to_ms(f["slot"]) - T0 for f in fires_view(state, T0 + 5_000, 10)["fires"]] == [10_000, 20_000]
    gone = fires_view(state, T0 + 20_000, 10)
    assert gone["fires"] == [] and gone["ends"] == gone["endedBecause"]
    # moved away: its slots are the other region's, none shown here
    moved = replace(state, moved_to="b")
    assert fires_view(moved, T0 - 1, 10)["fires"] == []


# ---- property: every bounded slot exactly once -------------------------------------------


@settings(max_examples=60, deadline=None)
@given(every_s=st.integers(1, 40), anchor_s=st.integers(-30, 30), start_s=st.none() | st.integers(0, 120),
       span_s=st.none() | st.integers(0, 200), max_runs=st.none() | st.integers(1, 12),
       pause=st.none() | st.tuples(st.integers(0, 150), st.integers(1, 60)),
       outage=st.none() | st.tuples(st.integers(0, 150), st.integers(61, 120)),
       catch_up=st.sampled_from(list(CatchUp)))
def test_every_slot_within_the_bounds_is_triggered_or_skipped_exactly_once(
        every_s: int, anchor_s: int, start_s: int | None, span_s: int | None, max_runs: int | None,
        pause: tuple[int, int] | None, outage: tuple[int, int] | None, catch_up: CatchUp) -> None:
    start = None if start_s is None else T0 + start_s * 1000
    end = None if span_s is None else (start or T0) + span_s * 1000
    sched = Schedule(every_s=every_s, anchor_ms=T0 + anchor_s * 1000, start_at_ms=start, end_at_ms=end,
                     max_runs=max_runs)
    spec = JobSpec("j", sched, Target(TargetType.HANDLER, handler="h"), catch_up=catch_up)
    if S.first_at_or_after(sched, T0) is None:
        return
    state = state_of(spec)
    cfg = J.SchedulerConfig(lookahead_ms=2_000)
    decided: list[J.RunTriggered | J.RunSkipped] = []
    now = T0
    while now <= T0 + 400_000:
        if pause is not None and now == T0 + pause[0] * 1000 and state.status is J.JobStatus.ACTIVE:
            for ev in J.decide(state, J.PauseJob("j", "t", now)):  # (a job behind: its due slots, then the pause)
                state = J.evolve(state, ev)  # type: ignore[assignment]
                if isinstance(ev, J.RunSkipped):
                    decided.append(ev)
        if pause is not None and now == T0 + (pause[0] + pause[1]) * 1000 and state.status is J.JobStatus.PAUSED:
            for ev in J.decide(state, J.ResumeJob("j", "t", now)):
                state = J.evolve(state, ev)  # type: ignore[assignment]
                if isinstance(ev, J.RunSkipped):
                    decided.append(ev)
        away = outage is not None and T0 + outage[0] * 1000 <= now < T0 + (outage[0] + outage[1]) * 1000
        if not away:
            for ev in J.decide_tick(state, now, cfg):
                assert isinstance(ev, J.RunTriggered | J.RunSkipped)
                state = J.evolve(state, ev)  # type: ignore[assignment]
                decided.append(ev)
        now += 1_000
    seen: dict[int, str] = {}
    for ev in decided:
        covered = ([ev.slot_ms] if isinstance(ev, J.RunTriggered) or ev.from_ms is None
                   else [s for s in S.next_n(sched, ev.from_ms - 1, 10_000) if s <= ev.slot_ms])
        assert len(covered) == (1 if isinstance(ev, J.RunTriggered) else ev.count)
        for slot in covered:
            assert S.is_slot(sched, slot), (ms_to_iso(slot), sched)
            assert slot not in seen, f"slot {ms_to_iso(slot)} decided twice"
            seen[slot] = type(ev).__name__
    runs = [ev for ev in decided if isinstance(ev, J.RunTriggered)]
    assert max_runs is None or len(runs) <= max_runs
    assert state.scheduled_runs == len(runs)
    # every slot up to where the job is (or all of them, once it ended) is accounted for
    upto = state.next_run_at_ms if state.next_run_at_ms is not None else (max(seen) + 1 if seen else T0)
    expected = [s for s in S.next_n(sched, T0 - 1, 10_000) if s < upto]
    assert sorted(seen) == expected
    if state.status is J.JobStatus.DONE:
        assert (max_runs is not None and len(runs) == max_runs) or (end is not None and S.next_after(sched, upto - 1) is None)


# ---- the simulation: real loops, faults, the checker ----------------------------------------


@pytest.mark.usefixtures("quiet_logs")
@pytest.mark.parametrize("seed", range(4), ids=lambda s: f"seed-{s}")
def test_intervals_and_bounds_under_faults_account_for_every_slot(seed: int) -> None:
    c = SimCluster(seed, processors=2, workers=2, partitions=4, faults=SimFaults.mixed())
    now = c.clock.now_ms()
    base = now - now % 1000
    c.register("every3", "", schedule=Schedule(every_s=3, anchor_ms=base + 1000))
    c.register("window", "", schedule=Schedule(cron="*/2 * * * * *", start_at_ms=base + 6_000, end_at_ms=base + 20_000))
    c.register("five", "", schedule=Schedule(every_s=2, max_runs=5))
    c.register("cron", "* * * * * *")
    c.run_for(40_000)
    c.heal(15_000)
    rep = c.history_report()
    assert rep.missed == 0 and rep.duplicates == 0 and not rep.problems, \
        f"{rep.summary()}\n{c.describe()}\nproblems: {rep.problems[:10]}"
    jobs = c.jobs()
    assert jobs["window"].status is J.JobStatus.DONE and jobs["five"].status is J.JobStatus.DONE
    assert jobs["five"].scheduled_runs == 5
    by_job: dict[str, set[int]] = {}
    for run in c.ledger():
        by_job.setdefault(run.job_id, set()).add(run.slot_ms)
    assert min(by_job["window"]) >= base + 6_000 and max(by_job["window"]) <= base + 20_000
    assert all((s - base - 1000) % 3000 == 0 for s in by_job["every3"])
    assert len(by_job["five"]) == 5


def test_changing_only_the_bounds_keeps_the_jobs_place_and_a_resume_does_not_trigger_twice() -> None:
    state = state_of(spec_of(every="1s", maxRuns=10))
    state, triggered, _ = run_ticks(state, T0)  # the lookahead: slots 0, 1, 2 s triggered
    assert [ev.slot_ms - T0 for ev in triggered] == [0, 1000, 2000] and state.scheduled_runs == 3
    (patched,) = J.decide(state, J.PatchJob("j", "t", '{"maxRuns":4}', None, T0 + 500))
    state = J.evolve(state, patched)  # type: ignore[assignment]
    assert state.next_run_at_ms == T0 + 3000  # not back to the slot at 1 s (triggered already)
    state = J.evolve(state, J.decide(state, J.PauseJob("j", "t", T0 + 600))[0])  # type: ignore[assignment]
    for ev in J.decide(state, J.ResumeJob("j", "t", T0 + 700)):
        state = J.evolve(state, ev)  # type: ignore[assignment]
    assert state.next_run_at_ms == T0 + 3000
    state, triggered, _ = run_ticks(state, T0 + 10_000)
    assert [ev.slot_ms - T0 for ev in triggered] == [3000] and state.status is J.JobStatus.DONE


def test_the_preview_counts_the_lookaheads_triggers_once() -> None:
    # maxRuns 6, every 20 s: the lookahead triggered the slots at 0, 20 and 40 s (3 runs
    # counted, next_run_at 60 s); at 10 s the preview shows 20, 40 (triggered) and then
    # the 3 runs left: 60, 80, 100, and ends there
    state = state_of(spec_of(every="20s", maxRuns=6))
    state, _, _ = run_ticks(state, T0, cfg=J.SchedulerConfig(lookahead_ms=45_000))
    assert state.scheduled_runs == 3 and state.next_run_at_ms == T0 + 60_000
    shown = fires_view(state, T0 + 10_000, 10)
    assert [iso_to_ms(f["slot"]) - T0 for f in shown["fires"]] == [20_000, 40_000, 60_000, 80_000, 100_000]
    assert shown["ends"] == "maxRuns: the last run is 2026-01-01T00:01:40Z"
