"""A reader that meets a schema id it does not know asks a schema source for the writer's
schema (gnomon.codec ``use_schema_source``, gnomon.codec.remote): a rolling upgrade,
where a newer release writes a newer version of a subject than an older one knows.

The "older release" is a codec on a copy of the checked-in registry without the newest
version of ``gnomon.jobs-value``; the "newer release" is today's codec. The registry is
a fake source here, then the schema registry's app in-process (starlette's TestClient,
an in-memory store) behind ``RegistrySchemaSource``."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from starlette.testclient import TestClient

from gnomon.codec import Codec, DecodeError, FetchedSchema, default_codec
from gnomon.codec.registry import Registry, load_registry
from gnomon.codec.remote import (
    FETCH_UNKNOWN_ENV,
    HttpClient,
    RegistrySchemaSource,
    fetch_unknown,
    install_registry_source,
)
from gnomon.config import Settings
from gnomon.core.jobs import JobState, JobStatus
from gnomon.core.model import JobSpec, Schedule, Target, TargetType
from gnomon.credentials import Credential
from gnomon.registry.app import create_app
from gnomon.registry.auth import RegistryUsers
from gnomon.registry.service import MemoryStore
from gnomon.registry.service import Registry as SchemaRegistry
from gnomon.registry.state import State, checked_in_versions, fold, import_checked_in, own_subjects

SUBJECT = "gnomon.jobs-value"
TOPIC = "gnomon.jobs"
NEWEST = default_codec.registry.latest(SUBJECT)  # the version the older release lacks
STATE = JobState("j1", "t1", JobSpec("j1", Schedule(cron="* * * * *"), Target(TargetType.HTTP, url="http://x")),
                 JobStatus.ACTIVE, 60_000, 3, 1_000, 2_000)
RETRY_AFTER_S = 30.0
REGISTRY_URL = "http://127.0.0.1:8081"
READER = Credential("registry-reader", "reader-secret")
ADMIN = Credential("registry-admin", "admin-secret")


@pytest.fixture(scope="module")
def older_registry(tmp_path_factory: pytest.TempPathFactory) -> Registry:
    """The checked-in registry without the newest version of SUBJECT (nothing references it)."""
    directory = tmp_path_factory.mktemp("older") / "avro"
    shutil.copytree(default_codec.registry.directory, directory)
    doc = json.loads((directory / "registry.json").read_text())
    del doc["schemas"][str(NEWEST.id)]
    assert not any(r["subject"] == SUBJECT for e in doc["schemas"].values() for r in e.get("references", []))
    (directory / "registry.json").write_text(json.dumps(doc))
    return load_registry(directory)


@pytest.fixture
def older(older_registry: Registry) -> Codec:
    codec = Codec(older_registry)
    assert NEWEST.id not in codec.registry.by_id and codec.registry.latest(SUBJECT).version == NEWEST.version - 1
    return codec


@pytest.fixture(scope="module")
def newer_bytes() -> bytes:
    data = default_codec.encode(STATE, TOPIC)
    assert data[1:5] == NEWEST.id.to_bytes(4, "big")
    return data


def newest_schema() -> FetchedSchema:
    """What the registry gives for NEWEST (self-contained: Confluent's ``format=resolved``)."""
    return FetchedSchema(SUBJECT, NEWEST.version, json.dumps(default_codec.schema_for_topic(TOPIC)))


@dataclass
class FakeSource:
    """Answers from a script, one per call (the last one repeats); records the ids asked."""

    answers: list[FetchedSchema | Exception | None]
    calls: list[int] = field(default_factory=list)

    def fetch(self, schema_id: int) -> FetchedSchema | None:
        self.calls.append(schema_id)
        answer = self.answers[min(len(self.calls), len(self.answers)) - 1]
        if isinstance(answer, Exception):
            raise answer
        return answer


@dataclass
class FakeClock:
    now_s: float = 1_000.0

    def __call__(self) -> float:
        return self.now_s


def test_without_a_source_an_unknown_id_is_refused_as_before(older: Codec, newer_bytes: bytes) -> None:
    with pytest.raises(DecodeError, match=rf"^value: unknown schema id {NEWEST.id}$"):
        older.decode(newer_bytes)


def test_an_older_reader_decodes_a_newer_id_once_asked(older: Codec, newer_bytes: bytes) -> None:
    source = FakeSource([newest_schema()])
    older.use_schema_source(source)
    expected = older.decode(older.encode(STATE, TOPIC))  # what the older release reads of its own record
    assert expected == STATE
    assert source.calls == []  # a known id never asks
    assert older.decode(newer_bytes) == expected
    assert older.decode(newer_bytes, TOPIC) == expected
    assert source.calls == [NEWEST.id]  # asked once: the reader is kept


def _schema_with_tenant_as_long() -> FetchedSchema:
    schema = default_codec.schema_for_topic(TOPIC)
    for f in schema["fields"]:
        if f["name"] == "tenant":
            f["type"] = "long"
    return FetchedSchema(SUBJECT, NEWEST.version, json.dumps(schema))


@pytest.mark.parametrize(("answer", "reason"), [
    pytest.param(ConnectionError("refused"), "asking the schema registry failed: ConnectionError: refused",
                 id="source-down"),
    pytest.param(KeyError("bug"), "asking the schema registry failed: KeyError", id="source-bug"),
    pytest.param(None, "not in the schema registry either", id="not-found"),
    pytest.param(FetchedSchema("orders-value", 1, '{"type": "string"}'), "'orders-value', a subject this release",
                 id="unknown-subject"),
    pytest.param(FetchedSchema(SUBJECT, 99, "{not json"), "not an Avro schema: JSONDecodeError", id="bad-json"),
    pytest.param(FetchedSchema(SUBJECT, 99, '{"type": "record", "name": "x", "fields": [{"type": "nope"}]}'),
                 "not an Avro schema", id="bad-avro"),
    pytest.param(FetchedSchema(SUBJECT, 99, json.dumps(default_codec.schema_for_topic("gnomon.run-logs"))),
                 "its record gnomon.LogLine does not resolve to this release's gnomon.JobState", id="other-record"),
    pytest.param(FetchedSchema(SUBJECT, 99, '"string"'), "not a record", id="not-a-record"),
])
def test_a_failed_fetch_is_a_decode_error_naming_the_id_and_why(
        older: Codec, newer_bytes: bytes, answer: FetchedSchema | Exception | None, reason: str) -> None:
    older.use_schema_source(FakeSource([answer]))
    with pytest.raises(DecodeError) as caught:
        older.decode(newer_bytes)
    assert f"unknown schema id {NEWEST.id}: " in caught.value.message and reason in caught.value.message


def test_a_schema_that_does_not_resolve_field_by_field_fails_on_read(older: Codec, newer_bytes: bytes) -> None:
    older.use_schema_source(FakeSource([_schema_with_tenant_as_long()]))
    with pytest.raises(DecodeError, match=rf"not Avro of schema id {NEWEST.id}: SchemaResolutionError"):
        older.decode(newer_bytes)


def test_a_fetched_id_of_another_topic_is_refused(older: Codec, newer_bytes: bytes) -> None:
    older.use_schema_source(FakeSource([newest_schema()]))
    with pytest.raises(DecodeError, match=rf"schema id {NEWEST.id} is {SUBJECT}, not gnomon.runs-value"):
        older.decode(newer_bytes, "gnomon.runs")
    with pytest.raises(DecodeError, match="no value schema for topic"):
        older.decode(newer_bytes, "no-such-topic")
    assert older.decode(newer_bytes, TOPIC) == STATE


def test_a_failed_id_is_asked_again_only_after_retry_after_s(older: Codec, newer_bytes: bytes) -> None:
    clock = FakeClock()
    source = FakeSource([ConnectionError("refused"), None, newest_schema()])
    older.use_schema_source(source, retry_after_s=RETRY_AFTER_S, monotonic_s=clock)
    with pytest.raises(DecodeError, match="refused"):
        older.decode(newer_bytes)
    clock.now_s += RETRY_AFTER_S - 1
    with pytest.raises(DecodeError, match=rf"unknown schema id {NEWEST.id}: .*refused \(29 s ago"):
        older.decode(newer_bytes)  # not asked: refused from memory
    assert source.calls == [NEWEST.id]
    clock.now_s += 1
    with pytest.raises(DecodeError, match="not in the schema registry either"):
        older.decode(newer_bytes)  # asked again
    clock.now_s += RETRY_AFTER_S
    assert older.decode(newer_bytes) == STATE  # and again: the registry has it now
    clock.now_s += RETRY_AFTER_S
    assert older.decode(newer_bytes) == STATE
    assert source.calls == [NEWEST.id] * 3


def test_removing_the_source_forgets_what_it_gave(older: Codec, newer_bytes: bytes) -> None:
    source = FakeSource([newest_schema()])
    older.use_schema_source(source)
    assert older.decode(newer_bytes) == STATE
    older.use_schema_source(None)
    with pytest.raises(DecodeError, match=rf"^value: unknown schema id {NEWEST.id}$"):
        older.decode(newer_bytes)
    assert older.decode(older.encode(STATE)) == STATE  # its own ids as ever


# ---- over HTTP: the schema registry's app, in-process ---------------------------------------


@pytest.fixture
def registry_http() -> Iterator[TestClient]:
    """The registry of the newer release (every checked-in version), as
    ``python -m gnomon.registry`` builds it on an empty store, with its two users."""
    versions = checked_in_versions(default_codec.registry.directory)
    store = MemoryStore()
    store.append(import_checked_in(State(), versions))
    registry = SchemaRegistry(fold(store.records), store, own_subjects(versions))
    with TestClient(create_app(registry, users=RegistryUsers(ADMIN, READER)), base_url=REGISTRY_URL) as client:
        yield client


def http_source(client: HttpClient, auth: Credential = READER) -> RegistrySchemaSource:
    return RegistrySchemaSource(REGISTRY_URL, (auth.username, auth.password), timeout_s=2.0, client=client)


def test_the_registry_gives_the_newer_schema_and_its_subject(registry_http: TestClient) -> None:
    fetched = http_source(registry_http).fetch(NEWEST.id)
    assert fetched is not None and (fetched.subject, fetched.version) == (SUBJECT, NEWEST.version)
    assert json.loads(fetched.schema_json) == default_codec.schema_for_topic(TOPIC)
    assert http_source(registry_http).fetch(99_999) is None


def test_an_older_reader_decodes_through_the_registry(older: Codec, newer_bytes: bytes,
                                                       registry_http: TestClient) -> None:
    older.use_schema_source(http_source(registry_http))
    assert older.decode(newer_bytes, TOPIC) == STATE
    with pytest.raises(DecodeError, match="unknown schema id 99999: not in the schema registry either"):
        older.decode(b"\x00" + (99_999).to_bytes(4, "big") + b"\x00")


def test_wrong_credentials_are_a_decode_error(older: Codec, newer_bytes: bytes, registry_http: TestClient) -> None:
    older.use_schema_source(http_source(registry_http, Credential(READER.username, "wrong")))
    with pytest.raises(DecodeError, match=rf"unknown schema id {NEWEST.id}: .*answered 401: authentication required"):
        older.decode(newer_bytes)


Respond = Callable[[httpx.Request], httpx.Response]


def _raises(exc: type[httpx.TransportError], message: str) -> Respond:
    def respond(request: httpx.Request) -> httpx.Response:
        raise exc(message, request=request)

    return respond


@pytest.mark.parametrize(("respond", "reason"), [
    pytest.param(_raises(httpx.ConnectError, "refused"), "ConnectError: refused", id="unreachable"),
    pytest.param(_raises(httpx.ReadTimeout, "timed out"), "ReadTimeout: timed out", id="timeout"),
    pytest.param(lambda r: httpx.Response(200, text="<html>"), "answered 200 without JSON", id="not-json"),
    pytest.param(lambda r: httpx.Response(404, text="no"), "answered 404", id="a-404-not-confluent"),
    pytest.param(lambda r: httpx.Response(500, json={"error_code": 50001, "message": "store"}),
                 "answered 500: store", id="server-error"),
    pytest.param(lambda r: httpx.Response(200, json={"schema": 3}), "/schemas/ids/5000 answered without a schema "
                 "string", id="no-schema"),
    pytest.param(lambda r: httpx.Response(200, json=[] if r.url.path.endswith("/versions") else {"schema": "{}"}),
                 "/schemas/ids/5000/versions answered without a subject and version", id="no-subject"),
])
def test_the_http_source_says_why_it_has_no_answer(older: Codec, respond: Respond, reason: str) -> None:
    source = RegistrySchemaSource(REGISTRY_URL, None, client=httpx.Client(transport=httpx.MockTransport(respond)))
    older.use_schema_source(source)
    with pytest.raises(DecodeError) as caught:
        older.decode(b"\x00" + (5_000).to_bytes(4, "big") + b"\x00")
    assert "unknown schema id 5000: asking the schema registry failed: SchemaFetchError" in caught.value.message
    assert reason in caught.value.message


# ---- wiring ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("raw", "on"), [(None, True), ("", True), ("1", True), ("true", True), ("0", False),
                                         ("off", False), ("False", False)])
