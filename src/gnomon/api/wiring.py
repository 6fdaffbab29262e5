"""Build the production API: Kafka producer, Cassandra history, tokens from config."""

from __future__ import annotations

from fastapi import FastAPI

from gnomon.adapters.kafka import SyncProducer
from gnomon.api.app import CommandSink, create_app
from gnomon.api.auth import Authenticator, load_tokens
from gnomon.config import Settings
from gnomon.topology import load_topology


def build_app(settings: Settings) -> FastAPI:
    from gnomon.history.cassandra import CassandraHistoryStore

    topo = load_topology()
    history = CassandraHistoryStore(settings.cassandra_hosts, settings.cassandra_port, ensure_schema=True)
    sink = CommandSink(SyncProducer(settings.kafka_bootstrap), topo.job_commands)
    return create_app(history=history, commands=sink, auth=Authenticator(load_tokens(settings)), topology=topo)
