"""A partition's side of job dependencies (core.dependencies; docs/adr/0011 decision 4):
what it writes to ``gnomon.dependencies`` when a job's ``after`` changes or one of its runs
ends, and what it does with what it reads there. The pure decisions are in
``gnomon.core.dependencies`` and ``gnomon.core.runs``; here they meet the partition's
state (``PartitionTask``), inside the caller's savepoint and transaction.

* A downstream D declares (or drops) each upstream U: ``DependencyDeclared`` keyed by U,
  so U's partition keeps D in ``JobState.downstreams``; it answers at once with the end
  of its latest slot's run, if that has ended and is still held.
* A run of U ends (or its slots are recorded skipped): one ``UpstreamEnded`` per
  downstream, keyed by it, in the same transaction as the run's terminal state.
* D's partition keeps the latest ends (``JobState.upstream_ends``), wakes its held runs
  (``RunHeld``) and reopens the runs an upstream's failure had skipped once a replay or
  backfill of that upstream succeeds.
* A downstream with no schedule of its own (``Schedule.after_upstreams``) has its
  upstreams' slots for logical times: the first end of an upstream run of slot T stages
  its run of T (``core.jobs.decide_follow``), which then waits for every upstream like
  any downstream run.
* Deleting U tells every downstream (``deleted``: their runs are skipped with the reason
  until they are edited); deleting D drops its edges.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from gnomon.adapters.kafka import partition_for
from gnomon.core import dependencies as D
from gnomon.core import jobs as J
from gnomon.core import runs as R
from gnomon.core.errors import TransitionError, ValidationError
from gnomon.core.model import slot_run_id
from gnomon.core.records import replace
from gnomon.processor.output import Output

if TYPE_CHECKING:
    from gnomon.processor.task import PartitionTask

log = logging.getLogger(__name__)

REOPEN_SLOTS_MAX = 100  # a downstream's slots one upstream success may reopen
_OUTCOMES = {
    R.RunStatus.SUCCEEDED: D.Outcome.SUCCEEDED,
    R.RunStatus.FAILED: D.Outcome.FAILED,
    R.RunStatus.CANCELLED: D.Outcome.CANCELLED,
    R.RunStatus.SKIPPED: D.Outcome.SKIPPED,
}


def held_prefix(job_id: str) -> bytes:
    """``jh/<job_id>\\0<run_id>``: the job's runs held for their upstreams."""
    return b"jh/" + job_id.encode() + b"\0"


def send(task: PartitionTask, msg: D.DependencyMessage) -> Output:
    to = D.receiver(msg)
    return Output(task.topo.dependencies, to, msg, partition_for(to, task.partitions))


def verdict(run: R.RunState, job: J.JobState | None, now_ms: int) -> D.Verdict | None:
    """What ``run``'s upstreams say now (None: it does not wait: a manual run, a job
    without upstreams, a deleted job)."""
    if run.manual or job is None or not job.spec.after:
        return None
    return D.decide_waiting(run.slot_ms, job.spec.after, D.ends_by_upstream(job.upstream_ends), now_ms,
                            D.wait_max_s(job.spec.wait_max_s), wait_from_ms=run.created_at_ms)


def end_of(run: R.RunState, job: J.JobState, downstream: str, now_ms: int) -> D.UpstreamEnded | None:
    """What ``run`` (a finished scheduled run of ``job``) tells ``downstream``."""
    outcome = _OUTCOMES.get(run.status)
    if outcome is None or run.manual:
        return None
    return D.UpstreamEnded(downstream, job.job_id, run.run_id,
                           run.skipped_from_ms if run.skipped_from_ms is not None else run.slot_ms,
                           run.slot_ms, _next_slot(job, run.slot_ms), outcome, now_ms,
                           reason=run.reason, tenant=job.tenant)


def _next_slot(job: J.JobState, slot_ms: int) -> int | None:
    """The job's first slot after ``slot_ms`` (a one-time job has none). A job after its
    upstreams has no schedule to say it: its next logical time was learnt from its
    upstreams' ends of the slot (``core.jobs.learn_follow_next``)."""
    if job.spec.schedule.run_at_ms is not None:
        return None
    if job.spec.schedule.after_upstreams:
        return J.follow_next_of(job, slot_ms)
    return J.first_slot_after(job.spec, slot_ms)


def _latest_slots(job: J.JobState, now_ms: int, count: int) -> list[int]:
    """The job's latest ``count`` slots at or before ``now_ms``, ascending (of a job after
    its upstreams: the latest it staged)."""
    if job.spec.schedule.after_upstreams:
        return [s for s in job.followed_slots if s <= now_ms][-count:]
    return sorted(J.last_slots_at_or_before(job.spec, now_ms, count))


def ended(task: PartitionTask, before: R.RunState | None, run: R.RunState, now_ms: int) -> list[Output]:
    """``run`` has just become final: tell its job's downstreams."""
    if not run.status.terminal or run.manual or (before is not None and before.status.terminal):
        return []
    job = task.job(run.job_id)
    if job is None or not job.downstreams:
        return []
    out = []
    for down in job.downstreams:
        end = end_of(run, job, down, now_ms)
        if end is not None:
            out.append(send(task, end))
    return out


