"""The schema registry against a browser on the same machine (issue 24, finding 7): its
"JSON only" guard was a substring check (``text/plain;json`` passed, a request a page on
any origin may send without a preflight), it read bodies of any size (a 9.3 MB schema was
accepted) and answered any ``Host`` (DNS rebinding: a page whose name resolves to
127.0.0.1 reads and writes it), and asked nobody who they were: anyone on the machine
could register a schema. Now two users (registry.auth): the reader reads, the admin writes."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient

from gnomon.credentials import Credential
from gnomon.registry.app import BODY_MAX_BYTES, create_app
from gnomon.registry.auth import RegistryUsers
from gnomon.registry.service import MemoryStore, Registry
from gnomon.registry.state import State, checked_in_versions, fold, import_checked_in, own_subjects

SUBJECT = "orders-value"
SCHEMA = json.dumps({"type": "record", "name": "Order", "fields": [{"name": "id", "type": "string"}]})


ADMIN = Credential("registry-admin", "admin-secret")
READER = Credential("registry-reader", "reader-secret")


def _app() -> Starlette:
    checked = checked_in_versions()
    store = MemoryStore()
    store.append(import_checked_in(State(), checked))
    registry = Registry(fold(store.records), store, own_subjects(checked))
    return create_app(registry, users=RegistryUsers(ADMIN, READER))


@pytest.fixture()
def http() -> TestClient:
    """The registry, called as its admin user."""
    client = TestClient(_app(), base_url="http://127.0.0.1:8081")
    client.auth = (ADMIN.username, ADMIN.password)
    return client


@pytest.fixture()
def anon() -> TestClient:
    """The same registry, called with no credentials."""
    return TestClient(_app(), base_url="http://127.0.0.1:8081")


def test_nothing_but_the_health_probe_is_served_without_a_registry_user(anon: TestClient) -> None:
    assert anon.get("/").status_code == 200
    for method, path in [("GET", "/subjects"), ("GET", "/schemas/ids/1"), ("GET", "/config"),
                         ("POST", f"/subjects/{SUBJECT}/versions"), ("PUT", "/config")]:
        r = anon.request(method, path, json={"schema": SCHEMA, "compatibility": "NONE"})
        assert r.status_code == 401, (method, path, r.text)
        assert r.headers["www-authenticate"].startswith("Basic realm=")
    bad = [("registry-admin", "wrong"), ("registry-reader", "admin-secret"), ("nobody", "reader-secret"),
           ("registry-admin", "")]
    for user, password in bad:
        assert anon.get("/subjects", auth=(user, password)).status_code == 401, user
    for header in ["Bearer admin-secret", "Basic !!!", "Basic " + "QQ==" * 400, "Basic cmVnaXN0cnktYWRtaW4="]:
        assert anon.get("/subjects", headers={"Authorization": header}).status_code == 401, header


def test_the_reader_reads_and_looks_up_but_cannot_register_or_configure(anon: TestClient) -> None:
    reader = (READER.username, READER.password)
    assert anon.get("/subjects", auth=reader).status_code == 200
    assert anon.get("/schemas/ids/1", auth=reader).status_code == 200
    r = anon.post(f"/subjects/{SUBJECT}/versions", json={"schema": SCHEMA}, auth=reader)
    assert r.status_code == 403 and "may only read" in r.json()["message"]
    assert anon.put("/config", json={"compatibility": "NONE"}, auth=reader).status_code == 403
    assert SUBJECT not in anon.get("/subjects", auth=reader).json()
    # a lookup and a compatibility check are reads (serializers call them)
    assert anon.post(f"/subjects/{SUBJECT}", json={"schema": SCHEMA}, auth=reader).status_code == 404
    admin = (ADMIN.username, ADMIN.password)
    assert anon.post(f"/subjects/{SUBJECT}/versions", json={"schema": SCHEMA}, auth=admin).status_code == 200
    assert anon.post(f"/subjects/{SUBJECT}", json={"schema": SCHEMA}, auth=reader).status_code == 200
    assert anon.post(f"/compatibility/subjects/{SUBJECT}/versions/latest", json={"schema": SCHEMA},
                     auth=reader).status_code == 200


def _subjects(http: TestClient) -> list[str]:
    return list(http.get("/subjects").json())


@pytest.mark.parametrize("media", ["text/plain;json", "text/plain; charset=json", "application/x-www-form-urlencoded;json",
                                   "multipart/form-data; boundary=json", "text/json-ish"])
def test_a_write_whose_media_type_only_mentions_json_is_refused(http: TestClient, media: str) -> None:
    r = http.post(f"/subjects/{SUBJECT}/versions", content=json.dumps({"schema": SCHEMA}).encode(),
                  headers={"Content-Type": media})
    assert r.status_code == 415, r.text
    assert SUBJECT not in _subjects(http)


@pytest.mark.parametrize("media", ["application/vnd.schemaregistry.v1+json", "application/json; charset=utf-8",
                                   "Application/JSON"])
def test_the_json_media_types_clients_send_still_register(http: TestClient, media: str) -> None:
    r = http.post(f"/subjects/{SUBJECT}/versions", content=json.dumps({"schema": SCHEMA}).encode(),
                  headers={"Content-Type": media})
    assert r.status_code == 200, r.text
    assert SUBJECT in _subjects(http)


def test_a_body_over_the_cap_is_refused_unread(http: TestClient) -> None:
    big = {"type": "record", "name": "Big", "doc": "x" * (9 * 1024 * 1024), "fields": []}
    r = http.post(f"/subjects/{SUBJECT}/versions", json={"schema": json.dumps(big)})
    assert r.status_code == 413 and str(BODY_MAX_BYTES) in r.json()["message"]
    assert SUBJECT not in _subjects(http)


def test_a_body_over_the_cap_without_a_length_is_refused(http: TestClient) -> None:
    def chunks() -> Iterator[bytes]:
        for _ in range(40):
            yield b" " * 16384  # 640 KiB of whitespace, chunked (no Content-Length)
        yield json.dumps({"schema": SCHEMA}).encode()

    r = http.post(f"/subjects/{SUBJECT}/versions", content=chunks(),
                  headers={"Content-Type": "application/json"})
    assert r.status_code == 413
    assert SUBJECT not in _subjects(http)


@pytest.mark.parametrize("host", ["attacker.example", "attacker.example:8081", "127.0.0.1.nip.io:8081", ""])
def test_a_request_for_another_host_is_refused(http: TestClient, host: str) -> None:
    """DNS rebinding: the browser sends the page's own name as Host."""
    r = http.get("/subjects", headers={"Host": host})
    assert r.status_code == 421, r.text
    w = http.post(f"/subjects/{SUBJECT}/versions", json={"schema": SCHEMA}, headers={"Host": host})
    assert w.status_code == 421
    assert SUBJECT not in _subjects(http)


@pytest.mark.parametrize("host", ["127.0.0.1:8081", "localhost:8081", "[::1]:8081", "LOCALHOST"])
def test_loopback_names_are_served(http: TestClient, host: str) -> None:
    assert http.get("/subjects", headers={"Host": host}).status_code == 200


def test_connects_rest_api_listens_on_loopback_only() -> None:
    """Issue 24, finding 7's other half: Kafka Connect's REST API (which can create
    connectors that read topics and write files) is bound to 127.0.0.1, never a wildcard."""
    from gnomon.infra import connect

    props = connect.parse_properties(connect.WORKER_TEMPLATE.read_text())
    listeners = [x.strip() for x in props["listeners"].split(",")]
    assert listeners and all(x.startswith("http://127.0.0.1:") for x in listeners), listeners
    assert props.get("rest.advertised.host.name") == "127.0.0.1"
    assert connect.HOST == "127.0.0.1"
