"""Dependencies wired (issue 25; docs/adr/0011 decision 4), in the simulation: the real
processors over the in-memory log, with seeded kills, stalls and lost commits.

The property, over random DAGs, schedules (some jobs with none of their own: they run
after their upstreams), outcomes and faults: a downstream run starts
only after the run of its upstreams' latest slot at or before its own slot has ended as
required (succeeded, or finished), every slot is accounted for once (the history
checker), a run skipped for its upstreams names them, and no run waits past its bound
(``waitMaxS``) without being recorded skipped with the reason."""

from __future__ import annotations

import itertools
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gnomon.core import jobs as J
from gnomon.core import runs as R
from gnomon.core.clock import iso_to_ms
from gnomon.core.errors import TransitionError
from gnomon.core.model import DependsOn, OverlapPolicy, Upstream, slot_run_id
from gnomon.sim import SimCluster

T0 = iso_to_ms("2026-12-25T11:58:00Z")
SCHEDULES = ("0 * * * * *", "30 * * * * *", "0 */2 * * * *")


def check_dependencies(c: SimCluster, wait_max_s: dict[str, int]) -> None:
    runs: dict[str, R.RunState] = {}
    for state in c.ledger():
        runs[state.run_id] = state
    jobs = c.jobs()
    now = c.clock.now_ms()
    for run in runs.values():
        job = jobs.get(run.job_id)
        if job is None or not job.spec.after or run.manual:
            continue
        for up in job.spec.after:
            upjob = jobs[up.job_id]
            if upjob.spec.schedule.after_upstreams:  # its slots: the runs it has
                slot = sorted((r.slot_ms for r in runs.values() if r.job_id == up.job_id and not r.manual
                               and r.slot_ms <= run.slot_ms), reverse=True)[:1]
            else:
                slot = J.last_slots_at_or_before(upjob.spec, run.slot_ms, 1)
            cover = runs.get(slot_run_id(up.job_id, slot[0])) if slot else None
            if run.started_at_ms is not None:
                assert cover is not None and cover.status.terminal, f"{run.run_id} started before {up.job_id} ended"
                assert cover.finished_at_ms is not None and cover.finished_at_ms <= run.started_at_ms, run.run_id
                if up.on is DependsOn.SUCCEEDED:
                    assert cover.status is R.RunStatus.SUCCEEDED, f"{run.run_id} ran after {cover.run_id} " \
                                                                  f"{cover.status.value}"
        if run.status is R.RunStatus.SKIPPED and run.reason and run.reason.startswith("upstream "):
            assert any(u.job_id in run.reason for u in job.spec.after), run.reason
        if run.status is R.RunStatus.SCHEDULED and run.held_until_ms is not None:
            # held: with the reason in its note, and never past its bound
            assert run.note is not None and run.note.startswith("waiting for upstream"), run.note
            bound = max(run.slot_ms, run.created_at_ms) + wait_max_s.get(run.job_id, 86_400) * 1000
            assert run.held_until_ms == bound and now < bound + 5_000, (run.run_id, run.held_until_ms, now)
        if run.status is R.RunStatus.SKIPPED and run.reason and run.reason.startswith("waited "):
            assert "waitMaxS" in run.reason


@st.composite
def dags(draw: st.DrawFn) -> list[tuple[str, str, tuple[Upstream, ...], int, int | None]]:
    n = draw(st.integers(3, 5))
    out = []
    for i in range(n):
        ups = draw(st.lists(st.integers(0, i - 1), max_size=min(i, 2), unique=True)) if i else []
        after = tuple(Upstream(f"j{u}", draw(st.sampled_from(list(DependsOn)))) for u in ups)
        fails = draw(st.sampled_from([0, 0, 1, 9]))  # 9: more than its attempts: dead-lettered
        wait = draw(st.sampled_from([None, 45, 90])) if after else None
        # "": no schedule of its own (it runs after its upstreams)
        out.append((f"j{i}", draw(st.sampled_from(SCHEDULES + (("",) if after else ()))), after, fails, wait))
    return out


