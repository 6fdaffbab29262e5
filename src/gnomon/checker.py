"""History checker: reads every run-ledger record (and the inbox) of a scenario and
accounts for every slot, in the spirit of Jepsen's Kafka checker.

Feed it the records in log order (``observe``), then ``check(jobs, now_ms, ...)``. Every
finding counts against ``CheckReport.ok``; ``problems`` names each one:

* every job the scenario registered has a job state (unless the scenario says it was
  never due); a job with no ledger record at all is checked like any other, from its
  first slot;
* every slot of every job, from its first slot up to where its schedule points now (an
  active job: at least up to ``now_ms - stuck_ms``, so a job that stopped advancing is
  seen), is exactly one run or a recorded skip (missed = 0, duplicates = 0); a skipped
  range record accounts for every slot of the schedule inside it, slot by slot, except a
  slot a backfill later ran (its own run accounts for it);
* no scheduled run is on a slot the job's schedule does not have, or one it has not
  reached yet (``wrong_slots``);
* a job after its upstreams (no schedule of its own) has for slots exactly the slots of
  its upstreams' finished scheduled runs at or after its creation (a skipped range: its
  last slot): each is one run or a recorded skip of it, and it has no other;
* a run's fencing token grows by one per grant, each token is granted once, and a new
  grant only follows an attempt that ended or one still staged (granted, never reported
  started), so no two started attempts overlap;
* no state change came from a stale token (terminal states are final);
* at the end every run is terminal or still within its bound: a RUNNING run within its
  lease, any other state no more than ``stuck_ms`` past the time it was waiting for
  (its slot, its backoff, its buffer or upstream deadline, or, READY, since it became
  ready).

Each branch that finds something is marked ``# finds: <name>``: the unit tests feed each
one its fault (``tests/unit/test_checker.py``) and a mutation test disables each marked
line in turn and expects those tests to fail.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from gnomon.core import schedule as slots
from gnomon.core.jobs import JobState, JobStatus
from gnomon.core.messages import Grant, Stop, StopReason
from gnomon.core.runs import RunState, RunStatus

# How long a run may sit in a waiting state past what it waits for before it counts as
# unfinished (a RUNNING run: past its lease, with no allowance).
STUCK_MS = 30_000


@dataclass
class JobTally:
    """One job's share of the report."""

    slots: int = 0
    runs: int = 0
    skips: int = 0
    missed: int = 0


@dataclass
class CheckReport:
    slots: int = 0
    runs: int = 0
    skips: int = 0
    duplicates: int = 0
    missed: int = 0
    overlapping_grants: int = 0
    stale_rejected: int = 0
    stale_accepted: int = 0
    unfinished: int = 0
    wrong_slots: int = 0
    unaccounted_jobs: int = 0
    problems: list[str] = field(default_factory=list)
    jobs: dict[str, JobTally] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not (self.duplicates or self.missed or self.overlapping_grants or self.stale_accepted
                    or self.unfinished or self.wrong_slots or self.unaccounted_jobs)

    def summary(self) -> str:
        return (f"slots={self.slots} runs={self.runs} skips={self.skips} duplicates={self.duplicates} "
                f"missed={self.missed} overlapping_grants={self.overlapping_grants} "
                f"stale_rejected={self.stale_rejected} stale_accepted={self.stale_accepted} "
                f"unfinished={self.unfinished} wrong_slots={self.wrong_slots} "
                f"unaccounted_jobs={self.unaccounted_jobs}")

    def jobs_short_of(self, slots_min: int) -> dict[str, int]:
        """The jobs with fewer than ``slots_min`` slots accounted for, and how many each had:
        what a scenario asserts empty, job by job, rather than a total any one job's
        silence would hide in."""
        return {job_id: t.slots for job_id, t in sorted(self.jobs.items()) if t.slots < slots_min}

    def verdict(self, problems_max: int = 8) -> str:
        """The summary and the first ``problems_max`` problems: what a failed check says."""
        shown = self.problems[:problems_max]
        more = len(self.problems) - len(shown)
        return "; ".join([self.summary(), *shown, *([f"... and {more} more"] if more else [])])

    def _miss(self, job_id: str) -> None:
        tally = self.jobs.setdefault(job_id, JobTally())
        self.slots += 1
        tally.slots += 1
        self.missed += 1
        tally.missed += 1

    def _account(self, job_id: str, state: RunState) -> None:
        tally = self.jobs.setdefault(job_id, JobTally())
        self.slots += 1
        tally.slots += 1
        if state.status is RunStatus.SKIPPED:
            self.skips += 1
            tally.skips += 1
        else:
            self.runs += 1
            tally.runs += 1


