"""Kafka Connect (standalone) exports run-ledger records that decode back to RunStates.

Runs its own worker (free REST port, state under tmp_path, the jars already fetched into
the real state dir) with the shipped ``history-runs-file-sink`` connector pointed at a
throwaway ``connecttest.*`` topic; the topic and the sink's consumer group are deleted at
the end. The worker authenticates as the Kafka role ``connect``; the test grants that
role READ on its throwaway topic for the duration (and removes it after).
"""

from __future__ import annotations

import contextlib
import dataclasses
import socket
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import KafkaException, Producer

from gnomon.codec import encode
from gnomon.config import Settings
from gnomon.core.model import JobSpec, Schedule, Target, TargetType
from gnomon.core.runs import RunState, RunStatus
from gnomon.infra import connect, fetch, kafka

pytestmark = pytest.mark.integration

BUDGET_S = 90.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _runs(tag: str) -> list[RunState]:
    spec = JobSpec(
        name=f"export-{tag}",
        schedule=Schedule(cron="*/5 * * * *", tz="UTC"),
        target=Target(TargetType.COMMAND, argv=("echo", "hi")),
        payload_json='{"n":1}',
    )
    base = RunState(
        run_id=f"acme.export-{tag}@2024-01-01T00:00:00Z",
        job_id=f"acme.export-{tag}",
        tenant="acme",
        spec=spec,
        slot_ms=1_704_067_200_000,
        not_before_ms=1_704_067_200_000,
        manual=False,
        status=RunStatus.SCHEDULED,
        created_at_ms=1_704_067_100_000,
        updated_at_ms=1_704_067_100_000,
    )
    running = dataclasses.replace(
        base,
        status=RunStatus.RUNNING,
        attempt=1,
        token=1,
        worker_id="w-1",
        lease_until_ms=1_704_067_230_000,
        deadline_ms=1_704_067_500_000,
        started_at_ms=1_704_067_200_500,
        updated_at_ms=1_704_067_200_500,
    )
    failed = dataclasses.replace(
        running,
        status=RunStatus.FAILED,
        finished_at_ms=1_704_067_260_000,
        exit_code=3,
        error="boom: ünïcode and\nnewline",
        reason="exit code 3",
        updated_at_ms=1_704_067_260_000,
    )
    other = dataclasses.replace(
        base,
        run_id=f"acme.export-{tag}@manual:k1",
        manual=True,
        status=RunStatus.SUCCEEDED,
        finished_at_ms=1_704_067_300_000,
        exit_code=0,
    )
    return [base, running, failed, other]


def test_file_sink_exports_decodable_run_states(infra: Settings, tmp_path: Path) -> None:
    started = time.monotonic()
    tag = uuid.uuid4().hex[:8]
    topic = f"connecttest.runs.{tag}"
    name = f"connecttest-runs-{tag}"
    bootstrap = infra.kafka_bootstrap
    admin = kafka.admin(bootstrap)
    lib = fetch.fetch(infra.state_dir, connect.COMPONENT, connect.LABEL)  # no-op once fetched
    settings = Settings(state_dir=tmp_path, credentials_path=infra.credentials_dir)
    port = _free_port()
    runs = _runs(tag)

    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        AclBinding,
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        NewTopic,  # type: ignore[attr-defined]
        ResourcePatternType,
        ResourceType,
    )

    from gnomon.adapters.kafka import security_config

    admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])[topic].result(
        timeout=20
    )
    acl = (ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, f"User:{connect.ROLE}", "*",
           AclOperation.READ, AclPermissionType.ALLOW)
    for future in admin.create_acls([AclBinding(*acl)]).values():
        future.result(timeout=20)
    try:
        producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", **security_config()})
        # A tombstone first, on the same key (so same partition) as records after it: once
        # those are exported the tombstone was processed, and must have left no line.
        producer.produce(topic, key=runs[0].run_id.encode(), value=None)
        for run in runs:
            producer.produce(topic, key=run.run_id.encode(), value=encode(run, topic="gnomon.runs"))
        assert producer.flush(20) == 0

        override = {"name": name, "topics": topic}
        template = connect.CONNECTORS_DIR / "history-runs-file-sink.properties"
        connect.start(settings, port=port, connectors=[(template, override)], lib=lib)
        try:
            connect.wait_ready(settings, port=port, timeout_s=60)
            st = connect.status(settings)  # the port comes from the rendered config
            assert st["state"] == "up", st
            assert st["connectors"] == {name: "RUNNING"}

            export = tmp_path / "exports" / "runs.b64"
            lines: list[str] = []
            while time.monotonic() - started < BUDGET_S - 10:
                if export.exists():
                    lines = [ln for ln in export.read_text().splitlines() if ln.strip()]
                    if len(lines) >= len(runs):
                        break
                time.sleep(0.3)
            assert len(lines) == len(runs), f"exported {len(lines)} of {len(runs)} records"
            assert "null" not in lines  # the tombstone was filtered out
            assert all(ln.startswith("AAAAA") for ln in lines)  # base64 of magic byte 0 + id

            decoded = connect.read_export(export)
            assert sorted(decoded, key=repr) == sorted(runs, key=repr)
            # per key (= partition) the export keeps topic order: the last state wins
            latest = connect.latest_by_run(decoded)
            assert latest[runs[0].run_id] == runs[2]
            assert latest[runs[3].run_id] == runs[3]
            # the JSON view of a decoded record
            assert '"status": "failed"' in connect.to_json(runs[2])
        finally:
            assert connect.stop(settings)
        assert connect.status(settings) == {"state": "down"}
    finally:
        for future in admin.delete_acls([AclBindingFilter(*acl)]).values():
            future.result(timeout=20)
        for future in admin.delete_topics([topic], operation_timeout=20).values():
            future.result(timeout=25)
        for future in admin.delete_consumer_groups([f"connect-{name}"]).values():
            with contextlib.suppress(KafkaException):  # no group if nothing was consumed
                future.result(timeout=25)
    assert time.monotonic() - started < BUDGET_S