def job_changed(task: PartitionTask, job_id: str, old: J.JobState | None, new: J.JobState | None,
                declare: bool, now_ms: int) -> list[Output]:
    """A job was registered, edited, resumed or deleted: its edges as messages. ``declare``:
    (re)declare every upstream (idempotent at the upstream: a job deleted and registered
    again learns its downstreams back when they are edited)."""
    out: list[Output] = []
    before = {u.job_id for u in old.spec.after} if old is not None else set()
    now = {u.job_id for u in new.spec.after} if new is not None else set()
    tenant = (new or old).tenant if (new or old) is not None else ""  # type: ignore[union-attr]
    for up in sorted(now if declare else now - before):
        out.append(send(task, D.DependencyDeclared(up, job_id, tenant, now_ms)))
    for up in sorted(before - now):
        out.append(send(task, D.DependencyDropped(up, job_id, tenant, now_ms)))
    if new is None and old is not None:
        for down in old.downstreams:
            out.append(send(task, D.UpstreamEnded(down, job_id, f"{job_id}@deleted", 0, 0, None, D.Outcome.DELETED,
                                                  now_ms, tenant=old.tenant)))
    return out


def handle(task: PartitionTask, msg: D.DependencyMessage, now_ms: int) -> list[Output]:
    """A message read from ``gnomon.dependencies`` on this partition."""
    to = D.receiver(msg)
    if "\0" in to or partition_for(to, task.partitions) != task.partition:
        raise ValidationError("job_id", f"{type(msg).__name__} for job {to[:200]!r} read on partition "
                                        f"{task.partition}, not its job's")
    if isinstance(msg, D.DependencyDeclared):
        return _declared(task, msg, now_ms)
    if isinstance(msg, D.DependencyDropped):
        job = task.job(msg.upstream_job)
        if job is None or job.tenant != msg.tenant or msg.downstream_job not in job.downstreams:
            return []
        out: list[Output] = []
        new = replace(job, downstreams=tuple(d for d in job.downstreams if d != msg.downstream_job))
        task._store_job(job.job_id, job, new, out)
        return out
    return _upstream_ended(task, msg, now_ms)


def _declared(task: PartitionTask, msg: D.DependencyDeclared, now_ms: int) -> list[Output]:
    job = task.job(msg.upstream_job)
    if job is None or job.tenant != msg.tenant:
        # (another tenant's job is "no such job" too: nothing about it is told)
        return [send(task, D.UpstreamEnded(msg.downstream_job, msg.upstream_job, f"{msg.upstream_job}@deleted", 0, 0,
                                           None, D.Outcome.DELETED, now_ms, reason="no such job",
                                           tenant=msg.tenant))]
    out: list[Output] = []
    if msg.downstream_job not in job.downstreams:
        if len(job.downstreams) >= D.DOWNSTREAMS_MAX:
            why = f"it has {len(job.downstreams)} downstream jobs already, at most {D.DOWNSTREAMS_MAX}"
            return [send(task, D.UpstreamEnded(msg.downstream_job, job.job_id, f"{job.job_id}@refused", 0, 0, None,
                                               D.Outcome.DELETED, now_ms, reason=why, tenant=job.tenant))]
        new = replace(job, downstreams=(*job.downstreams, msg.downstream_job))
        task._store_job(job.job_id, job, new, out)
        job = new
    # the ends it has of its latest slot's run and of the runs of slots since the
    # declaration was made (they may have ended before it arrived here; a job after its
    # upstreams stages its runs from them): a downstream declared after them learns them
    # now (one whose run has left state waits for the next, or its bound)
    slots = _latest_slots(job, now_ms, D.ENDS_KEPT_PER_UPSTREAM)
    for i, slot in enumerate(slots):
        if slot < msg.at_ms and i < len(slots) - 1:
            continue
        run = task.run(slot_run_id(job.job_id, slot))
        if run is not None and run.status.terminal:
            end = end_of(run, job, msg.downstream_job, now_ms)
            if end is not None:
                out.append(send(task, end))
    return out


def _upstream_ended(task: PartitionTask, end: D.UpstreamEnded, now_ms: int) -> list[Output]:
    job = task.job(end.downstream_job)
    if job is None or job.tenant != end.tenant or end.upstream_job not in {u.job_id for u in job.spec.after}:
        return []  # deleted, edited since, or not its upstream: nothing waits for it
    out: list[Output] = []
    ends = D.record_end(job.upstream_ends, end, job.spec.after)
    if ends == job.upstream_ends:
        return out  # a duplicate: decided already
    kept = replace(job, upstream_ends=ends)
    if job.spec.schedule.after_upstreams:
        return _follow(task, job, kept, end, now_ms)
    out.extend(wake(task, kept, now_ms))
    if _still_needed(task, kept, end):
        task._store_job(job.job_id, job, kept, out)
        if end.outcome is D.Outcome.SUCCEEDED:
            out.extend(_reopen(task, kept, end, now_ms))
    return out