class HistoryChecker:
    def __init__(self) -> None:
        self.ledger: dict[str, list[RunState]] = defaultdict(list)
        self.grants: dict[str, list[Grant]] = defaultdict(list)
        self.stale_stops = 0

    def observe(self, record: Any) -> None:
        if isinstance(record, RunState):
            self.ledger[record.run_id].append(record)
        elif isinstance(record, Grant):
            self.grants[record.run_id].append(record)
        elif isinstance(record, Stop) and record.kind is StopReason.STALE:
            self.stale_stops += 1

    def check(self, jobs: list[JobState], now_ms: int, *, first_slots: Mapping[str, int | None] | None = None,
              registered: Collection[str] = (), never_due: Collection[str] = (),
              due_until: Mapping[str, int] | None = None, stuck_ms: int = STUCK_MS) -> CheckReport:
        """``jobs``: each job's final state (a deleted job: DELETED, updated when it was
        deleted); ``first_slots``: each job's first slot, as its first state said (default:
        the earliest slot in the ledger); ``registered``: every job the scenario created,
        each of which must be in ``jobs`` unless it is in ``never_due``; ``due_until``: a
        time per job before which every slot of its schedule must be accounted for, wherever
        its state points (e.g. when the scenario paused it); ``stuck_ms``: how long past its
        time a run may still wait at the end (an active job: how far behind now it may be)."""
        assert stuck_ms >= 0, stuck_ms
        rep = CheckReport(stale_rejected=self.stale_stops)
        self._check_runs(rep, now_ms, stuck_ms)
        known = {job.job_id for job in jobs}
        for job_id in sorted(set(registered) - known - set(never_due)):
            rep.unaccounted_jobs += 1  # finds: job-without-state
            rep.problems.append(f"{job_id} was registered but has no job state")
        for job in jobs:
            rep.jobs.setdefault(job.job_id, JobTally())
            if job.spec.schedule.after_upstreams:
                self._check_follow(rep, job)
            else:
                until = (due_until or {}).get(job.job_id)
                if job.status is JobStatus.ACTIVE:
                    until = max(until or 0, now_ms - stuck_ms)
                elif job.status is JobStatus.DELETED:  # (its slots up to the delete: runs, or skipped)
                    until = max(until or 0, job.updated_at_ms)
                self._check_slots(rep, job, (first_slots or {}).get(job.job_id), until)
        return rep

    def _mine(self, job_id: str) -> dict[str, RunState]:
        prefix = job_id + "@"
        return {rid: st[-1] for rid, st in self.ledger.items() if rid.startswith(prefix) and not st[-1].manual}

    def _check_follow(self, rep: CheckReport, job: JobState) -> None:
        """A job after its upstreams: its logical times are its upstreams' slots."""
        expected: set[int] = set()
        for up in job.spec.after:
            for run in self._mine(up.job_id).values():
                if run.status.terminal and run.slot_ms >= job.created_at_ms:
                    expected.add(run.slot_ms)
        by_slot = {s.slot_ms: s for s in self._mine(job.job_id).values()}
        for slot in sorted(expected):
            st = by_slot.get(slot)
            if st is None:
                rep._miss(job.job_id)  # finds: follow-missed
                rep.problems.append(f"{job.job_id} slot {slot} (an upstream's) has no run and no skip")
            else:
                rep._account(job.job_id, st)
        for slot, st in sorted(by_slot.items()):
            if slot not in expected and not st.backfill and st.spec.schedule.after_upstreams:
                rep.duplicates += 1  # finds: follow-unexpected
                rep.problems.append(f"{st.run_id}: no upstream of {job.job_id} ended a run of slot {slot}")

    def _check_runs(self, rep: CheckReport, now_ms: int, stuck_ms: int) -> None:
        for run_id, states in self.ledger.items():
            created = {s.created_at_ms for s in states}
            if len(created) > 1:
                rep.duplicates += 1  # finds: created-twice
                rep.problems.append(f"{run_id} created {len(created)} times")
            prev: RunState | None = None
            for s in states:
                if prev is not None:
                    self._check_step(rep, prev, s)
                prev = s
            tokens = [g.token for g in self.grants.get(run_id, [])]
            if len(tokens) != len(set(tokens)):
                rep.overlapping_grants += 1  # finds: token-granted-twice
                rep.problems.append(f"{run_id} token granted twice: {tokens}")
            stuck = _stuck(states, now_ms, stuck_ms)
            if stuck is not None:
                rep.unfinished += 1  # finds: unfinished
                rep.problems.append(f"{run_id} {stuck} at the end")

    @staticmethod
    def _check_step(rep: CheckReport, prev: RunState, s: RunState) -> None:
        """One state after the one before it, of the same run."""
        replayed = prev.status is RunStatus.FAILED and s.replays == prev.replays + 1
        reopened = prev.status is RunStatus.SKIPPED and s.reopens == prev.reopens + 1  # a backfill
        if prev.status.terminal and s != prev and not replayed and not reopened:
            rep.stale_accepted += 1  # finds: changed-after-terminal
            rep.problems.append(f"{s.run_id} changed after terminal {prev.status.value}")
        if s.token not in (prev.token, prev.token + 1):
            rep.overlapping_grants += 1  # finds: token-jump
            rep.problems.append(f"{s.run_id} token jumped {prev.token}->{s.token}")
        # a staged grant (not started) may be revoked and granted again in one step
        if s.token == prev.token + 1 and prev.status is RunStatus.RUNNING and not prev.staged:
            rep.overlapping_grants += 1  # finds: granted-while-running
            rep.problems.append(f"{s.run_id} granted token {s.token} while {prev.token} still ran")

    def _check_slots(self, rep: CheckReport, job: JobState, first: int | None, until: int | None) -> None:
        mine = self._mine(job.job_id)
        sched = job.spec.schedule
        # (a skipped range names its last slot; its first is skipped_from_ms)
        seen = [s.slot_ms if s.skipped_from_ms is None else s.skipped_from_ms for s in mine.values()
                if s.spec.schedule == sched and not s.backfill]
        start = first if first is not None else min(seen, default=None)
        if start is None:
            if mine or job.status is JobStatus.ACTIVE:
                rep.unaccounted_jobs += 1  # finds: no-first-slot
                rep.problems.append(f"{job.job_id}: no first slot given and none in the ledger")
            return
        end = job.next_run_at_ms if job.next_run_at_ms is not None else max(
            (s.slot_ms for s in mine.values()), default=start) + 1
        if until is not None and job.next_run_at_ms is not None:
            end = max(end, until)
        # (start == end: a paused job whose first state left the compacted changelog, so its
        # first known position is where it stopped; nothing from there is due)
        expected = [start] if start < end else []
        if sched.run_at_ms is None:
            ms = slots.next_after(sched, start)
            while ms is not None and ms < end:
                expected.append(ms)
                ms = slots.next_after(sched, ms)
        by_slot = {s.slot_ms: s for s in mine.values()}
        self._check_stray(rep, job, mine)
        in_range = self._skipped_ranges(rep, job, mine, expected, by_slot)
        for slot in expected:
            st = by_slot.get(slot) or in_range.get(slot)
            if st is None:
                rep._miss(job.job_id)  # finds: slot-missed
                rep.problems.append(f"{job.job_id} slot {slot} has no run and no skip")
            else:
                rep._account(job.job_id, st)

    @staticmethod
    def _check_stray(rep: CheckReport, job: JobState, mine: dict[str, RunState]) -> None:
        """Scheduled runs within the schedule's bounds: on its slots, before where it points
        now, no more than maxRuns."""
        sched = job.spec.schedule
        for run in mine.values():
            if run.backfill or run.spec.schedule != sched:
                continue
            if not slots.is_slot(sched, run.slot_ms):
                rep.wrong_slots += 1  # finds: not-a-slot
                rep.problems.append(f"{run.run_id}: slot {run.slot_ms} is not one of the schedule's")
            elif (job.next_run_at_ms is not None and run.slot_ms >= job.next_run_at_ms
                  and not (job.status is JobStatus.DELETED and run.slot_ms < job.updated_at_ms)):
                rep.wrong_slots += 1  # finds: beyond-next-run
                rep.problems.append(f"{run.run_id}: slot {run.slot_ms} is at or after the job's next run "
                                    f"{job.next_run_at_ms}: it would be triggered again")
        ran = [run for run in mine.values() if run.status is not RunStatus.SKIPPED and not run.backfill]
        if sched.max_runs is not None and len(ran) > sched.max_runs:
            rep.duplicates += len(ran) - sched.max_runs  # finds: max-runs
            rep.problems.append(f"{job.job_id}: {len(ran)} scheduled runs, maxRuns is {sched.max_runs}")

    @staticmethod
    def _skipped_ranges(rep: CheckReport, job: JobState, mine: dict[str, RunState], expected: list[int],
                        by_slot: dict[int, RunState]) -> dict[int, RunState]:
        """Every slot of the schedule in a skipped range [from, last], accounted for by that
        one record: the slots each range covers."""
        ranges = sorted((s.skipped_from_ms, s.slot_ms, s) for s in mine.values()
                        if s.status is RunStatus.SKIPPED and s.skipped_from_ms is not None)
        in_range: dict[int, RunState] = {}
        for lo, hi, rec in ranges:
            covered = [slot for slot in expected if lo <= slot <= hi]
            if covered and len(covered) < rec.skipped_count:
                rep.missed += rec.skipped_count - len(covered)  # finds: range-overcounts
                rep.problems.append(f"{rec.run_id}: range counts {rec.skipped_count} slots, schedule has "
                                    f"{len(covered)}")
            for slot in covered:
                if slot in by_slot and by_slot[slot] is not rec and by_slot[slot].backfill:
                    continue  # a backfill ran this slot of the range: its run accounts for it
                if slot in in_range or (slot in by_slot and by_slot[slot] is not rec):
                    rep.duplicates += 1  # finds: range-overlap
                    rep.problems.append(f"{job.job_id} slot {slot} in a skipped range and recorded again")
                in_range[slot] = rec
        return in_range


