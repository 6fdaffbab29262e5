"""RFC 9457 problem details (application/problem+json) for every error the API returns."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from gnomon.core.errors import (
    Conflict,
    EventLogError,
    HistoryStoreError,
    InternalError,
    LimitExceeded,
    NotFound,
    ValidationError,
)

PROBLEM_BASE = "https://gnomon.dev/problems/"
PROBLEM_MEDIA_TYPE = "application/problem+json"
# A 503 says how long to wait before retrying: long enough for a broker or node to come back.
RETRY_AFTER_S = 5
# What a client may conclude about a command when the API answered 503:
OUTCOME_UNKNOWN = "unknown"  # the command may or may not be in the log: retry with the same key
OUTCOME_NOT_WRITTEN = "not-written"  # nothing was sent: retrying is always safe

log = logging.getLogger("gnomon.api")


class Unauthorized(Exception):
    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class Forbidden(Exception):
    """An authenticated caller without the role an endpoint needs (403)."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class TooLarge(Exception):
    """The request body is over the limit (checked before reading it when declared)."""

    def __init__(self, detail: str, field: str = "body") -> None:
        super().__init__(detail)
        self.detail = detail
        self.field = field


class CommandOutcomeUnknown(EventLogError):
    """A command send failed after the producer may have written it: the client cannot
    know whether it took effect, and must retry with the same idempotency key."""


class Pending(Exception):
    """A command is written but its processor's answer did not come within the API's
    bound (``api.answers``): answered 202 with a Location to poll (``position`` None:
    no decider is wired, nothing to poll)."""

    def __init__(self, position: tuple[int, int] | None, job_id: str, command: str) -> None:
        super().__init__(f"{command} for {job_id} written; the processor's answer has not come yet")
        self.position = position
        self.job_id = job_id
        self.command = command

    @property
    def command_id(self) -> str | None:
        return None if self.position is None else f"{self.position[0]}-{self.position[1]}"


def pending_answer(exc: Pending) -> JSONResponse:
    body: dict[str, Any] = {"status": "pending", "jobId": exc.job_id, "command": exc.command,
                            "commandId": exc.command_id,
                            "detail": "the command is written (it will be applied) but the scheduler has not "
                            "answered yet" + ("; poll the Location for its answer" if exc.command_id else "")}
    headers = {} if exc.command_id is None else {"Location": f"/v1/commands/{exc.command_id}"}
    return JSONResponse(body, status_code=202, headers=headers)


def problem(status: int, kind: str, title: str, detail: str, **extra: Any) -> JSONResponse:
    body: dict[str, Any] = {"type": PROBLEM_BASE + kind, "title": title, "status": status, "detail": detail}
    body.update(extra)
    headers: dict[str, str] = {}
    if status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    if status == 503:
        headers["Retry-After"] = str(RETRY_AFTER_S)
    return JSONResponse(body, status_code=status, media_type=PROBLEM_MEDIA_TYPE, headers=headers or None)


def limit_problem(exc: LimitExceeded) -> JSONResponse:
    """A tenant limit refused the request: 429 with Retry-After when waiting helps, else
    422. The body names the limit (``"limit": "backlog_max"``) and the field if one is."""
    extra: dict[str, Any] = {"limit": exc.limit}
    if exc.field is not None:
        extra["field"] = exc.field
        extra["errors"] = [{"field": exc.field, "message": exc.message}]
    if exc.retry_after_s is None:
        return problem(422, "limit-exceeded", "Tenant limit exceeded", exc.message, **extra)
    resp = problem(429, "limit-exceeded", "Tenant limit exceeded", exc.message, **extra)
    resp.headers["Retry-After"] = str(max(1, int(exc.retry_after_s)))
    return resp


def problem_for(exc: Exception) -> JSONResponse:
    """The problem the API answers for a refusal (``api.answers.refusal``)."""
    if isinstance(exc, ValidationError):
        return problem(422, "validation", "Invalid request", exc.message, field=exc.field,
                       errors=[{"field": exc.field, "message": exc.message}])
    if isinstance(exc, LimitExceeded):
        return limit_problem(exc)
    if isinstance(exc, NotFound):
        return problem(404, "not-found", "Not found", str(exc))
    return problem(409, "conflict", "Conflict", str(exc))


