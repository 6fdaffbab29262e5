"""The FastAPI application. Handlers validate with the core, produce one command
(returning only after Kafka acknowledged it) and read history from the HistoryStore
(Cassandra). Every command goes to gnomon.job-commands keyed by job id, cancel and
replay of a run included (keyed by the run's job id): only the API may write that
topic, and the processor refuses a cancel or replay read from gnomon.run-events, which
workers write (docs/adr/0006).

/openapi.json is the contract (``gnomon.api.schemas``); bodies are validated by the core,
not by FastAPI, so error fields are the core's. Blocking calls (history, Kafka) run in
the thread pool, also from the async handlers that read a body.

The status-page read, ``GET /v1/jobs/{id}/runs``, is the hot path (docs/benchmarks.md,
"Read path"): it runs on the event loop without a thread-pool hop. It awaits the store's
``get_job_async`` / ``list_runs_async`` (the Cassandra store's ``execute_async``; any
other store's blocking reads go to the thread pool), asks for the job and the page at
once, and renders each run's JSON once per state (``views.RunViews``) instead of through
FastAPI's ``jsonable_encoder``. In production the job and the page are kept for
``GNOMON_API_RUNS_CACHE_MS`` (default 1 s, ``ReadCache``) with one read per key in flight:
measured, two Cassandra reads per request cost Cassandra about 0.9 ms of CPU, which
alone would take a whole core at 1,000 requests/s on the 2-core reference machine. The
ownership check still runs on every request (on the kept job).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, Query, Request, Security
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPBearer

from gnomon import codec
from gnomon import region as region_names
from gnomon.api import schemas
from gnomon.api.alerts import AlertService
from gnomon.api.alerts import install as install_alert_routes
from gnomon.api.answers import ANSWER_TIMEOUT_S_DEFAULT, AnswerSource, Position, refusal
from gnomon.api.backfill import add_backfill_route
from gnomon.api.batch import add_batch_route
from gnomon.api.calendars import CalendarService
from gnomon.api.calendars import install as install_calendar_routes
from gnomon.api.dependencies import check_after
from gnomon.api.openapi import finish, problem_responses, request_body
from gnomon.api.recent import RecentJobs
from gnomon.api.tenants import TenantService, limit_responses
from gnomon.api.tenants import install as install_tenant_routes
from gnomon.api.views import FIRES_SHOWN, RunViews, fires_view, job_view, log_view, run_view
from gnomon.core.clock import Clock, SystemClock, iso_to_ms
from gnomon.core.command_checks import check_job_id, check_region
from gnomon.core.errors import Conflict, EventLogError, HistoryStoreError, NotFound, ValidationError
from gnomon.core.jobs import (
    DeleteJob,
    JobState,
    JobStatus,
    MoveJob,
    PatchJob,
    PauseJob,
    RegisterJob,
    ResumeJob,
    TriggerJob,
    canonical_patch,
    first_slot_after,
)
from gnomon.core.model import idempotent_job_id, job_id_of, manual_run_id, random_job_id
from gnomon.core.replies import ALREADY_REGISTERED, CommandResult
from gnomon.core.runs import CancelRun, ReplayRun, RunState, RunStatus
from gnomon.core.validation import (
    apply_patch,
    check_patch,
    parse_after,
    parse_job_spec,
    validate_idempotency_key,
)
from gnomon.metrics import api as api_metrics
from gnomon.ports import HistoryStore
from gnomon.topology import Topology
from gnomon.ui import install as install_ui
from gnomon.ui.overload import OverloadProbe, processor_targets
from gnomon.web import problems
from gnomon.web.auth import Authenticator
from gnomon.web.body import BODY_MAX_BYTES, closed_object, parse_json, read_bounded
from gnomon.web.problems import CommandOutcomeUnknown, Pending

__all__ = ["BODY_MAX_BYTES", "PAGE_MAX", "AsyncReads", "CommandSink", "ReadCache", "create_app", "idempotent_job_id"]

PAGE_MAX = 500
# A send that failed is retried by the producer for up to its delivery timeout; the
# flush waits this much longer, so that when send returns the message is settled.
FLUSH_MARGIN_S = 2.0
IDEMPOTENCY_HEADER = "Idempotency-Key"

_EXAMPLE_JOB = {"name": "nightly-report", "schedule": "0 2 * * *", "timezone": "Europe/London",
                "target": {"type": "http", "url": "https://example.com/hooks/report"},
                "payload": {"report": "daily"}, "retry": {"max": 3, "backoffS": 5}}
_LOCATION = {"Location": {"description": "/v1/jobs/{id}", "schema": {"type": "string"}}}
ANSWER_PENDING: dict[int | str, dict[str, Any]] = {202: {
    "model": schemas.CommandPending, "description": "written, but the processor's answer did not come in time: "
    "poll the Location (GET /v1/commands/{id}) for it",
    "headers": {"Location": {"description": "/v1/commands/{id}", "schema": {"type": "string"}}}}}


_bearer = HTTPBearer(auto_error=False, scheme_name="bearerAuth", description="an API token")


async def tenant_of(request: Request, _: Any = Security(_bearer)) -> str:
    """The caller's tenant. (The Security dependency only documents the scheme; the
    header is read here so that every failure is the same 401 problem.) ``async``: it
    only hashes the token, so it runs on the loop rather than costing a thread-pool hop."""
    auth: Authenticator = request.app.state.auth
    return auth.tenant_for(request.headers.get("authorization"))


# Module level: FastAPI resolves these (string) annotations in the module's namespace.
Tenant = Annotated[str, Depends(tenant_of)]
IdempotencyKey = Annotated[str | None, Header(
    alias=IDEMPOTENCY_HEADER, description="makes the create safe to retry: the same key and body always "
    "mean the same job (1-128 of A-Z a-z 0-9 . _ : -)")]
# Documented bounds only: the handlers check them, with the core's field names and messages.
Limit = Annotated[int, Query(json_schema_extra={"minimum": 1, "maximum": PAGE_MAX})]
FIRES_MAX = 100
FireCount = Annotated[int, Query(json_schema_extra={"minimum": 1, "maximum": FIRES_MAX})]


def limit_of_fires(count: int) -> int:
    if not 1 <= count <= FIRES_MAX:
        raise ValidationError("count", f"must be between 1 and {FIRES_MAX}, got {count}")
    return count


def instant_param(value: str | None, field: str, default_ms: int) -> int:
    """An ISO-8601 instant query parameter (with offset), or ``default_ms``."""
    if value is None:
        return default_ms
    try:
        return iso_to_ms(value)
    except (ValueError, OverflowError) as exc:
        raise ValidationError(field, f"not an ISO-8601 instant with offset: {exc}") from None
RunStatusQuery = Annotated[str | None, Query(json_schema_extra={"enum": [s.value for s in RunStatus]})]


SignFn = Callable[[str, str, bytes, bytes], tuple[tuple[str, bytes], ...]]


class CommandSink:
    """Where commands go: a Kafka topic (SyncProducer) in production, a list in tests.

    With ``delivery_timeout_s`` (the producer's message.timeout.ms), a failed send is
    reported only once that long has passed since it began: by then the producer has
    stopped retrying it, so a client's retry cannot race a send still in flight. The
    failure is ``CommandOutcomeUnknown`` (a 503 with ``"outcome": "unknown"``)."""

    def __init__(self, producer: Any, topic: str, *, delivery_timeout_s: float | None = None,
                 sleep: Callable[[float], None] = time.sleep,
                 monotonic: Callable[[], float] = time.monotonic, sign: SignFn | None = None) -> None:
        self._producer = producer
        self._topic = topic
        self._sign = sign  # the commands' signature headers (core.command_auth); None: unsigned
        self.delivery_timeout_s = delivery_timeout_s
        self._sleep = sleep
        self._monotonic = monotonic

    @property
    def topic(self) -> str:
        return self._topic

    def send(self, job_id: str, command: Any) -> Position | None:
        """Write ``command`` keyed by ``job_id``; where Kafka put it (partition, offset),
        or None from a producer that does not say (a test's list)."""
        value = codec.encode(command, self._topic)
        extra = self._headers(job_id, command, value)
        started = self._monotonic()
        try:
            if self.delivery_timeout_s is None:
                written = self._producer.send(self._topic, job_id, value, **extra)
            else:
                written = self._producer.send(self._topic, job_id, value,
                                              timeout_s=self.delivery_timeout_s + FLUSH_MARGIN_S, **extra)
            return written if isinstance(written, tuple) else None
        except EventLogError as exc:
            if self.delivery_timeout_s is not None:
                left_s = self.delivery_timeout_s - (self._monotonic() - started)
                if left_s > 0:
                    self._sleep(left_s)
            raise CommandOutcomeUnknown(str(exc)) from exc

    def send_many(self, items: Sequence[tuple[str, Any]],
                  positions: list[Position | None] | None = None) -> list[CommandOutcomeUnknown | None]:
        """Send ``(job id, command)`` pairs with one wait for Kafka's acknowledgements;
        one entry per item: None (acknowledged) or why its outcome is unknown.
        ``positions``: filled with where each item went (None: not written, or a producer
        that does not say). A producer without ``send_many`` (the tests' lists) gets one
        ``send`` per item."""
        values = [(job_id, codec.encode(command, self._topic)) for job_id, command in items]
        headers = [self._headers(job_id, command, value).get("headers", ())
                   for (job_id, command), (_, value) in zip(items, values, strict=True)]
        where: list[Position | None] = [None] * len(values)
        send_many = getattr(self._producer, "send_many", None)
        if send_many is None:
            out: list[CommandOutcomeUnknown | None] = []
            for i, (job_id, value) in enumerate(values):
                try:
                    written = self._producer.send(self._topic, job_id, value,
                                                  **({"headers": headers[i]} if headers[i] else {}))
                    where[i] = written if isinstance(written, tuple) else None
                    out.append(None)
                except EventLogError as exc:
                    out.append(CommandOutcomeUnknown(str(exc)))
            if positions is not None:
                positions[:] = where
            return out
        started = self._monotonic()
        timeout_s = 15.0 if self.delivery_timeout_s is None else self.delivery_timeout_s + FLUSH_MARGIN_S
        errors: list[str | None] = send_many(self._topic, values, timeout_s=timeout_s, positions=where,
                                             **({"headers": headers} if self._sign is not None else {}))
        if positions is not None:
            positions[:] = where
        if any(errors) and self.delivery_timeout_s is not None:
            left_s = self.delivery_timeout_s - (self._monotonic() - started)
            if left_s > 0:
                self._sleep(left_s)  # as send(): the producer has stopped retrying by then
        return [None if err is None else CommandOutcomeUnknown(err) for err in errors]

    def to(self, topic: str) -> CommandSink:
        """The same producer, another topic."""
        return CommandSink(self._producer, topic, delivery_timeout_s=self.delivery_timeout_s,
                           sleep=self._sleep, monotonic=self._monotonic)  # (other topics are not signed)

    def _headers(self, job_id: str, command: Any, value: bytes) -> dict[str, Any]:
        """``{"headers": ...}`` for a command of a tenant when signing, else {}."""
        tenant = getattr(command, "tenant", None)
        if self._sign is None or not isinstance(tenant, str):
            return {}
        return {"headers": self._sign(tenant, self._topic, job_id.encode(), value)}


class AsyncReads:
    """The history reads the event loop awaits: the store's own ``get_job_async`` /
    ``list_runs_async`` when it has them (they must never block the loop), else its
    blocking ``get_job`` / ``list_runs`` on the thread pool."""

    def __init__(self, history: HistoryStore) -> None:
        self._history = history
        self._get_job: Callable[[str], Awaitable[JobState | None]] | None = getattr(history, "get_job_async", None)
        self._list_runs: Callable[..., Awaitable[Any]] | None = getattr(history, "list_runs_async", None)

    @property
    def native(self) -> bool:
        return self._get_job is not None and self._list_runs is not None

    async def get_job(self, job_id: str) -> JobState | None:
        if self._get_job is not None:
            return await self._get_job(job_id)
        return await run_in_threadpool(self._history.get_job, job_id)

    async def list_runs(self, job_id: str, status: str | None, limit: int, cursor: str | None) -> Any:
        if self._list_runs is not None:
            return await self._list_runs(job_id, status, limit, cursor)
        return await run_in_threadpool(self._history.list_runs, job_id, status, limit, cursor)


class ReadCache:
    """Answers of the hot reads, kept ``ttl_s`` from the moment their read began, at most
    ``max_entries`` (oldest first out); with ``ttl_s`` 0 nothing is kept. At most one read
    per key is in flight: requests that miss while it runs wait for it (a burst of
    status-page polls is one Cassandra read per job, not one per request). Errors are
    not kept. For one event loop (not thread-safe)."""

    def __init__(self, ttl_s: float, max_entries: int = 10_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._clock = clock
        self._kept: dict[Any, tuple[float, Any]] = {}
        self._inflight: dict[Any, asyncio.Future[Any]] = {}
        self.reads = 0  # loads started (misses that read)

    def __len__(self) -> int:
        return len(self._kept)

    async def get(self, key: Any, load: Callable[[], Awaitable[Any]]) -> Any:
        if self.ttl_s <= 0:
            self.reads += 1
            return await load()
        now = self._clock()
        kept = self._kept.get(key)
        if kept is not None and kept[0] > now:
            return kept[1]
        task = self._inflight.get(key)
        if task is None:
            self.reads += 1
            task = asyncio.ensure_future(load())
            self._inflight[key] = task
            task.add_done_callback(lambda t: self._settled(key, t, now + self.ttl_s))
        return await asyncio.shield(task)  # a waiter that leaves does not cancel the others' read

    def _settled(self, key: Any, task: asyncio.Future[Any], until: float) -> None:
        if self._inflight.get(key) is task:
            del self._inflight[key]
        if task.cancelled() or task.exception() is not None:
            return
        self._kept.pop(key, None)
        while len(self._kept) >= self.max_entries:
            del self._kept[next(iter(self._kept))]
        self._kept[key] = (until, task.result())


def _forget(task: asyncio.Future[Any] | None) -> None:
    """Drop a read whose answer is not needed (cancelled, or its error retrieved so that
    asyncio does not log it as never retrieved)."""
    if task is None:
        return
    if not task.done():
        task.cancel()
    elif not task.cancelled():
        task.exception()


def create_app(
    *, history: HistoryStore, commands: CommandSink, auth: Authenticator, topology: Topology,
    clock: Clock | None = None, tenants: TenantService | None = None, runs_cache_s: float = 0.0,
    alerts: AlertService | None = None, calendars: CalendarService | None = None,
    overload: OverloadProbe | None = None,
    answers: AnswerSource | None = None, answer_timeout_s: float = ANSWER_TIMEOUT_S_DEFAULT,
    recent: RecentJobs | None = None,
) -> FastAPI:
    """``commands`` produces to ``topology.job_commands``. ``tenants``: limits, usage and
    the admin endpoints (api/tenants.py); default: built-in limits, no usage, read-only.
    ``alerts``: the tenants' alert webhooks (api/alerts.py); default: none, read-only.
    ``runs_cache_s``: ``GET /v1/jobs/{id}/runs`` may answer from a read (of the job and of
    the page) that began at most this long ago (``ReadCache``; 0: every request reads).
    ``overload``: whether a processor is overloaded (its /metrics; default: this host's
    processors, ``gnomon.ui.overload``; the UI's banner).
    ``answers``: the processor's answers (``api.answers``): every job write waits for its
    command's answer up to ``answer_timeout_s`` and returns it; None (no decider wired):
    a write answers 202 "pending" once Kafka has the command. ``recent``: the states
    of accepted writes, for read-your-writes (``api.recent``)."""
    clock = clock or SystemClock()
    recent = recent or RecentJobs()
    tenants = tenants or TenantService(topic=topology.tenants)
    pools = frozenset(topology.pools)
    app = FastAPI(
        title="gnomon",
        version="0.1.0",
        description="A shared, multi-tenant job scheduler event-sourced on Kafka. "
        "Authenticate with 'Authorization: Bearer <token>'. Errors are application/problem+json "
        "with a 'field' naming the offending input.",
        redirect_slashes=False,  # /v1/jobs/ is not found, not a redirect to /v1/jobs
        generate_unique_id_function=lambda route: route.name,  # operationId = handler name (create_job)
    )
    problems.install(app)
    api_metrics.install(app)  # GET /metrics and the request counters (gnomon.metrics.api)
    app.openapi = finish(app)  # type: ignore[method-assign]
    app.state.auth = auth
    overload = overload or OverloadProbe(processor_targets())
    app.state.overload_probe = overload  # (the UI's banner reads it too)
    install_tenant_routes(app, tenants, clock)
    install_alert_routes(app, alerts or AlertService(topic=topology.alert_configs), clock)  # /v1/alerts
    calendars = calendars or CalendarService(topic=topology.calendars)
    install_calendar_routes(app, calendars, history, clock)  # /v1/calendars

    async def body_of(request: Request) -> Any:
        return parse_json(await read_bounded(request, BODY_MAX_BYTES))

    reads = AsyncReads(history)
    run_views = RunViews()
    runs_cache = ReadCache(runs_cache_s)
    app.state.reads, app.state.run_views, app.state.runs_cache = reads, run_views, runs_cache
    add_batch_route(app, reads=reads, commands=commands, tenants=tenants, clock=clock, pools=pools,
                    answers=answers, answer_timeout_s=answer_timeout_s, recent=recent,
                    responses={200: {"model": schemas.JobBatchAck, "description": "one result per item, in order"},
                               **problem_responses(401, 413, 422, 503)},
                    openapi_extra=request_body(schemas.JobBatchInput, example={"jobs": [
                        {**_EXAMPLE_JOB, "idempotencyKey": "nightly-close-eu"}]}))  # POST /v1/jobs:batch

    def owned_job(tenant: str, job_id: str) -> JobState:
        return owned(recent.newest(job_id, history.get_job(job_id)), tenant, job_id)

    def decided(job_id: str, command: Any) -> CommandResult:
        """Write ``command``, then wait for the processor's answer (``api.answers``):
        the accepted result, or the refusal raised as the API's own error. ``Pending``
        (a 202 with a Location to poll) when no answer came within the bound, or when
        no decider is wired."""
        pos = commands.send(job_id, command)
        if answers is None or pos is None:
            raise Pending(None, job_id, type(command).__name__)
        res = answers.wait(pos, answer_timeout_s)
        if res is None:
            raise Pending(pos, job_id, type(command).__name__)
        if not res.accepted:
            raise refusal(res)
        return res

    # POST /v1/jobs/{id}:backfill, decided by the processor like every other write
    add_backfill_route(app, history=history, commands=commands, clock=clock, decide=decided,
                       calendars=lambda tenant, names: calendars.book.for_job(tenant, names))

    def remember(job_id: str, res: CommandResult, change: Callable[[JobState], JobState]) -> JobState | None:
        """The state this accepted write made, from the one kept of this API's own last
        write (None when none is kept: history will show it)."""
        base = recent.get(job_id)
        if base is None or res.job_version is None:
            return None
        state = replace(change(base), version=res.job_version, updated_at_ms=res.at_ms)
        recent.put(state)
        return state

    def limit_of(limit: int) -> int:
        if not 1 <= limit <= PAGE_MAX:
            raise ValidationError("limit", f"must be between 1 and {PAGE_MAX}")
        return limit

    def created(view: dict[str, Any], status: int) -> JSONResponse:
        return JSONResponse(view, status_code=status, headers={"Location": f"/v1/jobs/{view['id']}"})

    def register(tenant: str, data: Any, key: str | None) -> JSONResponse:
        """Validated here (a fast 422); accepted or refused by the processor, which also
        checks the tenant's limits and, with ``key``, whether the job exists: the same
        definition again is the same job (200), another one is 409."""
        now = clock.now_ms()
        job_id = random_job_id() if key is None else idempotent_job_id(tenant, key)
        spec = parse_job_spec(data, now, pools=pools)
        check_after(history, tenant, job_id, spec.after, recent.get)
        try:
            res = decided(job_id, RegisterJob(job_id, tenant, spec, now, idempotency_key=key))
        except Conflict as exc:
            if key is None:
                raise
            raise Conflict(f"{IDEMPOTENCY_HEADER} {key!r} was already used for job {job_id} with a different "
                           "definition; use a new key for a new job") from exc
        if res.reason == ALREADY_REGISTERED:  # the view of the job as it is, if it can be read
            try:
                existing = recent.newest(job_id, history.get_job(job_id))
            except HistoryStoreError:
                existing = recent.get(job_id)
            if existing is not None:
                return created(job_view(existing), 200)
        state = JobState(job_id, tenant, spec, JobStatus.ACTIVE, first_slot_after(spec, now - 1),
                         res.job_version or 1, now, now)
        if res.reason != ALREADY_REGISTERED:
            recent.put(state)
        return created(job_view(state), 200 if res.reason == ALREADY_REGISTERED else 201)

    @app.get("/healthz", include_in_schema=False)
    def healthz() -> dict[str, str]:
        """Alive: the process serves (history may still be connecting: /readyz)."""
        return {"status": "ok"}

    @app.get("/readyz", include_in_schema=False)
    def readyz() -> JSONResponse:
        """Ready to read history: 200 once the history store has connected; 503 before
        (reads would wait for that connect, then answer 503). A store that needs no
        connection (in memory) is always ready."""
        if getattr(history, "connected", True):
            return JSONResponse({"status": "ready"})
        return JSONResponse({"type": "about:blank", "title": "Not ready", "status": 503,
                             "detail": "the history store is still connecting; history reads answer 503 until it is"},
                            status_code=503, media_type="application/problem+json", headers={"Retry-After": "1"})

    @app.post("/v1/jobs", status_code=201, summary="Register a job", response_model=None,
              description="The answer is the scheduler's decision (docs/answers.md): 201 once the processor "
              "accepted the job, its problem when it refused it, 202 with a Location to poll when its answer did "
              "not come in time. With an Idempotency-Key the job id is derived from the tenant and the key: a retry "
              "with the same key and body answers the same job (200) and never registers a second one; the same "
              "key with another body is 409.",
              responses={**ANSWER_PENDING,
                         201: {"model": schemas.Job, "description": "registered", "headers": _LOCATION},
                         200: {"model": schemas.Job, "description": "already registered with this "
                               "Idempotency-Key and body", "headers": _LOCATION},
                         **problem_responses(401, 409, 413, 422, 503), **limit_responses()},
              openapi_extra=request_body(schemas.JobSpecInput, example=_EXAMPLE_JOB))
    async def create_job(request: Request, tenant: Tenant, idempotency_key: IdempotencyKey = None) -> JSONResponse:
        key = None if idempotency_key is None else validate_idempotency_key(idempotency_key, IDEMPOTENCY_HEADER)
        data = await body_of(request)
        return await run_in_threadpool(register, tenant, data, key)

    @app.get("/v1/commands/{command_id}", summary="The scheduler's answer to a write answered 202",
             response_model=None,
             description="A write whose answer did not come in time answers 202 with a Location here; a "
             "command a team's service produced to Kafka is named by where Kafka wrote it (partition-offset). "
             "This answers the processor's decision once this API process has read it: accepted (with the "
             "job's version) or refused (with the problem the write would have answered, and the processor's "
             "own code, field and reason); pending until then, and for another tenant's command. Answers are "
             "kept 10 minutes.",
             responses={200: {"model": schemas.CommandAnswer}, **problem_responses(401, 422)})
    def command_answer(command_id: str, tenant: Tenant) -> JSONResponse:
        pos = parse_command_id(command_id)
        res = None if answers is None else answers.get(pos)
        if res is None or res.tenant != tenant:  # another tenant's answer is not shown
            return JSONResponse({"commandId": command_id, "status": "pending"})
        body: dict[str, Any] = {"commandId": command_id, "jobId": res.job_id, "command": res.command,
                                "code": res.code.value}
        body.update({k: v for k, v in (("field", res.field), ("reason", res.reason), ("limit", res.limit),
                                       ("retryAfterS", res.retry_after_s)) if v is not None})
        if res.accepted:
            return JSONResponse({**body, "status": "accepted", "version": res.job_version})
        refused = problems.problem_for(refusal(res))
        return JSONResponse({**body, "status": "refused", "problem": json.loads(bytes(refused.body))})

    @app.get("/v1/jobs", summary="List this tenant's jobs", response_model=None,
             responses={200: {"model": schemas.JobPage}, **problem_responses(401, 422, 503)})
    def list_jobs(tenant: Tenant, cursor: str | None = None, limit: Limit = 100) -> dict[str, Any]:
        page = history.list_jobs(tenant, limit_of(limit), cursor)
        return {"items": [job_view(j) for j in page.items], "cursor": page.cursor}

    def job_action(job_id: str, tenant: str, command: Any, accepted: str, status: JobStatus) -> JSONResponse:
        check_job_id(job_id, "jobId")  # a fast 422 for an id no job can have
        res = decided(job_id, command)
        remember(job_id, res, lambda s: replace(s, status=status))
        return JSONResponse({"id": job_id, "accepted": accepted, "version": res.job_version})

    job_ack = {200: {"model": schemas.JobAck, "description": "the processor accepted it"},
               **ANSWER_PENDING, **problem_responses(401, 404, 409, 422, 503)}

    @app.post("/v1/jobs/{job_id}:pause", status_code=200, summary="Pause a job", response_model=None,
              responses=job_ack)
    def pause_job(job_id: str, tenant: Tenant) -> JSONResponse:
        return job_action(job_id, tenant, PauseJob(job_id, tenant, clock.now_ms()), "pause", JobStatus.PAUSED)

    @app.post("/v1/jobs/{job_id}:resume", status_code=200, summary="Resume a paused job at its next slot",
              response_model=None, responses=job_ack)
    def resume_job(job_id: str, tenant: Tenant) -> JSONResponse:
        return job_action(job_id, tenant, ResumeJob(job_id, tenant, clock.now_ms()), "resume", JobStatus.ACTIVE)

    def trigger(job_id: str, tenant: str, body: Any) -> JSONResponse:
        """The processor checks the job, the tenant's trigger rate and backlog, and
        refuses new one-off work while it is overloaded (429)."""
        key = validate_idempotency_key(closed_object(body, ("idempotencyKey",)).get("idempotencyKey"))
        check_job_id(job_id, "jobId")
        decided(job_id, TriggerJob(job_id, tenant, key, clock.now_ms()))
        return JSONResponse({"runId": manual_run_id(job_id, key)})

    @app.post("/v1/jobs/{job_id}:trigger", status_code=200, summary="Run a job now (idempotent per key)",
              response_model=None,
              responses={200: {"model": schemas.TriggerAck, "description": "the processor accepted it"},
                         **ANSWER_PENDING, **problem_responses(401, 404, 413, 422, 503), **limit_responses()},
              openapi_extra=request_body(schemas.TriggerBody, example={"idempotencyKey": "deploy-42"}))
    async def trigger_job(job_id: str, request: Request, tenant: Tenant) -> JSONResponse:
        body = await body_of(request)
        return await run_in_threadpool(trigger, job_id, tenant, body)

    @app.get("/v1/jobs/{job_id}", summary="Get a job", response_model=None,
             responses={200: {"model": schemas.Job}, **problem_responses(401, 404, 422, 503)})
    def get_job(job_id: str, tenant: Tenant) -> dict[str, Any]:
        return job_view(owned_job(tenant, job_id))

    @app.get("/v1/jobs/{job_id}/fires", summary="The job's next fire times", response_model=None,
             description="The next slots of the job's schedule after `after` (default now), within its bounds "
             "(startAt, endAt, and the runs its maxRuns leaves), each with the run's start (the slot plus the "
             "job's jitter) and its wall time in the job's zone; `ends` says when the schedule has no slot after "
             "the last one shown. Computed with the scheduler's own code.",
             responses={200: {"model": schemas.Fires}, **problem_responses(401, 404, 422, 503)})
    def job_fires(job_id: str, tenant: Tenant, count: FireCount = FIRES_SHOWN,
                  after: str | None = None) -> dict[str, Any]:
        job = owned_job(tenant, job_id)
        cals = calendars.book.for_job(tenant, job.spec.exclude_calendars)
        return fires_view(job, instant_param(after, "after", clock.now_ms()), limit_of_fires(count), cals)

    def update(job_id: str, tenant: str, patch: Any, if_match: str | None) -> JSONResponse:
        """Field names and values are checked here (a fast 422); the processor merges the
        patch into the job's current definition and checks ``If-Match`` against the
        job's version, so two quick edits of different fields both survive."""
        expected = version_of(if_match)
        check_job_id(job_id, "jobId")
        now = clock.now_ms()
        check_patch(patch, now, pools=pools)
        if patch.get("after"):  # (a dict: check_patch said so)
            check_after(history, tenant, job_id, parse_after(patch["after"]), recent.get)
        try:
            res = decided(job_id, PatchJob(job_id, tenant, canonical_patch(patch), expected, now))
        except Conflict as exc:
            if expected is None:
                raise
            return problems.problem(412, "precondition-failed", "Precondition Failed",
                                    f"{exc}; GET the job and apply your change again", field="If-Match")
        try:  # the merge the processor made, on the state this process kept (if any)
            state = remember(job_id, res, lambda s: replace(s, spec=apply_patch(s.spec, patch, now, pools=pools)))
        except ValidationError:  # accepted there: never answer a refusal for it here
            state = None
        if state is None:
            try:
                read = history.get_job(job_id)
            except HistoryStoreError:  # accepted: the answer does not depend on history
                read = None
            state = read if read is not None and read.version == res.job_version else None
        etag = {"ETag": f'"{res.job_version}"'}
        if state is None:  # history does not show this version yet
            return JSONResponse({"id": job_id, "version": res.job_version, "accepted": "patch"}, headers=etag)
        return JSONResponse(job_view(state), headers=etag)

    @app.patch("/v1/jobs/{job_id}", status_code=200, summary="Update fields of a job", response_model=None,
               description="Send `If-Match: \"<version>\"` (the job's `version`) to refuse the edit if somebody "
               "changed the job since you read it: the processor checks it when it applies the edit and a stale "
               "one is refused (412) with nothing changed. The merge happens in the processor, on the current "
               "definition. The answer is the job as the edit left it (or, when this API process has not seen "
               "that version yet, its id and version).",
               responses={**ANSWER_PENDING, 200: {"model": schemas.Job, "headers": {"ETag": {
                   "description": "the version this edit produces", "schema": {"type": "string"}}}},
                   **problem_responses(401, 404, 412, 413, 422, 503)},
               openapi_extra=request_body(schemas.JobPatch, example={"priority": "high"}))
    async def update_job(job_id: str, request: Request, tenant: Tenant,
                         if_match: Annotated[str | None, Header(alias="If-Match")] = None) -> JSONResponse:
        patch = await body_of(request)
        return await run_in_threadpool(update, job_id, tenant, patch, if_match)

    @app.delete("/v1/jobs/{job_id}", status_code=200, summary="Delete a job", response_model=None,
                responses=job_ack)
    def delete_job(job_id: str, tenant: Tenant) -> JSONResponse:
        return job_action(job_id, tenant, DeleteJob(job_id, tenant, clock.now_ms()), "delete", JobStatus.DELETED)

    def move(job_id: str, tenant: str, body: Any) -> JSONResponse:
        """The job's home processor hands it over at its schedule position (ADR 0013)."""
        to = closed_object(body, ("region",)).get("region")
        if not isinstance(to, str):
            raise ValidationError("region", "is required: the name of the region to move the job to")
        check_region(to, "region")
        # (the job's processor refuses a move out of the default namespace, after it has
        # checked that the job is the tenant's: one decider, and another tenant's job is a 404)
        here, known = topology.region, region_names.configured()
        if to == here:
            raise ValidationError("region", f"the job is in region {here} already")
        if known and to not in known:
            raise ValidationError("region", f"no region {to!r} here (the regions: {', '.join(known)})")
        check_job_id(job_id, "jobId")
        res = decided(job_id, MoveJob(job_id, tenant, to, clock.now_ms()))
        remember(job_id, res, lambda s: replace(s, status=JobStatus.DONE, next_run_at_ms=None, moved_to=to))
        return JSONResponse({"id": job_id, "accepted": "move", "version": res.job_version, "region": to})

    @app.post("/v1/jobs/{job_id}:move", status_code=200, summary="Move a job to another region",
              response_model=None,
              responses={200: {"model": schemas.MoveAck, "description": "the processor accepted it"},
                         **ANSWER_PENDING, **problem_responses(401, 404, 409, 413, 422, 503)},
              openapi_extra=request_body(schemas.MoveBody, example={"region": "eu2"}))
    async def move_job(job_id: str, request: Request, tenant: Tenant) -> JSONResponse:
        body = await body_of(request)
        return await run_in_threadpool(move, job_id, tenant, body)

    @app.get("/v1/jobs/{job_id}/runs", summary="Runs of a job, newest first", response_model=None,
             responses={200: {"model": schemas.RunPage}, **problem_responses(401, 404, 422, 503)})
    async def list_runs(job_id: str, tenant: Tenant, status: RunStatusQuery = None,
                        cursor: str | None = None, limit: Limit = 50) -> Response:
        # The same answers, in the same order of checks, as reading the job, then checking
        # the arguments, then listing; but the job and the page are read at once.
        bad: ValidationError | None = None
        if status is not None and status not in _RUN_STATUSES:
            bad = ValidationError("status", f"must be one of {', '.join(s.value for s in RunStatus)}")
        elif not 1 <= limit <= PAGE_MAX:
            bad = ValidationError("limit", f"must be between 1 and {PAGE_MAX}")
        listing = None if bad is not None else asyncio.ensure_future(runs_cache.get(
            ("runs", job_id, status, limit, cursor), lambda: reads.list_runs(job_id, status, limit, cursor)))
        try:
            read = await runs_cache.get(("job", job_id), lambda: reads.get_job(job_id))
            owned(recent.newest(job_id, read), tenant, job_id)
            if bad is not None:
                raise bad
            assert listing is not None
            page = await listing
        finally:
            _forget(listing)
        # (each run's own tenant too: a job id is its tenant's for ever now, but history may
        # hold runs of an id another tenant had before that held)
        mine = [r for r in page.items if r.tenant == tenant]
        return Response(run_views.page(mine, page.cursor), media_type="application/json")

    @app.get("/v1/dead-letters", summary="This tenant's failed runs (retries exhausted), newest first",
             response_model=None,
             responses={200: {"model": schemas.RunPage}, **problem_responses(401, 422, 503)})
    def list_dead_letters(tenant: Tenant, cursor: str | None = None, limit: Limit = 50) -> dict[str, Any]:
        page = history.list_dead_letters(tenant, limit_of(limit), cursor)
        return {"items": [run_view(r) for r in page.items], "cursor": page.cursor}

    def owned_run(tenant: str, run_id: str) -> RunState:
        try:
            job_id_of(run_id)
        except ValueError:
            raise ValidationError("runId", f"not a run id: {run_id!r}") from None
        run = history.get_run(run_id)
        if run is None or run.tenant != tenant:
            raise NotFound(f"no run {run_id!r}")
        return run

    run_ack = {200: {"model": schemas.RunAck, "description": "the processor accepted it"}, **ANSWER_PENDING,
               **problem_responses(401, 404, 409, 422, 503)}

    def run_action(run_id: str, tenant: str, command: CancelRun | ReplayRun, accepted: str) -> JSONResponse:
        """The processor decides (``PartitionTask._check_run_action``): 404 for a run the
        tenant cannot see, 409 for one the action cannot apply to."""
        try:
            job_id = job_id_of(run_id)
        except ValueError:
            raise ValidationError("runId", f"not a run id: {run_id!r}") from None
        try:
            decided(job_id, command)
        except NotFound:
            raise NotFound(f"no run {run_id!r}") from None
        return JSONResponse({"runId": run_id, "accepted": accepted})

    # Declared before GET /v1/runs/{run_id}. A run id contains "@" and may contain ":"
    # (manual runs: job@manual:key); the path parameter matches greedily, so the action is
    # always the last ":<action>" of the path and GET /v1/runs/<id> never matches these.
    @app.post("/v1/runs/{run_id}:cancel", status_code=200, summary="Cancel a run that has not finished",
              response_model=None, responses=run_ack)
    def cancel_run(run_id: str, tenant: Tenant) -> JSONResponse:
        return run_action(run_id, tenant, CancelRun(run_id, tenant, clock.now_ms()), "cancel")

    @app.post("/v1/runs/{run_id}:replay", status_code=200,
              summary="Run a failed (dead-lettered) run again with a fresh retry budget",
              response_model=None, responses=run_ack)
    def replay_run(run_id: str, tenant: Tenant) -> JSONResponse:
        return run_action(run_id, tenant, ReplayRun(run_id, tenant, clock.now_ms()), "replay")

    @app.get("/v1/runs/{run_id}/logs", summary="Log lines of a run", response_model=None,
             responses={200: {"model": schemas.LogPage}, **problem_responses(401, 404, 422, 503)})
    def run_logs(run_id: str, tenant: Tenant, cursor: str | None = None, limit: Limit = 500) -> dict[str, Any]:
        owned_run(tenant, run_id)
        page = history.get_logs(run_id, limit_of(limit), cursor)
        return {"items": [log_view(x) for x in page.items if x.tenant == tenant], "cursor": page.cursor}

    @app.get("/v1/runs/{run_id}", summary="Get a run", response_model=None,
             responses={200: {"model": schemas.Run}, **problem_responses(401, 404, 422, 503)})
    def get_run(run_id: str, tenant: Tenant) -> dict[str, Any]:
        return run_view(owned_run(tenant, run_id))

    install_ui(app, clock)  # the web UI under /ui, on these routes (docs/ui.md)
    return app


_RUN_STATUSES = frozenset(s.value for s in RunStatus)


def owned(state: JobState | None, tenant: str, job_id: str) -> JobState:
    """``state`` if it is a live job of ``tenant``, else NotFound (another tenant's job is
    not found either)."""
    if state is None or state.tenant != tenant or state.status is JobStatus.DELETED:
        raise NotFound(f"no job {job_id!r}")
    return state


def parse_command_id(command_id: str) -> Position:
    """``"3-1234"`` -> (3, 1234): a command's partition and offset."""
    part, _, off = command_id.partition("-")
    if not (part.isdigit() and off.isdigit() and len(part) <= 6 and len(off) <= 19):
        raise ValidationError("commandId", "must be <partition>-<offset>, as in the Location of a 202")
    return int(part), int(off)


def version_of(if_match: str | None) -> int | None:
    """``"7"``, ``W/"7"`` or ``7`` -> 7; None when absent."""
    if if_match is None:
        return None
    raw = if_match.strip().removeprefix("W/").strip('"')
    if not raw.isdigit() or len(raw) > 18:
        raise ValidationError("If-Match", 'must be the job\'s version in quotes, like "3"')
    return int(raw)
