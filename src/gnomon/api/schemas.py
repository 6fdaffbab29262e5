"""The API contract as Pydantic models: documentation only.

Request bodies are validated by the core (``parse_job_spec`` / ``apply_patch``), never
by these models, so errors keep the core's field names and messages ("target.url",
"retry.max"); the models only describe the JSON in /openapi.json. Response bodies are
built by ``gnomon.api.views``; the models here must describe exactly what the views
return (tests/security/test_openapi_contract.py checks every response against them),
which is why they forbid extra fields and mark every field that can be null as nullable.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import SkipJsonSchema

from gnomon.core.tenants import LIMIT_BOUNDS
from gnomon.core.validation import (
    ARGV_ITEM_MAX_CHARS,
    ARGV_MAX_ITEMS,
    BACKOFF_MAX_S,
    IDEMPOTENCY_KEY_MAX_CHARS,
    JITTER_MAX_S,
    LATE_MAX_S,
    MAX_RUNS_MAX,
    NAME_MAX_CHARS,
    RETRY_MAX_ATTEMPTS,
    SECRETS_MAX_ITEMS,
    TIMEOUT_MAX_S,
    URL_MAX_CHARS,
)

KEY_PATTERN = r"^[A-Za-z0-9._:\-]{1,128}$"
POOL_PATTERN = r"^[a-z][a-z0-9-]{0,31}$"
IMAGE_PATTERN = r"^[a-z0-9][a-z0-9._\-/:@]{0,254}$"
SECRET_PATTERN = r"^[a-z][a-z0-9-]{0,62}$"
HANDLER_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.:\-]{0,127}$"

Priority = Literal["high", "normal", "low"]
CatchUp = Literal["once", "all", "skip"]
Overlap = Literal["allow", "forbid", "replace", "bufferOne"]
JobStatus = Literal["active", "paused", "done", "deleted"]
RunStatus = Literal["scheduled", "ready", "running", "retry_wait", "succeeded", "failed", "cancelled", "skipped"]
SecretName = Annotated[str, Field(pattern=SECRET_PATTERN)]
Name = Annotated[str, Field(min_length=1, max_length=NAME_MAX_CHARS)]
Seconds = Annotated[float, Field(ge=0, le=BACKOFF_MAX_S)]
Instant = Annotated[datetime, Field(description="UTC ISO-8601 instant, e.g. 2026-01-01T09:00:00Z")]


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _drop_default(schema: dict[str, Any]) -> None:
    schema.pop("default", None)


def Omittable(description: str | None = None, alias: str | None = None) -> Any:
    """A field that may be left out but is never null (annotate it ``T | SkipJsonSchema[None]``):
    the core refuses null for most fields, and the views leave fields out rather than null them."""
    return Field(default=None, json_schema_extra=_drop_default, description=description, alias=alias)


class HandlerTarget(_Closed):
    """A Python function registered on the pool's workers with ``@worker.handler(name)``."""

    type: Literal["handler"]
    name: str = Field(pattern=HANDLER_PATTERN)


class HttpTarget(_Closed):
    """POST the payload to a callback URL."""

    type: Literal["http"]
    url: str = Field(max_length=URL_MAX_CHARS, description="an http(s) URL")


class CommandTarget(_Closed):
    """An argv run as a subprocess (no shell), if the pool's policy allows commands."""

    type: Literal["command"]
    argv: list[Annotated[str, Field(max_length=ARGV_ITEM_MAX_CHARS)]] = Field(
        min_length=1, max_length=ARGV_MAX_ITEMS)


class ContainerTarget(_Closed):
    """An image run in a container, if the pool's policy allows containers."""

    type: Literal["container"]
    image: str = Field(pattern=IMAGE_PATTERN, description="e.g. registry.local/team/app:1.2")
    argv: list[Annotated[str, Field(max_length=ARGV_ITEM_MAX_CHARS)]] = Field(min_length=1, max_length=ARGV_MAX_ITEMS)


Target = Annotated[HandlerTarget | HttpTarget | CommandTarget | ContainerTarget, Field(discriminator="type")]


