"""Tenants in the API: admin endpoints for limits, a tenant's own view.

``TenantService`` holds the API's copy of ``gnomon.tenants`` (a ``TenantBook``) and of
``gnomon.tenant-usage`` (a ``UsageBook``), both filled by a ``TenantFeed``
(``feeds/tenants.py``; ``poll`` from a background thread, see ``TenantPoller``),
and writes limit records for the admin endpoints. Admission (``core.admission``) is the
processors': a job write answers their ``LimitExceeded`` refusal (429 with Retry-After or
422, ``problems.limit_problem``; docs/answers.md). Only the batch still answers an item
over a limit early, from ``limits_and_totals`` (counts that may lag by a poll).

Routes (``install``):

* ``GET /v1/tenants``, ``GET|PUT|DELETE /v1/tenants/{tenant}``: the admin role only
  (a token entry ending in ``:admin``, see ``web/auth.py``), 403 for other tokens.
  ``{tenant}`` ``*`` is the defaults record. PUT merges the given camelCase limits into
  the tenant's current ones (its own record, else the defaults); DELETE tombstones the
  record, returning the tenant to the defaults.
* ``GET /v1/tenant``: the caller's own limits and usage.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Path, Request, Security
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPBearer

from gnomon import codec
from gnomon.api import schemas
from gnomon.api.openapi import problem_responses, request_body
from gnomon.api.polling import POLL_INTERVAL_S, FeedPoller
from gnomon.core.clock import Clock, SystemClock, ms_to_iso
from gnomon.core.errors import EventLogError, ValidationError
from gnomon.core.tenants import (
    DEFAULTS_KEY,
    LIMIT_BOUNDS,
    TenantBook,
    TenantLimits,
    check_tenant_name,
)
from gnomon.core.usage import UsageBook
from gnomon.topology import load_topology
from gnomon.web.auth import Authenticator, Principal
from gnomon.web.body import BODY_MAX_BYTES, parse_json, read_bounded
from gnomon.web.problems import Forbidden

__all__ = ["LIMIT_FIELDS", "TenantPoller", "TenantService", "install", "limit_responses"]

log = logging.getLogger("gnomon.api")

# API field (camelCase) -> TenantLimits field
LIMIT_FIELDS: dict[str, str] = {
    "concurrencyMax": "concurrency_max",
    "jobsMax": "jobs_max",
    "intervalMinS": "interval_min_s",
    "backlogMax": "backlog_max",
    "triggersPerMinMax": "triggers_per_min_max",
}
_API_NAME = {snake: camel for camel, snake in LIMIT_FIELDS.items()}
assert set(LIMIT_FIELDS.values()) == set(LIMIT_BOUNDS), "LIMIT_FIELDS must cover core.tenants.LIMIT_BOUNDS"
class TenantService:
    """The API's tenants: books, the limit writer, the limits and usage the batch's early
    answers read (admission itself is the processors'). Thread-safe (one lock around
    the books; handlers run in the thread pool)."""

    def __init__(self, book: TenantBook | None = None, usage: UsageBook | None = None, *,
                 writer: Any = None, topic: str | None = None, feed: Any = None) -> None:
        """``writer``: ``send(topic, key, value_or_None)`` acknowledged by Kafka (a
        ``SyncProducer``); None: limits cannot be changed (503). ``topic``: where limits
        are written (default: the topology's tenants topic). ``feed``: a
        ``TenantFeed`` (or anything with ``poll()``) that fills ``book`` and ``usage``."""
        self.book = book or TenantBook()
        self.usage = usage or UsageBook()
        self.writer = writer
        self.topic = topic if topic is not None else load_topology().tenants
        self.feed = feed
        self.lock = threading.Lock()

    def poll(self) -> int:
        """Apply what the feed has (non-blocking); how many records."""
        if self.feed is None:
            return 0
        with self.lock:
            return int(self.feed.poll())

    # ---- reads -------------------------------------------------------------------------

    def limits(self, tenant: str) -> TenantLimits:
        with self.lock:
            return self.book.limits(tenant)

    def view(self, tenant: str) -> dict[str, Any]:
        with self.lock:
            return self._view(tenant)

    def _view(self, tenant: str) -> dict[str, Any]:
        limits = self.book.limits(tenant)
        totals = self.usage.totals(tenant)
        return {
            "tenant": tenant,
            "configured": self.book.configured(tenant),
            "limits": limits_json(limits),
            "updatedAt": ms_to_iso(limits.updated_at_ms) if limits.updated_at_ms else None,
            "usage": {"jobs": totals["jobs"], "backlog": totals["backlog"], "running": totals["running"],
                      "triggersLastMin": totals["triggers_last_min"],
                      "countedAt": ms_to_iso(totals["at_ms"]) if totals["at_ms"] else None},
        }

    def list_view(self) -> dict[str, Any]:
        with self.lock:
            names = {t.tenant for t in self.book.all()} | set(self.usage.tenants())
            names.discard(DEFAULTS_KEY)
            return {"defaults": limits_json(self.book.defaults()),
                    "items": [self._view(t) for t in sorted(names)]}

    # ---- admin writes ------------------------------------------------------------------

    def put(self, tenant: str, body: Any, now_ms: int) -> dict[str, Any]:
        """Merge ``body`` (camelCase limits, any subset) into the tenant's current limits,
        write the record, and return the new view."""
        check_tenant_name(tenant)
        changes = parse_limits_body(body)
        with self.lock:
            current = self.book.limits(tenant)
            if not self.book.configured(tenant) and len(self.book.all()) >= self.book.tenants_max:
                raise ValidationError("tenant", f"more than {self.book.tenants_max} tenants configured")
        try:
            new = TenantLimits(tenant, **{**current.limits(), **changes}, updated_at_ms=now_ms)
        except ValidationError as exc:
            raise ValidationError(_API_NAME.get(exc.field, exc.field), exc.message) from None
        self._write(tenant, codec.encode(new, self.topic))
        with self.lock:
            self.book.apply(tenant, new)  # read-your-writes here; the feed applies the same record again
            return self._view(tenant)

    def reset(self, tenant: str) -> dict[str, Any]:
        """Tombstone the tenant's record (back to the defaults; ``*``: to the built-in
        defaults) and return the new view."""
        check_tenant_name(tenant)
        self._write(tenant, None)
        with self.lock:
            self.book.apply(tenant, None)
            return self._view(tenant)

    def _write(self, tenant: str, value: bytes | None) -> None:
        if self.writer is None:
            raise EventLogError(f"this API instance cannot write {self.topic}")
        self.writer.send(self.topic, tenant, value)

    # ---- the batch's early answers (api.batch; admission itself is the processors') -------

    def limits_and_totals(self, tenant: str, now_ms: int) -> tuple[TenantLimits, dict[str, int]]:
        """The tenant's limits and its usage (``UsageBook.totals``), read together."""
        with self.lock:
            return self.book.limits(tenant), self.usage.totals(tenant, now_ms)