def _stuck(states: list[RunState], now_ms: int, stuck_ms: int) -> str | None:
    """What is wrong with a run whose last state is not terminal at ``now_ms``, if it is past
    its bound; None when it is terminal or within it."""
    last = states[-1]
    if last.status.terminal:
        return None
    if last.status is RunStatus.RUNNING:
        lease = last.lease_until_ms or 0
        if lease < now_ms:
            return f"RUNNING with its lease lapsed {now_ms - lease} ms ago"  # finds: lease-lapsed
        return None
    entered = last.updated_at_ms  # when it entered the status it is in (the first of its trailing states)
    for s in reversed(states):
        if s.status is not last.status:
            break
        entered = s.updated_at_ms
    waits_for = {
        RunStatus.SCHEDULED: max(last.not_before_ms, last.recheck_at_ms or 0, last.held_until_ms or 0),
        RunStatus.READY: max(last.not_before_ms, entered),
        RunStatus.RETRY_WAIT: last.next_attempt_at_ms if last.next_attempt_at_ms is not None else entered,
    }[last.status]
    past_ms = now_ms - waits_for
    if past_ms > stuck_ms:
        return f"{last.status.value.upper()} {past_ms} ms past its time (bound {stuck_ms} ms)"  # finds: waiting-too-long
    return None