class RetryInput(_Closed):
    max: Annotated[int, Field(ge=1, le=RETRY_MAX_ATTEMPTS)] | SkipJsonSchema[None] = Omittable(
        description="attempts including the first")
    backoffS: Seconds | SkipJsonSchema[None] = Omittable(description="first retry delay, doubling")
    backoffCapS: Seconds | SkipJsonSchema[None] = Omittable(description="longest retry delay")


class Retry(_Closed):
    max: int
    backoffS: float
    backoffCapS: float


_SCHEDULE_DOC = ("cron expression (5 fields, or 6 with seconds first), wall clock in the job's timezone; "
                 "exactly one of schedule, every and runAt, or none of them with after (the job runs after "
                 "each run of its upstreams)")
_EVERY_DOC = ("an interval: a slot every this long, e.g. 90m, 1h30m, 7d, 45s (1 s to 366 days); absolute time "
              "(a DST change does not shape it: use schedule for a fixed wall time); exactly one of schedule, "
              "every and runAt, or none of them with after")
_FROM_DOC = ("the interval's first slot (its anchor); later slots are every apart from it. Default: the Unix "
             "epoch (every 90m: 00:00, 01:30, 03:00 UTC...)")
Duration = Annotated[str, Field(pattern=r"^(\d+d)?(\d+h)?(\d+m)?(\d+s)?$", max_length=32,
                                examples=["90m", "1h30m", "7d"])]
LocalOrInstant = Annotated[str, Field(max_length=64, description="ISO-8601 date-time: with an offset "
                                      "(2026-03-01T09:00:00Z), or without one, read in the job's timezone "
                                      "(2026-03-01T09:00)")]


class UpstreamInput(_Closed):
    job: str = Field(max_length=200, description="the upstream job's id")
    on: Literal["succeeded", "finished"] = "succeeded"


class _JobFields(_Closed):
    """Fields of a job definition; all optional here (a PATCH sends any of them)."""

    name: Name | SkipJsonSchema[None] = Omittable(description="no control or bidi characters")
    schedule: str | None = Field(default=None, description=_SCHEDULE_DOC)
    timezone: str | SkipJsonSchema[None] = Omittable(description="IANA zone of the schedule, default UTC")
    runAt: Instant | None = Field(default=None, description="one-time run at this instant (with offset)")
    every: Duration | None = Field(default=None, description=_EVERY_DOC)
    from_: LocalOrInstant | None = Field(default=None, alias="from", description=_FROM_DOC)
    startAt: LocalOrInstant | None = Field(default=None, description="no slot before this instant (inclusive); "
                                                                     "a repeating schedule only")
    endAt: LocalOrInstant | None = Field(default=None, description="no slot after this instant (inclusive); then "
                                                                   "the job is done. A repeating schedule only")
    maxRuns: Annotated[int, Field(ge=1, le=MAX_RUNS_MAX)] | None = Field(
        default=None, description="at most this many runs triggered by the schedule (manual triggers and "
                                  "backfills do not count); then the job is done")
    excludeCalendars: Annotated[list[str], Field(max_length=10)] | None = Field(
        default=None, description="names of this tenant's calendars (PUT /v1/calendars/{name}): a slot on one of "
                                  "their dates is recorded skipped, reason 'calendar <name>'")
    after: Annotated[list[UpstreamInput], Field(max_length=10)] | None = Field(
        default=None, description="jobs of this tenant whose runs this job's runs wait for: the run of an "
                                  "upstream's latest slot at or before this job's slot must have succeeded (on: "
                                  "succeeded, the default) or ended (on: finished). With no schedule, every nor runAt the job has no "
                                  "schedule of its own: a run after each run of its upstreams; docs/schedules.md")
    waitMaxS: Annotated[int, Field(ge=1, le=7 * 86_400)] | None = Field(
        default=None, description="how long past its slot a run waits for its upstreams before it is recorded "
                                  "skipped with the reason; default 86400")
    target: Target | SkipJsonSchema[None] = Omittable()
    payload: Any = Field(default=None, description="any JSON, at most 64 KiB; passed to the target")
    priority: Priority | SkipJsonSchema[None] = Omittable()
    timeoutS: Annotated[int, Field(ge=1, le=TIMEOUT_MAX_S)] | SkipJsonSchema[None] = Omittable(
        description="attempt timeout, seconds")
    retry: RetryInput | None = None
    catchUp: CatchUp | SkipJsonSchema[None] = Omittable(
        description="what to run of slots missed while down or paused")
    pool: Annotated[str, Field(pattern=POOL_PATTERN)] | SkipJsonSchema[None] = Omittable(
        description="worker pool, default 'default'")
    secrets: Annotated[list[SecretName], Field(max_length=SECRETS_MAX_ITEMS)] | SkipJsonSchema[None] = Omittable(
        description="names of this tenant's secrets the run may read (values stay on the workers)")
    overlap: Overlap | SkipJsonSchema[None] = Omittable(
        description="while an earlier run is active: allow (default), forbid (skip the slot, "
                    "recorded 'overlap'), replace (cancel the active run), bufferOne (one later slot "
                    "waits and starts when the active run ends; further ones are skipped, recorded 'overlap')")
    jitterS: Annotated[int, Field(ge=0, le=JITTER_MAX_S)] | SkipJsonSchema[None] = Omittable(
        description="start each scheduled run at a fixed offset (a hash of job and slot) in "
                    "[slot, slot + jitterS]; the run id keeps the slot. Default 0")
    alertLateS: Annotated[int, Field(ge=0, le=LATE_MAX_S)] | None = Field(
        default=None, description="a run whose first attempt starts more than this many seconds after its "
                                  "start time sends a 'late' alert (PUT /v1/alerts); null: the tenant's "
                                  "alert config default")
    lateMaxS: Annotated[int, Field(ge=1, le=LATE_MAX_S)] | None = Field(
        default=None, description="while the scheduler is overloaded, a slot that cannot start within this "
                                  "many seconds of its time is given up, recorded skipped with reason "
                                  "'overload'; null: the scheduler's misfire grace (60 s by default)")


