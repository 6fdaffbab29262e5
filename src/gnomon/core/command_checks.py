"""The decider's check of a command read from a topic: the API's own rules, applied again.

The API and ``gnomon.events`` validate before they send, but anyone holding the producer
credential can write the job-commands topic (docs/job-events.md), and a record is only as
good as its sender. So the processor, the one decider, checks every command it reads with
the same functions the API calls (``parse_job_spec``, ``validate_idempotency_key``,
``check_tenant_name``), and a command that fails is answered ``invalid`` with the field the
API would name, before anything is decided or written.

A spec is checked by turning it back into the API's JSON shape and parsing that: what comes
out is the spec the API would have built from the same request (a name trimmed, a payload
in canonical JSON), and that is the spec the processor applies.

Pure: no I/O, no clock (``now_ms`` is passed in).
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from gnomon.core import jobs as J
from gnomon.core import runs as R
from gnomon.core.errors import ValidationError
from gnomon.core.model import JobSpec, idempotent_job_id, is_derived_job_id, job_id_of
from gnomon.core.regions import validate_name
from gnomon.core.schedule import SLOT_MAX_MS
from gnomon.core.tenants import DEFAULTS_KEY, check_tenant_name
from gnomon.core.validation import (
    DEFAULT_POOLS,
    job_spec_to_json,
    parse_job_spec,
    reject_control_chars,
    validate_idempotency_key,
)

JOB_ID_MAX_CHARS = 200
# A command's own time (``at_ms``, its sender's clock) is "now" for the command: a sender
# whose clock is ahead of the processor's by more than this is refused (it would register
# jobs "from the future"); one older than the age limit is refused as a stale replay
# (longer than the topic keeps records by default).
COMMAND_AHEAD_MAX_MS = 5 * 60_000
COMMAND_AGE_MAX_MS = 7 * 86_400_000
CANCEL_REASON_MAX_CHARS = 1024


def check_job_id(job_id: object, field: str = "job_id") -> str:
    """A job id as a producer may choose it (docs/job-events.md): 1-200 characters, no
    ``@`` (it separates the job from the slot in a run id), no NUL, no control or bidi
    characters, no surrounding spaces."""
    if not isinstance(job_id, str) or not job_id or len(job_id) > JOB_ID_MAX_CHARS:
        raise ValidationError(field, f"must be a non-empty string of at most {JOB_ID_MAX_CHARS} characters")
    if "@" in job_id or "\0" in job_id or job_id != job_id.strip():
        raise ValidationError(field, "must not contain '@', NUL or surrounding spaces")
    reject_control_chars(job_id, field)
    return job_id


def check_spec(spec: JobSpec, now_ms: int, *, pools: frozenset[str] = DEFAULT_POOLS,
               run_at_must_be_future: bool = True) -> JobSpec:
    """``spec`` as the API would have built it from the same request, or ValidationError
    naming the API's field (``schedule``, ``timezone``, ``target.argv``...)."""
    schedule = spec.schedule
    given = sum(v is not None for v in (schedule.cron, schedule.run_at_ms, schedule.every_s))
    if given != 1 and not (given == 0 and spec.after):
        raise ValidationError("schedule", "give exactly one of schedule (a cron expression), every (an "
                                          "interval) or runAt (an ISO-8601 instant), or none of them with "
                                          "after")
    if schedule.run_at_ms is not None and not 0 <= schedule.run_at_ms <= SLOT_MAX_MS:
        raise ValidationError("runAt", f"must be an instant between 1970 and 9999, got {schedule.run_at_ms} ms")
    try:
        json.loads(spec.payload_json)
    except (ValueError, RecursionError):
        raise ValidationError("payload", "is not JSON text") from None
    try:
        data = job_spec_to_json(spec)
    except (ValueError, RecursionError, OverflowError) as exc:
        raise ValidationError("body", f"does not convert to a job definition: {type(exc).__name__}") from None
    try:
        return parse_job_spec(data, now_ms, pools=pools, run_at_must_be_future=run_at_must_be_future,
                              end_at_must_be_future=run_at_must_be_future)
    except RecursionError:
        raise ValidationError("payload", "is nested too deeply") from None