def _field_of(loc: Any) -> str:
    """FastAPI's error location without its ("body" | "query" | "path" | "header") prefix."""
    return ".".join(str(p) for p in loc if p not in ("body", "query", "path", "header")) or "body"


def install(app: FastAPI) -> None:
    @app.exception_handler(ValidationError)
    async def _validation(_: Request, exc: ValidationError) -> JSONResponse:
        return problem(422, "validation", "Invalid request", exc.message, field=exc.field,
                       errors=[{"field": exc.field, "message": exc.message}])

    @app.exception_handler(Unauthorized)
    async def _unauth(_: Request, exc: Unauthorized) -> JSONResponse:
        return problem(401, "unauthorized", "Unauthorized", exc.detail, field="Authorization")

    @app.exception_handler(Forbidden)
    async def _forbidden(_: Request, exc: Forbidden) -> JSONResponse:
        return problem(403, "forbidden", "Forbidden", exc.detail, field="Authorization")

    @app.exception_handler(LimitExceeded)
    async def _limit(_: Request, exc: LimitExceeded) -> JSONResponse:
        return limit_problem(exc)

    @app.exception_handler(TooLarge)
    async def _too_large(_: Request, exc: TooLarge) -> JSONResponse:
        return problem(413, "too-large", "Request body too large", exc.detail, field=exc.field)

    @app.exception_handler(Pending)
    async def _pending(_: Request, exc: Pending) -> JSONResponse:
        return pending_answer(exc)

    @app.exception_handler(NotFound)
    async def _not_found(_: Request, exc: NotFound) -> JSONResponse:
        return problem(404, "not-found", "Not found", str(exc))

    @app.exception_handler(Conflict)
    async def _conflict(_: Request, exc: Conflict) -> JSONResponse:
        return problem(409, "conflict", "Conflict", str(exc))

    @app.exception_handler(EventLogError)
    async def _kafka(_: Request, exc: EventLogError) -> JSONResponse:
        if isinstance(exc, CommandOutcomeUnknown):
            return problem(503, "event-log-unavailable", "Event log unavailable",
                           f"{exc}. The command may or may not have been written: retry with the same "
                           "Idempotency-Key (POST /v1/jobs) or idempotencyKey (trigger) so that a retry "
                           "cannot act twice; without one, list before retrying.",
                           outcome=OUTCOME_UNKNOWN)
        return problem(503, "event-log-unavailable", "Event log unavailable", str(exc))

    @app.exception_handler(HistoryStoreError)
    async def _history(request: Request, exc: HistoryStoreError) -> JSONResponse:
        # Every handler reads history before it sends a command, never after: a history
        # outage means nothing was written.
        extra = {} if request.method == "GET" else {"outcome": OUTCOME_NOT_WRITTEN}
        return problem(503, "history-unavailable", "History store unavailable", str(exc), **extra)

    @app.exception_handler(RequestValidationError)
    async def _fastapi_validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": ["body"], "msg": "invalid"}
        field = _field_of(first.get("loc", []))
        message = str(first.get("msg"))
        return problem(422, "validation", "Invalid request", message, field=field,
                       errors=[{"field": field, "message": message}])

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return problem(exc.status_code, "http", str(exc.detail), str(exc.detail))

    @app.exception_handler(InternalError)
    async def _internal(request: Request, exc: InternalError) -> JSONResponse:
        # gnomon's own bug (e.g. codec.EncodeError): logged; never a 4xx for the client.
        log.error("internal error on %s %s", request.method, request.url.path, exc_info=exc)
        return problem(500, "internal", "Internal error", "the server failed; see its log")

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> JSONResponse:
        # Still a bug (the server logs it); the client gets problem+json, not a stack trace.
        log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
        return problem(500, "internal", "Internal error", "the server failed; see its log")