class JobSpecInput(_JobFields):
    """A job definition (POST /v1/jobs). Validated by the server's core rules."""

    name: Name = Field(description="no control or bidi characters")
    target: Target


class JobBatchItem(JobSpecInput):
    """A job definition of a batch, optionally with its idempotency key."""

    idempotencyKey: str | SkipJsonSchema[None] = Omittable(
        description="the Idempotency-Key of this job: a retry of the batch never registers it twice")


class JobBatchInput(_Closed):
    """POST /v1/jobs:batch."""

    jobs: list[JobBatchItem] = Field(min_length=1, max_length=1000)


class JobPatch(_JobFields):
    """Fields to change (PATCH /v1/jobs/{job_id}); the merged definition is re-validated."""


class TriggerBody(_Closed):
    idempotencyKey: str = Field(pattern=KEY_PATTERN, max_length=IDEMPOTENCY_KEY_MAX_CHARS,
                                description="the same key always means the same single run")


class Job(_Closed):
    id: str
    tenant: str
    status: JobStatus
    nextRunAt: Instant | None
    version: int
    createdAt: Instant
    updatedAt: Instant
    name: str
    timezone: str
    scheduledRuns: int = Field(description="runs the schedule triggered so far (what maxRuns counts)")
    endedBecause: str | None = Field(description="status done: why the schedule has no slot left")
    schedule: str | SkipJsonSchema[None] = Omittable(description="present for cron jobs")
    runAt: Instant | SkipJsonSchema[None] = Omittable(description="present for one-time jobs")
    every: str | SkipJsonSchema[None] = Omittable(description="present for interval jobs, e.g. 1h30m")
    from_: Instant | SkipJsonSchema[None] = Omittable(alias="from", description="an interval's anchor, if set")
    startAt: Instant | SkipJsonSchema[None] = Omittable(description="present when the schedule has it")
    endAt: Instant | SkipJsonSchema[None] = Omittable(description="present when the schedule has it")
    maxRuns: int | SkipJsonSchema[None] = Omittable(description="present when the schedule has it")
    excludeCalendars: list[str] | SkipJsonSchema[None] = Omittable(description="present when the job names any")
    after: list[UpstreamInput] | SkipJsonSchema[None] = Omittable(description="present when the job has upstreams")
    waitMaxS: int | SkipJsonSchema[None] = Omittable(description="present when set")
    movedTo: str | SkipJsonSchema[None] = Omittable(description="status done: the region the job moved to "
                                                               "(its later slots run there)")
    downstreams: list[str] | SkipJsonSchema[None] = Omittable(description="jobs whose runs wait for this job's, "
                                                                          "as its partition knows them")
    target: Target
    payload: Any
    priority: Priority
    timeoutS: int
    retry: Retry
    catchUp: CatchUp
    pool: str
    secrets: list[str]
    jitterS: int
    overlap: Overlap
    alertLateS: int | None
    lateMaxS: int | None


