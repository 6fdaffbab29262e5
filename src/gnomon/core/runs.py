"""The run processor's state machine for one run: ``decide`` and ``evolve``.

Lifecycle (guarded by ``_ALLOWED``)::

    SCHEDULED --(stage time: slot - stage_ahead)--> READY --(assign/claim)--> RUNNING --(ok)--> SUCCEEDED
        |                                 ^   ^               |  (staged until the worker
        |                                 |   +--(revoked / returned before start)   reports Started)
        |                                 |                   +--(fail/timeout/lease lost)--> RETRY_WAIT
        |                                 +----(backoff over)----------------------------------+
        |                                                     +--(attempts exhausted)--> FAILED (dead letter)
        +--(cancel, from any non-terminal state)--> CANCELLED
    SKIPPED is born terminal (a slot that will not run, with a reason), or reached by a
    run withdrawn before it ever started (paused, deleted, schedule changed). A backfill
    reopens it (SKIPPED -> SCHEDULED, ``note`` says so): the one way out of a terminal
    state besides the replay of a dead letter.

``overlap: bufferOne``: at its start a scheduled run whose job has an active run waits
(stays SCHEDULED, *buffered*, re-checked every ``redispatch_after_ms``) if no other run
of the job is buffered, and is skipped ("overlap: ...") if one is; once no run of the job
is active the buffered run is released.

Pre-staging: a run is released (READY) ``stage_ahead_ms`` before its slot and granted to
a worker at once; the grant carries ``not_before_ms`` and the worker starts it at that
instant by its own clock. A granted attempt is *staged* until the worker reports
``AttemptStarted``; a staged attempt can still be revoked (edit, worker lost) or
withdrawn (pause, delete) and the worker is told to drop it. Its lease and deadline
count from the slot, not from the grant.

Every grant bumps ``token`` (the fencing token). Heartbeats, start reports and
completions that carry another token are rejected and their sender is told to stop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from gnomon.core import dependencies as D
from gnomon.core import schedule as schedule_slots
from gnomon.core.clock import ms_to_iso as _iso
from gnomon.core.errors import RunNotFound, TransitionError
from gnomon.core.jobs import (
    JobState,
    JobStatus,
    RunSkipped,
    RunTriggered,
    last_slots_at_or_before,
    skip_range,
)
from gnomon.core.model import JobSpec, OverlapPolicy, slot_run_id
from gnomon.core.priorities import DEFAULT_WEIGHTS, check_weights
from gnomon.core.records import replace
from gnomon.core.retry import BackoffStrategy


class RunStatus(StrEnum):
    SCHEDULED = "scheduled"
    READY = "ready"
    RUNNING = "running"
    RETRY_WAIT = "retry_wait"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    SKIPPED = "skipped"

    @property
    def terminal(self) -> bool:
        return self in _TERMINAL


# An attempt's output (CompleteAttempt.output) is JSON text of at most this many UTF-8
# bytes: it travels in run-events and in every RunState record of the run ledger.
OUTPUT_MAX_BYTES = 16 * 1024

_TERMINAL = frozenset({RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.SKIPPED})

_ALLOWED: dict[RunStatus, frozenset[RunStatus]] = {
    # SCHEDULED -> SCHEDULED: a buffered run (overlap: bufferOne) waits on
    RunStatus.SCHEDULED: frozenset({RunStatus.SCHEDULED, RunStatus.READY, RunStatus.CANCELLED, RunStatus.SKIPPED}),
    RunStatus.READY: frozenset({RunStatus.READY, RunStatus.RUNNING, RunStatus.CANCELLED, RunStatus.SKIPPED}),
    RunStatus.RUNNING: frozenset(
        {RunStatus.RUNNING, RunStatus.SUCCEEDED, RunStatus.RETRY_WAIT, RunStatus.FAILED, RunStatus.CANCELLED,
         RunStatus.READY, RunStatus.SKIPPED}  # READY / SKIPPED: only while staged (not started)
    ),
    RunStatus.RETRY_WAIT: frozenset({RunStatus.READY, RunStatus.CANCELLED}),
    RunStatus.SUCCEEDED: frozenset(),
    RunStatus.FAILED: frozenset({RunStatus.READY}),  # only by an explicit replay of a dead letter
    RunStatus.CANCELLED: frozenset(),
    RunStatus.SKIPPED: frozenset({RunStatus.SCHEDULED}),  # only by a backfill (RunReopened)
}


class Outcome(StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"


@dataclass(frozen=True)
class RunConfig:
    lease_ms: int = 30_000
    redispatch_after_ms: int = 1_000  # READY and no worker took it: try to assign again
    timeout_grace_ms: int = 30_000  # the processor fails an attempt past timeout + grace
    stage_ahead_ms: int = 30_000  # release + grant this long before the slot (pre-staging)
    # Bounded state (docs/adr/0005-bounded-state.md): a finished run leaves processor state
    # and the ledger (a tombstone) this long after it ended, once history has its final state.
    retention_ms: int = 3_600_000
    manual_key_retention_ms: int = 86_400_000  # a manual run (its idempotency key) is kept this long
    dead_letter_retention_ms: int = 7 * 86_400_000  # a FAILED run stays replayable this long
    purges_per_tick_max: int = 1_000
    # under contention, high/normal/low runs take free worker slots in these proportions
    priority_weights: tuple[int, int, int] = DEFAULT_WEIGHTS

    def __post_init__(self) -> None:
        assert self.lease_ms > 0 and self.redispatch_after_ms > 0 and self.timeout_grace_ms >= 0
        assert self.stage_ahead_ms >= 0
        assert self.retention_ms > 0 and self.purges_per_tick_max > 0
        assert self.manual_key_retention_ms >= 0 and self.dead_letter_retention_ms >= 0
        check_weights(self.priority_weights)


@dataclass(frozen=True)
class RunState:
    run_id: str
    job_id: str
    tenant: str
    spec: JobSpec
    slot_ms: int
    not_before_ms: int
    manual: bool
    status: RunStatus
    created_at_ms: int
    updated_at_ms: int
    attempt: int = 0  # number of attempts granted so far
    token: int = 0  # fencing token of the latest grant
    worker_id: str | None = None
    lease_until_ms: int | None = None
    deadline_ms: int | None = None  # attempt start + timeout + grace
    next_attempt_at_ms: int | None = None  # in RETRY_WAIT
    dispatched_at_ms: int | None = None
    started_at_ms: int | None = None  # first attempt's start, as the worker reported it (older records: first grant)
    finished_at_ms: int | None = None
    exit_code: int | None = None
    error: str | None = None
    reason: str | None = None  # why skipped / cancelled / failed
    replays: int = 0  # times this dead letter was replayed
    attempts_before_replay: int = 0  # attempts spent before the latest replay (retry budget base)
    granted_at_ms: int | None = None  # first grant (staging) time, processor clock
    attempt_started_at_ms: int | None = None  # current attempt's start (worker clock); None while staged
    # A skipped range (catch-up, paused): every slot of spec's schedule from skipped_from_ms
    # to slot_ms; skipped_count of them (at least). None / 1: this slot alone.
    skipped_from_ms: int | None = None
    skipped_count: int = 1
    # overlap: bufferOne: a SCHEDULED run waiting for the job's active run ends; checked
    # again at this time (None: not buffered)
    recheck_at_ms: int | None = None
    backfill: bool = False  # created or reopened by a backfill
    reopens: int = 0  # times a backfill reopened this run after it was skipped
    # how the run came to be or what it waited for, kept when it finishes (``reason`` is
    # then the outcome): "backfilled", "reopened by backfill (was skipped: ...)",
    # "overlap: buffered behind ... (bufferOne)"
    note: str | None = None
    output: str | None = None  # the latest ended attempt's output, JSON text (CompleteAttempt.output)
    # a SCHEDULED run of a job with upstreams (``spec.after``) whose upstream runs have not
    # all ended as required: it waits, and is recorded skipped at this time if they have not
    # (core.dependencies); None: not waiting
    held_until_ms: int | None = None

    @property
    def buffered(self) -> bool:
        """Waiting for an active run of its job to end (``overlap: bufferOne``)."""
        return self.status is RunStatus.SCHEDULED and self.recheck_at_ms is not None

    @property
    def held(self) -> bool:
        """Waiting for its upstream jobs' runs (core.dependencies)."""
        return self.status is RunStatus.SCHEDULED and self.held_until_ms is not None

    @property
    def staged(self) -> bool:
        """Granted to a worker that has not reported the attempt started."""
        return self.status is RunStatus.RUNNING and self.attempt_started_at_ms is None

    @property
    def never_started(self) -> bool:
        """No attempt of this run has started yet (a job edit still applies to it)."""
        return not self.status.terminal and self.started_at_ms is None and self.attempt <= 1 and (
            self.status is not RunStatus.RUNNING or self.attempt_started_at_ms is None)

    def purge_at_ms(self, cfg: RunConfig | None = None) -> int | None:
        """When this finished run may leave processor state (None: it is not finished).
        Never earlier than ``retention_ms`` after it ended; a manual run keeps its
        idempotency key ``manual_key_retention_ms`` from its creation; a dead letter stays
        replayable ``dead_letter_retention_ms``."""
        if not self.status.terminal:
            return None
        cfg = cfg or _DEFAULT_CFG
        ended = self.finished_at_ms if self.finished_at_ms is not None else self.updated_at_ms
        # never before its slot has passed (a run cancelled ahead of its slot keeps the slot
        # decided, whatever the retention and the lookahead)
        at = max(ended, self.not_before_ms) + cfg.retention_ms
        if self.status is RunStatus.FAILED:
            at = max(at, ended + cfg.dead_letter_retention_ms)
        if self.manual:
            # a manual run's slot is its request time (the key's age is judged from it)
            at = max(at, max(self.created_at_ms, self.slot_ms) + cfg.manual_key_retention_ms)
        return at

    def timer_ms(self, cfg: RunConfig | None = None) -> int | None:
        """When time alone next changes this run (the processor's timer index key)."""
        cfg = cfg or _DEFAULT_CFG
        if self.status is RunStatus.SCHEDULED:
            if self.recheck_at_ms is not None:
                return self.recheck_at_ms
            if self.held_until_ms is not None:
                return self.held_until_ms  # (an upstream's end wakes it before: the processor)
            if self.spec.overlap is not OverlapPolicy.ALLOW and not self.manual:
                return self.not_before_ms  # released at its start: the overlap check needs the present
            return self.not_before_ms - cfg.stage_ahead_ms
        if self.status is RunStatus.READY:
            return (self.dispatched_at_ms or self.not_before_ms) + cfg.redispatch_after_ms
        if self.status is RunStatus.RUNNING:
            assert self.lease_until_ms is not None and self.deadline_ms is not None
            return min(self.lease_until_ms, self.deadline_ms)
        if self.status is RunStatus.RETRY_WAIT:
            return self.next_attempt_at_ms
        return None


