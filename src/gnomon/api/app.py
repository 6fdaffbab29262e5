"""The FastAPI application. Handlers validate with the core, produce one command
(returning only after Kafka acknowledged it) and read history from the HistoryStore
(Cassandra). Job commands go to gnomon.job-commands keyed by job id; run commands
(cancel, replay) go to gnomon.run-events keyed by the run's job id, where the run
processor owns the run."""

from __future__ import annotations

import json
import secrets
from typing import Any

from fastapi import FastAPI, Header, Request
from fastapi.responses import JSONResponse

from gnomon import codec
from gnomon.api import problems
from gnomon.api.auth import Authenticator
from gnomon.api.views import job_view, log_view, run_view
from gnomon.core.clock import Clock, SystemClock
from gnomon.core.errors import Conflict, NotFound, ValidationError
from gnomon.core.jobs import (
    DeleteJob,
    JobState,
    JobStatus,
    PauseJob,
    RegisterJob,
    ResumeJob,
    TriggerJob,
    UpdateJob,
    first_slot_after,
)
from gnomon.core.model import job_id_of, manual_run_id
from gnomon.core.runs import CancelRun, ReplayRun, RunConfig, RunState, RunStatus
from gnomon.core.validation import apply_patch, parse_job_spec, validate_idempotency_key
from gnomon.ports import HistoryStore
from gnomon.topology import Topology

BODY_MAX_BYTES = 256 * 1024
PAGE_MAX = 500


class CommandSink:
    """Where commands go: a Kafka topic (SyncProducer) in production, a list in tests."""

    def __init__(self, producer: Any, topic: str) -> None:
        self._producer = producer
        self._topic = topic

    @property
    def topic(self) -> str:
        return self._topic

    def send(self, job_id: str, command: Any) -> None:
        self._producer.send(self._topic, job_id, codec.encode(command, self._topic))

    def to(self, topic: str) -> CommandSink:
        """The same producer, another topic."""
        return CommandSink(self._producer, topic)