def _follow(task: PartitionTask, job: J.JobState, kept: J.JobState, end: D.UpstreamEnded,
            now_ms: int) -> list[Output]:
    """``_upstream_ended`` for a job after its upstreams: stage its run of the end's slot
    (the job state records it, with the end: one record), then decide its held runs."""
    cals = (task.calendars.for_job(job.tenant, job.spec.exclude_calendars)
            if task.calendars is not None and job.spec.exclude_calendars else ())
    events = J.decide_follow(kept, end, now_ms, cals)
    kept = J.learn_follow_next(kept, end.last_slot_ms if events else None)
    if J.follow_too_old(kept, end):
        task.stats.follow_ends_too_old += 1
        log.warning("job %s: the end of %s (slot %d) is older than its last %d logical times; no run staged",
                    job.job_id, end.upstream_run, end.last_slot_ms, J.FOLLOWED_SLOTS_KEPT)
    out: list[Output] = []
    if events:
        out.extend(task._apply_job_events(job.job_id, job, events, now_ms, start=kept))
    else:
        task._store_job(job.job_id, job, kept, out)
    stored = task.job(job.job_id)
    out.extend(wake(task, stored, now_ms))
    if end.outcome is D.Outcome.SUCCEEDED and stored is not None:
        out.extend(_reopen(task, stored, end, now_ms))
    return out


def _still_needed(task: PartitionTask, job: J.JobState, end: D.UpstreamEnded) -> bool:
    """Must the job keep ``end`` (a record of its state), once its held runs have been
    woken? Not when every slot of the job it covers has a run that is decided (released,
    running or finished, and not skipped for an upstream a success reopens): the common
    chain of equal schedules, where keeping it would add a record to the critical path.
    Yes for a deletion, an end covering slots not triggered yet or a run still waiting
    (for another upstream)."""
    if end.outcome is D.Outcome.DELETED or end.next_slot_ms is None:
        return True
    slots = J.slots_between(job.spec, end.first_slot_ms, end.next_slot_ms - 1, REOPEN_SLOTS_MAX)
    if len(slots) > REOPEN_SLOTS_MAX:
        return True
    for slot in slots:
        run = task.run(slot_run_id(job.job_id, slot))
        if run is None:
            if slot >= job.created_at_ms:  # (no run for a slot before the job existed)
                return True
            continue
        if run.status is R.RunStatus.SCHEDULED or (run.status is R.RunStatus.SKIPPED and D.reopens(run.reason)):
            return True
    return False


def wake(task: PartitionTask, job: J.JobState | None, now_ms: int, job_id: str | None = None) -> list[Output]:
    """Decide the job's held runs again (an end arrived, the job changed)."""
    out: list[Output] = []
    jid = job.job_id if job is not None else job_id
    assert jid is not None
    for run_id in task._run_ids_under(held_prefix(jid)):
        run = task.run(run_id)
        if run is None or not run.held:
            continue
        # (released, it meets the job's overlap policy like any due run: forbid, bufferOne, replace)
        active = task._active_sibling(run, job)
        buffered = task._buffered_sibling(run, job) if active is not None else None
        events = R.decide_timer(run, now_ms, task.run_cfg, job, active=active, buffered=buffered,
                                upstreams=verdict(run, job, now_ms), wake=True)
        out.extend(task._apply_run_events(run, events, now_ms))
        out.extend(task._replace_active(run.run_id, active, now_ms))
    return out


def _reopen(task: PartitionTask, job: J.JobState, end: D.UpstreamEnded, now_ms: int) -> list[Output]:
    """An upstream run succeeded after a failure, cancel or skip of it had skipped the
    downstream's runs it covers (a replay, a backfill): they run after all."""
    to = (end.next_slot_ms - 1) if end.next_slot_ms is not None else now_ms
    out: list[Output] = []
    if job.spec.schedule.after_upstreams:
        slots = [s for s in job.followed_slots if end.first_slot_ms <= s <= min(to, now_ms)]
    else:
        slots = J.slots_between(job.spec, end.first_slot_ms, min(to, now_ms), REOPEN_SLOTS_MAX)
    for slot in slots:
        run = task.run(slot_run_id(job.job_id, slot))
        if run is None:
            continue
        events = R.reopen_after_upstream(run, end, now_ms)
        if events:
            out.extend(task._apply_run_events(run, events, now_ms))
    return out


def check_source(task: PartitionTask, cmd: object, source: str | None) -> bool:
    """Is ``cmd`` a dependency message (read from the one topic that may carry them)?"""
    is_dep = isinstance(cmd, D.DependencyDeclared | D.DependencyDropped | D.UpstreamEnded)
    if source is None:
        return is_dep
    if is_dep and source != task.topo.dependencies:
        raise TransitionError(f"{type(cmd).__name__} refused: it is read only from {task.topo.dependencies}, "
                              "which the processors alone write")
    if not is_dep and source == task.topo.dependencies:
        raise TransitionError(f"{type(cmd).__name__} refused: {task.topo.dependencies} carries dependency "
                              "messages only")
    return is_dep