_DEFAULT_CFG = RunConfig()


# ---- commands (gnomon.run-events, from workers and the API) --------------------------


@dataclass(frozen=True)
class ClaimRun:
    run_id: str
    worker_id: str
    at_ms: int


@dataclass(frozen=True)
class Heartbeat:
    run_id: str
    worker_id: str
    token: int
    at_ms: int


@dataclass(frozen=True)
class CompleteAttempt:
    run_id: str
    worker_id: str
    token: int
    outcome: Outcome
    at_ms: int
    exit_code: int | None = None
    error: str | None = None
    started_at_ms: int | None = None  # the attempt's start (worker clock), for one never reported started
    # what the attempt produced, JSON text of at most OUTPUT_MAX_BYTES: a handler's return
    # value, a command's last lines of output; None: nothing
    output: str | None = None


@dataclass(frozen=True)
class AttemptStarted:
    """The worker started a granted attempt at ``started_at_ms`` (its own clock)."""

    run_id: str
    worker_id: str
    token: int
    started_at_ms: int
    at_ms: int


@dataclass(frozen=True)
class ReturnGrant:
    """The worker hands back a staged attempt it will not start (full at the slot,
    shutting down). The run goes back to READY and is assigned again."""

    run_id: str
    worker_id: str
    token: int
    reason: str
    at_ms: int


