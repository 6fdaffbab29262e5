"""Build the production API: Kafka producer, Cassandra history, tokens from config.

The producer's delivery timeout (``message.timeout.ms``) is set here explicitly and the
command sinks are told about it: a send that fails is answered 503 only after that long,
when the producer has given up on the message, so a client retrying at once (with the
same idempotency key) never races a send the producer is still retrying.

Every job write waits for the processor's answer (``api.answers``): a reader of the
command-results topic starts at its end before the app is returned.

Tenant limits and usage (gnomon.tenants, gnomon.tenant-usage) are read to the end before
the API serves (``TenantFeed.load``), then polled on a daemon thread (``TenantPoller``).

``gnomon api --workers N`` runs N processes on one port (uvicorn's supervisor); each
calls ``app_from_env`` (``APP_FACTORY``), so each has its own producer, Cassandra
session and tenant feed. Python serves one request at a time per process, so the read
path scales with processes, not threads (docs/benchmarks.md, "Read path").
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI

from gnomon.api.answers import CommandAnswers
from gnomon.api.app import CommandSink, create_app
from gnomon.api.tenants import TenantPoller, TenantService
from gnomon.config import Settings, load
from gnomon.core.clock import SystemClock
from gnomon.core.errors import HistoryStoreError
from gnomon.core.tenants import TenantBook
from gnomon.core.usage import UsageBook
from gnomon.eventlog.kafka import SyncProducer
from gnomon.topology import Topology, load_topology
from gnomon.web.auth import Authenticator, load_principals

DELIVERY_TIMEOUT_ENV = "GNOMON_API_DELIVERY_TIMEOUT_MS"
DELIVERY_TIMEOUT_MS_DEFAULT = 10_000  # how long a client may wait for an answer while Kafka is away
KAFKA_ROLE_DEFAULT = "api"  # the Kafka principal with the API's ACLs (gnomon.infra.acls)
TENANTS_LOAD_TIMEOUT_S = 30.0
WORKERS_ENV = "GNOMON_API_WORKERS"
RUNS_CACHE_ENV = "GNOMON_API_RUNS_CACHE_MS"
RUNS_CACHE_MS_DEFAULT = 1000  # the status page's runs are at most this much older than history
APP_FACTORY = "gnomon.api.wiring:app_from_env"  # for uvicorn(..., factory=True)
ANSWER_TIMEOUT_ENV = "GNOMON_API_ANSWER_TIMEOUT_MS"
ANSWER_TIMEOUT_MS_DEFAULT = 5000
ANSWERS_GROUP = "gnomon-api-answers"  # librdkafka wants one; assigned partitions, nothing committed

log = logging.getLogger(__name__)


def api_workers() -> int:
    """``$GNOMON_API_WORKERS`` (1-64), default 1."""
    raw = os.environ.get(WORKERS_ENV, "").strip()
    if not raw:
        return 1
    if not raw.isdigit() or not 1 <= int(raw) <= 64:
        raise SystemExit(f"gnomon: {WORKERS_ENV}={raw!r} must be a number of processes from 1 to 64")
    return int(raw)


def runs_cache_ms() -> int:
    """``$GNOMON_API_RUNS_CACHE_MS`` (0-60000; 0: no cache), default 1000."""
    raw = os.environ.get(RUNS_CACHE_ENV, "").strip()
    if not raw:
        return RUNS_CACHE_MS_DEFAULT
    if not raw.isdigit() or not 0 <= int(raw) <= 60_000:
        raise SystemExit(f"gnomon: {RUNS_CACHE_ENV}={raw!r} must be milliseconds from 0 to 60000")
    return int(raw)


def serve(*, host: str, port: int, workers: int = 1, access_log: bool = True,
          tls: tuple[Path, Path] | None = None) -> None:
    """Serve ``app_from_env`` with uvicorn: in this process, or in ``workers`` processes
    sharing one listening socket. ``tls``: (certificate chain, key) PEM files: HTTPS only.

    With several workers uvicorn binds that socket itself with protocol 0, and asyncio
    then leaves Nagle's algorithm on for the connections it accepts (it sets TCP_NODELAY
    only on sockets whose protocol is IPPROTO_TCP): uvicorn writes a response's head and
    body separately, so each keep-alive response waited for the client's delayed ACK
    (measured: 1,894 -> 623 requests/s, p50 15 -> 48 ms). ``_TcpConfig`` binds it as TCP."""
    ssl: dict[str, Any] = {} if tls is None else {"ssl_certfile": str(tls[0]), "ssl_keyfile": str(tls[1])}
    if workers <= 1:
        uvicorn.run(APP_FACTORY, factory=True, host=host, port=port, log_level="info", access_log=access_log, **ssl)
        return
    from uvicorn.supervisors import Multiprocess

    from gnomon.metrics.api import multiprocess_dir

    config = _TcpConfig(APP_FACTORY, factory=True, host=host, port=port, workers=workers, log_level="info",
                        access_log=access_log, **ssl)
    with multiprocess_dir():  # the workers' /metrics report all of them
        Multiprocess(config, sockets=[config.bind_socket()]).run()


class _TcpConfig(uvicorn.Config):
    """uvicorn's Config, binding its listening socket as TCP (see ``serve``)."""

    def bind_socket(self) -> socket.socket:
        family = socket.AF_INET6 if self.host and ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # Linux: accepted sockets inherit it too
        try:
            sock.bind((self.host, self.port))
        except OSError as exc:
            sock.close()
            raise SystemExit(f"gnomon: cannot listen on {self.host}:{self.port}: {exc}") from exc
        log.info("API listening on %s://%s:%d (%d workers)", "https" if self.ssl_certfile else "http", self.host,
                 sock.getsockname()[1], self.workers)
        sock.set_inheritable(True)
        return sock


