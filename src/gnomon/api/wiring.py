"""Build the production API: Kafka producer, Cassandra history, tokens from config.

The producer's delivery timeout (``message.timeout.ms``) is set here explicitly and the
command sinks are told about it: a send that fails is answered 503 only after that long,
when the producer has given up on the message, so a client retrying at once (with the
same idempotency key) never races a send the producer is still retrying.

Tenant limits and usage (gnomon.tenants, gnomon.tenant-usage) are read to the end before
the API serves (``TenantFeed.load``), then polled on a daemon thread (``TenantPoller``).
"""

from __future__ import annotations

import os

from fastapi import FastAPI

from gnomon.adapters.kafka import SyncProducer
from gnomon.api.app import CommandSink, create_app
from gnomon.api.auth import Authenticator, load_principals
from gnomon.api.tenants import TenantPoller, TenantService
from gnomon.config import Settings
from gnomon.core.clock import SystemClock
from gnomon.core.tenants import TenantBook
from gnomon.core.usage import UsageBook
from gnomon.topology import load_topology

DELIVERY_TIMEOUT_ENV = "GNOMON_API_DELIVERY_TIMEOUT_MS"
DELIVERY_TIMEOUT_MS_DEFAULT = 10_000  # how long a client may wait for an answer while Kafka is away
KAFKA_ROLE_DEFAULT = "api"  # the Kafka principal with the API's ACLs (gnomon.infra.acls)
TENANTS_LOAD_TIMEOUT_S = 30.0


def delivery_timeout_ms() -> int:
    raw = os.environ.get(DELIVERY_TIMEOUT_ENV, "").strip()
    if not raw:
        return DELIVERY_TIMEOUT_MS_DEFAULT
    if not raw.isdigit() or not 1000 <= int(raw) <= 300_000:
        raise SystemExit(f"gnomon: {DELIVERY_TIMEOUT_ENV}={raw!r} must be milliseconds between 1000 and 300000")
    return int(raw)


def build_app(settings: Settings, *, dev: bool | None = None) -> FastAPI:
    """``dev``: allow the dev token when ``GNOMON_API_TOKENS`` is unset (default: ``GNOMON_DEV=1``)."""
    from gnomon.history.cassandra import CassandraHistoryStore
    from gnomon.streams.tenant_feed import TenantFeed

    auth = Authenticator.from_hashes(load_principals(settings, dev=dev))  # refuse to start before connecting
    topo = load_topology()
    history = CassandraHistoryStore(settings.cassandra_hosts, settings.cassandra_port, ensure_schema=True)
    timeout_ms = delivery_timeout_ms()
    role = os.environ.get("GNOMON_KAFKA_ROLE") or KAFKA_ROLE_DEFAULT
    producer = SyncProducer(settings.kafka_bootstrap, role=role, **{"message.timeout.ms": timeout_ms})
    sink = CommandSink(producer, topo.job_commands, delivery_timeout_s=timeout_ms / 1000)
    clock = SystemClock()
    book, usage = TenantBook(), UsageBook()
    feed = TenantFeed(settings.kafka_bootstrap, topo, book, usage, clock, role=role)
    feed.load(TENANTS_LOAD_TIMEOUT_S)
    tenants = TenantService(book, usage, writer=producer, topic=topo.tenants, feed=feed)
    TenantPoller(tenants).start()
    return create_app(history=history, commands=sink, auth=auth,
                      topology=topo, clock=clock, tenants=tenants)