@dataclass(frozen=True)
class WorkerLost:
    """Synthesised by the processor (never on the wire): ``worker_id`` stopped
    advertising, so its staged attempts move to another worker."""

    run_id: str
    worker_id: str
    at_ms: int


@dataclass(frozen=True)
class JobChanged:
    """Synthesised by the processor (never on the wire): the run's job was edited,
    paused, resumed or deleted (``job`` None) while the run had not started."""

    run_id: str
    job: JobState | None
    at_ms: int


# CancelRun and ReplayRun come from the API on behalf of a tenant and carry it: the
# processor refuses one whose tenant is not the run's (the API checks too, but anyone who
# can write gnomon.run-events is not the API). ``tenant`` has no default here, so no
# sender can forget it; records written before it existed decode with tenant "" (the
# schema's default) and are refused.


@dataclass(frozen=True)
class CancelRun:
    run_id: str
    tenant: str
    at_ms: int
    reason: str = "cancelled by user"


@dataclass(frozen=True)
class ReplayRun:
    """Give a dead-lettered (FAILED) run a fresh retry budget and release it again."""

    run_id: str
    tenant: str
    at_ms: int
    requested_by: str = "user"


RunCommand = (
    RunTriggered | RunSkipped | ClaimRun | Heartbeat | CompleteAttempt | CancelRun | ReplayRun | AttemptStarted
    | ReturnGrant | WorkerLost | JobChanged
)


# ---- events ----------------------------------------------------------------------------


@dataclass(frozen=True)
class RunCreated:
    run_id: str
    job_id: str
    tenant: str
    spec: JobSpec
    slot_ms: int
    not_before_ms: int
    manual: bool
    at_ms: int
    skipped_reason: str | None = None  # set: born SKIPPED
    skipped_from_ms: int | None = None  # a skipped range: its first slot
    skipped_count: int = 1
    backfill: bool = False
    note: str | None = None


@dataclass(frozen=True)
class RunReopened:
    """A backfill reopens a run recorded skipped: SCHEDULED again, released at once
    (its slot has passed), ``note`` keeping what it was skipped for. A skipped range
    gives up its range: the processor records the rest of it again
    (``reopened_range_rest``)."""

    run_id: str
    note: str
    at_ms: int
    spec: JobSpec | None = None  # the job's definition now (the backfill's)


@dataclass(frozen=True)
class RunBuffered:
    """``overlap: bufferOne``: the run waits at its start for ``active`` to end; checked
    again at ``recheck_at_ms``."""

    run_id: str
    active_run_id: str
    recheck_at_ms: int
    at_ms: int


@dataclass(frozen=True)
class RunHeld:
    """A scheduled run waits for its upstream jobs' runs (``pending``) until
    ``until_ms``; an upstream's end wakes it before (core.dependencies)."""

    run_id: str
    pending: tuple[str, ...]
    until_ms: int
    at_ms: int


@dataclass(frozen=True)
class RunReleased:
    """Ready for a worker: the processor stages it on one with room, or it waits for room."""

    run_id: str
    attempt: int  # the attempt a claim will get
    at_ms: int
    spec: JobSpec | None = None  # set at first release: the job's definition at its slot


@dataclass(frozen=True)
class RunWithdrawn:
    """A triggered run whose job was paused, deleted or rescheduled before it started:
    recorded as skipped with the reason (never silently dropped). ``worker_id``: the
    worker holding it staged, told to drop it."""

    run_id: str
    reason: str
    at_ms: int
    worker_id: str | None = None
    token: int = 0


@dataclass(frozen=True)
class GrantRevoked:
    """A staged (granted, not started) attempt taken back: its worker was lost, returned
    it, or the job was edited (``spec`` set: re-grant with the new definition). The run
    is READY again; the attempt does not count against the retry budget."""

    run_id: str
    worker_id: str
    token: int
    reason: str
    at_ms: int
    spec: JobSpec | None = None
    notify_worker: bool = True


