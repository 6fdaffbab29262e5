"""The API's metrics, served on its own HTTP port at ``/metrics`` (no token: no tenant
data in it). An ASGI middleware counts every request by method, route *template*
(``/v1/jobs/{job_id}``, never the id itself) and status code, and times it.

Requests the web UI makes to ``/v1`` in process (``gnomon.ui.backend``, addressed to
:data:`IN_PROCESS_HOST`, which no socket can be) are not counted: the UI page request
that made them is.

With ``gnomon api --workers N`` the processes share their counts through files
(prometheus-client's multiprocess mode: ``multiprocess_dir`` sets it up before they
start), so a scrape answered by any of them reports all of them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.multiprocess import MultiProcessCollector

LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
UNMATCHED = "unmatched"  # the route label of a request no route matched (a 404 or 405)
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"  # prometheus-client reads it when it is imported
IN_PROCESS_HOST = "gnomon-ui.internal"  # the UI's in-process calls: ASGI scope server (host, None)


class ApiMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.requests = Counter("gnomon_api_requests", "HTTP requests answered, by route template and status code",
                                ["method", "route", "status"], registry=r)
        self.latency = Histogram("gnomon_api_request_duration_seconds", "Time to answer an HTTP request",
                                 ["method", "route"], buckets=LATENCY_BUCKETS_S, registry=r)
        self.in_flight = Gauge("gnomon_api_requests_in_flight", "HTTP requests being answered", registry=r,
                               multiprocess_mode="livesum")

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        method = method if method in METHODS else "other"
        self.requests.labels(method, route, str(status)).inc()
        self.latency.labels(method, route).observe(seconds)


class MetricsMiddleware:
    """Pure ASGI (no per-request objects beyond a closure): counts after the response."""

    def __init__(self, app: Any, metrics: ApiMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or _in_process(scope):
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # an exception that escapes the app is answered 500 by the server

        async def send_status(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        self.metrics.in_flight.inc()
        try:
            await self.app(scope, receive, send_status)
        finally:
            self.metrics.in_flight.dec()
            route = getattr(scope.get("route"), "path", None) or UNMATCHED  # set by the router that matched
            self.metrics.observe(scope.get("method", ""), route, status, time.perf_counter() - started)


def _in_process(scope: dict[str, Any]) -> bool:
    """A call from within the process (httpx's ASGI transport sets ``server`` from the URL:
    a server behind a socket gets its address, never this name)."""
    server = scope.get("server")
    return isinstance(server, tuple | list) and len(server) == 2 and server[0] == IN_PROCESS_HOST \
        and server[1] is None


def install(app: Any, metrics: ApiMetrics | None = None) -> ApiMetrics:
    """Count ``app``'s requests and serve ``GET /metrics`` (outside the OpenAPI schema)."""
    from starlette.requests import Request
    from starlette.responses import Response

    m = metrics if metrics is not None else ApiMetrics()

    async def scrape(_: Request) -> Response:
        registry = m.registry
        if os.environ.get(MULTIPROC_ENV):  # several API processes: every one's counts
            registry = CollectorRegistry()
            MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    app.add_route("/metrics", scrape, methods=["GET"], include_in_schema=False)
    app.add_middleware(MetricsMiddleware, metrics=m)
    app.state.metrics = m
    return m


@contextlib.contextmanager
def multiprocess_dir() -> Iterator[str]:
    """A fresh directory for the counts of API processes about to be started (they
    inherit the environment), removed when they are gone."""
    path = tempfile.mkdtemp(prefix="gnomon-api-metrics-")
    os.environ[MULTIPROC_ENV] = path
    try:
        yield path
    finally:
        os.environ.pop(MULTIPROC_ENV, None)
        shutil.rmtree(path, ignore_errors=True)
