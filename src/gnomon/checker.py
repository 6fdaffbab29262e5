"""History checker: reads every run-ledger record (and the inbox) of a scenario and
accounts for every slot, in the spirit of Jepsen's Kafka checker.

Feed it the records in log order (``observe``), then ``check(jobs, until_ms)``:

* every slot of every job, from its first slot up to where its schedule points now,
  is exactly one run or a recorded skip (missed = 0, duplicates = 0); a skipped range
  record accounts for every slot of the schedule inside it, slot by slot, except a slot a
  backfill later ran (its own run accounts for it);
* a job after its upstreams (no schedule of its own) has for slots exactly the slots of
  its upstreams' finished scheduled runs at or after its creation (a skipped range: its
  last slot): each is one run or a recorded skip of it, and it has no other;
* a run's fencing token grows by one per grant, and a new grant only follows an
  attempt that ended or one still staged (granted, never reported started), so no two
  started attempts overlap;
* no state change came from a stale token (terminal states are final);
* at the end every run is terminal, leased, or still waiting for its slot/backoff.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from gnomon.core import schedule as slots
from gnomon.core.jobs import JobState
from gnomon.core.messages import Grant, Stop, StopReason
from gnomon.core.runs import RunState, RunStatus


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
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.duplicates or self.missed or self.overlapping_grants or self.stale_accepted
                    or self.unfinished)

    def summary(self) -> str:
        return (f"slots={self.slots} runs={self.runs} skips={self.skips} duplicates={self.duplicates} "
                f"missed={self.missed} overlapping_grants={self.overlapping_grants} "
                f"stale_rejected={self.stale_rejected} stale_accepted={self.stale_accepted} "
                f"unfinished={self.unfinished}")

    def verdict(self, problems_max: int = 8) -> str:
        """The summary and the first ``problems_max`` problems: what a failed check says."""
        shown = self.problems[:problems_max]
        more = len(self.problems) - len(shown)
        return "; ".join([self.summary(), *shown, *([f"... and {more} more"] if more else [])])


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

    def check(self, jobs: list[JobState], now_ms: int, *, first_slots: dict[str, int] | None = None) -> CheckReport:
        """``jobs``: final job states; ``first_slots``: each job's first slot (default: the
        earliest slot seen in the ledger)."""
        rep = CheckReport(stale_rejected=self.stale_stops)
        self._check_runs(rep, now_ms)
        for job in jobs:
            if job.spec.schedule.after_upstreams:
                self._check_follow(rep, job)
            else:
                self._check_slots(rep, job, (first_slots or {}).get(job.job_id))
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
            rep.slots += 1
            st = by_slot.get(slot)
            if st is None:
                rep.missed += 1
                rep.problems.append(f"{job.job_id} slot {slot} (an upstream's) has no run and no skip")
            elif st.status is RunStatus.SKIPPED:
                rep.skips += 1
            else:
                rep.runs += 1
        for slot, st in sorted(by_slot.items()):
            if slot not in expected and not st.backfill and st.spec.schedule.after_upstreams:
                rep.duplicates += 1
                rep.problems.append(f"{st.run_id}: no upstream of {job.job_id} ended a run of slot {slot}")

    def _check_runs(self, rep: CheckReport, now_ms: int) -> None:
        for run_id, states in self.ledger.items():
            created = {s.created_at_ms for s in states}
            if len(created) > 1:
                rep.duplicates += 1
                rep.problems.append(f"{run_id} created {len(created)} times")
            prev: RunState | None = None
            for s in states:
                if prev is not None:
                    replayed = prev.status is RunStatus.FAILED and s.replays == prev.replays + 1
                    reopened = prev.status is RunStatus.SKIPPED and s.reopens == prev.reopens + 1  # a backfill
                    if prev.status.terminal and s != prev and not replayed and not reopened:
                        rep.stale_accepted += 1
                        rep.problems.append(f"{run_id} changed after terminal {prev.status.value}")
                    if s.token not in (prev.token, prev.token + 1):
                        rep.overlapping_grants += 1
                        rep.problems.append(f"{run_id} token jumped {prev.token}->{s.token}")
                    # a staged grant (not started) may be revoked and granted again in one step
                    if s.token == prev.token + 1 and prev.status is RunStatus.RUNNING and not prev.staged:
                        rep.overlapping_grants += 1
                        rep.problems.append(f"{run_id} granted token {s.token} while {prev.token} still ran")
                prev = s
            tokens = [g.token for g in self.grants.get(run_id, [])]
            if len(tokens) != len(set(tokens)):
                rep.overlapping_grants += 1
                rep.problems.append(f"{run_id} token granted twice: {tokens}")
            last = states[-1]
            if last.status is RunStatus.RUNNING and (last.lease_until_ms or 0) < now_ms:
                rep.unfinished += 1
                rep.problems.append(f"{run_id} RUNNING with a lapsed lease at the end")

    def _check_slots(self, rep: CheckReport, job: JobState, first: int | None) -> None:
        prefix = job.job_id + "@"
        mine = {rid: st[-1] for rid, st in self.ledger.items() if rid.startswith(prefix) and not st[-1].manual}
        if not mine:
            return
        # (a skipped range names its last slot; its first is skipped_from_ms)
        start = first if first is not None else min(s.slot_ms if s.skipped_from_ms is None else s.skipped_from_ms
                                                    for s in mine.values())
        end = job.next_run_at_ms if job.next_run_at_ms is not None else max(s.slot_ms for s in mine.values()) + 1
        # (start == end: a paused job whose first state left the compacted changelog, so its
        # first known position is where it stopped; nothing from there is due)
        expected = [start] if start < end else []
        if job.spec.schedule.run_at_ms is None:
            ms = slots.next_after(job.spec.schedule, start)
            while ms is not None and ms < end:
                expected.append(ms)
                ms = slots.next_after(job.spec.schedule, ms)
        by_slot = {s.slot_ms: s for s in mine.values()}
        # within the schedule's bounds: no scheduled run outside them, no more than maxRuns
        sched = job.spec.schedule
        for run in mine.values():
            if not run.backfill and not slots.is_slot(sched, run.slot_ms) and run.spec.schedule == sched:
                rep.problems.append(f"{run.run_id}: slot {run.slot_ms} is not one of the schedule's (bounds)")
        ran = [run for run in mine.values() if run.status is not RunStatus.SKIPPED and not run.backfill]
        if sched.max_runs is not None and len(ran) > sched.max_runs:
            rep.duplicates += len(ran) - sched.max_runs
            rep.problems.append(f"{job.job_id}: {len(ran)} scheduled runs, maxRuns is {sched.max_runs}")
        # skipped ranges: every slot of the schedule in [from, last] is accounted for by one record
        ranges = sorted((s.skipped_from_ms, s.slot_ms, s) for s in mine.values()
                        if s.status is RunStatus.SKIPPED and s.skipped_from_ms is not None)
        in_range: dict[int, RunState] = {}
        for lo, hi, rec in ranges:
            covered = [slot for slot in expected if lo <= slot <= hi]
            if covered and len(covered) < rec.skipped_count:
                rep.problems.append(f"{rec.run_id}: range counts {rec.skipped_count} slots, schedule has "
                                    f"{len(covered)}")
                rep.missed += rec.skipped_count - len(covered)
            for slot in covered:
                if slot in by_slot and by_slot[slot] is not rec and by_slot[slot].backfill:
                    continue  # a backfill ran this slot of the range: its run accounts for it
                if slot in in_range or (slot in by_slot and by_slot[slot] is not rec):
                    rep.duplicates += 1
                    rep.problems.append(f"{job.job_id} slot {slot} in a skipped range and recorded again")
                in_range[slot] = rec
        for slot in expected:
            rep.slots += 1
            st = by_slot.get(slot) or in_range.get(slot)
            if st is None:
                rep.missed += 1
                rep.problems.append(f"{job.job_id} slot {slot} has no run and no skip")
            elif st.status is RunStatus.SKIPPED:
                rep.skips += 1
            else:
                rep.runs += 1
