"""The history checker itself: one clean history that passes, and for every branch that
finds something (``# finds:`` in ``gnomon/checker.py``) a history with exactly that fault,
which must fail. ``test_checker_mutations.py`` disables each branch in turn and expects
one of these tests to fail, so a weakened checker fails its own tests.

The tests reach the checker through ``C`` (the module), which the mutation test swaps."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import gnomon.checker as C
from gnomon.core.jobs import JobState, JobStatus
from gnomon.core.messages import Grant
from gnomon.core.model import JobSpec, Schedule, Target, TargetType, Upstream, slot_run_id
from gnomon.core.runs import RunState, RunStatus

EVERY_10S = Schedule(cron="*/10 * * * * *")
SPEC = JobSpec(name="j", schedule=EVERY_10S, target=Target(TargetType.COMMAND, argv=("true",)))
T0 = 1_796_116_920_000  # a slot of EVERY_10S
S = 10_000  # the schedule's step
LEASE_MS = 8_000


def _scheduled(slot: int, job: str = "j", spec: JobSpec = SPEC) -> RunState:
    return RunState(slot_run_id(job, slot), job, "t", spec, slot, slot, False, RunStatus.SCHEDULED, slot - 5_000,
                    slot - 5_000)


def _lifecycle(slot: int, job: str = "j", spec: JobSpec = SPEC, token: int = 1) -> list[RunState]:
    """A run's ledger states from its creation to success: scheduled, staged, started, done."""
    sched = _scheduled(slot, job, spec)
    staged = replace(sched, status=RunStatus.RUNNING, updated_at_ms=slot - 4_000, attempt=token, token=token,
                     worker_id="w1", lease_until_ms=slot + LEASE_MS, granted_at_ms=slot - 4_000)
    started = replace(staged, updated_at_ms=slot, attempt_started_at_ms=slot, started_at_ms=slot)
    done = replace(started, status=RunStatus.SUCCEEDED, updated_at_ms=slot + 500, finished_at_ms=slot + 500,
                   lease_until_ms=None, exit_code=0)
    return [sched, staged, started, done]


def _grant(state: RunState) -> Grant:
    return Grant("w1", state.run_id, state.job_id, "t", state.attempt, state.token, state.slot_ms + LEASE_MS,
                 state.slot_ms + 60_000, state.spec, state.slot_ms, state.slot_ms - 4_000)


def _job(next_run_at_ms: int | None = T0 + 3 * S, status: JobStatus = JobStatus.ACTIVE, job: str = "j",
         spec: JobSpec = SPEC, created_at_ms: int = T0 - 5_000) -> JobState:
    return JobState(job, "t", spec, status, next_run_at_ms, 3, created_at_ms, created_at_ms)


def _checker(*records: Any) -> C.HistoryChecker:
    checker = C.HistoryChecker()
    for rec in records:
        checker.observe(rec)
    return checker


def _clean(slots: int = 3) -> list[Any]:
    """Every record of a job's first ``slots`` slots, each run once: ledger states and grants."""
    out: list[Any] = []
    for i in range(slots):
        states = _lifecycle(T0 + i * S)
        out += [*states, _grant(states[1])]
    return out


NOW = T0 + 3 * S + 5_000  # all three runs over, the fourth slot not yet due


def _check(checker: C.HistoryChecker, jobs: list[JobState] | None = None, now_ms: int = NOW,
           **kw: Any) -> C.CheckReport:
    kw.setdefault("first_slots", {"j": T0})
    kw.setdefault("registered", ["j"])
    return checker.check([_job()] if jobs is None else jobs, now_ms, **kw)


# ---- the clean history ------------------------------------------------------------------

def test_a_clean_history_passes_and_counts_each_slot() -> None:
    report = _check(_checker(*_clean()))
    assert report.ok, report.verdict()
    assert (report.slots, report.runs, report.skips, report.missed) == (3, 3, 0, 0)
    assert report.jobs["j"] == C.JobTally(slots=3, runs=3, skips=0, missed=0)
    assert report.problems == []


def test_a_job_not_due_yet_needs_no_record() -> None:
    """Registered, first slot still ahead: nothing to account for."""
    report = _check(_checker(), [_job(next_run_at_ms=T0 + 60_000)], now_ms=T0 + 1_000,
                    first_slots={"j": T0 + 60_000})
    assert report.ok and report.slots == 0, report.verdict()


