"""The scheduler's state machine for one job: ``decide`` and ``evolve``.

``decide(state, command, now_ms)`` returns the events a command causes (or raises
``TransitionError``); ``decide_tick(state, now_ms, cfg)`` returns the events that the
passage of time causes (triggers within the lookahead, catch-up of missed slots);
``evolve(state, event)`` folds an event into the state. The processor persists the
state and forwards ``RunTriggered``/``RunSkipped`` to the run processor.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from gnomon.core import schedule as S
from gnomon.core.calendars import Calendar, calendar_reason, excluded_by
from gnomon.core.dependencies import Outcome, UpstreamEnded, ends_by_upstream, next_logical_time
from gnomon.core.errors import Conflict, JobNotFound, TransitionError, ValidationError
from gnomon.core.model import (
    CatchUp,
    JobSpec,
    Schedule,
    jitter_offset_ms,
    manual_run_id,
    slot_run_id,
)
from gnomon.core.records import replace
from gnomon.core.validation import DEFAULT_POOLS, apply_patch, format_duration_s


class JobStatus(StrEnum):
    ACTIVE = "active"
    PAUSED = "paused"
    # no slot left: a one-time job whose slot was triggered, or a bounded schedule past
    # its endAt or at its maxRuns (``ended_because`` says which)
    DONE = "done"
    DELETED = "deleted"


# Which status may move to which (guarded transitions).
_ALLOWED: dict[JobStatus, frozenset[JobStatus]] = {
    JobStatus.ACTIVE: frozenset({JobStatus.ACTIVE, JobStatus.PAUSED, JobStatus.DONE, JobStatus.DELETED}),
    JobStatus.PAUSED: frozenset({JobStatus.PAUSED, JobStatus.ACTIVE, JobStatus.DELETED}),
    JobStatus.DONE: frozenset({JobStatus.DONE, JobStatus.ACTIVE, JobStatus.DELETED}),
    JobStatus.DELETED: frozenset(),
}


@dataclass(frozen=True)
class SchedulerConfig:
    lookahead_ms: int = 30_000
    misfire_grace_ms: int = 60_000  # a slot older than this at tick time is "missed"
    catch_up_all_max: int = 100  # catchUp=all runs at most this many missed slots
    skip_count_max: int = 10_000  # slots counted one by one in a skipped range; beyond, count is a floor
    triggers_per_tick_max: int = 1000  # per job per tick
    catch_up_records_per_tick_max: int = 2000  # per partition per tick, for jobs past the misfire grace


@dataclass(frozen=True)
class JobState:
    job_id: str
    tenant: str
    spec: JobSpec
    status: JobStatus
    next_run_at_ms: int | None
    version: int
    created_at_ms: int
    updated_at_ms: int
    # runs the schedule triggered so far (not manual triggers, not backfills): what a
    # schedule's ``max_runs`` is counted against
    scheduled_runs: int = 0
    # jobs that run after this one (their ``after`` names it), told when its runs end
    downstreams: tuple[str, ...] = ()
    # the latest ends of this job's upstreams' runs (core.dependencies.record_end)
    upstream_ends: tuple[UpstreamEnded, ...] = ()
    # a job after its upstreams (no schedule of its own): the latest slots it staged a run
    # for (or recorded skipped), ascending, at most FOLLOWED_SLOTS_KEPT (``decide_follow``)
    followed_slots: tuple[int, ...] = ()
    # of those slots, the ones whose next logical time is known (``learn_follow_next``):
    # what the end of its run of a slot covers for its own downstreams
    follow_next: tuple[FollowNext, ...] = ()
    # the region the job moved to (``MoveJob``): here it is DONE and schedules nothing
    # more; its runs staged before the move still run here. None: it was never moved away
    moved_to: str | None = None
    # the latest slot the schedule reached (triggered, in the lookahead too, or recorded
    # skipped): a done job's slots still ahead of now are its preview's (``api.views``)
    last_slot_ms: int | None = None


@dataclass(frozen=True)
class FollowNext:
    """A job after its upstreams: its first logical time after ``slot_ms`` (None: none)."""

    slot_ms: int
    next_slot_ms: int | None


FOLLOWED_SLOTS_KEPT = 64


def learn_follow_next(state: JobState, staging_ms: int | None = None) -> JobState:
    """A job after its upstreams, whose ``upstream_ends`` just grew: the next logical
    time of each slot it follows (and of ``staging_ms``, the slot being staged now) that
    every upstream's ends now tell (``core.dependencies.next_logical_time``), kept with
    the slot. Learnt once every upstream has ended its run of the slot, so before the
    job's run of it can be released; a slot whose run is decided without it (paused, a
    calendar, a bound on the wait) covers only itself (``follow_next_of``)."""
    if not state.spec.schedule.after_upstreams:
        return state
    slots = sorted({*state.followed_slots, *(() if staging_ms is None else (staging_ms,))})[-FOLLOWED_SLOTS_KEPT:]
    known = {f.slot_ms: f for f in state.follow_next}
    by_up: dict[str, list[UpstreamEnded]] | None = None
    learnt = []
    for slot in slots:
        if slot in known:
            learnt.append(known[slot])
            continue
        if by_up is None:
            by_up = ends_by_upstream(state.upstream_ends)
        nxt = next_logical_time(slot, state.spec.after, by_up)
        if nxt is not None:
            learnt.append(FollowNext(slot, nxt.next_slot_ms))
    return state if tuple(learnt) == state.follow_next else replace(state, follow_next=tuple(learnt))


def follow_next_of(state: JobState, slot_ms: int) -> int | None:
    """The next logical time after ``slot_ms`` of a job after its upstreams, as learnt;
    ``slot_ms + 1`` when it was not (its end then covers its own slot only: a downstream
    slot after it waits for the job's next run rather than be released early)."""
    for f in state.follow_next:
        if f.slot_ms == slot_ms:
            return f.next_slot_ms
    return slot_ms + 1


def _live(spec: JobSpec, next_run_at_ms: int | None) -> JobStatus:
    """ACTIVE while the schedule has a slot left (a job after its upstreams always may)."""
    return JobStatus.ACTIVE if next_run_at_ms is not None or spec.schedule.after_upstreams else JobStatus.DONE


def runs_left(state: JobState) -> int | None:
    """How many more runs the schedule's ``max_runs`` allows (None: no limit)."""
    limit = state.spec.schedule.max_runs
    return None if limit is None else max(0, limit - state.scheduled_runs)


def ended_because(state: JobState) -> str | None:
    """Why a job whose schedule has no slot left ended (None while it has one, or when
    it is paused or deleted): the reason a job page and ``gnomon jobs show`` print."""
    if state.status is not JobStatus.DONE:
        return None
    if state.moved_to is not None:
        return f"moved to region {state.moved_to} (its later slots run there)"
    sched = state.spec.schedule
    if sched.run_at_ms is not None:
        return "its one-time slot was triggered"
    if sched.max_runs is not None and state.scheduled_runs >= sched.max_runs:
        return f"maxRuns reached ({state.scheduled_runs} of {sched.max_runs} runs)"
    if sched.end_at_ms is not None:
        from gnomon.core.clock import ms_to_iso

        return f"endAt passed ({ms_to_iso(sched.end_at_ms)})"
    return "the schedule has no slot left"


# ---- commands (gnomon.job-commands) -------------------------------------------------


@dataclass(frozen=True)
class RegisterJob:
    job_id: str
    tenant: str
    spec: JobSpec
    at_ms: int
    # the key a derived id (``model.idempotent_job_id``) came from: required for an id of
    # that form, so another tenant cannot register it first (JobCommand v13)
    idempotency_key: str | None = None


@dataclass(frozen=True)
class UpdateJob:
    """Replace the whole spec. The API no longer sends it (see ``PatchJob``); records
    already in the log are still applied as before."""

    job_id: str
    tenant: str
    spec: JobSpec
    at_ms: int


@dataclass(frozen=True)
class PatchJob:
    """Change some fields of a job; the processor merges them when it applies the command.

    A new command rather than a change to ``UpdateJob``: an ``UpdateJob`` carries a whole
    spec that its sender merged from its own (lagging) read of the job, so of two quick
    edits the later silently reverts the earlier, and its old records must keep meaning
    "replace everything". A ``PatchJob`` carries only the fields to change
    (``patch_json``: the request's JSON object as canonical text, see ``canonical_patch``)
    and is merged into the job as it is at apply time, in log order: edits to different
    fields all survive. ``expected_version`` (the API's If-Match) makes it conditional:
    applied only if the job is still at that version (None: no check)."""

    job_id: str
    tenant: str
    patch_json: str
    expected_version: int | None
    at_ms: int


@dataclass(frozen=True)
class PauseJob:
    job_id: str
    tenant: str
    at_ms: int


@dataclass(frozen=True)
class ResumeJob:
    job_id: str
    tenant: str
    at_ms: int


@dataclass(frozen=True)
class DeleteJob:
    job_id: str
    tenant: str
    at_ms: int


@dataclass(frozen=True)
class TriggerJob:
    job_id: str
    tenant: str
    idempotency_key: str
    at_ms: int


@dataclass(frozen=True)
class BackfillJob:
    """Create the runs of these past slots of the job's schedule (``POST /v1/jobs/{id}:backfill``).

    The API computes ``slots_ms`` from the schedule over the requested range and leaves
    out every slot whose run history has in a state other than skipped (run ids are
    ``job@slot``; a run purged from processor state is still in history, so it is not
    run twice). Each slot becomes a ``RunTriggered`` with ``backfill=True``: a new run, or
    the reopening of a run recorded skipped; a run that exists and is not skipped is
    left alone. At most ``BACKFILL_SLOTS_MAX`` slots, each at or after the job's first
    possible slot and before its schedule position (``next_run_at``)."""

    job_id: str
    tenant: str
    slots_ms: tuple[int, ...]
    at_ms: int


BACKFILL_SLOTS_MAX = 1000


@dataclass(frozen=True)
class MoveJob:
    """Move the job to another region's namespace (``POST /v1/jobs/{id}:move``; ADR 0013).

    Decided by the job's home processor: the job's slots before its schedule position
    (``next_run_at``: every slot up to it is triggered already, the lookahead's too) stay
    and run here; from that slot on, the job is the new region's. In one transaction
    the job becomes DONE here (``moved_to``) and an ``AdoptJob`` carrying it, signed with
    the operator's command key (the processors' word), goes to ``to_region``'s
    job-commands topic."""

    job_id: str
    tenant: str
    to_region: str
    at_ms: int


@dataclass(frozen=True)
class AdoptJob:
    """Written by a processor, never by the API: a job moved here from ``from_region``
    (``MoveJob``), to be scheduled from ``next_run_at_ms`` on (the first slot its old home
    did not decide), with its count of scheduled runs (``maxRuns``), version and creation
    time. Refused here (the id is taken by a job of this region, a limit), it goes back
    to ``from_region`` with ``returned`` set, and its old home takes it back where it was;
    a returned one that is refused again is only answered (it is never sent a third way)."""

    job_id: str
    tenant: str
    spec: JobSpec
    next_run_at_ms: int | None
    paused: bool
    scheduled_runs: int
    version: int
    created_at_ms: int
    from_region: str
    at_ms: int
    returned: bool = False


JobCommand = (RegisterJob | UpdateJob | PatchJob | PauseJob | ResumeJob | DeleteJob | TriggerJob | BackfillJob
              | MoveJob | AdoptJob)
JOB_COMMANDS = (RegisterJob, UpdateJob, PatchJob, PauseJob, ResumeJob, DeleteJob, TriggerJob, BackfillJob,
                MoveJob, AdoptJob)


def canonical_patch(patch: Mapping[str, object]) -> str:
    """The text a ``PatchJob`` carries: compact, keys sorted, no NaN (one patch, one text)."""
    return json.dumps(patch, separators=(",", ":"), sort_keys=True, allow_nan=False)


# ---- events ----------------------------------------------------------------------------


@dataclass(frozen=True)
class JobRegistered:
    job_id: str
    tenant: str
    spec: JobSpec
    next_run_at_ms: int | None
    at_ms: int


@dataclass(frozen=True)
class JobUpdated:
    job_id: str
    spec: JobSpec
    next_run_at_ms: int | None
    at_ms: int


@dataclass(frozen=True)
class JobPaused:
    job_id: str
    at_ms: int


@dataclass(frozen=True)
class JobResumed:
    job_id: str
    next_run_at_ms: int | None
    at_ms: int


@dataclass(frozen=True)
class JobDeleted:
    job_id: str
    at_ms: int


@dataclass(frozen=True)
class JobMovedOut:
    """The job left for ``to_region`` (``MoveJob``): DONE here from now on."""

    job_id: str
    to_region: str
    at_ms: int


@dataclass(frozen=True)
class JobAdopted:
    """The job arrived from another region (``AdoptJob``), or came back to its old home."""

    job_id: str
    tenant: str
    spec: JobSpec
    next_run_at_ms: int | None
    paused: bool
    scheduled_runs: int
    version: int
    created_at_ms: int
    at_ms: int


@dataclass(frozen=True)
class RunTriggered:
    """A run exists for this slot (or manual trigger). Sent to the run processor."""

    run_id: str
    job_id: str
    tenant: str
    spec: JobSpec
    slot_ms: int
    not_before_ms: int
    manual: bool
    at_ms: int
    # advances=True: the job's next_run_at becomes advance_to_ms (None = no more slots).
    # Manual triggers and all but the last record of a catch-up batch do not advance.
    advances: bool = False
    advance_to_ms: int | None = None
    # from a backfill (``BackfillJob``): creates the run, or reopens one recorded skipped.
    # Only ever applied in place by the processor that decided it; one read from the log
    # is refused (the processor's guard, processor/task.py).
    backfill: bool = False


@dataclass(frozen=True)
class RunSkipped:
    """Slots that will not run, recorded with why: one record for a whole range.

    The range is every slot of ``spec``'s schedule from ``from_ms`` (None: just
    ``slot_ms``) to ``slot_ms`` inclusive; ``run_id`` names the last one. ``count`` is
    how many slots that is (at least that many when it reached ``skip_count_max``)."""

    run_id: str
    job_id: str
    tenant: str
    spec: JobSpec
    slot_ms: int
    reason: str
    at_ms: int
    count: int = 1
    advances: bool = False
    advance_to_ms: int | None = None
    from_ms: int | None = None


JobEvent = (JobRegistered | JobUpdated | JobPaused | JobResumed | JobDeleted | JobMovedOut | JobAdopted
            | RunTriggered | RunSkipped)


# ---- schedule arithmetic ---------------------------------------------------------------


def first_slot_after(spec: JobSpec, after_ms: int) -> int | None:
    """The first slot strictly after ``after_ms`` within the schedule's bounds (a one-time
    job's run_at, if at or after ``after_ms``)."""
    if spec.schedule.run_at_ms is not None:
        return spec.schedule.run_at_ms if spec.schedule.run_at_ms >= after_ms else None
    return S.next_after(spec.schedule, after_ms)


def _next_slot(spec: JobSpec, slot_ms: int) -> int | None:
    if spec.schedule.run_at_ms is not None:
        return None
    return S.next_after(spec.schedule, slot_ms)


def same_slots(a: Schedule, b: Schedule) -> bool:
    """Do ``a`` and ``b`` make the same slots before their bounds?"""
    return (a.cron, a.tz, a.run_at_ms, a.every_s, a.anchor_ms) == (b.cron, b.tz, b.run_at_ms, b.every_s, b.anchor_ms)


def _first_slot(state: JobState, spec: JobSpec, after_ms: int) -> int | None:
    """``first_slot_after`` unless the schedule's ``max_runs`` is spent."""
    left = spec.schedule.max_runs
    if left is not None and state.scheduled_runs >= left:
        return None
    return first_slot_after(spec, after_ms)


def last_slots_at_or_before(spec: JobSpec, until_ms: int, count: int) -> list[int]:
    """Up to ``count`` latest slots <= until_ms within the bounds, newest first."""
    return S.last_at_or_before(spec.schedule, until_ms, count)


def _check(state: JobState, target: JobStatus) -> None:
    if target not in _ALLOWED[state.status]:
        raise TransitionError(f"job {state.job_id} is {state.status.value}; cannot become {target.value}")


# ---- decide ----------------------------------------------------------------------------


def deleted_owner(state: JobState, at_ms: int) -> JobState:
    """What the processor keeps of a job deleted at ``at_ms``: its id's owner, for ever (a
    DELETED state, on the jobs topic and in the store), so no other tenant can register
    the id again and so read the old job's runs, logs and dead letters as its own. It
    schedules nothing and counts toward no limit; its own tenant may register the id
    again."""
    return replace(state, status=JobStatus.DELETED, version=state.version + 1, updated_at_ms=at_ms)


def not_found(job_id: str) -> str:
    """The one answer for a job a command cannot act on because it is not there for the
    command's tenant: never registered, deleted, or another tenant's (the same words, so a
    refusal tells nothing of other tenants' ids)."""
    return f"job {job_id} does not exist"


def decide(state: JobState | None, cmd: JobCommand, cfg: SchedulerConfig | None = None, *,
           pools: frozenset[str] = DEFAULT_POOLS, region: str | None = None) -> list[JobEvent]:
    """Events caused by a command. The command's own ``at_ms`` is "now". ``pools``: the
    pools a job may use (the topology's), checked when a patch is merged. ``region``: the
    region whose namespace decides (None: the default namespace, which has no moves)."""
    cfg = cfg or SchedulerConfig()
    now = cmd.at_ms
    if isinstance(cmd, AdoptJob):
        return _adopt(state, cmd, region)
    if state is not None and state.moved_to is not None:
        raise TransitionError(f"job {cmd.job_id} moved to region {state.moved_to}; send its commands there "
                              f"(or move it back from there)")
    if isinstance(cmd, RegisterJob):
        if state is not None and state.tenant != cmd.tenant:
            # a job id is its tenant's for ever: live, or deleted (``deleted_owner``)
            raise TransitionError(f"job {cmd.job_id} already exists")
        if state is not None and state.status is not JobStatus.DELETED:
            if state.spec == cmd.spec and state.tenant == cmd.tenant:
                return []  # a replayed registration is a no-op
            raise TransitionError(f"job {cmd.job_id} already exists")
        nxt = first_slot_after(cmd.spec, now - 1)
        return [JobRegistered(cmd.job_id, cmd.tenant, cmd.spec, nxt, now)]
    if state is None or state.status is JobStatus.DELETED or state.tenant != cmd.tenant:
        # (another tenant's job gets the words an unknown one does: its ids cannot be probed)
        raise JobNotFound(not_found(cmd.job_id))
    if isinstance(cmd, UpdateJob):
        _check(state, state.status)
        return [_updated(state, cmd.spec, now)]
    if isinstance(cmd, PatchJob):
        _check(state, state.status)
        if cmd.expected_version is not None and cmd.expected_version != state.version:
            raise Conflict(f"job {cmd.job_id} is at version {state.version}, not the expected "
                           f"{cmd.expected_version}; patch refused, nothing changed")
        return [_updated(state, _patched(state, cmd, pools), now)]
    if isinstance(cmd, PauseJob):
        _check(state, JobStatus.PAUSED)
        if state.status is JobStatus.PAUSED:
            return []
        # slots already due and not triggered (a job behind: deferred by an overloaded
        # processor, or in a catch-up not reached yet) are recorded now, as a delete does,
        # not left for a resume that may never come; the job moves past them
        overdue = _skip_range(state, state.next_run_at_ms, now - 1, "paused", now, cfg) if (
            state.status is JobStatus.ACTIVE and state.next_run_at_ms is not None
            and state.next_run_at_ms < now) else []
        if overdue:
            last = overdue[-1]
            assert isinstance(last, RunSkipped)
            nxt = _next_slot(state.spec, last.slot_ms)
            overdue[-1] = replace(last, advances=True, advance_to_ms=nxt)
            if nxt is None:
                return overdue  # (no slot left: the job is done, nothing to pause)
        return [*overdue, JobPaused(cmd.job_id, now)]
    if isinstance(cmd, ResumeJob):
        _check(state, JobStatus.ACTIVE)
        if state.status is not JobStatus.PAUSED:
            return []
        events: list[JobEvent] = []
        # Slots that fell while paused are recorded as skipped, then resume at the next slot.
        if state.next_run_at_ms is not None and state.next_run_at_ms < now:
            events.extend(_skip_range(state, state.next_run_at_ms, now - 1, "paused", now, cfg))
        # (slots before next_run_at were decided already: a lookahead's triggers made
        # before the pause are not made again, nor counted twice against maxRuns)
        resume_at = max(now, state.next_run_at_ms) if state.next_run_at_ms is not None else now
        return [*events, JobResumed(cmd.job_id, _first_slot(state, state.spec, resume_at - 1), now)]
    if isinstance(cmd, DeleteJob):
        _check(state, JobStatus.DELETED)
        # slots already due and not triggered (a job behind: deferred by an overloaded
        # processor, or in a catch-up not reached yet) are recorded, not dropped silently
        behind: list[JobEvent] = []
        if state.status is JobStatus.ACTIVE and state.next_run_at_ms is not None and state.next_run_at_ms < now:
            behind = list(_skip_range(state, state.next_run_at_ms, now - 1, "job deleted", now, SchedulerConfig()))
        return [*behind, JobDeleted(cmd.job_id, now)]
    if isinstance(cmd, TriggerJob):
        return [
            RunTriggered(
                run_id=manual_run_id(cmd.job_id, cmd.idempotency_key),
                job_id=cmd.job_id,
                tenant=state.tenant,
                spec=state.spec,
                slot_ms=now,
                not_before_ms=now,
                manual=True,
                at_ms=now,
            )
        ]
    if isinstance(cmd, BackfillJob):
        return _backfill(state, cmd)
    if isinstance(cmd, MoveJob):
        return _move(state, cmd, region)
    raise AssertionError(f"unknown command {cmd!r}")


def _move(state: JobState, cmd: MoveJob, region: str | None) -> list[JobEvent]:
    """A job leaves for ``cmd.to_region`` at its schedule position (``MoveJob``)."""
    if region is None:
        raise TransitionError(f"job {cmd.job_id} is in the default namespace, which is no region; only a job "
                              "of a region ($GNOMON_REGION) can move")
    if cmd.to_region == region:
        raise ValidationError("region", f"job {cmd.job_id} is in region {region} already")
    if state.status is JobStatus.DONE:
        raise TransitionError(f"job {cmd.job_id} is done ({ended_because(state)}); it has no slot left to move")
    if state.spec.after or state.downstreams:
        raise TransitionError(f"job {cmd.job_id} has upstreams or downstreams (after); jobs that depend on one "
                              "another live in one region, so it cannot move alone")
    return [JobMovedOut(cmd.job_id, cmd.to_region, cmd.at_ms)]


def adoption_of(state: JobState, moved: JobMovedOut, from_region: str) -> AdoptJob:
    """The ``AdoptJob`` that hands ``state`` (the job before ``moved``) to ``moved.to_region``."""
    return AdoptJob(state.job_id, state.tenant, state.spec, state.next_run_at_ms,
                    state.status is JobStatus.PAUSED, state.scheduled_runs, state.version + 1,
                    state.created_at_ms, from_region, moved.at_ms)


def returned(adopt: AdoptJob, region: str) -> AdoptJob:
    """``adopt``, refused in ``region``, on its way back to its old home."""
    return replace(adopt, from_region=region, returned=True)


def _adopt(state: JobState | None, cmd: AdoptJob, region: str | None) -> list[JobEvent]:
    if region is None:
        raise TransitionError(f"job {cmd.job_id} cannot be adopted by the default namespace (no region)")
    if cmd.from_region == region:
        raise ValidationError("from_region", f"an adoption from region {region} read in region {region}")
    if state is not None and state.status is JobStatus.DELETED and state.tenant != cmd.tenant:
        raise Conflict(f"job {cmd.job_id} exists in region {region} already; the move from region "
                       f"{cmd.from_region} is refused and the job goes back there")  # (another tenant's id, deleted)
    if state is not None and state.status is not JobStatus.DELETED:
        if not cmd.returned and state.moved_to is None:
            raise Conflict(f"job {cmd.job_id} exists in region {region} already; the move from region "
                           f"{cmd.from_region} is refused and the job goes back there")
        if cmd.returned and state.moved_to != cmd.from_region:
            raise TransitionError(f"job {cmd.job_id} did not move to region {cmd.from_region}; its return from "
                                  "there is refused")
        if state.tenant != cmd.tenant:
            raise JobNotFound(not_found(cmd.job_id))
    elif cmd.returned:
        raise TransitionError(f"job {cmd.job_id} did not move from here; its return is refused")
    return [JobAdopted(cmd.job_id, cmd.tenant, cmd.spec, cmd.next_run_at_ms, cmd.paused, cmd.scheduled_runs,
                       cmd.version, cmd.created_at_ms, cmd.at_ms)]


def check_backfill_slots(state: JobState, slots_ms: tuple[int, ...], field: str = "slots") -> None:
    """Refuse a backfill the job cannot take: a paused or one-time job, too many slots,
    a slot that is not one of the schedule's, one before the job existed, or one not yet
    passed (at or after the job's ``next_run_at``: the scheduler triggers those itself). ``TransitionError`` for
    the job's state, ``ValidationError(field)`` for the slots."""
    if state.spec.schedule.run_at_ms is not None:
        raise TransitionError(f"job {state.job_id} is a one-time job; backfill needs a repeating schedule "
                              "(trigger it by hand instead)")
    if state.spec.schedule.after_upstreams:
        raise TransitionError(f"job {state.job_id} has no schedule of its own (it runs after its upstreams); "
                              "backfill its upstreams instead: their runs stage its runs")
    if state.status is not JobStatus.ACTIVE:
        raise TransitionError(f"job {state.job_id} is {state.status.value}; resume it before a backfill")
    if not slots_ms:
        raise ValidationError(field, "names no slot")
    if len(slots_ms) > BACKFILL_SLOTS_MAX:
        raise ValidationError(field, f"names {len(slots_ms)} slots; at most {BACKFILL_SLOTS_MAX} per backfill")
    if len(set(slots_ms)) != len(slots_ms):
        raise ValidationError(field, "names a slot twice")
    for i, slot in enumerate(slots_ms):
        if not S.is_slot(state.spec.schedule, slot):
            raise ValidationError(f"{field}[{i}]", f"{slot} is not a slot of the schedule "
                                                   f"({describe_schedule(state.spec)})")
        if slot < state.created_at_ms:
            raise ValidationError(f"{field}[{i}]", f"{slot} is before the job existed (created at "
                                                   f"{state.created_at_ms})")
        if state.next_run_at_ms is not None and slot >= state.next_run_at_ms:
            raise ValidationError(f"{field}[{i}]", f"{slot} is not a past slot: the schedule is at "
                                                   f"{state.next_run_at_ms} and triggers it itself")


def _backfill(state: JobState, cmd: BackfillJob) -> list[JobEvent]:
    check_backfill_slots(state, cmd.slots_ms)
    spec = state.spec
    return [
        RunTriggered(
            run_id=slot_run_id(state.job_id, slot), job_id=state.job_id, tenant=state.tenant, spec=spec,
            slot_ms=slot, not_before_ms=slot + jitter_offset_ms(state.job_id, slot, spec.jitter_s),
            manual=False, at_ms=cmd.at_ms, backfill=True,
        )
        for slot in sorted(cmd.slots_ms)
    ]


def describe_schedule(spec: JobSpec) -> str:
    """One line: the schedule and its bounds, for messages and previews."""
    from gnomon.core.clock import ms_to_iso

    sched = spec.schedule
    if sched.run_at_ms is not None:
        return f"once at {ms_to_iso(sched.run_at_ms)}"
    if sched.after_upstreams:
        ups = ", ".join(u.job_id for u in spec.after)
        text = f"after each run of {ups} (no schedule of its own)"
        if spec.exclude_calendars:
            text += f", not on the dates of {', '.join(spec.exclude_calendars)}"
        return text
    if sched.every_s is not None:
        text = f"every {format_duration_s(sched.every_s)}"
        if sched.anchor_ms is not None:
            text += f" from {ms_to_iso(sched.anchor_ms)}"
    else:
        text = f"cron {sched.cron!r} ({sched.tz})"
    if sched.start_at_ms is not None:
        text += f", not before {ms_to_iso(sched.start_at_ms)}"
    if sched.end_at_ms is not None:
        text += f", not after {ms_to_iso(sched.end_at_ms)}"
    if sched.max_runs is not None:
        text += f", at most {sched.max_runs} runs"
    if spec.exclude_calendars:
        text += f", not on the dates of {', '.join(spec.exclude_calendars)}"
    return text


def slots_between(spec: JobSpec, from_ms: int, to_ms: int, limit: int) -> list[int]:
    """The schedule's slots in [from_ms, to_ms], oldest first; at most ``limit + 1`` of them
    (so a caller sees that the range holds more than ``limit``)."""
    if spec.schedule.run_at_ms is not None:
        return [spec.schedule.run_at_ms] if from_ms <= spec.schedule.run_at_ms <= to_ms else []
    out: list[int] = []
    slot = first_slot_after(spec, from_ms - 1)
    while slot is not None and slot <= to_ms and len(out) <= limit:
        out.append(slot)
        slot = _next_slot(spec, slot)
    return out


def _updated(state: JobState, spec: JobSpec, now: int) -> JobUpdated:
    """The job takes ``spec``. Its schedule position stays unless the schedule changed (or
    a finished one-time job gets a new slot)."""
    if spec.schedule == state.spec.schedule and state.status is not JobStatus.DONE:
        nxt = state.next_run_at_ms
    elif (state.status is not JobStatus.DONE and state.next_run_at_ms is not None
          and same_slots(spec.schedule, state.spec.schedule)):
        # only the bounds changed: the job keeps its place (the slots before it were
        # decided, the lookahead's triggers included), within the new bounds
        nxt = _first_slot(state, spec, state.next_run_at_ms - 1)
    else:
        nxt = _first_slot(state, spec, now - 1)
    return JobUpdated(state.job_id, spec, nxt, now)


def _patched(state: JobState, cmd: PatchJob, pools: frozenset[str]) -> JobSpec:
    """The job's current spec with the patch merged and the whole re-validated (the API's
    rules). A patch that does not parse or validate raises ``ValidationError`` naming the
    field. The text may come from anyone who can write the topic: nothing in it may raise
    anything else (a deep nesting would), or the record would stop the processor instead
    of going to poison."""
    refused = f"patch of job {cmd.job_id} refused"
    try:
        patch = json.loads(cmd.patch_json)
    except (ValueError, RecursionError) as exc:
        raise ValidationError("body", f"{refused}: not JSON ({type(exc).__name__})") from None
    try:
        return apply_patch(state.spec, patch, cmd.at_ms, pools=pools)
    except ValidationError as exc:
        raise ValidationError(exc.field, f"{refused}: {exc.message}") from None
    except RecursionError:
        raise ValidationError("body", f"{refused}: nested too deeply") from None


def _skip_range(
    state: JobState, from_ms: int, until_ms: int, reason: str, now: int, cfg: SchedulerConfig
) -> list[JobEvent]:
    return skip_range(state.job_id, state.tenant, state.spec, from_ms, until_ms, reason, now, cfg)


def skip_range(
    job_id: str, tenant: str, spec: JobSpec, from_ms: int, until_ms: int, reason: str, now: int,
    cfg: SchedulerConfig | None = None,
) -> list[JobEvent]:
    """One skipped-range record for every slot in [from_ms, until_ms] (none if the range
    holds no slot). The walk that counts them stops at ``skip_count_max``: the range
    still covers every slot up to its last one, found by a reverse step."""
    cfg = cfg or SchedulerConfig()
    first = from_ms if spec.schedule.run_at_ms is not None else first_slot_after(spec, from_ms - 1)
    if first is None or first > until_ms:
        return []
    if spec.schedule.run_at_ms is not None:
        last, count = first, 1
    else:
        before = last_slots_at_or_before(spec, until_ms, 1)
        last = before[0] if before else first
        if last < first:  # the reverse walk can miss a repeated hour (DST fall-back): walk forward
            last = first
            while (nxt := _next_slot(spec, last)) is not None and nxt <= until_ms:
                last = nxt
        count, slot = 1, first
        while count < cfg.skip_count_max:
            nxt = _next_slot(spec, slot)
            if nxt is None or nxt > last:
                break
            count, slot = count + 1, nxt
    return [RunSkipped(slot_run_id(job_id, last), job_id, tenant, spec, last, reason, now,
                       count=count, from_ms=first if first != last else None)]


OVERLOAD_REASON = "overload"


def late_max_ms(spec: JobSpec, cfg: SchedulerConfig) -> int:
    """How late a slot may start under overload before it is given up (the job's
    ``late_max_s``, else the misfire grace)."""
    return spec.late_max_s * 1000 if spec.late_max_s is not None else cfg.misfire_grace_ms


def _give_up(state: JobState, give_up_to: int, now_ms: int, cfg: SchedulerConfig) -> tuple[list[JobEvent], int | None]:
    """The job's slots from its next one to ``give_up_to`` given up under overload (one
    range recorded skipped, reason ``overload``; a one-time job: its slot), and its next
    slot after them."""
    spec, first = state.spec, state.next_run_at_ms
    assert first is not None and first <= give_up_to
    if spec.schedule.run_at_ms is not None:
        return [RunSkipped(slot_run_id(state.job_id, first), state.job_id, state.tenant, spec, first,
                           OVERLOAD_REASON, now_ms, advances=True)], None
    events = _skip_range(state, first, give_up_to, OVERLOAD_REASON, now_ms, cfg)
    if not events:
        return [], first
    given_up = events[-1]
    assert isinstance(given_up, RunSkipped)
    slot = _next_slot(spec, given_up.slot_ms)
    events[-1] = replace(given_up, advances=True, advance_to_ms=slot)
    return events, slot


def _catch_keep(spec: JobSpec, now_ms: int, first: int, cfg: SchedulerConfig) -> list[int]:
    """The missed slots (from ``first`` up to now) the job's catch-up policy runs."""
    keep_n = {CatchUp.SKIP: 0, CatchUp.ONCE: 1, CatchUp.ALL: cfg.catch_up_all_max}[spec.catch_up]
    latest = sorted(last_slots_at_or_before(spec, now_ms, keep_n)) if keep_n else []
    return [s for s in latest if s >= first]


def _catch_up_skips(state: JobState, now_ms: int, cfg: SchedulerConfig) -> list[JobEvent]:
    """The skip part of a catch-up alone (the budget is spent): the missed slots before the
    ones the policy keeps recorded skipped, the job moved to the first kept (or past now)."""
    assert state.next_run_at_ms is not None
    keep = _catch_keep(state.spec, now_ms, state.next_run_at_ms, cfg)
    skipped = _skip_range(state, state.next_run_at_ms, (keep[0] - 1) if keep else now_ms,
                          f"catch-up policy {state.spec.catch_up.value}", now_ms, cfg)
    if not skipped:
        return []
    last = skipped[-1]
    assert isinstance(last, RunSkipped)
    nxt = keep[0] if keep else _next_slot(state.spec, last.slot_ms)
    return [*skipped[:-1], replace(last, advances=True, advance_to_ms=nxt)]


def decide_tick(state: JobState, now_ms: int, cfg: SchedulerConfig | None = None,
                present_since_ms: int | None = None, *, triggers: bool = True,
                calendars: Sequence[Calendar] = ()) -> list[JobEvent]:
    """Triggers for slots due within the lookahead; catch-up for slots already missed.

    ``present_since_ms``: since when the deciding processor has ticked this partition
    without a gap (None: unknown). A slot at or after it that is still untriggered was
    not missed by an outage but deferred by an overloaded processor (its tick budget,
    ``processor.task``): such slots run late, up to the job's ``late_max_ms``, and older
    ones are given up in one range recorded skipped with reason ``overload``. Slots
    before it were missed while no processor ticked: the job's catch-up policy decides.
    ``triggers`` False (the tick's budget is spent): only the give-up, nothing triggered.
    ``calendars``: the job's exclusion calendars (``spec.exclude_calendars``, as the
    processor knows them): a slot one of them holds is recorded skipped, reason
    ``calendar <name>``, where it would have been triggered (not counted by maxRuns)."""
    cfg = cfg or SchedulerConfig()
    if state.status is not JobStatus.ACTIVE or state.next_run_at_ms is None:
        return []
    horizon = now_ms + cfg.lookahead_ms
    first = state.next_run_at_ms
    if first > horizon:
        return []
    events: list[JobEvent] = []
    missed_before = now_ms - cfg.misfire_grace_ms
    spec = state.spec
    left = runs_left(state)

    def trigger(slot: int, advance: int | None, advances: bool) -> RunTriggered | RunSkipped:
        excluded = excluded_by(calendars, slot) if calendars else None
        if excluded is not None:
            return RunSkipped(slot_run_id(state.job_id, slot), state.job_id, state.tenant, spec, slot,
                              calendar_reason(excluded), now_ms, advances=advances, advance_to_ms=advance)
        return RunTriggered(
            run_id=slot_run_id(state.job_id, slot), job_id=state.job_id, tenant=state.tenant, spec=spec,
            slot_ms=slot, not_before_ms=slot + jitter_offset_ms(state.job_id, slot, spec.jitter_s),
            manual=False, at_ms=now_ms,
            advances=advances, advance_to_ms=advance,
        )

    slot: int | None = first
    give_up_to = now_ms - late_max_ms(spec, cfg)  # under overload, slots at or before this are given up
    if present_since_ms is not None and first >= present_since_ms:
        if first <= give_up_to:
            events, slot = _give_up(state, give_up_to, now_ms, cfg)
            if slot is None and events and spec.schedule.run_at_ms is not None:
                return events
        if not triggers:
            return events
    elif not triggers:
        # Missed while no processor ticked, and the budget is spent: the runs the catch-up
        # policy keeps wait for budget, but the slots it skips are recorded now (a record
        # costs no trigger), so a job the budget never reaches still accounts for its
        # backlog and waits at its kept slots only. (A one-time or maxRuns job: all wait.)
        if first >= missed_before or spec.schedule.run_at_ms is not None or left is not None:
            return []
        return _catch_up_skips(state, now_ms, cfg)
    elif first < missed_before:
        # Catch-up: the processors were away. Decide which missed slots run.
        if spec.schedule.run_at_ms is not None:
            if spec.catch_up is CatchUp.SKIP:
                return [RunSkipped(slot_run_id(state.job_id, first), state.job_id, state.tenant, spec, first,
                                   "catch-up policy skip", now_ms, advances=True)]
            return [trigger(first, None, advances=True)]
        # The job is behind by more than the grace: the policy decides over its whole
        # backlog, up to now. (Slots inside the grace are not run one by one on top of it:
        # after an outage that would be up to grace/interval extra runs per job at once,
        # all due now, ahead of every slot that is due now.)
        latest = _catch_keep(spec, now_ms, first, cfg)
        if left is not None:  # (maxRuns: the oldest of them run, the job ends after them)
            latest = latest[:left]
            left -= len(latest)
        skip_until = (latest[0] - 1) if latest else now_ms
        reason = f"catch-up policy {spec.catch_up.value}"
        events.extend(_skip_range(state, first, skip_until, reason, now_ms, cfg))
        for s in latest:
            ev = trigger(s, None, advances=False)
            if isinstance(ev, RunSkipped) and left is not None:
                left += 1  # (a calendar's skip is no run)
            events.append(ev)
        last_missed = latest[-1] if latest else skip_until
        slot = _next_slot(spec, last_missed) if left != 0 else None
        # the state must advance past everything decided so far
        if events:
            final = events[-1]
            assert isinstance(final, RunTriggered | RunSkipped)
            events[-1] = replace(final, advances=True, advance_to_ms=slot)
    while slot is not None and slot <= horizon and len(events) < cfg.triggers_per_tick_max:
        nxt = _next_slot(spec, slot)
        decided = trigger(slot, nxt, advances=True)
        if left is not None and isinstance(decided, RunTriggered):
            left -= 1
            if left <= 0:  # maxRuns reached with this run: the job ends
                nxt = None
                decided = replace(decided, advance_to_ms=None)
        events.append(decided)
        slot = nxt
    return events


def decide_follow(state: JobState, end: UpstreamEnded, now_ms: int,
                  calendars: Sequence[Calendar] = ()) -> list[JobEvent]:
    """A job after its upstreams (no schedule of its own) learns that an upstream run of
    slot T ended: T is one of its logical times, staged now (a run, which then waits for
    all its upstreams like any downstream run) unless it was staged already. Recorded
    skipped instead while the job is paused (reason ``paused``) or on a date one of its
    ``calendars`` holds. Nothing for a slot before the job existed, a deletion, or a slot
    older than every one of its last ``FOLLOWED_SLOTS_KEPT`` (decided long ago, or an end
    so late that it cannot be told from one: the caller counts it)."""
    slot = end.last_slot_ms
    if not state.spec.schedule.after_upstreams or state.status is JobStatus.DELETED:
        return []
    if end.outcome is Outcome.DELETED or slot < state.created_at_ms or slot in state.followed_slots:
        return []
    if len(state.followed_slots) >= FOLLOWED_SLOTS_KEPT and slot < state.followed_slots[0]:
        return []
    run_id = slot_run_id(state.job_id, slot)
    if state.status is JobStatus.PAUSED:
        return [RunSkipped(run_id, state.job_id, state.tenant, state.spec, slot, "paused", now_ms)]
    excluded = excluded_by(calendars, slot) if calendars else None
    if excluded is not None:
        return [RunSkipped(run_id, state.job_id, state.tenant, state.spec, slot, calendar_reason(excluded), now_ms)]
    return [RunTriggered(run_id=run_id, job_id=state.job_id, tenant=state.tenant, spec=state.spec, slot_ms=slot,
                         not_before_ms=slot + jitter_offset_ms(state.job_id, slot, state.spec.jitter_s),
                         manual=False, at_ms=now_ms)]


def follow_too_old(state: JobState, end: UpstreamEnded) -> bool:
    """``decide_follow`` dropped ``end`` because its slot is older than every slot kept."""
    return (state.spec.schedule.after_upstreams and end.outcome is not Outcome.DELETED
            and len(state.followed_slots) >= FOLLOWED_SLOTS_KEPT and end.last_slot_ms < state.followed_slots[0])


# ---- evolve ----------------------------------------------------------------------------


def evolve(state: JobState | None, event: JobEvent) -> JobState | None:
    if isinstance(event, JobRegistered):
        return JobState(
            job_id=event.job_id, tenant=event.tenant, spec=event.spec,
            status=_live(event.spec, event.next_run_at_ms),
            next_run_at_ms=event.next_run_at_ms, version=1,
            created_at_ms=event.at_ms, updated_at_ms=event.at_ms,
        )
    if isinstance(event, JobAdopted):
        status = JobStatus.PAUSED if event.paused else _live(event.spec, event.next_run_at_ms)
        return JobState(
            job_id=event.job_id, tenant=event.tenant, spec=event.spec, status=status,
            next_run_at_ms=event.next_run_at_ms, version=event.version, created_at_ms=event.created_at_ms,
            updated_at_ms=event.at_ms, scheduled_runs=event.scheduled_runs,
        )
    assert state is not None, f"{type(event).__name__} on a missing job"
    if isinstance(event, JobMovedOut):
        return replace(state, status=JobStatus.DONE, next_run_at_ms=None, moved_to=event.to_region,
                       version=state.version + 1, updated_at_ms=event.at_ms)
    if isinstance(event, JobUpdated):
        status = state.status
        if status is JobStatus.DONE:
            status = _live(event.spec, event.next_run_at_ms)
        ups = {u.job_id for u in event.spec.after}
        ends = tuple(e for e in state.upstream_ends if e.upstream_job in ups)  # (only of its upstreams now)
        return replace(state, spec=event.spec, next_run_at_ms=event.next_run_at_ms, status=status,
                       version=state.version + 1, updated_at_ms=event.at_ms, upstream_ends=ends)
    if isinstance(event, JobPaused):
        return replace(state, status=JobStatus.PAUSED, version=state.version + 1, updated_at_ms=event.at_ms)
    if isinstance(event, JobResumed):
        return replace(state, status=_live(state.spec, event.next_run_at_ms),
                       next_run_at_ms=event.next_run_at_ms, version=state.version + 1, updated_at_ms=event.at_ms)
    if isinstance(event, JobDeleted):
        return None
    if isinstance(event, RunTriggered | RunSkipped):
        counted = state.scheduled_runs + (isinstance(event, RunTriggered) and not event.manual and not event.backfill)
        if state.spec.schedule.after_upstreams and not (isinstance(event, RunTriggered) and event.manual):
            followed = tuple(sorted({*state.followed_slots, event.slot_ms}))[-FOLLOWED_SLOTS_KEPT:]
            nexts = tuple(f for f in state.follow_next if f.slot_ms >= followed[0])
            return replace(state, scheduled_runs=counted, followed_slots=followed, follow_next=nexts)
        if not event.advances:
            return state if counted == state.scheduled_runs else replace(state, scheduled_runs=counted)
        nxt = event.advance_to_ms
        status = state.status if nxt is not None else JobStatus.DONE
        last = event.slot_ms if state.last_slot_ms is None else max(state.last_slot_ms, event.slot_ms)
        return replace(state, next_run_at_ms=nxt, status=status, scheduled_runs=counted, last_slot_ms=last)
    raise AssertionError(f"unknown event {event!r}")

