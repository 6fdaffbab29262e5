"""A tenant's exclusion calendars: ``GET /v1/calendars``, ``GET|PUT|DELETE
/v1/calendars/{name}`` (core.calendars, docs/schedules.md "Calendars").

``CalendarService`` holds the API's copy of ``gnomon.calendars`` (a ``CalendarBook``,
filled by the tenant feed) and writes calendar records, keyed ``<tenant>/<name>``. The
tenant comes from the token: a tenant sees and changes only its own calendars. PUT
replaces a calendar (422 naming ``timezone``, ``dates[i]``...; at most
``CALENDARS_PER_TENANT_MAX`` per tenant). DELETE of a calendar a job of the tenant names
is refused (409 naming the jobs), so no job is left naming a calendar that is gone.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request
from fastapi.concurrency import run_in_threadpool

from gnomon import codec
from gnomon.api import schemas
from gnomon.api.openapi import problem_responses, request_body
from gnomon.api.tenants import principal_of
from gnomon.core.calendars import (
    CALENDARS_PER_TENANT_MAX,
    Calendar,
    CalendarBook,
    calendar_to_json,
    check_name,
    parse_calendar,
)
from gnomon.core.clock import Clock, SystemClock
from gnomon.core.errors import Conflict, EventLogError, LimitExceeded, NotFound
from gnomon.ports import HistoryStore
from gnomon.topology import load_topology
from gnomon.web.auth import Principal
from gnomon.web.body import BODY_MAX_BYTES, parse_json, read_bounded

__all__ = ["CalendarService", "install"]

JOBS_SCANNED_MAX = 10_000  # a delete looks at up to this many of the tenant's jobs


class CalendarService:
    def __init__(self, book: CalendarBook | None = None, *, writer: Any = None, topic: str | None = None) -> None:
        """``writer``: ``send(topic, key, value_or_None)`` acknowledged by Kafka; None:
        calendars cannot be changed (503)."""
        self.book = book if book is not None else CalendarBook()
        self.writer = writer
        self.topic = topic if topic is not None else load_topology().calendars
        self.lock = threading.Lock()

    def listing(self, tenant: str) -> dict[str, Any]:
        with self.lock:
            return {"items": [calendar_to_json(c) for c in self.book.of_tenant(tenant)]}

    def get(self, tenant: str, name: str) -> Calendar:
        check_name(name)
        with self.lock:
            cal = self.book.get(tenant, name)
        if cal is None:
            raise NotFound(f"no calendar {name!r}")
        return cal

    def put(self, tenant: str, name: str, body: Any, now_ms: int) -> dict[str, Any]:
        cal = parse_calendar(tenant, name, body, now_ms)
        with self.lock:
            if self.book.get(tenant, name) is None and len(self.book.of_tenant(tenant)) >= CALENDARS_PER_TENANT_MAX:
                raise LimitExceeded("calendars_max", f"tenant {tenant} has {CALENDARS_PER_TENANT_MAX} calendars, the "
                                    "limit; delete one first", field="name")
        self._write(cal.key, codec.encode(cal, self.topic))
        with self.lock:
            self.book.apply(cal.key, cal)  # read-your-writes; the feed applies the same record again
        return calendar_to_json(cal)

    def delete(self, tenant: str, name: str, users: Callable[[], list[str]]) -> dict[str, Any]:
        cal = self.get(tenant, name)
        using = users()
        if using:
            shown = ", ".join(using[:10]) + (f" and {len(using) - 10} more" if len(using) > 10 else "")
            raise Conflict(f"calendar {name!r} is excluded by job(s) {shown}; remove it from their "
                           "excludeCalendars first")
        self._write(cal.key, None)
        with self.lock:
            self.book.apply(cal.key, None)
        return {"name": name, "deleted": True}

    def _write(self, key: str, value: bytes | None) -> None:
        if self.writer is None:
            raise EventLogError(f"this API instance cannot write {self.topic}")
        self.writer.send(self.topic, key, value)


def jobs_naming(history: HistoryStore, tenant: str, name: str) -> list[str]:
    """The tenant's jobs (not deleted) whose ``excludeCalendars`` holds ``name``."""
    found: list[str] = []
    cursor: str | None = None
    scanned = 0
    while scanned < JOBS_SCANNED_MAX:
        page = history.list_jobs(tenant, 500, cursor)
        scanned += len(page.items)
        found += [j.job_id for j in page.items if name in j.spec.exclude_calendars]
        cursor = page.cursor
        if not cursor:
            break
    return found


Caller = Annotated[Principal, Depends(principal_of)]
_EXAMPLE = {"timezone": "Europe/London", "dates": ["2026-12-25", "2026-12-28", {"from": "2027-04-02",
                                                                                "to": "2027-04-05"}]}


def install(app: FastAPI, service: CalendarService, history: HistoryStore, clock: Clock | None = None) -> None:
    """Register the calendar routes on ``app`` (whose ``state.auth`` is the Authenticator)."""
    now: Callable[[], int] = (clock or SystemClock()).now_ms
    app.state.calendars = service

    @app.get("/v1/calendars", summary="This tenant's exclusion calendars", response_model=None,
             responses={200: {"model": schemas.CalendarList}, **problem_responses(401)})
    def list_calendars(who: Caller) -> dict[str, Any]:
        return service.listing(who.tenant)

    @app.get("/v1/calendars/{name}", summary="One exclusion calendar", response_model=None,
             responses={200: {"model": schemas.CalendarView}, **problem_responses(401, 404, 422)})
    def get_calendar(name: str, who: Caller) -> dict[str, Any]:
        return calendar_to_json(service.get(who.tenant, name))

    @app.put("/v1/calendars/{name}", summary="Create or replace an exclusion calendar",
             description="Dates (or date ranges, both ends included) in the calendar's zone. A job that names the "
             "calendar in `excludeCalendars` records its slots on those dates skipped, reason `calendar <name>`. "
             "A change applies to the slots the scheduler has not triggered yet (its lookahead: 30 s).",
             response_model=None,
             responses={200: {"model": schemas.CalendarView}, **problem_responses(401, 413, 422, 503)},
             openapi_extra=request_body(schemas.CalendarInput, example=_EXAMPLE))
    async def put_calendar(name: str, request: Request, who: Caller) -> dict[str, Any]:
        body = parse_json(await read_bounded(request, BODY_MAX_BYTES))
        return await run_in_threadpool(service.put, who.tenant, name, body, now())

    @app.delete("/v1/calendars/{name}", summary="Delete an exclusion calendar no job names", response_model=None,
                responses={200: {"model": schemas.CalendarDeleted}, **problem_responses(401, 404, 409, 422, 503)})
    def delete_calendar(name: str, who: Caller) -> dict[str, Any]:
        return service.delete(who.tenant, name, lambda: jobs_naming(history, who.tenant, name))