def test_a_run_waiting_within_its_bound_is_not_unfinished() -> None:
    states = _lifecycle(T0)
    ready = replace(states[0], status=RunStatus.READY, updated_at_ms=T0)
    report = _check(_checker(states[0], ready), [_job(next_run_at_ms=T0 + S)], now_ms=T0 + 20_000)
    assert report.ok and report.unfinished == 0, report.verdict()


# ---- jobs ----------------------------------------------------------------------------------

def test_a_registered_job_with_no_state_is_unaccounted() -> None:
    report = _check(_checker(*_clean()), registered=["j", "k"])
    assert not report.ok and report.unaccounted_jobs == 1, report.verdict()
    assert any("k was registered" in p for p in report.problems)


def test_a_registered_job_the_scenario_says_was_never_due_may_lack_a_state() -> None:
    report = _check(_checker(*_clean()), registered=["j", "k"], never_due=["k"])
    assert report.ok, report.verdict()


def test_a_job_that_never_ran_is_missed_from_its_first_slot() -> None:
    """No ledger record at all: every slot from the first one is missed (the old checker
    returned early and passed it)."""
    report = _check(_checker())
    assert not report.ok and report.missed == 3 and report.jobs["j"].missed == 3, report.verdict()


def test_an_active_job_that_stopped_advancing_is_missed_up_to_now() -> None:
    """Its state still points at its first slot a minute later: the slots due since then
    are missed, wherever the state points."""
    report = _check(_checker(), [_job(next_run_at_ms=T0)], now_ms=T0 + 90_000)
    assert not report.ok and report.missed == 6, report.verdict()  # T0 .. T0+50 s (bound 30 s)


def test_due_until_holds_a_paused_job_to_the_time_it_was_paused() -> None:
    paused = _job(next_run_at_ms=T0 + S, status=JobStatus.PAUSED)
    states = _lifecycle(T0)
    assert _check(_checker(*states), [paused]).ok
    report = _check(_checker(*states), [paused], due_until={"j": T0 + 2 * S + 1})
    assert not report.ok and report.missed == 2, report.verdict()


def test_no_first_slot_and_no_ledger_record_is_unaccounted() -> None:
    report = _check(_checker(), first_slots={})
    assert not report.ok and report.unaccounted_jobs == 1, report.verdict()


def test_a_missing_slot_is_missed() -> None:
    records = _clean()
    del records[5:10]  # the second slot's states and grant
    report = _check(_checker(*records))
    assert not report.ok and report.missed == 1, report.verdict()
    assert any(f"slot {T0 + S} has no run" in p for p in report.problems)


def test_a_paused_job_at_its_first_known_position_expects_nothing_more() -> None:
    """Its first changelog record was compacted away: its first known position is where
    it stopped, and nothing from there is due."""
    skipped = replace(_scheduled(T0), status=RunStatus.SKIPPED, reason="paused", finished_at_ms=T0 - 1)
    paused = _job(next_run_at_ms=T0 + 60_000, status=JobStatus.PAUSED)
    report = _check(_checker(skipped), [paused], now_ms=T0 + 30_000, first_slots={"j": T0 + 60_000})
    assert report.ok and report.missed == 0, report.verdict()


# ---- slots ---------------------------------------------------------------------------------

def test_a_run_on_a_slot_the_schedule_does_not_have_is_wrong() -> None:
    off = _lifecycle(T0 + 5_000)
    report = _check(_checker(*_clean(), *off))
    assert not report.ok and report.wrong_slots == 1, report.verdict()


def test_a_run_at_or_after_the_jobs_next_run_is_wrong() -> None:
    """The job would trigger that slot again when it gets there."""
    ahead = _lifecycle(T0 + 3 * S)
    report = _check(_checker(*_clean(), *ahead), now_ms=NOW + S)
    assert not report.ok and report.wrong_slots == 1, report.verdict()


def test_more_runs_than_max_runs_are_duplicates() -> None:
    spec = replace(SPEC, schedule=replace(EVERY_10S, max_runs=2))
    records = [st for i in range(3) for st in _lifecycle(T0 + i * S, spec=spec)]
    report = _check(_checker(*records), [_job(next_run_at_ms=None, status=JobStatus.DONE, spec=spec)])
    assert not report.ok and report.duplicates == 1, report.verdict()