@dataclass(frozen=True)
class AttemptStartReported:
    run_id: str
    token: int
    started_at_ms: int
    lease_until_ms: int
    at_ms: int


@dataclass(frozen=True)
class AttemptGranted:
    run_id: str
    worker_id: str
    attempt: int
    token: int
    lease_until_ms: int
    deadline_ms: int
    at_ms: int


@dataclass(frozen=True)
class ClaimRejected:
    run_id: str
    worker_id: str
    reason: str
    at_ms: int


@dataclass(frozen=True)
class LeaseExtended:
    run_id: str
    token: int
    lease_until_ms: int
    at_ms: int


@dataclass(frozen=True)
class StaleRejected:
    """A heartbeat/completion with a token that is not the current grant: tell it to stop."""

    run_id: str
    worker_id: str
    token: int
    reason: str
    at_ms: int


@dataclass(frozen=True)
class AttemptEnded:
    run_id: str
    token: int
    outcome: Outcome | None  # None: the processor ended it (lease lost / deadline)
    reason: str
    at_ms: int
    exit_code: int | None = None
    error: str | None = None
    retry_at_ms: int | None = None  # set: RETRY_WAIT; None and not ok: FAILED
    output: str | None = None  # JSON text (CompleteAttempt.output)


@dataclass(frozen=True)
class RunCancelled:
    run_id: str
    worker_id: str | None  # the worker to stop, if it was running
    token: int
    reason: str
    at_ms: int


@dataclass(frozen=True)
class RunReplayed:
    run_id: str
    at_ms: int


RunEvent = (
    RunCreated | RunReopened | RunBuffered | RunHeld | RunReleased | RunWithdrawn | RunReplayed | AttemptGranted | ClaimRejected | LeaseExtended | StaleRejected | AttemptEnded
    | RunCancelled | GrantRevoked | AttemptStartReported
)


# ---- decide ----------------------------------------------------------------------------


def _guard(state: RunState, to: RunStatus) -> None:
    if to not in _ALLOWED[state.status]:
        raise TransitionError(f"run {state.run_id} is {state.status.value}; cannot become {to.value}")


def _end_attempt(
    state: RunState, outcome: Outcome | None, reason: str, now: int, exit_code: int | None, error: str | None,
    output: str | None = None,
) -> AttemptEnded:
    if output is not None and len(output.encode()) > OUTPUT_MAX_BYTES:
        output = None  # a worker enforces the cap; one that did not loses its output, not the run
    if outcome is Outcome.SUCCEEDED:
        return AttemptEnded(state.run_id, state.token, outcome, reason, now, exit_code, error, output=output)
    strategy = BackoffStrategy(state.spec.retry)
    spent = state.attempt - state.attempts_before_replay
    retry_at = now + strategy.delay_ms(state.run_id, spent) if strategy.should_retry(spent) else None
    return AttemptEnded(state.run_id, state.token, outcome, reason, now, exit_code, error, retry_at, output)