def check_command(cmd: Any, now_ms: int, *, pools: frozenset[str] = DEFAULT_POOLS) -> Any:
    """The job command (or run cancel/replay) ``cmd``, read from the job-commands topic and
    applied at ``now_ms``, checked with the API's rules: returned as the API would have
    built it, or ValidationError naming the field. What depends on state (does the job
    exist, whose is it, is the version current) is the state machine's to decide."""
    if isinstance(cmd, R.CancelRun | R.ReplayRun):
        check_job_id(_job_of(cmd.run_id), "run_id")
        reject_control_chars(cmd.run_id, "run_id")
        _check_tenant(cmd.tenant)
        _check_at(cmd.at_ms, now_ms)
        if isinstance(cmd, R.CancelRun) and len(cmd.reason) > CANCEL_REASON_MAX_CHARS:
            raise ValidationError("reason", f"is {len(cmd.reason)} characters; at most {CANCEL_REASON_MAX_CHARS}")
        if isinstance(cmd, R.CancelRun):
            reject_control_chars(cmd.reason, "reason")  # (it reaches the worker's log and the run's error)
        return cmd
    if not isinstance(cmd, J.JOB_COMMANDS):
        raise ValidationError("body", f"{type(cmd).__name__} is not a job command")
    check_job_id(cmd.job_id)
    _check_tenant(cmd.tenant)
    _check_at(cmd.at_ms, now_ms)
    if isinstance(cmd, J.RegisterJob):
        check_derived_id(cmd)
        return replace(cmd, spec=check_spec(cmd.spec, cmd.at_ms, pools=pools))
    if isinstance(cmd, J.UpdateJob):  # a whole spec, as an old API sent it for an edit
        return replace(cmd, spec=check_spec(cmd.spec, cmd.at_ms, pools=pools, run_at_must_be_future=False))
    if isinstance(cmd, J.AdoptJob):  # a processor's; its spec was checked where it was registered
        check_region(cmd.from_region, "from_region")
        if cmd.scheduled_runs < 0 or cmd.version < 1:
            raise ValidationError("version", "an adoption carries a version of 1 or more and a run count of 0 or more")
        return replace(cmd, spec=check_spec(cmd.spec, cmd.at_ms, pools=pools, run_at_must_be_future=False))
    if isinstance(cmd, J.MoveJob):
        check_region(cmd.to_region, "region")
    if isinstance(cmd, J.TriggerJob):
        validate_idempotency_key(cmd.idempotency_key)
    elif isinstance(cmd, J.PatchJob) and cmd.expected_version is not None and cmd.expected_version < 0:
        raise ValidationError("expected_version", f"must be a version (1 or more), got {cmd.expected_version}")
    # PatchJob's text and BackfillJob's slots are checked against the job when decided
    # (core.jobs: apply_patch and check_backfill_slots, the API's functions too)
    return cmd


def check_derived_id(cmd: J.RegisterJob) -> None:
    """An id of the derived form (``job_`` and 16 hex digits) is registered only with the
    idempotency key it was derived from, with the command's own tenant; a key, when given,
    is the one the id was derived from. So a tenant who guesses another tenant's key
    cannot take that tenant's id first (issue 50, finding 1)."""
    key = cmd.idempotency_key
    if key is not None:
        validate_idempotency_key(key, "idempotency_key")
        if idempotent_job_id(cmd.tenant, key) != cmd.job_id:
            raise ValidationError("jobId", "is not the id derived from this idempotency key and tenant "
                                           "(gnomon.core.model.idempotent_job_id)")
    elif is_derived_job_id(cmd.job_id):
        raise ValidationError("jobId", "ids of the form job_<16 hex digits> are those derived from an "
                                       "idempotency key: register it with its key (RegisterJob.idempotency_key, "
                                       "JobCommand v13), or choose another id")


def check_region(name: str, field: str) -> str:
    """``name`` if it is a region name, else ``ValidationError`` naming ``field``."""
    try:
        return validate_name(name, field)
    except ValueError as exc:
        raise ValidationError(field, str(exc).removeprefix(f"{field}: ")) from None


def _check_tenant(tenant: str) -> None:
    check_tenant_name(tenant)
    if tenant == DEFAULTS_KEY:
        raise ValidationError("tenant", f"{DEFAULTS_KEY!r} names the tenants' default limits, not a tenant")


def _job_of(run_id: str) -> str:
    try:
        return job_id_of(run_id)
    except ValueError:
        raise ValidationError("run_id", f"not a run id (job@slot): {run_id[:80]!r}") from None


def _check_at(at_ms: int, now_ms: int) -> None:
    if at_ms > now_ms + COMMAND_AHEAD_MAX_MS:
        raise ValidationError("at_ms", f"is {(at_ms - now_ms) // 1000} s ahead of the processor's clock; "
                                       f"at most {COMMAND_AHEAD_MAX_MS // 1000} s (is the sender's clock right?)")
    if at_ms < now_ms - COMMAND_AGE_MAX_MS:
        raise ValidationError("at_ms", f"is {(now_ms - at_ms) // 86_400_000} days old; commands older than "
                                       f"{COMMAND_AGE_MAX_MS // 86_400_000} days are refused (send it again)")