def app_from_env() -> FastAPI:
    """The production app from the environment alone (``gnomon.config.load()``; dev mode
    from ``GNOMON_DEV``): what every API worker process builds. SIGUSR1 writes every
    thread's stack to its stderr (its log) and goes on, as for the other processes:
    where a request that hangs waits."""
    from gnomon import stacks
    from gnomon.codec.remote import install_registry_source

    stacks.dump_on_sigusr1()
    settings = load()
    install_registry_source(settings)  # a newer release's schema ids, during a rolling upgrade (schemas/README.md)
    return build_app(settings)


def delivery_timeout_ms() -> int:
    raw = os.environ.get(DELIVERY_TIMEOUT_ENV, "").strip()
    if not raw:
        return DELIVERY_TIMEOUT_MS_DEFAULT
    if not raw.isdigit() or not 1000 <= int(raw) <= 300_000:
        raise SystemExit(f"gnomon: {DELIVERY_TIMEOUT_ENV}={raw!r} must be milliseconds between 1000 and 300000")
    return int(raw)


def build_app(settings: Settings, *, dev: bool | None = None) -> FastAPI:
    """``dev``: allow the dev token when ``GNOMON_API_TOKENS`` is unset (default: ``GNOMON_DEV=1``)."""
    if not logging.getLogger().handlers:  # (each of ``--workers`` builds its own app): gnomon's
        from gnomon.logs import configure  # lines beside uvicorn's, from INFO (were WARNING only)

        configure(logging.INFO)
    from gnomon.alerts.feed import AlertFeed
    from gnomon.api.alerts import AlertPoller, AlertService
    from gnomon.api.calendars import CalendarService
    from gnomon.command_keys import Signer, keys_dir
    from gnomon.core.alerts import AlertBook
    from gnomon.core.calendars import CalendarBook
    from gnomon.feeds.tenants import TenantFeed
    from gnomon.history.cassandra import CassandraHistoryStore

    auth = Authenticator.from_hashes(load_principals(settings, dev=dev))  # refuse to start before connecting
    cache_s = runs_cache_ms() / 1000
    topo = load_topology()
    history = CassandraHistoryStore(settings.cassandra_hosts, settings.cassandra_port, ensure_schema=True)
    threading.Thread(target=_connect_early, args=(history,), name="cassandra-connect", daemon=True).start()
    timeout_ms = delivery_timeout_ms()
    role = os.environ.get("GNOMON_KAFKA_ROLE") or KAFKA_ROLE_DEFAULT
    producer = SyncProducer(settings.kafka_bootstrap, role=role, **{"message.timeout.ms": timeout_ms})
    # the API signs each command with its tenant's key, issuing a tenant's first key (ADR 0006)
    signer = Signer(keys_dir(settings), issue=True)
    sink = CommandSink(producer, topo.job_commands, delivery_timeout_s=timeout_ms / 1000, sign=signer.headers)
    clock = SystemClock()
    book, usage, calendar_book = TenantBook(), UsageBook(), CalendarBook()
    feed = TenantFeed(settings.kafka_bootstrap, topo, book, usage, clock, role=role, calendars=calendar_book)
    feed.load(TENANTS_LOAD_TIMEOUT_S)
    tenants = TenantService(book, usage, writer=producer, topic=topo.tenants, feed=feed)
    TenantPoller(tenants).start()
    alert_feed = AlertFeed(settings.kafka_bootstrap, topo, AlertBook(), role=role)
    alert_feed.load(TENANTS_LOAD_TIMEOUT_S)
    alerts = AlertService(alert_feed.book, writer=producer, topic=topo.alert_configs, feed=alert_feed)
    AlertPoller(alerts).start()
    answers = command_answers(settings, topo, role)
    calendars = CalendarService(calendar_book, writer=producer, topic=topo.calendars)  # (the tenant feed fills it)
    return create_app(history=history, commands=sink, auth=auth, topology=topo, clock=clock, tenants=tenants,
                      runs_cache_s=cache_s, alerts=alerts, calendars=calendars, answers=answers,
                      answer_timeout_s=answer_timeout_ms() / 1000)


