"""API hardening: body limits, hostile JSON, control characters, idempotent creates,
honest 503s and token handling. Each answer is problem+json naming the field."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import stat
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gnomon.api.app import CommandSink, create_app, idempotent_job_id
from gnomon.config import Settings
from gnomon.core.errors import EventLogError, HistoryStoreError
from gnomon.history.memory import InMemoryHistoryStore
from gnomon.testing import DecidingProducer
from gnomon.topology import load_topology
from gnomon.web.auth import Authenticator, dev_token, hash_token, load_tokens, parse_tokens
from gnomon.web.body import BODY_MAX_BYTES, JSON_DEPTH_MAX, json_depth

JOB = {"name": "n", "schedule": "0 * * * *", "target": {"type": "command", "argv": ["true"]}}
PROBLEM = "application/problem+json"


@pytest.fixture
def client(gnomon_api: Any) -> TestClient:
    return TestClient(gnomon_api.app, raise_server_exceptions=False, headers=gnomon_api.auth("acme"))


def _problem(resp: Any, status: int, field: str | None = None) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"] == PROBLEM
    body: dict[str, Any] = resp.json()
    if field is not None:
        assert body["field"] == field, body
    return body


# ---- body size -----------------------------------------------------------------------


def _asgi_post(app: Any, headers: list[tuple[bytes, bytes]], chunks: list[bytes]) -> tuple[int, dict[str, Any], int]:
    """POST /v1/jobs straight through ASGI; (status, JSON body, body chunks the app read)."""
    read = 0
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal read
        if read >= len(chunks):
            return {"type": "http.disconnect"}
        read += 1
        return {"type": "http.request", "body": chunks[read - 1], "more_body": read < len(chunks)}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": "/v1/jobs", "raw_path": b"/v1/jobs", "query_string": b"",
             "root_path": "", "headers": headers, "client": ("127.0.0.1", 1), "server": ("testserver", 80)}
    asyncio.run(app(scope, receive, send))
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, json.loads(body), read


def test_content_length_over_the_limit_is_413_before_reading(gnomon_api: Any) -> None:
    auth = ("Bearer " + gnomon_api.tokens["acme"]).encode()
    headers = [(b"authorization", auth), (b"content-length", str(BODY_MAX_BYTES + 1).encode())]
    status, body, read = _asgi_post(gnomon_api.app, headers, [b"x" * 1024] * 300)
    assert (status, body["field"], read) == (413, "body", 0)
    assert body["type"].endswith("/too-large")
    assert gnomon_api.producer.sent == []


def test_chunked_body_is_cut_at_the_limit(gnomon_api: Any) -> None:
    auth = ("Bearer " + gnomon_api.tokens["acme"]).encode()
    chunk_bytes = 1024
    status, body, read = _asgi_post(gnomon_api.app, [(b"authorization", auth)], [b"x" * chunk_bytes] * 1000)
    assert (status, body["field"]) == (413, "body")
    assert read == BODY_MAX_BYTES // chunk_bytes + 1  # stopped at the limit, not at the end
    assert gnomon_api.producer.sent == []


def test_body_at_the_limit_is_read(client: TestClient) -> None:
    padded = json.dumps({**JOB, "name": "n" + " " * 10}).encode()
    resp = client.post("/v1/jobs", content=padded + b" " * (BODY_MAX_BYTES - len(padded)))
    assert resp.status_code == 201, resp.text


# ---- hostile JSON ----------------------------------------------------------------------


@pytest.mark.parametrize("raw", [b"[" * 100_000, b'{"a":' * 50_000, b"[" * (JSON_DEPTH_MAX + 1) + b"]" * (JSON_DEPTH_MAX + 1)])
def test_deep_nesting_is_422_not_500(client: TestClient, raw: bytes) -> None:
    _problem(client.post("/v1/jobs", content=raw), 422, "body")


def test_nesting_at_the_limit_reaches_the_core(client: TestClient) -> None:
    payload = json.loads("[" * (JSON_DEPTH_MAX - 1) + "]" * (JSON_DEPTH_MAX - 1))
    assert client.post("/v1/jobs", json={**JOB, "payload": payload}).status_code == 201


def test_json_depth_ignores_brackets_in_strings() -> None:
    assert json_depth(b'{"a": "[[[[\\"[[[", "b": [1, {"c": "]]]"}]}') == 3


@pytest.mark.parametrize("digits", [21, 5000, 100_000])
def test_huge_integers_are_422_not_500(client: TestClient, digits: int) -> None:
    raw = b'{"name": "n", "timeoutS": 1' + b"0" * (digits - 1) + b"}"
    body = _problem(client.post("/v1/jobs", content=raw), 422, "body")
    assert "digits" in body["detail"]


@pytest.mark.parametrize("raw", [b'{"name": NaN}', b'{"name": Infinity}', b'{"name": -Infinity}'])
def test_nan_and_infinity_are_not_json(client: TestClient, raw: bytes) -> None:
    _problem(client.post("/v1/jobs", content=raw), 422, "body")


def test_invalid_utf8_and_lone_surrogates(client: TestClient) -> None:
    _problem(client.post("/v1/jobs", content=b'{"name": "\xff"}'), 422, "body")
    raw = json.dumps({**JOB, "name": "a\ud800b"}).encode()
    _problem(client.post("/v1/jobs", content=raw), 422, "name")
    raw = json.dumps({**JOB, "target": {"type": "command", "argv": ["echo", "\udfff"]}}).encode()
    _problem(client.post("/v1/jobs", content=raw), 422, "target.argv[1]")


# ---- control characters in identifiers ----------------------------------------------------

CONTROLS = ["\x1b[31m", "\x00", "\n", "\x7f", "\x85", "\u202e", "\u2066", "\u2028"]


@pytest.mark.parametrize("char", CONTROLS, ids=repr)
def test_control_characters_in_name_and_pool_are_refused(client: TestClient, char: str) -> None:
    body = _problem(client.post("/v1/jobs", json={**JOB, "name": f"nightly{char}report"}), 422, "name")
    assert "control or bidi" in body["detail"]
    _problem(client.post("/v1/jobs", json={**JOB, "pool": f"default{char}"}), 422, "pool")


@pytest.mark.parametrize("char", CONTROLS, ids=repr)
def test_control_characters_in_idempotency_keys_are_refused(gnomon_api: Any, client: TestClient, char: str) -> None:
    job_id = client.post("/v1/jobs", json=JOB).json()["id"]
    resp = client.post(f"/v1/jobs/{job_id}:trigger", json={"idempotencyKey": f"k{char}"})
    _problem(resp, 422, "idempotencyKey")
    _problem(client.patch(f"/v1/jobs/{job_id}", json={"name": f"x{char}"}), 422, "name")


def test_a_trailing_newline_is_not_a_valid_key(client: TestClient) -> None:
    job_id = client.post("/v1/jobs", json=JOB).json()["id"]
    _problem(client.post(f"/v1/jobs/{job_id}:trigger", json={"idempotencyKey": "k1\n"}), 422, "idempotencyKey")


def test_idempotency_header_is_validated(client: TestClient) -> None:
    _problem(client.post("/v1/jobs", json=JOB, headers={"Idempotency-Key": "has space"}), 422, "Idempotency-Key")
    _problem(client.post("/v1/jobs", json=JOB, headers={"Idempotency-Key": "k" * 129}), 422, "Idempotency-Key")


# ---- idempotent create ---------------------------------------------------------------------


def _register_commands(api: Any) -> list[Any]:
    return [c for _, _, c in api.producer.sent if type(c).__name__ == "RegisterJob"]


def test_a_retried_create_answers_the_same_job(gnomon_api: Any, client: TestClient) -> None:
    first = client.post("/v1/jobs", json=JOB, headers={"Idempotency-Key": "create-1"})
    again = client.post("/v1/jobs", json=JOB, headers={"Idempotency-Key": "create-1"})
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["id"] == again.json()["id"] == idempotent_job_id("acme", "create-1")
    assert again.headers["location"] == f"/v1/jobs/{first.json()['id']}"
    # the retry is the processor's to judge: the same definition is the same job, unchanged
    assert len(_register_commands(gnomon_api)) == 2
    assert gnomon_api.producer.job(first.json()["id"]).version == 1
    assert len(client.get("/v1/jobs").json()["items"]) == 1


def test_same_key_other_body_is_409(gnomon_api: Any, client: TestClient) -> None:
    assert client.post("/v1/jobs", json=JOB, headers={"Idempotency-Key": "k"}).status_code == 201
    body = _problem(client.post("/v1/jobs", json={**JOB, "name": "other"}, headers={"Idempotency-Key": "k"}), 409)
    assert "different definition" in body["detail"]
    job_id = _register_commands(gnomon_api)[0].job_id
    assert gnomon_api.producer.job(job_id).spec.name == JOB["name"]  # refused by the processor: unchanged


def test_same_key_after_delete_registers_the_job_again(gnomon_api: Any, client: TestClient) -> None:
    """History forgets a deleted job and the processor re-registers a deleted id
    (core.jobs.decide), so a key is free again once its job is deleted."""
    job_id = client.post("/v1/jobs", json=JOB, headers={"Idempotency-Key": "k"}).json()["id"]
    assert client.delete(f"/v1/jobs/{job_id}").status_code == 200
    again = client.post("/v1/jobs", json=JOB, headers={"Idempotency-Key": "k"})
    assert (again.status_code, again.json()["id"]) == (201, job_id)
    assert client.get(f"/v1/jobs/{job_id}").status_code == 200


def test_a_retry_is_judged_by_the_processor_not_by_a_lagging_history(gnomon_api: Any, client: TestClient) -> None:
    from dataclasses import replace

    from gnomon.core.jobs import JobStatus

    job_id = client.post("/v1/jobs", json=JOB, headers={"Idempotency-Key": "k"}).json()["id"]
    # history shows something stale (here: deleted); the processor has the job as it is
    gnomon_api.history.put_job(replace(gnomon_api.history.get_job(job_id), status=JobStatus.DELETED))
    again = client.post("/v1/jobs", json=JOB, headers={"Idempotency-Key": "k"})
    assert again.status_code == 200 and again.json()["id"] == job_id
    _problem(client.post("/v1/jobs", json={**JOB, "name": "x"}, headers={"Idempotency-Key": "k"}), 409)


def test_keys_are_per_tenant(gnomon_api: Any, client: TestClient) -> None:
    mine = client.post("/v1/jobs", json=JOB, headers={"Idempotency-Key": "k"}).json()["id"]
    theirs = client.post("/v1/jobs", json=JOB, headers={"Idempotency-Key": "k", **gnomon_api.auth("other")})
    assert theirs.status_code == 201 and theirs.json()["id"] != mine


def _app(producer: Any, history: Any = None, answers: Any = None, **sink: Any) -> TestClient:
    topo = load_topology()
    app = create_app(history=history or InMemoryHistoryStore(),
                     commands=CommandSink(producer, topo.job_commands, **sink),
                     auth=Authenticator({"tok": "acme"}), topology=topo, answers=answers)
    return TestClient(app, raise_server_exceptions=False, headers={"Authorization": "Bearer tok"})


def test_a_quick_retry_before_history_catches_up_gets_the_same_id() -> None:
    producer = DecidingProducer(None)  # nothing reaches history: the projector is "behind"
    client = _app(producer, answers=producer.answers)
    answers = [client.post("/v1/jobs", json=JOB, headers={"Idempotency-Key": "k"}) for _ in range(2)]
    assert [a.status_code for a in answers] == [201, 200]
    ids = {a.json()["id"] for a in answers}
    assert ids == {idempotent_job_id("acme", "k")}
    # Both RegisterJob commands carry the same id and spec: the processor applies the
    # first and answers the second "already registered" (core.jobs.decide: a no-op).
    assert {(key, cmd.spec) for _, key, cmd in producer.sent} == {(ids.pop(), producer.sent[0][2].spec)}


# ---- 503 honesty -----------------------------------------------------------------------------


class BrokenProducer:
    def __init__(self) -> None:
        self.timeouts_s: list[float] = []

    def send(self, topic: str, key: str, value: bytes, timeout_s: float = 15.0) -> None:
        self.timeouts_s.append(timeout_s)
        raise EventLogError(f"Kafka refused the write to {topic}: Local: Message timed out")


def test_a_failed_send_waits_out_the_delivery_timeout_and_says_the_outcome_is_unknown() -> None:
    producer, slept_s = BrokenProducer(), []
    client = _app(producer, delivery_timeout_s=10.0, sleep=slept_s.append, monotonic=lambda: 100.0)
    body = _problem(client.post("/v1/jobs", json=JOB, headers={"Idempotency-Key": "k"}), 503)
    assert body["outcome"] == "unknown" and "same Idempotency-Key" in body["detail"]
    assert producer.timeouts_s[0] > 10.0  # the flush outlives the producer's own retries
    assert slept_s == [10.0]  # failed "at once": the answer still waits the delivery timeout
    retried = client.post("/v1/jobs", json=JOB, headers={"Idempotency-Key": "k"})
    assert retried.headers["retry-after"]


def test_a_history_outage_does_not_stop_job_writes_and_reads_say_503() -> None:
    class DownHistory(InMemoryHistoryStore):
        def get_job(self, job_id: str) -> Any:
            raise HistoryStoreError("cassandra is down")

        def get_run(self, run_id: str) -> Any:
            raise HistoryStoreError("cassandra is down")

    producer = DecidingProducer(None)
    client = _app(producer, DownHistory(), answers=producer.answers)
    job_id = client.post("/v1/jobs", json=JOB).json()["id"]  # the processor decides; history is not read
    assert client.post(f"/v1/jobs/{job_id}:pause").status_code == 200
    assert _problem(client.post("/v1/jobs/job_x:pause"), 404)["title"] == "Not found"
    assert "outcome" not in _problem(client.get("/v1/jobs/job_x"), 503)
    # a cancel is the processor's to decide too (no such run there: 404)
    assert _problem(client.post(f"/v1/runs/{job_id}@manual:k:cancel"), 404)["title"] == "Not found"


# ---- tokens ----------------------------------------------------------------------------------


def test_tokens_are_kept_as_hashes_only(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    digest = hashlib.sha256(b"tok-other").hexdigest()
    monkeypatch.setenv("GNOMON_API_TOKENS", f"tok-acme:acme, sha256:{digest}:other")
    hashes = load_tokens(Settings(state_dir=tmp_path))
    assert hashes == {hash_token("tok-acme"): "acme", digest: "other"}
    auth = Authenticator.from_hashes(hashes)
    assert auth.tenant_for("Bearer tok-acme") == "acme" and auth.tenant_for("bearer tok-other") == "other"
    assert "tok-acme" not in repr(vars(auth))
    assert not (tmp_path / "dev-token").exists()


@pytest.mark.parametrize("raw", ["tok", ":acme", "tok:", "sha256:abc:acme", f"sha256:{'0' * 64}", "tok:a b"])
def test_bad_token_entries_refuse_to_start(raw: str) -> None:
    with pytest.raises(SystemExit, match="GNOMON_API_TOKENS"):
        parse_tokens(raw)


def test_no_tokens_refuses_to_start_unless_dev(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.delenv("GNOMON_API_TOKENS", raising=False)
    monkeypatch.delenv("GNOMON_DEV", raising=False)
    settings = Settings(state_dir=tmp_path / "state")
    with pytest.raises(SystemExit, match="GNOMON_API_TOKENS is not set"):
        load_tokens(settings)
    assert not (tmp_path / "state").exists()
    assert load_tokens(settings, dev=True) == {hash_token(dev_token(settings)): "dev"}
    monkeypatch.setenv("GNOMON_DEV", "1")
    assert list(load_tokens(settings).values()) == ["dev"]


def test_build_app_refuses_before_connecting(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    from gnomon.api.wiring import build_app

    monkeypatch.delenv("GNOMON_API_TOKENS", raising=False)
    monkeypatch.delenv("GNOMON_DEV", raising=False)
    with pytest.raises(SystemExit, match="GNOMON_API_TOKENS"):
        build_app(Settings(state_dir=tmp_path))


def test_dev_token_file_is_born_0600_and_stable(tmp_path: Any) -> None:
    settings = Settings(state_dir=tmp_path / "state")
    old_umask = os.umask(0o000)  # even with a permissive umask
    try:
        token = dev_token(settings)
    finally:
        os.umask(old_umask)
    path = tmp_path / "state" / "dev-token"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert token.startswith("gnomon-dev-") and dev_token(settings) == token
    assert [p.name for p in path.parent.iterdir()] == ["dev-token"]  # no temp file left behind


def test_an_accepted_write_is_answered_as_accepted_while_history_is_down() -> None:
    class DownHistory(InMemoryHistoryStore):
        def get_job(self, job_id: str) -> Any:
            raise HistoryStoreError("cassandra is down")

    producer = DecidingProducer(None)
    client = _app(producer, DownHistory(), answers=producer.answers)
    first = client.post("/v1/jobs", json=JOB, headers={"Idempotency-Key": "k"})
    again = client.post("/v1/jobs", json=JOB, headers={"Idempotency-Key": "k"})
    assert (first.status_code, again.status_code) == (201, 200) and again.json()["id"] == first.json()["id"]
    patched = client.patch(f"/v1/jobs/{first.json()['id']}", json={"priority": "high"})
    assert patched.status_code == 200 and patched.headers["ETag"] == '"2"', patched.text
    # without If-Match, a refusal that is not about the version stays itself (not a 412)
    assert _problem(client.patch("/v1/jobs/job_missing", json={"priority": "high"}), 404)["title"] == "Not found"