class Fire(_Closed):
    slot: Instant
    start: Instant = Field(description="when the run starts: the slot plus the job's jitter")
    local: str = Field(description="the slot's wall time in the job's zone, with the zone's abbreviation")
    excludedBy: str | None = Field(description="a calendar of the job's excludeCalendars holds the slot's date: "
                                               "it will be recorded skipped, not run")


class Fires(_Closed):
    """GET /v1/jobs/{job_id}/fires."""

    jobId: str
    timezone: str
    schedule: str = Field(description="the schedule and its bounds in words")
    status: JobStatus
    after: Instant
    fires: list[Fire]
    ends: str | None = Field(description="the schedule has no slot after the last one shown: why "
                                         "(endAt, maxRuns, one time); null while it goes on")
    endedBecause: str | None = Field(description="status done: why the job has no slot left")


class Run(_Closed):
    id: str
    jobId: str
    status: RunStatus
    staged: bool = Field(description="running, but granted ahead and waiting for its slot on the worker")
    slot: Instant
    manual: bool
    attempt: int = Field(description="attempts granted so far, counting every replay")
    maxAttempts: int = Field(description="where the current retry budget ends")
    replays: int
    worker: str | None
    createdAt: Instant
    grantedAt: Instant | None
    startAt: Instant = Field(description="when it is due to start: the slot plus the job's jitter")
    startedAt: Instant | None
    startLagS: float | None = Field(description="startedAt - startAt, seconds")
    finishedAt: Instant | None
    nextAttemptAt: Instant | None
    exitCode: int | None
    error: str | None
    reason: str | None
    skippedFrom: Instant | None
    skippedCount: int | None
    backfill: bool = Field(description="created or reopened by a backfill (POST /v1/jobs/{id}:backfill)")
    reopens: int = Field(description="times a backfill reopened it after it was skipped")
    note: str | None = Field(description="how the run came to be or what it waited for, kept when it finishes: "
                             "'backfilled', 'reopened by backfill (was skipped: ...)', "
                             "'overlap: buffered behind ... (bufferOne)'")
    output: Any = Field(description="the latest ended attempt's output, any JSON value: a handler's return "
                        "value, a command's last lines; null: none recorded")


class LogLine(_Closed):
    attempt: int
    seq: int
    stream: Literal["stdout", "stderr", "system"]
    at: Instant
    line: str


class JobPage(_Closed):
    items: list[Job]
    cursor: str | None = Field(description="pass back for the next page; null: no more")


class RunPage(_Closed):
    items: list[Run]
    cursor: str | None = Field(description="pass back for the next page; null: no more")


class LogPage(_Closed):
    items: list[LogLine]
    cursor: str | None = Field(description="pass back for the next page; null: no more")


class JobAck(_Closed):
    id: str
    accepted: Literal["pause", "resume", "delete"]
    version: int | None = Field(None, description="the job's version after it")


class CommandPending(_Closed):
    status: Literal["pending"]
    jobId: str
    command: str = Field(description="RegisterJob, PatchJob, PauseJob, ...")
    commandId: str | None = Field(description="partition-offset of the command; GET /v1/commands/{commandId}")
    detail: str