def test_a_skipped_range_counting_more_slots_than_it_covers_is_missed() -> None:
    rng = replace(_scheduled(T0 + 2 * S), status=RunStatus.SKIPPED, reason="paused", skipped_from_ms=T0,
                  skipped_count=5, finished_at_ms=T0)
    report = _check(_checker(rng))
    assert not report.ok and report.missed == 2 and report.skips == 3, report.verdict()


def test_a_slot_in_a_skipped_range_and_run_again_is_a_duplicate() -> None:
    rng = replace(_scheduled(T0 + 2 * S), status=RunStatus.SKIPPED, reason="paused", skipped_from_ms=T0,
                  skipped_count=3, finished_at_ms=T0)
    report = _check(_checker(rng, *_lifecycle(T0 + S)))
    assert not report.ok and report.duplicates == 1, report.verdict()


def test_a_skipped_range_alone_accounts_for_its_slots() -> None:
    rng = replace(_scheduled(T0 + 2 * S), status=RunStatus.SKIPPED, reason="paused", skipped_from_ms=T0,
                  skipped_count=3, finished_at_ms=T0)
    report = _check(_checker(rng))
    assert report.ok and report.skips == 3, report.verdict()


# ---- runs ----------------------------------------------------------------------------------

def test_a_run_created_twice_is_a_duplicate() -> None:
    again = replace(_scheduled(T0), created_at_ms=T0 - 1_000, updated_at_ms=T0 - 1_000)
    report = _check(_checker(*_clean(), again))
    assert not report.ok and report.duplicates >= 1, report.verdict()
    assert any("created 2 times" in p for p in report.problems)


def test_a_change_after_a_terminal_state_is_stale_accepted() -> None:
    states = _lifecycle(T0)
    late = replace(states[-1], status=RunStatus.FAILED, updated_at_ms=T0 + 900, exit_code=1)
    report = _check(_checker(*_clean(), late))
    assert not report.ok and report.stale_accepted == 1, report.verdict()


def test_a_replay_of_a_failed_run_is_no_change_after_terminal() -> None:
    states = _lifecycle(T0)
    failed = replace(states[-1], status=RunStatus.FAILED, exit_code=1)
    replayed = replace(failed, status=RunStatus.READY, replays=1, updated_at_ms=T0 + 2_000)
    again = [replace(replayed, status=RunStatus.RUNNING, token=2, attempt=2, attempt_started_at_ms=T0 + 2_100,
                     lease_until_ms=T0 + 10_000, updated_at_ms=T0 + 2_100),
             replace(replayed, status=RunStatus.SUCCEEDED, token=2, attempt=2, updated_at_ms=T0 + 2_500)]
    report = _check(_checker(*states[:-1], failed, replayed, *again, *_clean()[5:]))
    assert report.ok, report.verdict()


def test_a_token_that_jumps_is_an_overlapping_grant() -> None:
    states = _lifecycle(T0)
    jumped = [replace(st, token=3, attempt=3) for st in states[2:]]
    report = _check(_checker(*states[:2], *jumped, *_clean()[5:]))
    assert not report.ok and report.overlapping_grants == 1, report.verdict()
    assert any("jumped 1->3" in p for p in report.problems)


def test_a_grant_while_the_previous_attempt_still_ran_overlaps() -> None:
    states = _lifecycle(T0)
    regrant = replace(states[2], token=2, attempt=2, updated_at_ms=T0 + 1_000)  # started token 1 never ended
    report = _check(_checker(*states[:3], regrant, replace(states[3], token=2, attempt=2), *_clean()[5:]))
    assert not report.ok and report.overlapping_grants == 1, report.verdict()
    assert any("while 1 still ran" in p for p in report.problems)


def test_a_staged_grant_taken_back_and_granted_again_is_fine() -> None:
    states = _lifecycle(T0)
    regrant = replace(states[1], token=2, attempt=2, worker_id="w2", updated_at_ms=T0 - 3_000)
    rest = [replace(st, token=2, attempt=2, worker_id="w2") for st in states[2:]]
    report = _check(_checker(*states[:2], regrant, *rest, *_clean()[5:]))
    assert report.ok, report.verdict()


