"""The tenant's own alert webhook: ``GET|PUT|DELETE /v1/alerts`` (core.alerts).

``AlertService`` holds the API's copy of ``gnomon.alert-configs`` (an ``AlertBook``
filled by an ``AlertFeed``, polled on a daemon thread) and writes config records. Any
tenant token may set its own tenant's config (not another's: the tenant comes from the
token). PUT replaces the config; its body is checked by the core (422 naming ``url``,
``kinds``, ``lateS`` or an unknown field). A URL the alerter's policy refuses is refused at
once: plain http, a port not allowed (``gnomon.alerts.policy``: https's ports by default),
or a host that is a literal address the SSRF guard refuses (loopback, private,
metadata...) unless the operator allowed its network (``GNOMON_ALERT_ALLOWED_CIDRS``, as
the alerter). A name is resolved and checked by the alerter at every call.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Annotated, Any
from urllib.parse import urlsplit

import httpx
from fastapi import Depends, FastAPI, Request
from fastapi.concurrency import run_in_threadpool

from gnomon import codec
from gnomon.alerts.policy import http_policy
from gnomon.api import schemas
from gnomon.api.openapi import problem_responses, request_body
from gnomon.api.polling import POLL_INTERVAL_S, FeedPoller
from gnomon.api.tenants import principal_of
from gnomon.core.alerts import ALL_KINDS, AlertBook, AlertConfig, check_url
from gnomon.core.clock import Clock, SystemClock, ms_to_iso
from gnomon.core.errors import EventLogError, ValidationError
from gnomon.core.validation import check_late_s
from gnomon.outbound.http import HttpPolicy
from gnomon.outbound.netguard import literal_address, refusal
from gnomon.topology import load_topology
from gnomon.web.auth import Principal
from gnomon.web.body import BODY_MAX_BYTES, closed_object, parse_json, read_bounded

__all__ = ["AlertPoller", "AlertService", "install", "parse_alert_body"]

log = logging.getLogger("gnomon.api")
_FIELDS = ("kinds", "lateS", "url")  # (sorted: the order a refusal lists them in)


def parse_alert_body(body: Any, tenant: str, now_ms: int, policy: HttpPolicy | None = None) -> AlertConfig:
    """A PUT body -> the tenant's ``AlertConfig``, or ``ValidationError`` naming the field.
    ``policy``: the alerter's (``gnomon.alerts.policy.http_policy``; default https only to
    public addresses on https's ports)."""
    policy = policy or HttpPolicy()
    body = closed_object(body, _FIELDS, must_be='must be a JSON object, e.g. {"url": "https://example.com/alerts"}')
    if "url" not in body:
        raise ValidationError("url", "is required")
    url = check_url(body["url"])
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise ValidationError("url", f"not a URL: {exc}") from None
    scheme_or_port = policy.url_refusal(parsed)
    if scheme_or_port is not None:
        raise ValidationError("url", scheme_or_port.replace("the policy's ", "the alert policy's "))
    host = urlsplit(url).hostname or ""
    address = literal_address(host)
    if address is not None:
        why = refusal(address, allow_private=False, allowed=policy.networks)
        if why is not None:
            raise ValidationError("url", f"{address} is {why.replace('pool policy', 'the alert policy')}")
    kinds = body.get("kinds", list(ALL_KINDS))
    if not isinstance(kinds, list) or not all(isinstance(k, str) and k in ALL_KINDS for k in kinds):
        raise ValidationError("kinds", f"must be a list of {', '.join(ALL_KINDS)}")
    if len(set(kinds)) != len(kinds):
        raise ValidationError("kinds", "must not repeat a kind")
    late_s = check_late_s(body.get("lateS"), "lateS")
    return AlertConfig(tenant, url, tuple(kinds), late_s, now_ms)


def config_json(tenant: str, config: AlertConfig | None) -> dict[str, Any]:
    if config is None:
        return {"tenant": tenant, "configured": False, "url": None, "kinds": [], "lateS": None, "updatedAt": None}
    return {"tenant": tenant, "configured": True, "url": config.url, "kinds": list(config.kinds),
            "lateS": config.late_s, "updatedAt": ms_to_iso(config.updated_at_ms) if config.updated_at_ms else None}