class CommandAnswer(_Closed):
    commandId: str
    status: Literal["pending", "accepted", "refused"]
    jobId: str | None = None
    command: str | None = None
    version: int | None = Field(None, description="the job's version after it (accepted)")
    problem: dict[str, Any] | None = Field(None, description="why it was refused: the problem the write "
                                           "would have answered")
    code: Literal["accepted", "invalid", "limit", "conflict", "refused"] | None = Field(
        None, description="the processor's answer as it wrote it (docs/job-events.md, \"Answers\"): what a "
        "Kafka-native producer reads here for its commands")
    field: str | None = Field(None, description="the field the refusal names")
    reason: str | None = Field(None, description="the processor's reason")
    limit: str | None = Field(None, description="the tenant limit that refused it (code limit)")
    retryAfterS: int | None = Field(None, description="when to try again (a rate or backlog limit)")


class RunAck(_Closed):
    runId: str
    accepted: Literal["cancel", "replay"]


class TriggerAck(_Closed):
    runId: str


class MoveBody(_Closed):
    region: str = Field(pattern=r"^[a-z][a-z0-9]{0,15}$",
                        description="the region to move the job to; its slots from the job's next one run there")


class MoveAck(_Closed):
    id: str
    accepted: Literal["move"]
    version: int | None = Field(None, description="the job's version after it (here, where it is now done)")
    region: str


def _limit(name: str, description: str) -> Any:
    """The bounds of limit ``name`` (``LIMIT_BOUNDS``), as a pydantic ``Field``."""
    low, high = LIMIT_BOUNDS[name]
    return Field(ge=low, le=high, description=description)


ConcurrencyMax = Annotated[int, _limit("concurrency_max", "runs granted to workers (staged or running) at once, "
                                       "per pool")]
JobsMax = Annotated[int, _limit("jobs_max", "registered jobs")]
IntervalMinS = Annotated[int, _limit("interval_min_s", "shortest gap between two fire times of a cron schedule, "
                                     "seconds")]
BacklogMax = Annotated[int, _limit("backlog_max", "one-off runs (manual triggers, one-time jobs) queued and not "
                                   "started")]
TriggersPerMinMax = Annotated[int, _limit("triggers_per_min_max", "manual triggers accepted per minute")]


class TenantLimitsInput(_Closed):
    """Limits to set (PUT /v1/tenants/{tenant}); the ones left out keep their current value
    (the tenant's own, else the defaults)."""

    concurrencyMax: ConcurrencyMax | SkipJsonSchema[None] = Omittable()
    jobsMax: JobsMax | SkipJsonSchema[None] = Omittable()
    intervalMinS: IntervalMinS | SkipJsonSchema[None] = Omittable()
    backlogMax: BacklogMax | SkipJsonSchema[None] = Omittable()
    triggersPerMinMax: TriggersPerMinMax | SkipJsonSchema[None] = Omittable()


class TenantLimitValues(_Closed):
    concurrencyMax: ConcurrencyMax
    jobsMax: JobsMax
    intervalMinS: IntervalMinS
    backlogMax: BacklogMax
    triggersPerMinMax: TriggersPerMinMax


class TenantUsage(_Closed):
    """Summed over the processors' partitions, as they last reported it."""

    jobs: int
    backlog: int
    running: int
    triggersLastMin: int
    countedAt: Instant | None = Field(description="the oldest partition count included; null: none yet")


class Tenant(_Closed):
    tenant: str = Field(description="'*' is the defaults record")
    configured: bool = Field(description="false: the tenant has no record of its own and gets the defaults")
    limits: TenantLimitValues
    updatedAt: Instant | None
    usage: TenantUsage


class TenantList(_Closed):
    defaults: TenantLimitValues = Field(description="the limits of every tenant without a record of its own")
    items: list[Tenant] = Field(description="configured tenants and tenants with usage, by name")


class FieldError(BaseModel):
    field: str
    message: str