def decide(state: RunState | None, cmd: RunCommand, cfg: RunConfig | None = None,
           now_ms: int | None = None) -> list[RunEvent]:
    """Events a command causes. ``now_ms`` is when the processor applies it (default: the
    command's own ``at_ms``). Leases are measured from ``now_ms``: a claim that waited in a
    backlog still gets a whole lease from the moment it is granted."""
    cfg = cfg or RunConfig()
    now = cmd.at_ms if now_ms is None else now_ms
    if isinstance(cmd, RunTriggered | RunSkipped):
        if state is not None:
            if isinstance(cmd, RunTriggered) and cmd.backfill and not cmd.manual:
                return _reopen(state, cmd, now)
            return []  # insert-if-absent: a replayed trigger makes no second run
        return [
            RunCreated(
                cmd.run_id, cmd.job_id, cmd.tenant, cmd.spec, cmd.slot_ms,
                cmd.not_before_ms if isinstance(cmd, RunTriggered) else cmd.slot_ms,
                cmd.manual if isinstance(cmd, RunTriggered) else False,
                now,
                skipped_reason=cmd.reason if isinstance(cmd, RunSkipped) else None,
                skipped_from_ms=cmd.from_ms if isinstance(cmd, RunSkipped) else None,
                skipped_count=cmd.count if isinstance(cmd, RunSkipped) else 1,
                backfill=isinstance(cmd, RunTriggered) and cmd.backfill,
                note="backfilled" if isinstance(cmd, RunTriggered) and cmd.backfill else None,
            )
        ]
    if state is None:
        if isinstance(cmd, ClaimRun):
            return [ClaimRejected(cmd.run_id, cmd.worker_id, "unknown run", now)]
        if isinstance(cmd, Heartbeat | CompleteAttempt | AttemptStarted):
            # (a start report too: whatever its sender runs, nobody here granted it)
            return [StaleRejected(cmd.run_id, cmd.worker_id, cmd.token, "unknown run", now)]
        return []
    if isinstance(cmd, ClaimRun):
        if state.status is not RunStatus.READY:
            return [ClaimRejected(cmd.run_id, cmd.worker_id, f"run is {state.status.value}", now)]
        _guard(state, RunStatus.RUNNING)
        start = max(now, state.not_before_ms)  # a staged attempt's lease and deadline count from its slot
        return [
            AttemptGranted(
                cmd.run_id, cmd.worker_id, state.attempt + 1, state.token + 1,
                start + cfg.lease_ms, start + state.spec.timeout_s * 1000 + cfg.timeout_grace_ms, now,
            )
        ]
    if isinstance(cmd, ReturnGrant):
        if state.staged and cmd.token == state.token and cmd.worker_id == state.worker_id:
            return [GrantRevoked(cmd.run_id, cmd.worker_id, cmd.token, f"returned by worker: {cmd.reason}", now,
                                 notify_worker=False)]
        return []  # idempotent: already moved on
    if isinstance(cmd, WorkerLost):
        if state.staged and state.worker_id == cmd.worker_id:
            return [GrantRevoked(cmd.run_id, cmd.worker_id, state.token, "worker lost before the start", now)]
        return []
    if isinstance(cmd, JobChanged):
        return _job_changed(state, cmd.job, now)
    if isinstance(cmd, Heartbeat | CompleteAttempt | AttemptStarted):
        if state.status is not RunStatus.RUNNING or cmd.token != state.token or cmd.worker_id != state.worker_id:
            why = (
                f"stale token {cmd.token} (current {state.token})" if cmd.token != state.token
                else f"run is {state.status.value}"
            )
            return [StaleRejected(cmd.run_id, cmd.worker_id, cmd.token, why, now)]
        if isinstance(cmd, AttemptStarted):
            if state.attempt_started_at_ms is not None:
                return []  # a repeated report
            return [AttemptStartReported(cmd.run_id, cmd.token, cmd.started_at_ms,
                                         max(now + cfg.lease_ms, state.lease_until_ms or 0), now)]
        if isinstance(cmd, Heartbeat):
            return [LeaseExtended(cmd.run_id, cmd.token, now + cfg.lease_ms, now)]
        ended = _end_attempt(state, cmd.outcome, cmd.outcome.value, now, cmd.exit_code, cmd.error, cmd.output)
        if state.attempt_started_at_ms is None and cmd.started_at_ms is not None:
            # a short attempt: its start and its end arrive in one record
            return [AttemptStartReported(cmd.run_id, cmd.token, cmd.started_at_ms, state.lease_until_ms or now, now),
                    ended]
        return [ended]
    if isinstance(cmd, CancelRun | ReplayRun):
        _check_tenant(state, cmd)
    if isinstance(cmd, ReplayRun):
        if state.status is not RunStatus.FAILED:
            return []  # idempotent: a second replay (or one of a live run) changes nothing
        return [RunReplayed(cmd.run_id, now), RunReleased(cmd.run_id, state.attempt + 1, now)]
    if isinstance(cmd, CancelRun):
        if state.status.terminal:
            return []
        return [RunCancelled(cmd.run_id, state.worker_id if state.status is RunStatus.RUNNING else None,
                             state.token, cmd.reason, now)]
    raise AssertionError(f"unknown command {cmd!r}")


def _reopen(state: RunState, cmd: RunTriggered, now: int) -> list[RunEvent]:
    """A backfill of an existing run: reopen it if it was skipped; any other run (ran,
    running, waiting, failed, cancelled) is left as it is: a slot never runs twice."""
    if state.status is not RunStatus.SKIPPED or state.manual:
        return []
    if state.tenant != cmd.tenant or state.job_id != cmd.job_id:
        raise TransitionError(f"backfill of run {state.run_id} refused: no such run of this job")
    _guard(state, RunStatus.SCHEDULED)
    was = state.reason or "no reason recorded"
    if state.skipped_from_ms is not None:
        was += f"; its range from {state.skipped_from_ms} keeps the earlier slots skipped"
    return [RunReopened(state.run_id, f"reopened by backfill (was skipped: {was})", now, cmd.spec)]


def reopen_after_upstream(state: RunState, end: D.UpstreamEnded, now_ms: int) -> list[RunEvent]:
    """A run recorded skipped because of an upstream's end (failed, cancelled, skipped:
    ``dependencies.reopens``) that ``end`` (a later success of that upstream, a replay or a
    backfill) makes good: SCHEDULED again, to be decided at once."""
    if state.status is not RunStatus.SKIPPED or state.manual or not D.reopens(state.reason):
        return []
    if end.outcome is not D.Outcome.SUCCEEDED or not end.covers(state.slot_ms):
        return []
    if not (state.reason or "").startswith(f"upstream {end.upstream_job}@"):
        return []
    return [RunReopened(state.run_id, f"reopened: upstream {end.upstream_run} succeeded (was skipped: "
                                      f"{state.reason})", now_ms)]


def reopened_range_rest(before: RunState, now_ms: int, has_run: Callable[[str], bool]) -> RunSkipped | None:
    """``before``: a skipped range record [skipped_from_ms .. slot_ms] that a backfill just
    reopened at its last slot. The rest of the range stays skipped: a new range record
    named by the latest earlier slot of the range that has no run of its own (``has_run``
    tells; a slot backfilled earlier has one), or None if there is no such slot."""
    if before.status is not RunStatus.SKIPPED or before.skipped_from_ms is None or before.spec.schedule.run_at_ms is not None:
        return None
    lo = before.skipped_from_ms
    until = before.slot_ms - 1
    while until >= lo:
        found = last_slots_at_or_before(before.spec, until, 1)
        if not found or found[0] < lo:
            return None
        if not has_run(slot_run_id(before.job_id, found[0])):
            break
        until = found[0] - 1
    else:
        return None
    events = skip_range(before.job_id, before.tenant, before.spec, lo, until, before.reason or "skipped", now_ms)
    if not events:
        return None
    (rest,) = events
    assert isinstance(rest, RunSkipped)
    return rest


