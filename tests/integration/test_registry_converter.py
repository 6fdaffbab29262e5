"""gnomon's Kafka Connect converter (connectors/registry-converter), built with Maven, reads
values that gnomon's codec wrote: it fetches each writer schema by id from a
Confluent-REST registry and gives the record as a Connect Struct or as one line of JSON.

The registry here is a throwaway HTTP server serving ``GET /schemas/ids/{id}`` from
schemas/avro (the ids gnomon writes), plus one schema split with a Confluent-style
reference, so both lookups the converter does are exercised without a real registry.
The converter runs through its ``gnomon.connect.Decode`` entry point (the same class
Connect loads). Needs Java 17 and Maven; no Kafka.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import registry_stub
from gnomon.codec import encode, schema_id_for_topic
from gnomon.config import load
from gnomon.core.exports import export_of
from gnomon.core.model import JobSpec, Schedule, Target, TargetType
from gnomon.core.runs import RunState, RunStatus
from gnomon.infra import connect, connect_plugins, fetch
from gnomon.topology import load_topology

pytestmark = pytest.mark.integration

EXPORTS = load_topology().run_exports
REF_ID = 9_001  # a schema served only by this test: a record referring to another by name
REF_SCHEMA = {"type": "record", "name": "Outer", "namespace": "t",
              "fields": [{"name": "inner", "type": "t.Inner"}, {"name": "tags", "type": {"type": "array",
                                                                                        "items": "string"}}]}
INNER = {"type": "record", "name": "Inner", "namespace": "t", "fields": [{"name": "n", "type": "long"}]}


EXTRA = {
    f"/schemas/ids/{REF_ID}": {"schema": json.dumps(REF_SCHEMA), "references": [
        {"name": "t.Inner", "subject": "t.Inner", "version": 1}]},
    "/subjects/t.Inner/versions/1": {"subject": "t.Inner", "version": 1, "id": 9_000, "schema": json.dumps(INNER)},
}
HITS: list[str] = []


@pytest.fixture(scope="module")
def registry_url() -> Iterator[str]:
    with registry_stub.serve(EXTRA) as (url, hits):
        global HITS
        HITS = hits
        yield url


@pytest.fixture(scope="module")
def classpath() -> str:
    state = load().state_dir
    lib = connect_plugins.build_converter(state)  # no-op once built
    api = fetch.fetch(state, connect.COMPONENT, connect.LABEL)  # connect-api, as the worker provides it
    return f"{lib}/*:{api}/*"


def _decode(classpath: str, url: str, values: list[bytes], tmp: Path, output: str,
            user_info: str | None = None) -> subprocess.CompletedProcess[str]:
    framed = tmp / f"values.{output}.bin"
    framed.write_bytes(b"".join(len(v).to_bytes(4, "big") + v for v in values))
    env = {**os.environ, **({"GNOMON_REGISTRY_USER_INFO": user_info} if user_info else {})}
    return subprocess.run(["java", "-cp", classpath, "gnomon.connect.Decode", url, str(framed), output],
                          capture_output=True, text=True, timeout=60, env=env)


def _finished_run() -> RunState:
    spec = JobSpec(name="conv", schedule=Schedule(cron="* * * * *", tz="UTC"),
                   target=Target(TargetType.COMMAND, argv=("true",)), pool="batch")
    return RunState(run_id="acme.conv@2026-12-01T00:00:00Z", job_id="acme.conv", tenant="acme", spec=spec,
                    slot_ms=1_796_083_200_000, not_before_ms=1_796_083_200_000, manual=False,
                    status=RunStatus.FAILED, created_at_ms=1_796_083_190_000, updated_at_ms=1_796_083_260_000,
                    attempt=3, started_at_ms=1_796_083_200_042, finished_at_ms=1_796_083_260_000, exit_code=2,
                    reason='exit code 2: "quoted"\nand a newline \u2603')


def test_json_mode_gives_one_json_line_per_record(classpath: str, registry_url: str, tmp_path: Path) -> None:
    run = _finished_run()
    export = export_of(run)
    assert export is not None
    other = replace(export, run_id="acme.conv@other", start_lag_ms=None, started_at_ms=None, reason=None)
    got = _decode(classpath, registry_url, [encode(export, EXPORTS), encode(other, EXPORTS)], tmp_path, "json")
    assert got.returncode == 0, got.stderr[-3000:]
    lines = got.stdout.splitlines()
    assert len(lines) == 2
    first = json.loads(lines[0])
    assert first == {
        "run_id": run.run_id, "job_id": "acme.conv", "tenant": "acme", "pool": "batch", "priority": "normal",
        "slot_ms": run.slot_ms, "slot": "2026-12-01T00:00:00Z", "status": "failed", "attempts": 3,
        "manual": False, "updated_at_ms": run.updated_at_ms, "start_lag_ms": 42,
        "started_at_ms": run.started_at_ms, "finished_at_ms": run.finished_at_ms, "exit_code": 2,
        "reason": run.reason}
    assert list(first) == [f["name"] for f in json.loads(registry_stub.gnomon_documents()["/schemas/ids/80"]["schema"])["fields"]]
    second = json.loads(lines[1])
    assert second["start_lag_ms"] is None and second["reason"] is None and second["run_id"] == "acme.conv@other"
    assert f"/schemas/ids/{schema_id_for_topic(EXPORTS)}" in HITS


def test_struct_mode_maps_records_enums_and_optional_fields(classpath: str, registry_url: str,
                                                            tmp_path: Path) -> None:
    history = replace(_finished_run(), reason="exit code 2")  # one line each in Struct.toString()
    export = export_of(history)
    assert export is not None
    # and a whole RunState (nested JobSpec, arrays, enums), as on the dead-letters topic
    values = [encode(export, EXPORTS), encode(history, load_topology().dead_letters)]
    got = _decode(classpath, registry_url, values, tmp_path, "struct")
    assert got.returncode == 0, got.stderr[-3000:]
    lines = got.stdout.splitlines()
    assert lines[0].startswith("gnomon.RunExport Struct{run_id=acme.conv@2026-12-01T00:00:00Z,"), lines[0]
    assert "status=failed" in lines[0] and "attempts=3" in lines[0] and "start_lag_ms=42" in lines[0]
    assert lines[1].startswith("gnomon.RunState Struct{"), lines[1]
    assert "spec=Struct{name=conv" in lines[1] and "argv=[true]" in lines[1]


def test_references_are_fetched_by_subject_version(classpath: str, registry_url: str, tmp_path: Path) -> None:
    from io import BytesIO

    from fastavro import parse_schema, schemaless_writer

    named: dict[str, Any] = {}
    parse_schema(INNER, named)
    buf = BytesIO()
    schemaless_writer(buf, parse_schema(REF_SCHEMA, named), {"inner": {"n": 7}, "tags": ["a", "b"]})
    got = _decode(classpath, registry_url, [b"\x00" + REF_ID.to_bytes(4, "big") + buf.getvalue()], tmp_path, "json")
    assert got.returncode == 0, got.stderr[-3000:]
    assert json.loads(got.stdout) == {"inner": {"n": 7}, "tags": ["a", "b"]}
    assert "/subjects/t.Inner/versions/1" in HITS


def test_the_converter_authenticates_with_basic_auth_user_info(classpath: str, registry_url: str,
                                                               tmp_path: Path) -> None:
    """Connect passes ``value.converter.basic.auth.user.info`` (the registry's reader):
    every request of the converter carries it as HTTP Basic (registry.auth)."""
    assert isinstance(HITS, registry_stub.Hits)
    before = len(HITS.authorizations)
    got = _decode(classpath, registry_url, [encode(export_of(_finished_run()), EXPORTS)], tmp_path, "json",
                  user_info="registry-reader:s3cret")
    assert got.returncode == 0, got.stderr[-3000:]
    sent = HITS.authorizations[before:]
    assert sent and all(a == "Basic " + base64.b64encode(b"registry-reader:s3cret").decode() for a in sent), sent


def test_unknown_ids_and_unframed_values_are_refused_with_the_reason(classpath: str, registry_url: str,
                                                                    tmp_path: Path) -> None:
    unknown = _decode(classpath, registry_url, [b"\x00\x00\x00\x27\x0f" + b"\x02"], tmp_path, "json")
    assert unknown.returncode != 0
    assert "DataException" in unknown.stderr and "answered 404 for schema id 9999" in unknown.stderr
    raw = _decode(classpath, registry_url, [b'{"not": "avro"}'], tmp_path, "json")
    assert raw.returncode != 0 and "not Confluent-framed Avro" in raw.stderr
    down = _decode(classpath, "http://127.0.0.1:9", [encode(export_of(_finished_run()), EXPORTS)],  # type: ignore[arg-type]
                   tmp_path, "json")
    assert down.returncode != 0 and "RetriableException" in down.stderr and "unreachable" in down.stderr