def limits_json(limits: TenantLimits) -> dict[str, int]:
    return {camel: getattr(limits, snake) for camel, snake in LIMIT_FIELDS.items()}


def parse_limits_body(body: Any) -> dict[str, int]:
    """A PUT body -> {TenantLimits field: value} (bounds are checked by TenantLimits)."""
    if not isinstance(body, dict):
        raise ValidationError("body", "must be a JSON object of limits, e.g. {\"jobsMax\": 100}")
    out: dict[str, int] = {}
    for name, value in body.items():
        if name not in LIMIT_FIELDS:
            raise ValidationError(name, f"unknown field; allowed: {', '.join(LIMIT_FIELDS)}")
        if isinstance(value, bool) or not isinstance(value, int):
            low, high = LIMIT_BOUNDS[LIMIT_FIELDS[name]]
            raise ValidationError(name, f"must be a whole number from {low} to {high}, got {value!r}")
        out[LIMIT_FIELDS[name]] = value
    return out


class TenantPoller(FeedPoller):
    """Polls a ``TenantService``'s feed every ``interval_s`` on a daemon thread."""

    def __init__(self, service: TenantService, interval_s: float = POLL_INTERVAL_S) -> None:
        super().__init__(service, name="gnomon-tenant-feed", what="tenant limits", interval_s=interval_s)