def _check_tenant(state: RunState, cmd: CancelRun | ReplayRun) -> None:
    """A user's command acts only on its own tenant's runs; one written before commands
    carried a tenant (tenant "") acts on none."""
    what = f"{type(cmd).__name__} of run {cmd.run_id} refused"
    if not cmd.tenant:
        raise TransitionError(f"{what}: it carries no tenant (written before run commands carried one); "
                              "send it again")
    if cmd.tenant != state.tenant:
        raise RunNotFound(f"no run {cmd.run_id!r}")  # (another tenant's: as an unknown one)


def _job_changed(state: RunState, job: JobState | None, now: int) -> list[RunEvent]:
    """A job edit reaches a run that has not started: withdraw it (paused, deleted, slot
    gone) or hand it the new definition (re-grant if it is staged on a worker). A run
    still SCHEDULED looks at its job when it is staged, so it needs nothing here."""
    if not state.never_started or state.status not in (RunStatus.READY, RunStatus.RUNNING):
        return []
    if state.status is RunStatus.RUNNING and state.not_before_ms <= now:
        return []  # its slot has come: the worker may have started it (report in flight); leave it be
    staged_on = state.worker_id if state.status is RunStatus.RUNNING else None
    reason: str | None = None
    if job is None:
        reason = "job deleted before the slot"
    elif state.manual:
        return []
    elif job.status is JobStatus.PAUSED:
        reason = "paused"
    elif not _still_a_slot(state, job):
        reason = "schedule changed before the slot"
    if reason is not None:
        return [RunWithdrawn(state.run_id, reason, now, staged_on, state.token)]
    assert job is not None
    if job.spec == state.spec:
        return []
    if staged_on is not None:
        return [GrantRevoked(state.run_id, staged_on, state.token, "job edited before the slot; granted again",
                             now, spec=job.spec)]
    return [RunReleased(state.run_id, state.attempt + 1, now, job.spec)]


class _Unchecked:
    """Marker: the caller did not look the job up (pure tests); release as triggered."""


UNCHECKED = _Unchecked()


def decide_timer(state: RunState, now_ms: int, cfg: RunConfig | None = None,
                 job: JobState | _Unchecked | None = UNCHECKED, read_up_to_ms: int | None = None,
                 active: RunState | None = None, buffered: RunState | None = None,
                 upstreams: D.Verdict | None = None, wake: bool = False) -> list[RunEvent]:
    """What the passage of time does to a run (called when ``timer_ms() <= now``).

    At its slot a scheduled run looks at its job as it is *now* (``job``, None = deleted):
    a paused or deleted job, or a slot no longer in an updated schedule, withdraws the run
    (recorded skipped); otherwise it is released with the job's current definition. So an
    edit made while a run sits in the lookahead applies to that run. Manual runs only
    check that the job still exists.

    ``active``: another run of the same job that is released and not finished (the
    processor looks it up for jobs with an overlap policy). With ``overlap: forbid`` the
    slot is then withdrawn, recorded skipped "overlap: ..."; with ``replace`` it is
    released and the processor cancels ``active`` (``replacement_cancel``); with
    ``bufferOne`` it waits (``RunBuffered``, checked again ``redispatch_after_ms`` later)
    unless ``buffered`` (another scheduled run of the job, already waiting) is set, in
    which case it is withdrawn "overlap: ...". A buffered run is released once no run of
    its job is active.

    ``read_up_to_ms``: how far (in record time) the processor has read this partition's
    input. A lease or deadline is judged lapsed only against min(now, read_up_to_ms), so a
    processor catching up on a backlog never expires a lease whose heartbeat or completion
    is still unread in that backlog.

    ``upstreams``: for a run of a job with upstreams (``spec.after``), what its upstreams'
    ends say (``core.dependencies.decide_waiting``; the processor computes it; None: the
    run does not wait): ``Wait`` holds it (``RunHeld``, skipped at the wait's end), ``Skip``
    withdraws it with the reason, ``Release`` lets it go on. ``wake``: an upstream's end
    arrived for a held run: decide now, whatever its timer says.
    """
    cfg = cfg or RunConfig()
    due = state.timer_ms(cfg)
    if due is None or (due > now_ms and not (wake and state.held)):
        return []
    if state.status is RunStatus.SCHEDULED and not isinstance(job, _Unchecked):
        if job is None:
            return [RunWithdrawn(state.run_id, "job deleted before the slot", now_ms)]
        if job.status is JobStatus.PAUSED and not state.manual:
            return [RunWithdrawn(state.run_id, "paused", now_ms)]
        # (a run triggered from the job's current schedule is a slot of it: skip the cron walk)
        if not state.manual and job.spec.schedule != state.spec.schedule and not _still_a_slot(state, job):
            return [RunWithdrawn(state.run_id, "schedule changed before the slot", now_ms)]
        if state.buffered and isinstance(upstreams, D.Wait):
            # its upstreams released it before it was buffered: the ends that did may have
            # left the job's latest ends since, which is no reason to hold it again (a
            # Skip, e.g. an upstream deleted meanwhile, still withdraws it)
            upstreams = None
        if isinstance(upstreams, D.Skip):
            return [RunWithdrawn(state.run_id, upstreams.reason, now_ms)]
        if isinstance(upstreams, D.Wait):
            if state.held_until_ms == upstreams.until_ms:
                return []
            return [RunHeld(state.run_id, upstreams.pending, upstreams.until_ms, now_ms)]
        if (active is not None and not state.manual and not active.manual and job.spec.after
                and job.spec.overlap is OverlapPolicy.REPLACE and active.slot_ms > state.slot_ms):
            # released by its upstreams after a later slot was (they ended out of order): the
            # later run replaces it, not the other way round. (Without upstreams, runs are
            # released in slot order; one released late after a fault replaces, as always.)
            return [RunWithdrawn(state.run_id, f"overlap: superseded by {active.run_id}, a later slot "
                                               "already released (replace)", now_ms)]
        if active is not None and not state.manual and job.spec.overlap is OverlapPolicy.FORBID:
            return [RunWithdrawn(state.run_id, f"overlap: {active.run_id} is still {active.status.value}", now_ms)]
        if active is not None and not state.manual and job.spec.overlap is OverlapPolicy.BUFFER_ONE:
            return [_buffer_one(state, active, buffered, now_ms, cfg)]
        return [RunReleased(state.run_id, state.attempt + 1, now_ms, job.spec)]
    if state.status in (RunStatus.SCHEDULED, RunStatus.RETRY_WAIT, RunStatus.READY):
        # first release, release after backoff, or re-dispatch of an unclaimed run
        return [RunReleased(state.run_id, state.attempt + 1, now_ms)]
    if state.status is RunStatus.RUNNING:
        assert state.lease_until_ms is not None and state.deadline_ms is not None
        judged = now_ms if read_up_to_ms is None else min(now_ms, read_up_to_ms)
        if min(state.lease_until_ms, state.deadline_ms) > judged:
            return []
        reason = "lease lost (no heartbeat)" if state.lease_until_ms <= judged else "deadline passed (timeout + grace)"
        outcome = None if state.lease_until_ms <= judged else Outcome.TIMED_OUT
        return [_end_attempt(state, outcome, reason, now_ms, None, None)]
    return []


