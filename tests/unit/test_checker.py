"""The history checker itself: a paused job whose first changelog record was compacted
away (its first known position is where it stopped) expects no slot from there."""

from __future__ import annotations

from gnomon.checker import HistoryChecker
from gnomon.core.jobs import JobState, JobStatus
from gnomon.core.model import JobSpec, Schedule, Target, TargetType, slot_run_id
from gnomon.core.runs import RunState, RunStatus

SPEC = JobSpec(name="x", schedule=Schedule(cron="8 * * * * *"), target=Target(TargetType.COMMAND, argv=("true",)))
SLOT = 1_796_116_928_000  # a :08 second


def _skipped(slot: int) -> RunState:
    return RunState(slot_run_id("j", slot), "j", "t", SPEC, slot, slot, False, RunStatus.SKIPPED, slot - 1, slot - 1,
                    reason="paused", finished_at_ms=slot - 1)


def test_a_paused_job_at_its_first_known_position_expects_nothing_more() -> None:
    checker = HistoryChecker()
    checker.observe(_skipped(SLOT))
    paused = JobState("j", "t", SPEC, JobStatus.PAUSED, SLOT + 60_000, 3, 0, 0)
    report = checker.check([paused], SLOT + 30_000, first_slots={"j": SLOT + 60_000})
    assert report.ok and report.missed == 0, report.problems


def test_a_missing_slot_is_still_missed() -> None:
    checker = HistoryChecker()
    checker.observe(_skipped(SLOT))
    active = JobState("j", "t", SPEC, JobStatus.ACTIVE, SLOT + 120_000, 3, 0, 0)
    report = checker.check([active], SLOT + 90_000, first_slots={"j": SLOT})
    assert report.missed == 1 and not report.ok  # SLOT + 60 s has no run and no skip