def create_app(
    *, history: HistoryStore, commands: CommandSink, auth: Authenticator, topology: Topology,
    clock: Clock | None = None, run_commands: CommandSink | None = None,
) -> FastAPI:
    """``commands`` produces to ``topology.job_commands``; ``run_commands`` to
    ``topology.run_events`` (default: ``commands``' producer on that topic)."""
    clock = clock or SystemClock()
    run_sink = run_commands if run_commands is not None else commands.to(topology.run_events)
    pools = frozenset(topology.pools)
    app = FastAPI(
        title="gnomon",
        version="0.1.0",
        description="A shared, multi-tenant job scheduler event-sourced on Kafka. "
        "Authenticate with 'Authorization: Bearer <token>'. Errors are application/problem+json "
        "with a 'field' naming the offending input.",
    )
    problems.install(app)

    async def body_of(request: Request) -> Any:
        raw = await request.body()
        if len(raw) > BODY_MAX_BYTES:
            raise ValidationError("body", f"request body is {len(raw)} bytes; the limit is {BODY_MAX_BYTES}")
        if not raw:
            return {}
        try:
            return json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValidationError("body", f"not valid JSON: {exc.msg} at position {exc.pos}") from None

    def owned_job(tenant: str, job_id: str) -> JobState:
        state = history.get_job(job_id)
        if state is None or state.tenant != tenant or state.status is JobStatus.DELETED:
            raise NotFound(f"no job {job_id!r}")
        return state

    def limit_of(limit: int) -> int:
        if not 1 <= limit <= PAGE_MAX:
            raise ValidationError("limit", f"must be between 1 and {PAGE_MAX}")
        return limit

    @app.get("/healthz", include_in_schema=False)
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/v1/jobs", status_code=201, summary="Register a job")
    async def create_job(request: Request, authorization: str | None = Header(None)) -> JSONResponse:
        tenant = auth.tenant_for(authorization)
        now = clock.now_ms()
        spec = parse_job_spec(await body_of(request), now, pools=pools)
        job_id = "job_" + secrets.token_hex(8)
        commands.send(job_id, RegisterJob(job_id, tenant, spec, now))
        view = job_view(JobState(job_id, tenant, spec, JobStatus.ACTIVE, first_slot_after(spec, now - 1), 1, now, now))
        return JSONResponse(view, status_code=201, headers={"Location": f"/v1/jobs/{job_id}"})

    @app.get("/v1/jobs", summary="List this tenant's jobs")
    def list_jobs(cursor: str | None = None, limit: int = 100, authorization: str | None = Header(None)) -> dict[str, Any]:
        tenant = auth.tenant_for(authorization)
        page = history.list_jobs(tenant, limit_of(limit), cursor)
        return {"items": [job_view(j) for j in page.items], "cursor": page.cursor}

    @app.post("/v1/jobs/{job_id}:pause", status_code=202, summary="Pause a job")
    def pause_job(job_id: str, authorization: str | None = Header(None)) -> dict[str, Any]:
        tenant = auth.tenant_for(authorization)
        owned_job(tenant, job_id)
        commands.send(job_id, PauseJob(job_id, tenant, clock.now_ms()))
        return {"id": job_id, "accepted": "pause"}

    @app.post("/v1/jobs/{job_id}:resume", status_code=202, summary="Resume a paused job at its next slot")
    def resume_job(job_id: str, authorization: str | None = Header(None)) -> dict[str, Any]:
        tenant = auth.tenant_for(authorization)
        owned_job(tenant, job_id)
        commands.send(job_id, ResumeJob(job_id, tenant, clock.now_ms()))
        return {"id": job_id, "accepted": "resume"}

    @app.post("/v1/jobs/{job_id}:trigger", status_code=202, summary="Run a job now (idempotent per key)")
    async def trigger_job(job_id: str, request: Request, authorization: str | None = Header(None)) -> dict[str, Any]:
        tenant = auth.tenant_for(authorization)
        body = await body_of(request)
        if not isinstance(body, dict):
            raise ValidationError("body", "must be a JSON object")
        for key in body:
            if key != "idempotencyKey":
                raise ValidationError(key, "unknown field; allowed: idempotencyKey")
        key = validate_idempotency_key(body.get("idempotencyKey"))
        owned_job(tenant, job_id)
        commands.send(job_id, TriggerJob(job_id, tenant, key, clock.now_ms()))
        return {"runId": manual_run_id(job_id, key)}

    @app.get("/v1/jobs/{job_id}", summary="Get a job")
    def get_job(job_id: str, authorization: str | None = Header(None)) -> dict[str, Any]:
        return job_view(owned_job(auth.tenant_for(authorization), job_id))

    @app.patch("/v1/jobs/{job_id}", status_code=202, summary="Update fields of a job")
    async def update_job(job_id: str, request: Request, authorization: str | None = Header(None)) -> dict[str, Any]:
        tenant = auth.tenant_for(authorization)
        patch = await body_of(request)
        state = owned_job(tenant, job_id)
        now = clock.now_ms()
        spec = apply_patch(state.spec, patch, now, pools=pools)
        commands.send(job_id, UpdateJob(job_id, tenant, spec, now))
        return job_view(JobState(job_id, tenant, spec, state.status, state.next_run_at_ms, state.version + 1,
                                 state.created_at_ms, now))

    @app.delete("/v1/jobs/{job_id}", status_code=202, summary="Delete a job")
    def delete_job(job_id: str, authorization: str | None = Header(None)) -> dict[str, Any]:
        tenant = auth.tenant_for(authorization)
        owned_job(tenant, job_id)
        commands.send(job_id, DeleteJob(job_id, tenant, clock.now_ms()))
        return {"id": job_id, "accepted": "delete"}

    @app.get("/v1/jobs/{job_id}/runs", summary="Runs of a job, newest first")
    def list_runs(job_id: str, status: str | None = None, cursor: str | None = None, limit: int = 50,
                  authorization: str | None = Header(None)) -> dict[str, Any]:
        tenant = auth.tenant_for(authorization)
        owned_job(tenant, job_id)
        if status is not None and status not in [s.value for s in RunStatus]:
            raise ValidationError("status", f"must be one of {', '.join(s.value for s in RunStatus)}")
        page = history.list_runs(job_id, status, limit_of(limit), cursor)
        return {"items": [run_view(r) for r in page.items], "cursor": page.cursor}

    @app.get("/v1/dead-letters", summary="This tenant's failed runs (retries exhausted), newest first")
    def list_dead_letters(cursor: str | None = None, limit: int = 50,
                          authorization: str | None = Header(None)) -> dict[str, Any]:
        tenant = auth.tenant_for(authorization)
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

    # Declared before GET /v1/runs/{run_id}. A run id contains "@" and may contain ":"
    # (manual runs: job@manual:key); the path parameter matches greedily, so the action is
    # always the last ":<action>" of the path and GET /v1/runs/<id> never matches these.
    @app.post("/v1/runs/{run_id}:cancel", status_code=202, summary="Cancel a run that has not finished")
    def cancel_run(run_id: str, authorization: str | None = Header(None)) -> dict[str, Any]:
        tenant = auth.tenant_for(authorization)
        run = owned_run(tenant, run_id)
        if run.status.terminal:
            raise Conflict(f"run {run_id!r} is {run.status.value}; only a run that has not finished can be cancelled")
        run_sink.send(job_id_of(run_id), CancelRun(run_id, clock.now_ms()))
        return {"runId": run_id, "accepted": "cancel"}

    @app.post("/v1/runs/{run_id}:replay", status_code=202,
              summary="Run a failed (dead-lettered) run again with a fresh retry budget")
    def replay_run(run_id: str, authorization: str | None = Header(None)) -> dict[str, Any]:
        tenant = auth.tenant_for(authorization)
        run = owned_run(tenant, run_id)
        if run.status is not RunStatus.FAILED:
            raise Conflict(f"run {run_id!r} is {run.status.value}; only a failed (dead-lettered) run can be replayed")
        window_ms = RunConfig().dead_letter_retention_ms  # the processors' default (docs/adr/0005)
        if run.finished_at_ms is not None and clock.now_ms() - run.finished_at_ms >= window_ms:
            raise Conflict(f"run {run_id!r} failed more than {window_ms // 86_400_000} days ago; dead letters are "
                           "replayable for that long (history keeps it; trigger the job by hand instead)")
        run_sink.send(job_id_of(run_id), ReplayRun(run_id, clock.now_ms()))
        return {"runId": run_id, "accepted": "replay"}

    @app.get("/v1/runs/{run_id}/logs", summary="Log lines of a run")
    def run_logs(run_id: str, cursor: str | None = None, limit: int = 500,
                 authorization: str | None = Header(None)) -> dict[str, Any]:
        tenant = auth.tenant_for(authorization)
        owned_run(tenant, run_id)
        page = history.get_logs(run_id, limit_of(limit), cursor)
        return {"items": [log_view(x) for x in page.items], "cursor": page.cursor}

    @app.get("/v1/runs/{run_id}", summary="Get a run")
    def get_run(run_id: str, authorization: str | None = Header(None)) -> dict[str, Any]:
        return run_view(owned_run(auth.tenant_for(authorization), run_id))

    return app