def _buffer_one(state: RunState, active: RunState, buffered: RunState | None, now_ms: int,
                cfg: RunConfig) -> RunEvent:
    """``overlap: bufferOne`` with ``active`` still running: wait, unless another run
    already waits (then this slot is skipped)."""
    if buffered is not None and buffered.run_id != state.run_id and not state.buffered:
        return RunWithdrawn(state.run_id, f"overlap: {active.run_id} is still {active.status.value} and "
                                          f"{buffered.run_id} already waits for it (bufferOne)", now_ms)
    return RunBuffered(state.run_id, active.run_id, now_ms + cfg.redispatch_after_ms, now_ms)


def replacement_cancel(released: RunState, active: RunState, now_ms: int) -> CancelRun | None:
    """With ``overlap: replace``: the cancel of ``active`` that the release of
    ``released`` (a later slot of the same job) calls for, or None."""
    if released.manual or released.spec.overlap is not OverlapPolicy.REPLACE or active.status.terminal:
        return None
    assert active.job_id == released.job_id and active.run_id != released.run_id
    return CancelRun(active.run_id, active.tenant, now_ms, f"replaced by {released.run_id} (overlap: replace)")


def is_active(run: RunState) -> bool:
    """Released and not finished: what an overlap policy looks at."""
    return run.status in (RunStatus.READY, RunStatus.RUNNING, RunStatus.RETRY_WAIT)


def _still_a_slot(state: RunState, job: JobState) -> bool:
    """Is the run's slot one of the job's as the job is now? A job edited to run after
    its upstreams only has for slots those their ends staged (``followed_slots``), not
    those its old schedule did."""
    if not _is_slot_of(job.spec, state.slot_ms):
        return False
    return (not job.spec.schedule.after_upstreams or state.spec.schedule == job.spec.schedule
            or state.slot_ms in job.followed_slots)


def _is_slot_of(spec: JobSpec, slot_ms: int) -> bool:
    # (an instant outside what a calendar holds, years 1-9999, is a forged or corrupt slot
    # (issue 21 fuzzing): no slot of any schedule)
    return schedule_slots.is_slot(spec.schedule, slot_ms)


# ---- evolve ----------------------------------------------------------------------------


