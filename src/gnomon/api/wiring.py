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
    producer = SyncProducer(settings.kafka_bootstrap)
    sink = CommandSink(producer, topo.job_commands)
    run_sink = CommandSink(producer, topo.run_events)
    return create_app(history=history, commands=sink, run_commands=run_sink,
                      auth=Authenticator(load_tokens(settings)), topology=topo)
