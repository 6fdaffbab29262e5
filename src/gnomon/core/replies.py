"""What the processor tells a producer about its job command (issue 11, docs/job-events.md).

Every job command read from the job-commands topic gets one ``CommandResult`` on the
command-results topic, in the processor's same transaction: ``accepted``, or refused
with the same field and reason the REST API would give. The result is keyed by the job
id (co-partitioned with the commands) and names the command by its partition and
offset, which the producer learns from Kafka's acknowledgement, so a producer in any
language finds the answer to its command without a correlation id of its own.

Pure: the mapping from an outcome to a result; the runtime produces it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from gnomon.core.command_auth import Unauthenticated
from gnomon.core.errors import (
    Conflict,
    GnomonError,
    JobNotFound,
    LimitExceeded,
    RunNotFound,
    ValidationError,
)

REASON_MAX_CHARS = 2048


class ResultCode(StrEnum):
    ACCEPTED = "accepted"
    INVALID = "invalid"  # a field's value is refused (the API's 422); ``field`` names it
    LIMIT = "limit"  # a tenant limit (the API's 429 or 422); ``limit`` names it
    CONFLICT = "conflict"  # an expected version did not match (the API's 409/412)
    REFUSED = "refused"  # the job's state does not allow it (409); field "jobId": the job is missing,
    # deleted or another tenant's (404); field "signature": the command does not prove its tenant


@dataclass(frozen=True)
class CommandResult:
    job_id: str
    tenant: str
    command: str
    source_partition: int
    source_offset: int
    code: ResultCode
    at_ms: int
    field: str | None = None
    reason: str | None = None
    limit: str | None = None
    retry_after_s: int | None = None
    job_version: int | None = None

    @property
    def accepted(self) -> bool:
        return self.code is ResultCode.ACCEPTED


ALREADY_REGISTERED = "already registered"  # an accepted RegisterJob that changed nothing (a retry)


def result_for(cmd: Any, partition: int, offset: int, now_ms: int, *, error: GnomonError | None = None,
               job_version: int | None = None, note: str | None = None) -> CommandResult:
    """The result of job command ``cmd`` read at ``partition``/``offset``: accepted
    (``error`` None; ``job_version``: the job's version after it; ``note``: the accepted
    result's reason, e.g. ``ALREADY_REGISTERED``) or refused by ``error``."""
    job_id = getattr(cmd, "job_id", None) or str(getattr(cmd, "run_id", "")).partition("@")[0]
    accepted = CommandResult(str(job_id), str(getattr(cmd, "tenant", "")), type(cmd).__name__, partition, offset,
                             ResultCode.ACCEPTED, now_ms)
    if error is None:
        return replace(accepted, job_version=job_version, reason=note)
    reason = str(error)[:REASON_MAX_CHARS]
    if isinstance(error, LimitExceeded):
        return replace(accepted, code=ResultCode.LIMIT, field=error.field, reason=reason, limit=error.limit,
                       retry_after_s=error.retry_after_s)
    if isinstance(error, ValidationError):
        return replace(accepted, code=ResultCode.INVALID, field=error.field, reason=reason)
    if isinstance(error, Conflict):
        return replace(accepted, code=ResultCode.CONFLICT, reason=reason)
    if isinstance(error, JobNotFound | RunNotFound | Unauthenticated):
        return replace(accepted, code=ResultCode.REFUSED, field=error.field, reason=reason)
    return replace(accepted, code=ResultCode.REFUSED, reason=reason)
