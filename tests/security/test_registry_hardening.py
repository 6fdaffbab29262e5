"""The schema registry against a browser on the same machine (issue 24, finding 7): its
"JSON only" guard was a substring check (``text/plain;json`` passed, a request a page on
any origin may send without a preflight), it read bodies of any size (a 9.3 MB schema was
accepted) and answered any ``Host`` (DNS rebinding: a page whose name resolves to
127.0.0.1 reads and writes it)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from starlette.testclient import TestClient

from gnomon.registry.app import BODY_MAX_BYTES, create_app
from gnomon.registry.service import MemoryStore, Registry
from gnomon.registry.state import State, checked_in_versions, fold, import_checked_in, own_subjects

SUBJECT = "orders-value"
SCHEMA = json.dumps({"type": "record", "name": "Order", "fields": [{"name": "id", "type": "string"}]})


@pytest.fixture()
def http() -> TestClient:
    checked = checked_in_versions()
    store = MemoryStore()
    store.append(import_checked_in(State(), checked))
    registry = Registry(fold(store.records), store, own_subjects(checked))
    return TestClient(create_app(registry), base_url="http://127.0.0.1:8081")


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
