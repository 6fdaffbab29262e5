"""RFC 9457 problem details (application/problem+json) for every error the API returns."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from gnomon.core.errors import Conflict, EventLogError, HistoryStoreError, NotFound, ValidationError

PROBLEM_BASE = "https://gnomon.dev/problems/"


class Unauthorized(Exception):
    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


def problem(status: int, kind: str, title: str, detail: str, **extra: Any) -> JSONResponse:
    body: dict[str, Any] = {"type": PROBLEM_BASE + kind, "title": title, "status": status, "detail": detail}
    body.update(extra)
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(body, status_code=status, media_type="application/problem+json", headers=headers)


def install(app: Any) -> None:
    @app.exception_handler(ValidationError)
    async def _validation(_: Request, exc: ValidationError) -> JSONResponse:
        return problem(422, "validation", "Invalid request", exc.message, field=exc.field,
                       errors=[{"field": exc.field, "message": exc.message}])

    @app.exception_handler(Unauthorized)
    async def _unauth(_: Request, exc: Unauthorized) -> JSONResponse:
        return problem(401, "unauthorized", "Unauthorized", exc.detail, field="Authorization")

    @app.exception_handler(NotFound)
    async def _not_found(_: Request, exc: NotFound) -> JSONResponse:
        return problem(404, "not-found", "Not found", str(exc))

    @app.exception_handler(Conflict)
    async def _conflict(_: Request, exc: Conflict) -> JSONResponse:
        return problem(409, "conflict", "Conflict", str(exc))

    @app.exception_handler(EventLogError)
    async def _kafka(_: Request, exc: EventLogError) -> JSONResponse:
        return problem(503, "event-log-unavailable", "Event log unavailable", str(exc))

    @app.exception_handler(HistoryStoreError)
    async def _history(_: Request, exc: HistoryStoreError) -> JSONResponse:
        return problem(503, "history-unavailable", "History store unavailable", str(exc))

    @app.exception_handler(RequestValidationError)
    async def _fastapi_validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": ["body"], "msg": "invalid"}
        field = ".".join(str(p) for p in first.get("loc", []) if p not in ("body", "query", "path"))
        return problem(422, "validation", "Invalid request", str(first.get("msg")), field=field or "body")

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return problem(exc.status_code, "http", str(exc.detail), str(exc.detail))