@settings(max_examples=int(os.environ.get("GNOMON_DAG_EXAMPLES", "8")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(dag=dags(), seed=st.integers(0, 2**16))
def test_random_dags_under_faults_never_run_before_their_upstreams(
        dag: list[tuple[str, str, tuple[Upstream, ...], int, int | None]], seed: int) -> None:
    c = SimCluster(seed, processors=2, workers=2, partitions=4)
    c.clock.set(T0)
    for job_id, cron, after, fails, wait in dag:  # upstreams first (the API refuses one that is not there)
        c.register(job_id, cron, fail_attempts=fails, max_attempts=2, after=after, wait_max_s=wait)
        c.run_for(500, faults=False)
    c.run_for(240_000)
    c.heal(20_000)
    rep = c.history_report()
    assert rep.missed == 0 and rep.duplicates == 0 and not rep.problems, f"{rep.summary()} {rep.problems[:5]}"
    check_dependencies(c, {j: w for j, _, _, _, w in dag if w is not None})


def test_a_chain_runs_in_order_and_a_failing_upstream_skips_its_downstream_with_the_reason() -> None:
    c = SimCluster(7, processors=2, workers=2, partitions=4)
    c.clock.set(T0)
    c.register("extract", "0 * * * * *", fail_attempts=1, max_attempts=1)  # its every run fails
    c.register("audit", "0 * * * * *")
    c.run_for(500, faults=False)
    c.register("transform", "0 * * * * *", after=("audit",))
    c.register("load", "0 * * * * *", after=(Upstream("transform"), Upstream("extract", DependsOn.FINISHED)))
    c.register("report", "0 * * * * *", after=("extract",))
    c.run_for(150_000)
    c.heal(10_000)
    runs = {s.run_id: s for s in c.ledger()}
    slot = "2026-12-25T12:00:00Z"
    a, t, ld, rp = (runs[f"{j}@{slot}"] for j in ("audit", "transform", "load", "report"))
    assert runs[f"extract@{slot}"].status is R.RunStatus.FAILED
    assert a.finished_at_ms is not None and t.started_at_ms is not None and a.finished_at_ms <= t.started_at_ms
    assert ld.status is R.RunStatus.SUCCEEDED  # "finished": a failed extract releases it
    assert rp.status is R.RunStatus.SKIPPED and rp.reason is not None
    assert rp.reason.startswith(f"upstream extract@{slot} failed"), rp.reason
    check_dependencies(c, {})
    rep = c.history_report()
    assert rep.missed == 0 and rep.duplicates == 0 and not rep.problems, f"{rep.summary()} {rep.problems[:5]}"


def test_an_upstream_that_never_ends_bounds_the_wait_with_the_reason() -> None:
    c = SimCluster(3, processors=1, workers=1, partitions=2)
    c.clock.set(T0)
    c.register("up", "0 0 0 1 1 *")  # once a year: its latest slot before the downstream's has no run
    c.run_for(500, faults=False)
    c.register("down", "0 * * * * *", after=("up",), wait_max_s=30)
    c.run_for(120_000, faults=False)
    c.heal(5_000)
    runs = {s.run_id: s for s in c.ledger()}
    first = runs["down@2026-12-25T11:59:00Z"]
    assert first.status is R.RunStatus.SKIPPED and first.started_at_ms is None
    assert first.reason == "waited 30 s (waitMaxS) for upstream up", first.reason
    check_dependencies(c, {"down": 30})


def test_deleting_an_upstream_skips_its_downstreams_until_they_are_edited() -> None:
    c = SimCluster(5, processors=1, workers=1, partitions=2)
    c.clock.set(T0)
    c.register("up", "0 * * * * *")
    c.run_for(500, faults=False)
    c.register("down", "0 * * * * *", after=("up",))
    c.run_for(70_000, faults=False)
    c.submit(J.DeleteJob("up", "sim", c.clock.now_ms()))
    c.run_for(70_000, faults=False)
    c.heal(5_000)
    runs = {s.run_id: s for s in c.ledger()}
    assert runs["down@2026-12-25T11:59:00Z"].status is R.RunStatus.SUCCEEDED
    later = runs["down@2026-12-25T12:00:00Z"]
    assert later.status is R.RunStatus.SKIPPED and later.reason == "upstream job up was deleted", later.reason
    assert "down" not in c.jobs()["down"].downstreams and c.jobs()["down"].upstream_ends[-1].outcome.value == "deleted"


def test_a_job_without_a_schedule_runs_after_each_run_of_its_upstream_once() -> None:
    """extract on cron -> transform and load with no schedule of their own: each slot of
    extract runs transform then load, in order, once, under the simulation's faults."""
    c = SimCluster(11, processors=2, workers=2, partitions=4)
    c.clock.set(T0)
    c.register("extract", "0 * * * * *")
    c.run_for(500, faults=False)
    c.register("transform", "", after=("extract",))
    c.register("load", "", after=("transform",))
    c.run_for(200_000)
    c.heal(10_000)
    runs = {s.run_id: s for s in c.ledger()}
    # (extract's slot at T0 came before transform existed: it has no run of it)
    slots = sorted(r.slot_ms for r in runs.values() if r.job_id == "extract" and r.status.terminal and r.slot_ms > T0)
    assert len(slots) >= 3 and slot_run_id("transform", T0) not in runs
    for slot in slots:
        e, t, ld = (runs.get(slot_run_id(j, slot)) for j in ("extract", "transform", "load"))
        assert e is not None and t is not None and ld is not None, slot
        assert t.status is R.RunStatus.SUCCEEDED and ld.status is R.RunStatus.SUCCEEDED, (t, ld)
        assert e.finished_at_ms is not None and t.started_at_ms is not None and e.finished_at_ms <= t.started_at_ms
        assert t.finished_at_ms is not None and ld.started_at_ms is not None and t.finished_at_ms <= ld.started_at_ms
    assert {r.slot_ms for r in runs.values() if r.job_id == "load"} == set(slots)
    assert c.jobs()["load"].status is J.JobStatus.ACTIVE and c.jobs()["load"].next_run_at_ms is None
    check_dependencies(c, {})
    rep = c.history_report()
    assert rep.missed == 0 and rep.duplicates == 0 and not rep.problems, f"{rep.summary()} {rep.problems[:5]}"
    assert rep.slots >= 3 * len(slots)


def test_a_job_without_a_schedule_is_skipped_with_the_reason_paused_or_failed_and_refuses_a_backfill() -> None:
    c = SimCluster(13, processors=1, workers=1, partitions=2)
    c.clock.set(T0)
    c.register("extract", "0 * * * * *", fail_attempts=1, max_attempts=1)  # every run fails
    c.register("ok", "0 * * * * *")
    c.run_for(500, faults=False)
    c.register("report", "", after=("extract",))
    c.register("paused", "", after=("ok",))
    c.run_for(500, faults=False)
    c.submit(J.PauseJob("paused", "sim", c.clock.now_ms()))
    c.run_for(70_000, faults=False)
    c.heal(5_000)
    runs = {s.run_id: s for s in c.ledger()}
    slot = "2026-12-25T11:59:00Z"
    rp, pz = runs[f"report@{slot}"], runs[f"paused@{slot}"]
    assert rp.status is R.RunStatus.SKIPPED and rp.reason is not None
    assert rp.reason.startswith(f"upstream extract@{slot} failed"), rp.reason
    assert pz.status is R.RunStatus.SKIPPED and pz.reason == "paused", pz.reason
    rep = c.history_report()
    assert rep.missed == 0 and rep.duplicates == 0 and not rep.problems, f"{rep.summary()} {rep.problems[:5]}"
    job = c.jobs()["report"]
    with pytest.raises(TransitionError, match="no schedule of its own"):
        J.check_backfill_slots(job, (iso_to_ms(slot),))


def test_a_long_run_of_a_job_without_a_schedule_covers_its_own_logical_time_only() -> None:
    """A every 10 s, F after A with no schedule, D every 10 s after F, every run 60 s: F's
    run of slot T ends long after A's later slots have ended, and its end covers [T, T+10 s)
    (A's next slot), not up to the slots of the ends F holds then: D's run of T+10 s waits
    for F's run of T+10 s."""
    c = SimCluster(17, processors=1, workers=2, partitions=2, duration_ms=(60_000, 60_000))
    c.clock.set(T0)
    c.register("a", "*/10 * * * * *", timeout_s=120)
    c.run_for(500, faults=False)
    c.register("f", "", after=("a",), timeout_s=120)
    c.register("d", "*/10 * * * * *", after=("f",), timeout_s=120)
    c.run_for(240_000, faults=False)
    c.heal(10_000)
    runs = {s.run_id: s for s in c.ledger()}
    assert sum(1 for r in runs.values() if r.job_id == "d" and r.started_at_ms is not None) >= 5
    check_dependencies(c, {})


@pytest.mark.parametrize("overlap", [OverlapPolicy.FORBID, OverlapPolicy.BUFFER_ONE])
def test_a_run_released_by_its_upstreams_keeps_its_overlap_policy(overlap: OverlapPolicy) -> None:
    """A run held for its upstreams, once released, is decided like any due run: with
    ``overlap: forbid`` it is skipped ("overlap") while the job's previous run still runs,
    with ``bufferOne`` one waits for it and the next is skipped."""
    c = SimCluster(19, processors=1, workers=2, partitions=2, duration_ms=(90_000, 90_000))
    c.clock.set(T0)
    c.register("up", "0 * * * * *", timeout_s=120)
    c.run_for(500, faults=False)
    c.register("down", "0 * * * * *", after=("up",), timeout_s=200, overlap=overlap)
    c.run_for(400_000, faults=False)
    c.heal(10_000)
    downs = list({s.run_id: s for s in c.ledger() if s.job_id == "down"}.values())
    ran = sorted((s for s in downs if s.started_at_ms is not None), key=lambda r: r.started_at_ms or 0)
    assert len(ran) >= 3 and any(s.status is R.RunStatus.SKIPPED and (s.reason or "").startswith("overlap") for s in downs)
    for a, b in itertools.pairwise(ran):
        assert a.finished_at_ms is not None and b.started_at_ms is not None
        assert a.finished_at_ms <= b.started_at_ms, (a.run_id, b.run_id)


def test_a_job_edited_to_run_after_its_upstreams_only_withdraws_the_slots_its_old_schedule_staged() -> None:
    from gnomon.core.model import Schedule
    from gnomon.core.records import replace

    c = SimCluster(23, processors=1, workers=1, partitions=2)
    c.clock.set(T0)
    c.register("up", "0 * * * * *")
    c.run_for(500, faults=False)
    c.register("down", "30 * * * * *", after=("up",))
    c.run_for(87_000, faults=False)  # 11:59:27: down@11:59:30 is staged (the lookahead)
    runs = {s.run_id: s for s in c.ledger()}
    assert "down@2026-12-25T11:59:30Z" in runs
    spec = replace(c.jobs()["down"].spec, schedule=Schedule())
    c.submit(J.UpdateJob("down", "sim", spec, c.clock.now_ms()))
    c.run_for(90_000, faults=False)
    c.heal(5_000)
    runs = {s.run_id: s for s in c.ledger()}
    old = runs["down@2026-12-25T11:59:30Z"]
    assert old.status is R.RunStatus.SKIPPED and old.reason == "schedule changed before the slot", old.reason
    assert runs["down@2026-12-25T12:00:00Z"].status is R.RunStatus.SUCCEEDED
    assert "down@2026-12-25T12:00:30Z" not in runs
    check_dependencies(c, {})


def test_a_buffered_run_keeps_its_upstreams_release_while_later_upstream_ends_arrive() -> None:
    """U every 10 s (short runs), D every 10 s after U with ``bufferOne`` and 60 s runs: a
    run of D released by U's end and buffered behind D's previous run sees more ends of U
    arrive than D keeps (four) while it waits. It runs once the previous run ends; no run
    of D is skipped but for the overlap. (The pure rule: test_overlap.py,
    test_a_buffered_run_is_not_held_again_by_its_upstreams.)"""
    c = SimCluster(29, processors=1, workers=2, partitions=2, duration_ms=(300, 300))
    c.clock.set(T0)
    c.register("u", "*/10 * * * * *")
    c.run_for(500, faults=False)
    c.register("d", "*/10 * * * * *", after=("u",), overlap=OverlapPolicy.BUFFER_ONE, timeout_s=120,
               wait_max_s=150, duration_ms=(60_000, 60_000))
    c.run_for(400_000, faults=False)
    c.heal(10_000)
    downs = list({s.run_id: s for s in c.ledger() if s.job_id == "d"}.values())
    waited = [(s.run_id, s.reason) for s in downs if s.status is R.RunStatus.SKIPPED
              and not (s.reason or "").startswith("overlap")]
    assert not waited, waited
    ran = sorted((s for s in downs if s.started_at_ms is not None), key=lambda r: r.started_at_ms or 0)
    assert len(ran) >= 5
    for a, b in itertools.pairwise(ran):
        assert a.finished_at_ms is not None and b.started_at_ms is not None
        assert a.finished_at_ms <= b.started_at_ms, (a.run_id, b.run_id)
    check_dependencies(c, {"d": 150})
