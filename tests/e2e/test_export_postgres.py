"""Export people can query (issue 11, point 6): a job runs on the real stack, the history
projector publishes its finished run to gnomon.run-exports, and Kafka Connect, reading
through gnomon's registry converter, writes it as a row of PostgreSQL table gnomon_runs
(JDBC sink, upsert by run_id) and as a line of the JSON-lines file sink, with the slot,
status, attempts and start lag that history has.

Runs its own PostgreSQL (gnomon.infra.postgres, free port) and its own Connect worker
(free REST port) in a throwaway state dir, with the shipped connector templates under
names of their own (fresh consumer groups: they read the export stream from its start);
the jars and plugins come from the real state dir. The schema registry is gnomon's own
(``python -m gnomon.registry --memory``, tests/private_registry.py): the real server with
this tree's schemas, since the shared one on 8081 serves whichever tree started it.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import Stack, wait_for

from gnomon.codec import schema_id_for_topic
from gnomon.config import Settings, load
from gnomon.core.clock import iso_to_ms
from gnomon.infra import connect, fetch, kafka, postgres
from gnomon.infra.errors import InfraError
from gnomon.topology import load_topology
from private_registry import private_registry

pytestmark = pytest.mark.integration

COLUMNS = ("run_id", "job_id", "tenant", "slot", "slot_ms", "status", "attempts", "start_lag_ms", "started_at_ms",
           "finished_at_ms", "priority", "pool")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def export_settings() -> Iterator[Settings]:
    """A state dir of its own that the postgres user can reach (pytest's tmp is 0700)."""
    state = Path(tempfile.mkdtemp(prefix="gnomon-export-"))
    state.chmod(0o755)
    real = load()
    s = Settings(state_dir=state, credentials_path=real.credentials_dir, postgres_port=_free_port())
    try:
        yield s
    finally:
        postgres.stop(s)
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture(scope="module")
def exporting(export_settings: Settings) -> Iterator[dict[str, Any]]:
    """PostgreSQL and a Connect worker with both run-exports sinks RUNNING."""
    real = load()
    tag = secrets.token_hex(4)
    postgres.start(export_settings)
    lib = fetch.fetch(real.state_dir, connect.COMPONENT, connect.LABEL)
    port = _free_port()
    with private_registry(ready_id=schema_id_for_topic(load_topology().run_exports)) as url:
        names = {"jsonl": f"e2e-runs-jsonl-{tag}", "postgres": f"e2e-runs-postgres-{tag}"}
        connectors = [
            (connect.CONNECTORS_DIR / "runs-jsonl-file-sink.properties",
             {"name": names["jsonl"], "value.converter.registry.url": url}),
            (connect.CONNECTORS_DIR / "runs-postgres-sink.properties",
             {"name": names["postgres"], "value.converter.registry.url": url}),
        ]
        connect.start(export_settings, port=port, connectors=connectors, lib=lib)
        try:
            connect.wait_ready(export_settings, port=port, timeout_s=90)
            yield {"names": names, "registry": url, "port": port,
                   "jsonl": connect.worker(export_settings, port).exports_dir / "runs.jsonl"}
        finally:
            connect.stop(export_settings)
            admin = kafka.admin(real.kafka_bootstrap)
            groups = [f"connect-{n}" for n in names.values()]
            for future in admin.delete_consumer_groups(groups, request_timeout=10).values():
                with contextlib.suppress(Exception):  # a group that never committed
                    future.result(timeout=15)


def _row(settings: Settings, run_id: str) -> dict[str, str] | None:
    sql = (f"SELECT {', '.join(COLUMNS)} FROM gnomon_runs "
           f"WHERE run_id = '{run_id.replace(chr(39), chr(39) * 2)}'")
    try:
        rows = postgres.query(settings, sql)
    except InfraError as exc:  # the sink creates the table with its first record
        if "does not exist" in str(exc):
            return None
        raise
    return dict(zip(COLUMNS, rows[0], strict=True)) if rows else None


def _line(path: Path, run_id: str) -> dict[str, Any] | None:
    if not path.exists():
        return None
    found = [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
    mine = [d for d in found if d["run_id"] == run_id]
    return mine[-1] if mine else None


def test_a_finished_run_becomes_a_row_and_a_json_line(stack: Stack, exporting: dict[str, Any],
                                                      export_settings: Settings) -> None:
    at_ms = int(time.time() + 3) * 1000
    body = {"name": "e2e-export-" + secrets.token_hex(3), "runAt": _iso(at_ms),
            "target": {"type": "command", "argv": ["sh", "-c", "echo exported"]}, "timeoutS": 30}
    job_id = str(stack.client.create_job(body)["id"])
    run_id = f"{job_id}@{_iso(at_ms)}"
    try:
        run = wait_for(lambda: _finished(stack, run_id), 90, f"{run_id} finished in history")
        assert run["status"] == "succeeded" and run["startLagS"] is not None

        row = wait_for(lambda: _row(export_settings, run_id), 60, f"a gnomon_runs row for {run_id}")
        assert row["status"] == "succeeded" and row["job_id"] == job_id and row["tenant"] == "acme"
        assert int(row["slot_ms"]) == iso_to_ms(run["slot"]) == at_ms and row["slot"] == run["slot"]
        assert int(row["attempts"]) == run["attempt"] == 1
        assert int(row["start_lag_ms"]) == round(run["startLagS"] * 1000)
        assert int(row["started_at_ms"]) == iso_to_ms(run["startedAt"])
        assert int(row["finished_at_ms"]) == iso_to_ms(run["finishedAt"])
        assert row["priority"] == "normal" and row["pool"] == "default"

        line = wait_for(lambda: _line(exporting["jsonl"], run_id), 30, f"a JSON line for {run_id}")
        assert line["status"] == "succeeded" and line["slot_ms"] == at_ms and line["attempts"] == 1
        assert line["start_lag_ms"] == int(row["start_lag_ms"]) and line["slot"] == run["slot"]
        # one row per run however often the record is delivered (upsert by run_id)
        count = postgres.query(export_settings, f"SELECT count(*) FROM gnomon_runs WHERE run_id = '{run_id}'")
        assert count == [["1"]]
    finally:
        stack.client.delete(job_id)


def test_connects_rest_api_never_shows_the_password_and_the_sink_is_no_superuser(
        exporting: dict[str, Any], export_settings: Settings) -> None:
    """Whoever holds Connect's REST credential can read its API: the JDBC
    sink's config there holds a FileConfigProvider reference, not the password; the role
    it logs in as (it wrote the row above) is not a superuser and owns only its table."""
    import httpx

    password = postgres.export_credential(export_settings).password
    base = f"http://127.0.0.1:{exporting['port']}"
    name = exporting["names"]["postgres"]
    auth = connect.rest_auth(connect.worker(export_settings, exporting["port"]))
    for path in (f"/connectors/{name}/config", f"/connectors/{name}", f"/connectors/{name}/tasks",
                 "/connectors?expand=info&expand=status"):
        assert httpx.get(base + path, timeout=10).status_code == 401, path  # (tests/security: the REST auth)
        r = httpx.get(base + path, auth=auth, timeout=10)
        assert r.status_code == 200, (path, r.status_code)
        assert password not in r.text, f"{path} shows the PostgreSQL password"
    config = httpx.get(f"{base}/connectors/{name}/config", auth=auth, timeout=10).json()
    assert config["connection.password"].startswith("${file:") and config["connection.username"] == "gnomon_export"
    role = postgres.query(export_settings, "SELECT rolsuper, rolcreaterole, rolcreatedb FROM pg_roles "
                                           "WHERE rolname = 'gnomon_export'")
    assert role == [["f", "f", "f"]]
    owner = postgres.query(export_settings, "SELECT tableowner FROM pg_tables WHERE tablename = 'gnomon_runs'")
    assert owner == [["gnomon_export"]]


def _iso(ms: int) -> str:
    from gnomon.core.clock import ms_to_iso

    return ms_to_iso(ms)


def _finished(stack: Stack, run_id: str) -> dict[str, Any] | None:
    from gnomon.client import ApiError

    try:
        run = stack.client.get_run(run_id)
    except ApiError as exc:
        if exc.status == 404:
            return None
        raise
    return run if run["status"] in ("succeeded", "failed", "cancelled", "skipped") else None
