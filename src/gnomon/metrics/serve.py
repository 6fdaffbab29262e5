"""Serve a registry's /metrics on a port of its own (the processor, the worker, the
projector). Metrics must never stop a service: a port that cannot be bound is logged
and the process goes on without one."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from prometheus_client import (
    CollectorRegistry,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    start_http_server,
)

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


def serve(registry: CollectorRegistry, kind: str, *, port: int | None, host: str = "127.0.0.1",
          process_metrics: bool = True) -> Endpoint | None:
    """Start a daemon HTTP server for ``registry`` on the first free port of
    ``candidate_ports``; None (logged) if there is none, or metrics are off."""
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
            start_http_server(p, addr=host, registry=registry)
        except OSError as exc:
            last = exc
            continue
        endpoint = Endpoint(host, p)
        log.info("%s metrics on %s", kind, endpoint.url)
        return endpoint
    log.warning("%s metrics not served: no free port in %s (%s); set another with --metrics-port",
                kind, ports if len(ports) == 1 else f"{ports[0]}-{ports[-1]}", last)
    return None