class AlertService:
    """Thread-safe (one lock around the book; handlers run in the thread pool)."""

    def __init__(self, book: AlertBook | None = None, *, writer: Any = None, topic: str | None = None,
                 feed: Any = None, policy: HttpPolicy | None = None) -> None:
        """``writer``: ``send(topic, key, value_or_None)`` acknowledged by Kafka (a
        ``SyncProducer``); None: configs cannot be changed (503). ``policy``: what a webhook
        URL may be (default: the alerter's, from the environment: ``http_policy``)."""
        self.book = book or AlertBook()
        self.writer = writer
        self.topic = topic if topic is not None else load_topology().alert_configs
        self.feed = feed
        self.policy = http_policy() if policy is None else policy
        self.lock = threading.Lock()

    def poll(self) -> int:
        if self.feed is None:
            return 0
        with self.lock:
            return int(self.feed.poll())

    def view(self, tenant: str) -> dict[str, Any]:
        with self.lock:
            return config_json(tenant, self.book.get(tenant))

    def put(self, tenant: str, body: Any, now_ms: int) -> dict[str, Any]:
        config = parse_alert_body(body, tenant, now_ms, self.policy)
        with self.lock:
            if self.book.get(tenant) is None and len(self.book) >= self.book.tenants_max:
                raise ValidationError("tenant", f"more than {self.book.tenants_max} tenants with alerts")
        self._write(tenant, codec.encode(config, self.topic))
        with self.lock:
            self.book.apply(tenant, config)  # read-your-writes; the feed applies the same record again
            return config_json(tenant, config)

    def delete(self, tenant: str) -> dict[str, Any]:
        self._write(tenant, None)
        with self.lock:
            self.book.apply(tenant, None)
            return config_json(tenant, None)

    def _write(self, tenant: str, value: bytes | None) -> None:
        if self.writer is None:
            raise EventLogError(f"this API instance cannot write {self.topic}")
        self.writer.send(self.topic, tenant, value)


class AlertPoller(FeedPoller):
    """Polls an ``AlertService``'s feed every ``interval_s`` on a daemon thread."""

    def __init__(self, service: AlertService, interval_s: float = POLL_INTERVAL_S) -> None:
        super().__init__(service, name="gnomon-alert-feed", what="alert configs", interval_s=interval_s)


Caller = Annotated[Principal, Depends(principal_of)]


def install(app: FastAPI, service: AlertService, clock: Clock | None = None) -> None:
    """Register the alert routes on ``app`` (whose ``state.auth`` is the Authenticator)."""
    now: Callable[[], int] = (clock or SystemClock()).now_ms
    app.state.alerts = service

    @app.get("/v1/alerts", summary="This tenant's alert webhook", response_model=None,
             responses={200: {"model": schemas.AlertConfigView}, **problem_responses(401)})
    def get_alerts(who: Caller) -> dict[str, Any]:
        return service.view(who.tenant)

    @app.put("/v1/alerts", summary="Set this tenant's alert webhook",
             description="Replaces the config. The alerter calls the URL (POST, signed like HTTP targets with the "
             "tenant's http-signing-key, Idempotency-Key = the alert's key) when a run is dead-lettered, a slot is "
             "skipped, or a run starts later than its threshold. Takes effect within a poll.",
             response_model=None,
             responses={200: {"model": schemas.AlertConfigView}, **problem_responses(401, 413, 422, 503)},
             openapi_extra=request_body(schemas.AlertConfigInput, example={
                 "url": "https://ops.example.com/gnomon-alerts", "kinds": ["dead_letter", "late"], "lateS": 60}))
    async def put_alerts(request: Request, who: Caller) -> dict[str, Any]:
        body = parse_json(await read_bounded(request, BODY_MAX_BYTES))
        return await run_in_threadpool(service.put, who.tenant, body, now())

    @app.delete("/v1/alerts", summary="Turn this tenant's alerts off", response_model=None,
                responses={200: {"model": schemas.AlertConfigView}, **problem_responses(401, 503)})
    def delete_alerts(who: Caller) -> dict[str, Any]:
        return service.delete(who.tenant)