class Problem(BaseModel):
    """RFC 9457 problem details (media type application/problem+json)."""

    type: str
    title: str
    status: int
    detail: str
    field: str | SkipJsonSchema[None] = Omittable(description="the offending input, e.g. target.url or retry.max")
    errors: list[FieldError] | SkipJsonSchema[None] = Omittable()
    limit: str | SkipJsonSchema[None] = Omittable(description="422/429 of a tenant limit: which one, e.g. "
        "backlog_max (429: retry after Retry-After seconds)")
    outcome: Literal["unknown", "not-written"] | SkipJsonSchema[None] = Omittable(description="503 of a command: unknown = it may have been written (retry with the same "
        "idempotency key); not-written = nothing was sent")


class BatchPending(_Closed):
    jobId: str
    commandId: str | None = Field(description="GET /v1/commands/{commandId} for the answer")


class JobBatchResult(_Closed):
    index: int = Field(description="the item's place in jobs, from 0")
    status: Literal[200, 201, 202, 404, 409, 422, 429, 503] = Field(
        description="201 registered; 200 already registered with this key and definition; 202 written but "
        "the scheduler's answer did not come in time (poll pending.commandId); else refused")
    job: Job | SkipJsonSchema[None] = Omittable(description="with 200 and 201")
    pending: BatchPending | SkipJsonSchema[None] = Omittable(description="with 202")
    problem: Problem | SkipJsonSchema[None] = Omittable(description="with the other statuses; its field starts "
                                                       "with jobs[index]")


class JobBatchAck(_Closed):
    results: list[JobBatchResult]
    created: int
    existing: int
    pending: int
    refused: int


REQUEST_MODELS: tuple[type[BaseModel], ...] = (JobSpecInput, JobBatchInput, JobPatch, TriggerBody, MoveBody,
                                               TenantLimitsInput)


# ---- alerts (api/alerts.py) -------------------------------------------------------------

AlertKindName = Literal["dead_letter", "late", "skipped"]


class AlertConfigInput(_Closed):
    """The tenant's alert webhook (PUT /v1/alerts replaces the whole config)."""

    url: str = Field(max_length=URL_MAX_CHARS, description="http(s) webhook; checked by the SSRF guard at every "
                     "call (a literal private or loopback address is refused here)")
    kinds: list[AlertKindName] | SkipJsonSchema[None] = Omittable(
        description="alerts to send, default all: dead_letter (a run dead-lettered), late (a run started more "
                    "than the threshold after its start time), skipped (a slot recorded skipped)")
    lateS: Annotated[int, Field(ge=0, le=LATE_MAX_S)] | None = Field(
        default=None, description="late threshold, seconds, for jobs without alertLateS; null: only jobs with "
                                  "their own alertLateS alert late")


class AlertConfigView(_Closed):
    tenant: str
    configured: bool = Field(description="false: no alert config, no alerts are sent")
    url: str | None
    kinds: list[AlertKindName]
    lateS: int | None
    updatedAt: Instant | None


REQUEST_MODELS = (*REQUEST_MODELS, AlertConfigInput)


# ---- calendars (api/calendars.py) -------------------------------------------------------

IsoDate = Annotated[str, Field(pattern=r"^\d{4}-\d{2}-\d{2}$", examples=["2026-12-25"])]


class DateSpan(_Closed):
    from_: IsoDate = Field(alias="from")
    to: IsoDate = Field(description="inclusive; at most 366 days after from")


class CalendarInput(_Closed):
    """An exclusion calendar (PUT /v1/calendars/{name} replaces it whole)."""

    timezone: str | SkipJsonSchema[None] = Omittable(description="IANA zone whose dates these are, default UTC")
    dates: list[IsoDate | DateSpan] = Field(max_length=1000, description="dates, or ranges {from, to}")


class CalendarView(_Closed):
    name: str
    timezone: str
    dates: list[IsoDate | DateSpan] = Field(description="sorted, overlapping ranges merged; a one-day range is "
                                                        "its date")
    days: int = Field(description="how many dates the calendar holds")
    updatedAt: Instant


class CalendarList(_Closed):
    items: list[CalendarView]


class CalendarDeleted(_Closed):
    name: str
    deleted: bool


REQUEST_MODELS = (*REQUEST_MODELS, CalendarInput)