def test_a_token_granted_twice_overlaps() -> None:
    states = _lifecycle(T0)
    report = _check(_checker(*_clean(), _grant(states[1])))
    assert not report.ok and report.overlapping_grants == 1, report.verdict()


def test_a_running_run_whose_lease_lapsed_is_unfinished() -> None:
    states = _lifecycle(T0)
    report = _check(_checker(*states[:3], *_clean()[5:]), now_ms=NOW)  # started, lease T0+8 s, never ended
    assert not report.ok and report.unfinished == 1, report.verdict()


def test_a_run_stuck_ready_past_the_bound_is_unfinished() -> None:
    ready = replace(_scheduled(T0), status=RunStatus.READY, updated_at_ms=T0)
    report = _check(_checker(_scheduled(T0), ready, *_clean()[5:]), now_ms=T0 + S * 3 + 31_000,
                    jobs=[_job()])
    assert not report.ok and report.unfinished == 1, report.verdict()
    assert any("READY" in p for p in report.problems)


def test_a_run_stuck_scheduled_past_the_bound_is_unfinished() -> None:
    report = _check(_checker(_scheduled(T0), *_clean()[5:]), now_ms=T0 + 31_000)
    assert not report.ok and report.unfinished == 1, report.verdict()


def test_a_run_stuck_in_retry_wait_past_the_bound_is_unfinished() -> None:
    states = _lifecycle(T0)
    waiting = replace(states[2], status=RunStatus.RETRY_WAIT, next_attempt_at_ms=T0 + 2_000, lease_until_ms=None,
                      updated_at_ms=T0 + 1_000)
    report = _check(_checker(*states[:3], waiting, *_clean()[5:]), now_ms=T0 + 2_000 + 31_000)
    assert not report.ok and report.unfinished == 1, report.verdict()


# ---- jobs after their upstreams -------------------------------------------------------------

FOLLOW = replace(SPEC, name="f", schedule=Schedule(), after=(Upstream("j"),))


def test_a_follower_run_per_upstream_slot_passes() -> None:
    follows = [st for i in range(3) for st in _lifecycle(T0 + i * S, job="f", spec=FOLLOW)]
    report = _check(_checker(*_clean(), *follows),
                    [_job(), _job(next_run_at_ms=None, job="f", spec=FOLLOW)], registered=["j", "f"])
    assert report.ok and report.jobs["f"].runs == 3, report.verdict()


def test_an_upstream_slot_the_follower_never_ran_is_missed() -> None:
    follows = [st for i in range(2) for st in _lifecycle(T0 + i * S, job="f", spec=FOLLOW)]
    report = _check(_checker(*_clean(), *follows),
                    [_job(), _job(next_run_at_ms=None, job="f", spec=FOLLOW)], registered=["j", "f"])
    assert not report.ok and report.missed == 1 and report.jobs["f"].missed == 1, report.verdict()


def test_a_follower_run_no_upstream_ended_is_a_duplicate() -> None:
    follows = [st for i in range(4) for st in _lifecycle(T0 + i * S, job="f", spec=FOLLOW)]
    report = _check(_checker(*_clean(), *follows),
                    [_job(), _job(next_run_at_ms=None, job="f", spec=FOLLOW)], registered=["j", "f"])
    assert not report.ok and report.duplicates == 1, report.verdict()


# ---- a deleted job ---------------------------------------------------------------------------

def test_a_deleted_job_accounts_for_its_slots_up_to_the_delete() -> None:
    """Its last state before the delete (DELETED, updated at the delete) still pointed at its
    third slot; the slots from there to the delete are recorded skipped in one range."""
    deleted = replace(_job(next_run_at_ms=T0 + 2 * S), status=JobStatus.DELETED, updated_at_ms=T0 + 5 * S)
    ran = [*_lifecycle(T0), *_lifecycle(T0 + S)]
    behind = replace(_scheduled(T0 + 4 * S), status=RunStatus.SKIPPED, reason="job deleted",
                     skipped_from_ms=T0 + 2 * S, skipped_count=3, finished_at_ms=T0 + 5 * S)
    report = _check(_checker(*ran, behind), [deleted], now_ms=T0 + 20 * S)
    assert report.ok and (report.runs, report.skips) == (2, 3), report.verdict()
    report = _check(_checker(*ran), [deleted], now_ms=T0 + 20 * S)
    assert not report.ok and report.missed == 3, report.verdict()