def evolve(state: RunState | None, event: RunEvent) -> RunState:
    if isinstance(event, RunCreated):
        assert state is None, f"run {event.run_id} created twice"
        return RunState(
            run_id=event.run_id, job_id=event.job_id, tenant=event.tenant, spec=event.spec,
            slot_ms=event.slot_ms, not_before_ms=event.not_before_ms, manual=event.manual,
            status=RunStatus.SKIPPED if event.skipped_reason else RunStatus.SCHEDULED,
            created_at_ms=event.at_ms, updated_at_ms=event.at_ms,
            reason=event.skipped_reason, backfill=event.backfill, note=event.note,
            finished_at_ms=event.at_ms if event.skipped_reason else None,
            skipped_from_ms=event.skipped_from_ms, skipped_count=event.skipped_count,
        )
    assert state is not None, f"{type(event).__name__} for a missing run"
    if isinstance(event, RunReopened):
        _guard(state, RunStatus.SCHEDULED)
        return replace(state, status=RunStatus.SCHEDULED, spec=event.spec or state.spec, reason=None,
                       note=event.note, backfill=True, reopens=state.reopens + 1, finished_at_ms=None,
                       skipped_from_ms=None, skipped_count=1, recheck_at_ms=None, held_until_ms=None,
                       updated_at_ms=event.at_ms)
    if isinstance(event, RunHeld):
        _guard(state, RunStatus.SCHEDULED)
        note = f"waiting for upstream {', '.join(event.pending)} (at most until {_iso(event.until_ms)})"
        return replace(state, held_until_ms=event.until_ms, recheck_at_ms=None, reason=note, note=note,
                       updated_at_ms=event.at_ms)
    if isinstance(event, RunBuffered):
        _guard(state, RunStatus.SCHEDULED)
        note = f"overlap: buffered behind {event.active_run_id} (bufferOne)"
        return replace(state, recheck_at_ms=event.recheck_at_ms, held_until_ms=None, reason=note, note=note,
                       updated_at_ms=event.at_ms)
    if isinstance(event, ClaimRejected | StaleRejected):
        return state  # rejections change nothing; the processor tells the worker
    if isinstance(event, RunReplayed):
        return replace(state, replays=state.replays + 1, attempts_before_replay=state.attempt,
                       finished_at_ms=None, updated_at_ms=event.at_ms)
    if isinstance(event, RunWithdrawn):
        _guard(state, RunStatus.SKIPPED)
        assert state.never_started, f"run {state.run_id} withdrawn after it started"
        return replace(state, status=RunStatus.SKIPPED, reason=event.reason, finished_at_ms=event.at_ms,
                       recheck_at_ms=None, held_until_ms=None,
                       attempt=state.attempt - 1 if state.staged else state.attempt,  # a dropped grant is no attempt
                       lease_until_ms=None, deadline_ms=None, updated_at_ms=event.at_ms)
    if isinstance(event, GrantRevoked):
        _guard(state, RunStatus.READY)
        assert state.staged and event.token == state.token, f"run {state.run_id}: only a staged grant is revoked"
        return replace(state, status=RunStatus.READY, spec=event.spec or state.spec, attempt=state.attempt - 1,
                       worker_id=None, lease_until_ms=None, deadline_ms=None, dispatched_at_ms=event.at_ms,
                       updated_at_ms=event.at_ms)
    if isinstance(event, AttemptStartReported):
        _guard(state, RunStatus.RUNNING)
        return replace(state, attempt_started_at_ms=event.started_at_ms,
                       started_at_ms=state.started_at_ms if state.started_at_ms is not None else event.started_at_ms,
                       lease_until_ms=event.lease_until_ms, updated_at_ms=event.at_ms)
    if isinstance(event, RunReleased):
        _guard(state, RunStatus.READY)
        # (the wait's reason goes with the wait; its note stays, for the run's page)
        waited = state.held or state.buffered
        return replace(state, status=RunStatus.READY, spec=event.spec or state.spec, dispatched_at_ms=event.at_ms,
                       reason=None if waited else state.reason,
                       next_attempt_at_ms=None, recheck_at_ms=None, held_until_ms=None,
                       worker_id=None, lease_until_ms=None, deadline_ms=None, updated_at_ms=event.at_ms)
    if isinstance(event, AttemptGranted):
        _guard(state, RunStatus.RUNNING)
        assert event.token == state.token + 1, "fencing tokens grow by one per grant"
        return replace(state, status=RunStatus.RUNNING, attempt=event.attempt, token=event.token,
                       worker_id=event.worker_id, lease_until_ms=event.lease_until_ms,
                       deadline_ms=event.deadline_ms, attempt_started_at_ms=None,
                       granted_at_ms=state.granted_at_ms if state.granted_at_ms is not None else event.at_ms,
                       updated_at_ms=event.at_ms)
    if isinstance(event, LeaseExtended):
        _guard(state, RunStatus.RUNNING)
        return replace(state, lease_until_ms=event.lease_until_ms, updated_at_ms=event.at_ms)
    if isinstance(event, AttemptEnded):
        if event.outcome is Outcome.SUCCEEDED:
            to = RunStatus.SUCCEEDED
        elif event.retry_at_ms is not None:
            to = RunStatus.RETRY_WAIT
        else:
            to = RunStatus.FAILED
        _guard(state, to)
        return replace(state, status=to, lease_until_ms=None, deadline_ms=None,
                       next_attempt_at_ms=event.retry_at_ms, exit_code=event.exit_code, error=event.error,
                       reason=event.reason, output=event.output,
                       finished_at_ms=event.at_ms if to.terminal else None, updated_at_ms=event.at_ms)
    if isinstance(event, RunCancelled):
        _guard(state, RunStatus.CANCELLED)
        # a grant dropped before its slot is no attempt; after the slot the worker may have
        # started it (its report still in flight), so it counts
        dropped = state.staged and event.at_ms < state.not_before_ms
        return replace(state, status=RunStatus.CANCELLED, reason=event.reason, lease_until_ms=None, recheck_at_ms=None,
                       held_until_ms=None,
                       attempt=state.attempt - 1 if dropped else state.attempt,
                       deadline_ms=None, finished_at_ms=event.at_ms, updated_at_ms=event.at_ms)
    raise AssertionError(f"unknown event {event!r}")