def answer_timeout_ms() -> int:
    """``$GNOMON_API_ANSWER_TIMEOUT_MS`` (100-60000), default 5000: how long a write
    waits for the processor's answer before it answers 202 (``api.answers``)."""
    raw = os.environ.get(ANSWER_TIMEOUT_ENV, "").strip()
    if not raw:
        return ANSWER_TIMEOUT_MS_DEFAULT
    if not raw.isdigit() or not 100 <= int(raw) <= 60_000:
        raise SystemExit(f"gnomon: {ANSWER_TIMEOUT_ENV}={raw!r} must be milliseconds between 100 and 60000")
    return int(raw)


def command_answers(settings: Settings, topo: Topology, role: str) -> CommandAnswers:
    """The reader of the processor's answers, from the command-results topic's current
    end (before the API takes its first write)."""
    from gnomon.eventlog.kafka import KafkaEventLog

    reader = KafkaEventLog(settings.kafka_bootstrap, role=role).reader(
        ANSWERS_GROUP, client_id="gnomon-api-answers", config={"enable.partition.eof": False,
                                                             "fetch.wait.max.ms": 10})
    return CommandAnswers(reader, topo.command_results, topo.partitions).start(TENANTS_LOAD_TIMEOUT_S)


def _connect_early(history: object) -> None:
    """Connect before the first request needs it (the store also connects on first use,
    so a Cassandra that is not up yet only means 503s until it is)."""
    began = time.monotonic()
    try:
        history.connect()  # type: ignore[attr-defined]
        log.info("history store connected in %.1f s: ready (/readyz)", time.monotonic() - began)
    except HistoryStoreError as exc:
        log.warning("history store not reachable yet (requests will retry): %s", exc)
