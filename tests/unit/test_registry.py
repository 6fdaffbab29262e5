"""The schema registry's pure parts (gnomon.registry): compatibility levels, id
allocation, the store records and a restart from them, the import of the checked-in
registry, and the HTTP routes over an in-memory store (Confluent's response shapes)."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from starlette.testclient import TestClient

from gnomon.codec import default_codec
from gnomon.registry import compat
from gnomon.registry.app import create_app
from gnomon.registry.errors import ApiError, StoreMismatch
from gnomon.registry.service import MemoryStore, Registry, parse_version
from gnomon.registry.state import (
    OUTSIDE_MIN_ID,
    Ref,
    State,
    Version,
    checked_in_versions,
    config_record,
    fold,
    import_checked_in,
    own_subjects,
    parse_record,
    schema_record,
)

CHECKED_IN = checked_in_versions()


def record(*fields: dict[str, Any], name: str = "T") -> dict[str, Any]:
    return {"type": "record", "name": name, "namespace": "test", "fields": list(fields)}


A = {"name": "a", "type": "int"}
B_NO_DEFAULT = {"name": "b", "type": "int"}
B_DEFAULT = {"name": "b", "type": "int", "default": 0}


def text(schema: Any) -> str:
    return json.dumps(schema)


def fresh() -> tuple[Registry, MemoryStore]:
    """A registry as `python -m gnomon.registry` builds it on an empty store."""
    store = MemoryStore()
    store.append(import_checked_in(State(), CHECKED_IN))
    return Registry(fold(store.records), store, own_subjects(CHECKED_IN)), store


# ---- compatibility levels ------------------------------------------------------------


def test_full_transitive_needs_both_directions_against_every_version() -> None:
    v1 = record(A)
    assert compat.problems("FULL_TRANSITIVE", record(A, B_DEFAULT), [(1, v1)]) == []
    backward = compat.problems("FULL_TRANSITIVE", record(A, B_NO_DEFAULT), [(1, v1)])
    assert len(backward) == 1 and "version 1 cannot be read by the new schema" in backward[0]
    # a new enum symbol: new readers read old data, but old readers cannot read the new symbol
    e1 = record({"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["x"]}})
    e2 = record({"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["x", "y"]}})
    assert compat.problems("BACKWARD", e2, [(1, e1)]) == []
    forward = compat.problems("FULL_TRANSITIVE", e2, [(1, e1)])
    assert forward and "cannot be read by version 1" in forward[0]


def test_transitive_checks_every_earlier_version_not_only_the_latest() -> None:
    v1 = record(A, B_NO_DEFAULT)
    v2 = record(A, B_DEFAULT)
    v3 = record(A)  # drops b: v2 readers default it, v1 readers cannot
    history = [(1, v1), (2, v2)]
    assert compat.problems("FORWARD", v3, history) == []
    assert compat.problems("FULL", v3, history) == []
    transitive = compat.problems("FULL_TRANSITIVE", v3, history)
    assert transitive == [p for p in transitive if "version 1" in p] and transitive
    assert compat.problems("NONE", "string", history) == []
    with pytest.raises(ValueError, match="unknown compatibility level"):
        compat.problems("SIDEWAYS", v3, history)


# ---- ids, records, restart -------------------------------------------------------------


def test_outside_ids_start_at_1000_and_above_every_known_id() -> None:
    assert max(v.id for v in CHECKED_IN) < OUTSIDE_MIN_ID
    reg, _ = fresh()
    assert reg.state.next_id() == OUTSIDE_MIN_ID
    high = Version("x-value", 1, 4321, text(record(A)))
    assert fold([schema_record(high)], reg.state).next_id() == 4322


def test_store_records_round_trip_and_a_restart_keeps_ids_and_settings() -> None:
    reg, store = fresh()
    v1 = reg.register("orders-value", text(record(A)), (), None)
    v2 = reg.register("orders-value", text(record(A, B_DEFAULT)), (), "AVRO")
    reg.set_level("orders-value", "BACKWARD")
    assert (v1.id, v1.version, v2.id, v2.version) == (1000, 1, 1001, 2)
    wire = [(r.key(), r.value()) for r in store.records]
    restarted = fold(parse_record(k, v) for k, v in wire)
    assert restarted == reg.state
    assert restarted.by_id[1001].subject == "orders-value" and restarted.level("orders-value") == "BACKWARD"
    assert restarted.level() == "FULL_TRANSITIVE"
    # the store already has every checked-in version: nothing to import again
    assert import_checked_in(restarted, CHECKED_IN) == []
    assert json.loads(config_record(None, "FULL").key()) == {"keytype": "CONFIG", "subject": None}
    with pytest.raises(ValueError, match="not a registry record"):
        parse_record(b'{"keytype":"SCHEMA","subject":"s","version":1}', b'{"subject":"s"}')
    with pytest.raises(ValueError, match="tombstone"):
        parse_record(b'{"keytype":"CONFIG","subject":null}', None)


# ---- the checked-in registry ---------------------------------------------------------------


def test_import_brings_every_checked_in_id_with_its_file_verbatim() -> None:
    reg, store = fresh()
    assert len(store.records) == len(default_codec.registry.by_id)
    for sv in default_codec.registry:
        v = reg.by_id(sv.id)
        assert (v.subject, v.version) == (sv.subject, sv.version)
        assert v.schema == (default_codec.registry.directory / sv.file).read_text()
        assert v.references == tuple(Ref(r.name, r.subject, r.version) for r in sv.references)
        # resolved, it is the very schema the codec writes with
        assert reg.resolved(sv.id) == json.loads(json.dumps(
            {k: x for k, x in sv.schema.items() if not k.startswith("__")}, default=str))


def test_a_store_that_contradicts_registry_json_is_a_loud_error() -> None:
    first = CHECKED_IN[0]
    edited = Version(first.subject, first.version, first.id, first.schema + " ", first.references)
    with pytest.raises(StoreMismatch, match=f"schema id {first.id} .* differs"):
        import_checked_in(fold([schema_record(edited)]), CHECKED_IN)
    moved = Version(first.subject, first.version, 999, first.schema, first.references)
    with pytest.raises(StoreMismatch, match=f"v{first.version} is schema id 999 in the store but {first.id}"):
        import_checked_in(fold([schema_record(moved)]), CHECKED_IN)
    other = Version("someone-value", 1, first.id, text(record(A)))
    with pytest.raises(StoreMismatch, match=f"schema id {first.id} is someone-value v1 in the store"):
        import_checked_in(fold([schema_record(other)]), CHECKED_IN)
    with pytest.raises(StoreMismatch, match="not below 1000"):
        import_checked_in(State(), [Version("x-value", 1, 1000, text(record(A)))])


# ---- the service ---------------------------------------------------------------------


def test_register_is_idempotent_and_refuses_incompatible_and_invalid_schemas() -> None:
    reg, store = fresh()
    v1 = reg.register("orders-value", text(record(A)), (), None)
    n = len(store.records)
    again = reg.register("orders-value", json.dumps(record(A), indent=2), (), None)  # same schema, other text
    assert again == v1 and len(store.records) == n
    with pytest.raises(ApiError) as exc:
        reg.register("orders-value", text(record(A, B_NO_DEFAULT)), (), None)
    assert (exc.value.status, exc.value.code) == (409, 409) and "FULL_TRANSITIVE" in exc.value.message
    for bad in ("{not json", text(record({"name": "a"})), text("no.such.Type")):
        with pytest.raises(ApiError) as exc:
            reg.register("orders-value", bad, (), None)
        assert (exc.value.status, exc.value.code) == (422, 42201)
    with pytest.raises(ApiError) as exc:
        reg.register("orders-value", text(record(A)), (), "PROTOBUF")
    assert exc.value.code == 42201
    assert len(store.records) == n


def test_gnomon_subjects_are_read_only_but_their_schemas_are_found() -> None:
    reg, _ = fresh()
    latest = default_codec.registry.latest("gnomon.job-commands-value")
    with pytest.raises(ApiError) as exc:
        reg.register("gnomon.job-commands-value", text(record(A)), (), None)
    assert (exc.value.status, exc.value.code) == (422, 42205)
    assert reg.mode("gnomon.job-commands-value") == "READONLY" and reg.mode("orders-value") == "READWRITE"
    # their level is the checked-in registry's rule (their history is not all forward compatible)
    assert reg.level("gnomon.job-commands-value") == "BACKWARD_TRANSITIVE" and reg.level("x") == "FULL_TRANSITIVE"
    with pytest.raises(ApiError) as exc:
        reg.set_level("gnomon.job-commands-value", "NONE")
    assert exc.value.code == 42205
    # the latest file with its reference, or the same schema inlined: both are that version
    own = reg.by_id(latest.id)
    assert reg.register(own.subject, own.schema, own.references, None).id == latest.id
    inlined = json.dumps(reg.resolved(latest.id))
    assert reg.lookup("gnomon.job-commands-value", inlined, (), None).id == latest.id
    # a subject a newer gnomon release wrote to the store (an id below 1000) is gnomon's too
    newer = Version("gnomon.later-value", 1, 900, text(record(A)))
    assert own_subjects([newer, Version("orders-value", 1, 1000, text(record(A)))]) == {"gnomon.later-value"}


def test_a_new_subject_may_reference_gnomon_types() -> None:
    reg, _ = fresh()
    jobspec = default_codec.registry.latest("gnomon.JobSpec")
    schema = record({"name": "job", "type": "gnomon.JobSpec"}, name="Wrapper")
    with pytest.raises(ApiError, match=r"gnomon\.JobSpec"):
        reg.register("wrapper-value", text(schema), (), None)
    v = reg.register("wrapper-value", text(schema), (Ref("gnomon.JobSpec", "gnomon.JobSpec", jobspec.version),), None)
    assert v.id >= OUTSIDE_MIN_ID
    with pytest.raises(ApiError, match="does not exist"):
        reg.register("w2-value", text(schema), (Ref("gnomon.JobSpec", "gnomon.JobSpec", 99),), None)


def test_versions_parse_like_confluent() -> None:
    assert parse_version("latest") is None and parse_version("-1") is None and parse_version("3") == 3
    for bad in ("0", "x", str(2**31)):
        with pytest.raises(ApiError) as exc:
            parse_version(bad)
        assert exc.value.code == 42202


# ---- HTTP ----------------------------------------------------------------------------------


@pytest.fixture()
def http() -> TestClient:
    reg, _ = fresh()
    return TestClient(create_app(reg), base_url="http://127.0.0.1:8081")


def test_http_reads_answer_in_confluent_shapes(http: TestClient) -> None:
    latest = default_codec.registry.latest("gnomon.job-commands-value")
    r = http.get(f"/schemas/ids/{latest.id}")
    assert r.status_code == 200 and r.headers["content-type"] == "application/vnd.schemaregistry.v1+json"
    body = r.json()
    assert json.loads(body["schema"]) == latest.raw
    assert body["references"] == [{"name": x.name, "subject": x.subject, "version": x.version}
                                  for x in latest.references]
    resolved = http.get(f"/schemas/ids/{latest.id}?format=resolved").json()
    assert "references" not in resolved and "gnomon.RegisterJob" in resolved["schema"]
    assert http.get(f"/schemas/ids/{latest.id}/subjects").json() == ["gnomon.job-commands-value"]
    assert http.get(f"/schemas/ids/{latest.id}/versions").json() == [
        {"subject": "gnomon.job-commands-value", "version": latest.version}]
    doc = http.get("/subjects/gnomon.job-commands-value/versions/latest").json()
    assert (doc["id"], doc["version"], doc["subject"]) == (latest.id, latest.version, latest.subject)
    assert json.loads(http.get("/subjects/gnomon.job-commands-value/versions/1/schema").text)["type"] == "record"
    assert "gnomon.job-commands-value" in http.get("/subjects").json()
    assert http.get("/config").json() == {"compatibilityLevel": "FULL_TRANSITIVE"}
    assert http.get("/mode").json() == {"mode": "READWRITE"}
    for path, status, code in (("/schemas/ids/99999", 404, 40403), ("/subjects/nope/versions", 404, 40401),
                               ("/subjects/gnomon.jobs-value/versions/99", 404, 40402),
                               ("/subjects/gnomon.jobs-value/versions/zero", 422, 42202)):
        r = http.get(path)
        assert (r.status_code, r.json()["error_code"]) == (status, code), path
        assert r.json()["message"]
    for path in ("/nowhere", "/subjects/a/b/c"):
        r = http.get(path)
        assert (r.status_code, r.json()["error_code"]) == (404, 404)
    r = http.delete("/subjects/gnomon.jobs-value")  # never deleted: ids are not reused
    assert (r.status_code, r.json()["error_code"]) == (405, 405)


def test_http_register_conflict_config_and_compatibility(http: TestClient) -> None:
    r = http.post("/subjects/orders-value/versions", json={"schema": text(record(A))})
    assert r.status_code == 200 and r.json()["id"] == OUTSIDE_MIN_ID
    r = http.post("/subjects/orders-value/versions", json={"schema": text(record(A, B_NO_DEFAULT))})
    assert r.status_code == 409 and r.json()["error_code"] == 409 and "incompatible" in r.json()["message"]
    check = http.post("/compatibility/subjects/orders-value/versions/latest?verbose=true",
                      json={"schema": text(record(A, B_NO_DEFAULT))}).json()
    assert check["is_compatible"] is False and check["messages"]
    assert http.post("/compatibility/subjects/orders-value/versions",
                     json={"schema": text(record(A, B_DEFAULT))}).json() == {"is_compatible": True}
    assert http.put("/config/orders-value", json={"compatibility": "NONE"}).json() == {"compatibility": "NONE"}
    assert http.get("/config/orders-value").json() == {"compatibilityLevel": "NONE"}
    assert http.put("/config", json={"compatibility": "SIDEWAYS"}).json()["error_code"] == 42203
    r = http.post("/subjects/orders-value/versions", json={"schema": text(record(A, B_NO_DEFAULT))})
    assert r.status_code == 200 and r.json()["id"] == OUTSIDE_MIN_ID + 1
    found = http.post("/subjects/orders-value", json={"schema": text(record(A))}).json()
    assert (found["id"], found["version"]) == (OUTSIDE_MIN_ID, 1)
    missing = http.post("/subjects/orders-value", json={"schema": text(record(B_DEFAULT))})
    assert (missing.status_code, missing.json()["error_code"]) == (404, 40403)
    bad = http.post("/subjects/orders-value/versions", content=b"not json",
                    headers={"Content-Type": "application/vnd.schemaregistry.v1+json"})
    assert (bad.status_code, bad.json()["error_code"]) == (422, 42201)
    # a cross-site "simple" request (a web page posting text/plain to 127.0.0.1) is refused
    plain = http.post("/subjects/orders-value/versions", content=text(record(A)).encode(),
                      headers={"Content-Type": "text/plain"})
    assert plain.status_code == 415 and http.put("/config", content=b'{"compatibility": "NONE"}').status_code == 415
    # every gnomon.* subject is reserved, registered or not: a later release's new subject
    # can never meet an outsider's version of it
    future = http.post("/subjects/gnomon.some-future-topic-value/versions", json={"schema": text(record(A))})
    assert (future.status_code, future.json()["error_code"]) == (422, 42205)
    assert http.get("/mode/gnomon.some-future-topic-value").json() == {"mode": "READONLY"}


def test_an_id_whose_write_failed_is_never_handed_out_again() -> None:
    """A timed-out write may still reach the store: the next registration gets a new id."""
    from gnomon.core.errors import EventLogError
    from gnomon.registry.state import State

    class Flaky:
        fail = True
        appended: list[object] = []

        def append(self, records: object) -> None:
            if Flaky.fail:
                Flaky.fail = False
                raise EventLogError("Kafka did not acknowledge the write within 15s")
            Flaky.appended.append(records)

    reg = Registry(State(), Flaky())  # type: ignore[arg-type]
    with pytest.raises(ApiError):
        reg.register("orders-value", text(record(A)), (), None)
    v = reg.register("payments-value", text(record(A)), (), None)
    assert v.id == OUTSIDE_MIN_ID + 1


def test_memory_mode_serves_the_checked_in_ids_and_confluent_serdes_match_the_codec() -> None:
    """`python -m gnomon.registry --memory` (no store, no Kafka); confluent-kafka's Avro serdes
    pointed at it and gnomon's codec write the same bytes and read each other's."""
    import socket
    import subprocess
    import sys
    import time

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "gnomon.registry", "--memory", "--no-auth", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "GNOMON_KAFKA_BOOTSTRAP": "127.0.0.1:1"})
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/schemas/ids/1", timeout=1)
                break
            except httpx.HTTPError:
                assert proc.poll() is None and time.monotonic() < deadline, "the registry did not serve"
                time.sleep(0.2)
        assert r.status_code == 200 and json.loads(r.json()["schema"])["name"] == "JobSpec"
        _confluent_serdes_speak_the_codec_s_wire_format(f"http://127.0.0.1:{port}")
    finally:
        proc.terminate()
        proc.wait(10)


def _confluent_serdes_speak_the_codec_s_wire_format(url: str) -> None:
    """confluent-kafka's AvroSerializer, given the registry's latest version, writes the
    bytes gnomon's codec writes; its AvroDeserializer reads gnomon's records by their id."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from gnomon.codec import decode, encode
    from gnomon.core.jobs import RegisterJob
    from gnomon.topology import load_topology

    sr = SchemaRegistryClient({"url": url})
    ctx = SerializationContext(load_topology().job_commands, MessageField.VALUE)
    serialize = AvroSerializer(sr, conf={"auto.register.schemas": False, "use.latest.version": True})
    spec = {"name": "n", "schedule": {"cron": "0 2 * * *", "tz": "UTC"},
            "target": {"type": "command", "argv": ["true"]}, "timeout_s": 30}
    value = serialize({"body": ("gnomon.RegisterJob", {"job_id": "j1", "tenant": "acme", "spec": spec,
                                                        "at_ms": 7})}, ctx)
    assert value is not None
    command = decode(value)
    assert isinstance(command, RegisterJob) and command.spec.target.argv == ("true",)
    assert encode(command) == value  # the same id, the same Avro bytes
    back = AvroDeserializer(sr)(encode(command), ctx)
    assert back is not None and back["body"]["job_id"] == "j1" and back["body"]["spec"]["timeout_s"] == 30



def test_the_kafka_store_reads_its_topic_whole_through_the_event_log_port() -> None:
    """``read_all`` on the in-memory log: every record in order, then an exact refusal of
    a record that is not the registry's (ids are at stake)."""
    from gnomon.core.clock import FakeClock
    from gnomon.core.errors import EventLogError
    from gnomon.eventlog.memory import MemoryEventLog
    from gnomon.registry.kafka_store import read_all
    from gnomon.registry.state import config_record

    log = MemoryEventLog(FakeClock(0), partitions=1)
    assert read_all("b:1", "t-schemas", log=log) == []  # empty: nothing to wait for
    records = [config_record(None, "BACKWARD"), config_record("s-value", "FULL")]
    for r in records:
        log.append("t-schemas", r.key(), r.value(), 0)
    assert read_all("b:1", "t-schemas", log=log) == records
    log.append("t-schemas", b'{"keytype":"CONFIG"}', None, 0)
    with pytest.raises(EventLogError, match="t-schemas@2"):
        read_all("b:1", "t-schemas", log=log)