def test_the_env_var_turns_it_off(raw: str | None, on: bool) -> None:
    assert fetch_unknown({} if raw is None else {FETCH_UNKNOWN_ENV: raw}) is on


def test_a_bad_env_value_is_refused() -> None:
    with pytest.raises(SystemExit, match=FETCH_UNKNOWN_ENV):
        fetch_unknown({FETCH_UNKNOWN_ENV: "maybe"})


def test_install_uses_the_settings_url_and_the_reader_credential(
        older: Codec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GNOMON_REGISTRY_URL", raising=False)
    monkeypatch.delenv(FETCH_UNKNOWN_ENV, raising=False)
    settings = Settings(state_dir=tmp_path, registry_port=18081, credentials_path=tmp_path / "credentials")
    source = install_registry_source(settings, older)
    assert source is not None and source.url == "http://127.0.0.1:18081" and source.auth is None
    assert not (tmp_path / "credentials").exists()  # a client never makes the registry's password

    from gnomon import credentials

    credentials.write(tmp_path / "credentials", credentials.REGISTRY_READER, READER)
    source = install_registry_source(settings, older)
    assert source is not None and source.auth == (READER.username, READER.password)
    assert older.decode(older.encode(STATE)) == STATE  # a known id: no network

    monkeypatch.setenv(FETCH_UNKNOWN_ENV, "0")
    older.use_schema_source(None)
    assert install_registry_source(settings, older) is None
    with pytest.raises(DecodeError, match=rf"^value: unknown schema id {NEWEST.id}$"):
        older.decode(default_codec.encode(STATE, TOPIC))
