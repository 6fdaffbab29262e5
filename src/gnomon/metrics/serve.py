"""Serve a registry's /metrics on a port of its own (the processor, the worker, the
projector). Metrics must never stop a service: a port that cannot be bound is logged
and the process goes on without one."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import (
    CollectorRegistry,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    make_wsgi_app,
    start_http_server,
)

Health = Callable[[], tuple[bool, dict[str, object]]]  # healthy?, and what /healthz says

log = logging.getLogger("gnomon.metrics")

# Default ports per process kind, and how many ports after the default a process tries
# when the one before is taken (several workers or processors on one box). A port set
# explicitly (flag or environment) is tried alone.
DEFAULT_PORTS = {"processor": 9470, "projector": 9480, "worker": 9490}
PORT_SPAN = {"processor": 10, "projector": 10, "worker": 20}


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"


def candidate_ports(kind: str, port: int | None) -> list[int]:
    """The ports to try for ``kind``: ``port`` alone when given (0: none), else the
    kind's default and the ports after it."""
    if port is not None:
        return [port] if port > 0 else []
    base = DEFAULT_PORTS[kind]
    return list(range(base, base + PORT_SPAN[kind]))


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def health_app(registry: CollectorRegistry, health: Health) -> Callable[..., Iterable[bytes]]:
    """/healthz answers ``health()`` as JSON (200 healthy, 503 not); every other path the metrics."""
    metrics = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == "/healthz":
            ok, body = health()
            data = json.dumps(body).encode()
            start_response("200 OK" if ok else "503 Service Unavailable",
                           [("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
            return [data]
        result: Iterable[bytes] = metrics(environ, start_response)
        return result

    return app


def _start(registry: CollectorRegistry, port: int, host: str, health: Health | None) -> None:
    if health is None:
        start_http_server(port, addr=host, registry=registry)
        return
    server = make_server(host, port, health_app(registry, health), _ThreadingServer, handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, name="gnomon-metrics", daemon=True).start()


def serve(registry: CollectorRegistry, kind: str, *, port: int | None, host: str = "127.0.0.1",
          process_metrics: bool = True, health: Health | None = None) -> Endpoint | None:
    """Start a daemon HTTP server for ``registry`` on the first free port of
    ``candidate_ports``; None (logged) if there is none, or metrics are off. ``health``:
    also answer /healthz (200 or 503, JSON)."""
    ports = candidate_ports(kind, port)
    if not ports:
        log.info("%s metrics off (port 0)", kind)
        return None
    if process_metrics:
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        GCCollector(registry=registry)
    last: OSError | None = None
    for p in ports:
        try:
            _start(registry, p, host, health)
        except OSError as exc:
            last = exc
            continue
        endpoint = Endpoint(host, p)
        log.info("%s metrics on %s", kind, endpoint.url)
        return endpoint
    log.warning("%s metrics not served: no free port in %s (%s); set another with --metrics-port",
                kind, ports if len(ports) == 1 else f"{ports[0]}-{ports[-1]}", last)
    return None