# ---- routes ----------------------------------------------------------------------------

_bearer = HTTPBearer(auto_error=False, scheme_name="bearerAuth", description="an API token")
_STRING = {"schema": {"type": "string"}}


def limit_responses() -> dict[int | str, dict[str, Any]]:
    """``responses=`` entry for a 429 of a tenant limit (add to a job route's)."""
    return {429: {"model": schemas.Problem, "description": "a tenant limit (named in 'limit') refuses it "
                  "for now; retry after Retry-After seconds",
                  "headers": {"Retry-After": {"description": "seconds", **_STRING}}}}


def _admin_problems(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {**problem_responses(*statuses),
            403: {"model": schemas.Problem, "description": "the token does not have the admin role"}}


def principal_of(request: Request, _: Any = Security(_bearer)) -> Principal:
    """The caller (the Security dependency only documents the scheme, as in api/app.py)."""
    auth: Authenticator = request.app.state.auth
    return auth.principal_for(request.headers.get("authorization"))


def admin_of(who: Principal = Depends(principal_of)) -> Principal:
    if not who.admin:
        raise Forbidden("this endpoint needs a token with the admin role")
    return who


# Module level: FastAPI resolves these (string) annotations in the module's namespace.
Caller = Annotated[Principal, Depends(principal_of)]
Admin = Annotated[Principal, Depends(admin_of)]
# Documented only; check_tenant_name checks it with the core's field name and message.
TenantName = Annotated[str, Path(description="a tenant, or '*' for the defaults", json_schema_extra={
    "pattern": r"^(\*|[A-Za-z0-9._-]{1,128})$"})]


def install(app: FastAPI, service: TenantService, clock: Clock | None = None) -> None:
    """Register the tenant routes on ``app`` (whose ``state.auth`` is the Authenticator)."""
    now: Callable[[], int] = (clock or SystemClock()).now_ms
    app.state.tenants = service

    @app.get("/v1/tenant", summary="This tenant's limits and usage", response_model=None,
             responses={200: {"model": schemas.Tenant}, **problem_responses(401)})
    def get_own_tenant(who: Caller) -> dict[str, Any]:
        return service.view(who.tenant)

    @app.get("/v1/tenants", summary="Every configured tenant, and the defaults (admin)", response_model=None,
             responses={200: {"model": schemas.TenantList}, **_admin_problems(401)})
    def list_tenants(_: Admin) -> dict[str, Any]:
        return service.list_view()

    @app.get("/v1/tenants/{tenant}", summary="A tenant's limits and usage (admin; '*': the defaults)",
             response_model=None, responses={200: {"model": schemas.Tenant}, **_admin_problems(401, 422)})
    def get_tenant(tenant: TenantName, _: Admin) -> dict[str, Any]:
        check_tenant_name(tenant)
        return service.view(tenant)

    @app.put("/v1/tenants/{tenant}", summary="Set a tenant's limits (admin; '*': the defaults)",
             description="Limits left out keep their current value (the tenant's own, else the defaults). "
             "Takes effect within a poll on every API and processor instance.",
             response_model=None, responses={200: {"model": schemas.Tenant}, **_admin_problems(401, 413, 422, 503)},
             openapi_extra=request_body(schemas.TenantLimitsInput, example={"jobsMax": 500, "backlogMax": 100}))
    async def put_tenant(tenant: TenantName, request: Request, _: Admin) -> dict[str, Any]:
        body = parse_json(await read_bounded(request, BODY_MAX_BYTES))
        return await run_in_threadpool(service.put, tenant, body, now())

    @app.delete("/v1/tenants/{tenant}", summary="Return a tenant to the defaults (admin)",
                response_model=None, responses={200: {"model": schemas.Tenant}, **_admin_problems(401, 422, 503)})
    def reset_tenant(tenant: TenantName, _: Admin) -> dict[str, Any]:
        return service.reset(tenant)
