"""The scheduler's pure state machine: decide / decide_tick / evolve."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gnomon.core import jobs as J
from gnomon.core.clock import iso_to_ms
from gnomon.core.cron import CronSchedule
from gnomon.core.errors import Conflict, GnomonError, TransitionError, ValidationError
from gnomon.core.model import CatchUp, JobSpec, Priority, Schedule, Target, TargetType
from gnomon.core.validation import DEFAULT_POOLS

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


# ---- tenant: every command on an existing job must come from its tenant ------------------


def _commands_as(tenant: str, at: int = T0 + 1) -> list[J.JobCommand]:
    return [
        J.UpdateJob("job1", tenant, spec("*/10 * * * * *"), at),
        J.PatchJob("job1", tenant, '{"name":"x"}', None, at),
        J.PauseJob("job1", tenant, at),
        J.ResumeJob("job1", tenant, at),
        J.DeleteJob("job1", tenant, at),
        J.TriggerJob("job1", tenant, "k", at),
    ]


@pytest.mark.parametrize("tenant", ["other-tenant", "", "T", "t "])
@pytest.mark.parametrize("paused", [False, True])
def test_every_command_from_another_tenant_is_refused(tenant: str, paused: bool) -> None:
    s = register(spec())
    if paused:
        s = apply(s, J.decide(s, J.PauseJob("job1", "t", T0)))
    for cmd in _commands_as(tenant):
        with pytest.raises(TransitionError, match=r"^job job1 does not exist$"):  # (as an unknown job)
            J.decide(s, cmd)
    # the job's own tenant may (each command alone, on the same state)
    for cmd in _commands_as("t"):
        J.decide(s, cmd)


def test_registering_over_another_tenants_job_is_refused() -> None:
    s = register(spec())
    with pytest.raises(TransitionError, match="already exists"):
        J.decide(s, J.RegisterJob("job1", "other-tenant", spec(), T0))


# ---- PatchJob: merged by the processor, optionally conditional -------------------------


def patch(fields: dict[str, Any], version: int | None = None, at: int = T0 + 1, tenant: str = "t") -> J.PatchJob:
    return J.PatchJob("job1", tenant, J.canonical_patch(fields), version, at)


def test_two_patches_to_different_fields_back_to_back_both_survive() -> None:
    """The lost-update race of the full-spec UpdateJob: both edits were made against
    version 1. As patches, merged in log order by the processor, both stay."""
    s = register(spec())
    s = apply(s, J.decide(s, patch({"priority": "high"})))
    s = apply(s, J.decide(s, patch({"payload": {"a": 1}}, at=T0 + 2)))
    assert s.spec.priority is Priority.HIGH and s.spec.payload_json == '{"a":1}'
    assert s.spec.schedule == spec().schedule and s.spec.target == CMD
    assert s.version == 3 and s.updated_at_ms == T0 + 2


def test_a_patch_keeps_the_schedule_position_unless_the_schedule_changes() -> None:
    s = register(spec())
    kept = apply(s, J.decide(s, patch({"name": "renamed"})))
    assert kept.next_run_at_ms == s.next_run_at_ms and kept.spec.name == "renamed"
    moved = apply(s, J.decide(s, patch({"schedule": "0 0 * * * *"}, at=T0 + 1)))
    assert moved.spec.schedule.cron == "0 0 * * * *" and moved.next_run_at_ms == T0 + 3_600_000


def test_a_patch_with_the_current_version_applies_and_a_stale_one_is_refused() -> None:
    s = register(spec())
    assert s.version == 1
    s2 = apply(s, J.decide(s, patch({"priority": "low"}, version=1)))
    assert s2.version == 2 and s2.spec.priority is Priority.LOW
    with pytest.raises(Conflict, match="version 2, not the expected 1"):
        J.decide(s2, patch({"priority": "high"}, version=1))  # made against the old version
    s3 = apply(s2, J.decide(s2, patch({"priority": "high"}, version=2)))
    assert s3.version == 3 and s3.spec.priority is Priority.HIGH


def test_pause_and_resume_move_the_version_a_patch_expects() -> None:
    s = register(spec())
    s = apply(s, J.decide(s, J.PauseJob("job1", "t", T0)))
    with pytest.raises(Conflict):
        J.decide(s, patch({"name": "x"}, version=1))
    s = apply(s, J.decide(s, patch({"name": "x"}, version=2)))
    assert s.status is J.JobStatus.PAUSED and s.version == 3, "a patch does not resume a paused job"


@pytest.mark.parametrize(("fields", "field"), [
    ({"timeoutS": 0}, "timeoutS"),
    ({"schedule": "not a cron"}, "schedule"),
    ({"retry": {"max": 1000}}, "retry.max"),
    ({"bogus": 1}, "bogus"),
    ({"pool": "gpu"}, "pool"),
    ({"runAt": "2020-01-01T00:00:00Z"}, "runAt"),
])
def test_an_invalid_patch_is_refused_with_its_field(fields: dict[str, Any], field: str) -> None:
    s = register(spec())
    with pytest.raises(ValidationError) as info:
        J.decide(s, patch(fields))
    assert info.value.field == field and "patch of job job1 refused" in str(info.value)


def test_a_patch_is_validated_against_the_pools_given() -> None:
    s = register(spec())
    with pytest.raises(ValidationError, match="unknown pool"):
        J.decide(s, patch({"pool": "gpu"}))
    s = apply(s, J.decide(s, patch({"pool": "gpu"}), pools=frozenset({"default", "gpu"})))
    assert s.spec.pool == "gpu"
    assert "gpu" not in DEFAULT_POOLS


@pytest.mark.parametrize("text", ["", "not json", "[1, 2]", '"x"', "null", "NaN", "[" * 100_000, "1" * 10_000])
def test_a_patch_that_is_not_a_json_object_is_refused(text: str) -> None:
    s = register(spec())
    with pytest.raises(ValidationError) as info:
        J.decide(s, J.PatchJob("job1", "t", text, None, T0 + 1))
    assert info.value.field == "body"


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=10,
)
PATCH_FIELDS = st.sampled_from(["name", "schedule", "timezone", "runAt", "target", "payload", "priority",
                                "timeoutS", "retry", "catchUp", "pool", "other"])


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(PATCH_FIELDS, JSON, max_size=4) | st.text(max_size=30).map(lambda t: {"raw": t}))
def test_any_patch_either_applies_or_is_refused_with_a_gnomon_error(fields: dict[str, Any]) -> None:
    """What a forged record could carry never raises anything but a GnomonError (which
    the runtime routes to poison), and a refused patch changes nothing."""
    s = register(spec())
    text = fields["raw"] if set(fields) == {"raw"} else json.dumps(fields)
    try:
        evs = J.decide(s, J.PatchJob("job1", "t", text, None, T0 + 1))
    except GnomonError:
        return
    new = apply(s, evs)
    assert new.version == s.version + 1


def test_a_full_spec_update_from_the_log_still_applies() -> None:
    s = register(spec())
    new = replace(spec("*/10 * * * * *"), name="v2")
    s = apply(s, J.decide(s, J.UpdateJob("job1", "t", new, T0 + 1)))
    assert s.spec == new and s.version == 2


def test_a_patch_of_a_missing_or_deleted_job_is_refused() -> None:
    with pytest.raises(TransitionError, match="does not exist"):
        J.decide(None, patch({"name": "x"}))


def test_canonical_patch_is_compact_and_sorted() -> None:
    assert J.canonical_patch({"b": 1, "a": {"d": [1, 2], "c": "é"}}) == '{"a":{"c":"\\u00e9","d":[1,2]},"b":1}'
    with pytest.raises(ValueError):
        J.canonical_patch({"a": float("nan")})
