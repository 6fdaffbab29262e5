"""The export pipeline without the scheduler: run states on a ledger topic -> the history
projector (real Cassandra, a throwaway keyspace) -> its exports on an export topic ->
Kafka Connect through gnomon's registry converter and the real registry -> a PostgreSQL
row and a JSON line, one row per run however often the record comes.

Everything is throwaway: topics ``exporttest.<tag>.*`` (deleted at the end; the Connect
role gets READ on the export topic for the duration), a keyspace, a state dir with its own
PostgreSQL and Connect worker (free ports), and a private ``gnomon.registry --memory``.
The jars and plugins come from the real state dir.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
import socket
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gnomon.codec import encode, schema_id_for_topic
from gnomon.config import Settings
from gnomon.core.exports import export_of
from gnomon.core.model import JobSpec, Schedule, Target, TargetType
from gnomon.core.runs import RunState, RunStatus
from gnomon.eventlog.kafka import KafkaEventLog
from gnomon.history.cassandra import CassandraHistoryStore
from gnomon.history.cassandra import connect as cassandra_connect
from gnomon.history.export import RunExportPublisher
from gnomon.history.migrate import migrate
from gnomon.history.projector import HistoryProjector
from gnomon.infra import connect, fetch, kafka, postgres
from gnomon.infra.errors import InfraError
from gnomon.topology import load_topology
from private_registry import private_registry

pytestmark = pytest.mark.integration

T0 = 1_796_083_200_000  # 2026-12-01T00:00:00Z


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _states(tag: str) -> list[RunState]:
    spec = JobSpec(name=f"pipe-{tag}", schedule=Schedule(cron="* * * * *", tz="UTC"),
                   target=Target(TargetType.COMMAND, argv=("true",)), pool="batch")
    base = RunState(run_id=f"acme.pipe-{tag}@2026-12-01T00:00:00Z", job_id=f"acme.pipe-{tag}", tenant="acme",
                    spec=spec, slot_ms=T0, not_before_ms=T0 + 500, manual=False, status=RunStatus.RUNNING,
                    created_at_ms=T0 - 30_000, updated_at_ms=T0 + 800, attempt=1, token=1, worker_id="w",
                    started_at_ms=T0 + 820, attempt_started_at_ms=T0 + 820)
    done = dataclasses.replace(base, status=RunStatus.FAILED, attempt=2, finished_at_ms=T0 + 9_000, exit_code=3,
                               reason="exit code 3", updated_at_ms=T0 + 9_000)
    skipped = dataclasses.replace(base, run_id=f"acme.pipe-{tag}@2026-12-01T00:01:00Z", slot_ms=T0 + 60_000,
                                  status=RunStatus.SKIPPED, attempt=0, started_at_ms=None, reason="paused",
                                  updated_at_ms=T0 + 60_000)
    return [base, done, skipped]


@pytest.fixture
def keyspace(infra: Settings) -> Iterator[str]:
    cluster, session = cassandra_connect(infra.cassandra_hosts, infra.cassandra_port)
    ks = f"gnomon_test_{uuid.uuid4().hex[:12]}"
    try:
        migrate(session, ks)
        yield ks
    finally:
        session.execute(f"DROP KEYSPACE IF EXISTS {ks}", timeout=60)
        cluster.shutdown()


@pytest.fixture
def state_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="gnomon-exporttest-"))
    path.chmod(0o755)  # the postgres user must reach its data dir (pytest's tmp is 0700)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _row(settings: Settings, run_id: str) -> list[str] | None:
    try:
        rows = postgres.query(settings, "SELECT status, slot_ms, slot, attempts, start_lag_ms, reason, pool "
                                        f"FROM gnomon_runs WHERE run_id = '{run_id}'")
    except InfraError as exc:
        if "does not exist" in str(exc):  # the sink creates the table with its first record
            return None
        raise
    return rows[0] if rows else None


def test_projected_final_runs_become_rows_and_json_lines(infra: Settings, keyspace: str, state_dir: Path) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        AclBinding,
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        NewTopic,  # type: ignore[attr-defined]
        ResourcePatternType,
        ResourceType,
    )

    from gnomon.adapters.kafka import producer_config

    tag = uuid.uuid4().hex[:8]
    topo = load_topology()
    topics = {role: f"exporttest.{tag}.{role}" for role in ("jobs", "runs", "logs", "exports")}
    admin = kafka.admin(infra.kafka_bootstrap)
    for f in admin.create_topics([NewTopic(t, num_partitions=1, replication_factor=1)
                                  for t in topics.values()]).values():
        f.result(timeout=20)
    acl = AclBinding(ResourceType.TOPIC, topics["exports"], ResourcePatternType.LITERAL, f"User:{connect.ROLE}",
                     "*", AclOperation.READ, AclPermissionType.ALLOW)
    for f in admin.create_acls([acl]).values():
        f.result(timeout=20)
    settings = Settings(state_dir=state_dir, credentials_path=infra.credentials_dir, postgres_port=_free_port())
    name = f"exporttest-{tag}"
    store = CassandraHistoryStore(infra.cassandra_hosts, infra.cassandra_port, keyspace).connect()
    projector: HistoryProjector | None = None
    try:
        postgres.start(settings)
        lib = fetch.fetch(infra.state_dir, connect.COMPONENT, connect.LABEL)
        port = _free_port()
        with private_registry(ready_id=schema_id_for_topic(topo.run_exports)) as registry_url:
            overrides = {"topics": topics["exports"], "value.converter.registry.url": registry_url}
            connect.start(settings, port=port, lib=lib, connectors=[
                (connect.CONNECTORS_DIR / "runs-postgres-sink.properties", {**overrides, "name": f"{name}-pg"}),
                (connect.CONNECTORS_DIR / "runs-jsonl-file-sink.properties", {**overrides, "name": f"{name}-jsonl"}),
            ])
            try:
                connect.wait_ready(settings, port=port, timeout_s=90)
                states = _states(tag)
                producer = Producer(producer_config(infra.kafka_bootstrap))
                for s in states:
                    producer.produce(topics["runs"], key=s.run_id.encode(), value=encode(s, topo.runs))
                assert producer.flush(20) == 0

                exporter = RunExportPublisher.connect(infra.kafka_bootstrap, topic=topics["exports"])
                projector = HistoryProjector(store, KafkaEventLog(infra.kafka_bootstrap), group_id=f"{name}-history",
                                             topics={k: topics[k] for k in ("jobs", "runs", "logs")},
                                             exporter=exporter, consumer_config={"auto.offset.reset": "earliest"})
                deadline = time.monotonic() + 30
                while projector.stats.records < len(states) and time.monotonic() < deadline:
                    projector.run_once(100, timeout_s=0.5)
                assert projector.stats.exported == 2, projector.stats  # the failed and the skipped run
                failed_run, skipped_run = states[1], states[2]
                assert store.get_run(failed_run.run_id) == failed_run

                # the same final record again (a replayed batch): still one row per run
                assert exporter.publish([failed_run]) == 1
                _wait(lambda: _row(settings, failed_run.run_id) and _row(settings, skipped_run.run_id), 60, "rows")
                rows = postgres.query(settings, f"SELECT run_id, count(*) FROM gnomon_runs WHERE run_id LIKE "
                                                f"'acme.pipe-{tag}@%' GROUP BY run_id ORDER BY run_id")
                assert rows == [[failed_run.run_id, "1"], [skipped_run.run_id, "1"]]
                assert _row(settings, failed_run.run_id) == [
                    "failed", str(T0), "2026-12-01T00:00:00Z", "2", "320", "exit code 3", "batch"]
                assert _row(settings, skipped_run.run_id) == [
                    "skipped", str(T0 + 60_000), "2026-12-01T00:01:00Z", "0", "", "paused", "batch"]

                jsonl = connect.worker(settings, port).exports_dir / "runs.jsonl"
                lines = _wait(lambda: _lines(jsonl, 3), 30, "three JSON lines")
                assert [d["run_id"] for d in lines] == [failed_run.run_id, skipped_run.run_id, failed_run.run_id]
                expected = dataclasses.asdict(export_of(failed_run))  # type: ignore[arg-type]
                assert lines[0] == {k: (v.value if hasattr(v, "value") else v) for k, v in expected.items()}
            finally:
                connect.stop(settings)
    finally:
        if projector is not None:
            projector.close()
        store.close()
        postgres.stop(settings)
        for f in admin.delete_acls([AclBindingFilter(ResourceType.TOPIC, topics["exports"], ResourcePatternType.LITERAL,
                                               f"User:{connect.ROLE}", "*", AclOperation.READ,
                                               AclPermissionType.ALLOW)]).values():
            with contextlib.suppress(Exception):
                f.result(timeout=20)
        groups = [f"connect-{name}-pg", f"connect-{name}-jsonl", f"{name}-history"]
        for f in admin.delete_consumer_groups(groups, request_timeout=10).values():
            with contextlib.suppress(Exception):
                f.result(timeout=15)
        for f in admin.delete_topics(list(topics.values()), operation_timeout=20).values():
            with contextlib.suppress(Exception):
                f.result(timeout=30)


def _lines(path: Path, n: int) -> list[dict[str, Any]] | None:
    if not path.exists():
        return None
    found = [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
    return found if len(found) >= n else None


def _wait(predicate: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
