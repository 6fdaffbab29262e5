"""The API in-process: validation, problem+json, auth, commands produced (no Kafka)."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from gnomon import codec
from gnomon.api.app import CommandSink, create_app
from gnomon.api.auth import Authenticator
from gnomon.core import jobs as J
from gnomon.core.clock import FakeClock, iso_to_ms
from gnomon.history.memory import InMemoryHistoryStore
from gnomon.topology import load_topology

NOW = iso_to_ms("2026-11-29T08:00:00.500Z")
AUTH = {"Authorization": "Bearer tok-a"}


class ListProducer:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str, Any]] = []

    def send(self, topic: str, key: str, value: bytes) -> None:
        self.sent.append((topic, key, codec.decode(value)))


@pytest.fixture
def env() -> tuple[TestClient, ListProducer, InMemoryHistoryStore]:
    producer, history = ListProducer(), InMemoryHistoryStore()
    topo = load_topology()
    app = create_app(history=history, commands=CommandSink(producer, topo.job_commands),
                     auth=Authenticator({"tok-a": "acme", "tok-b": "other"}), topology=topo, clock=FakeClock(NOW))
    return TestClient(app), producer, history


def body(**over: Any) -> dict[str, Any]:
    b = {"name": "n", "schedule": "0 * * * *", "target": {"type": "command", "argv": ["true"]}}
    b.update(over)
    return b


def test_create_produces_one_register_command(env: Any) -> None:
    client, producer, _ = env
    resp = client.post("/v1/jobs", json=body(), headers=AUTH)
    assert resp.status_code == 201, resp.text
    job = resp.json()
    assert job["id"].startswith("job_") and job["nextRunAt"] == "2026-11-29T09:00:00Z"
    ((topic, key, cmd),) = producer.sent
    assert topic == "gnomon.job-commands" and key == job["id"]
    assert isinstance(cmd, J.RegisterJob) and cmd.tenant == "acme"


@pytest.mark.parametrize(
    ("payload", "field"),
    [(body(schedule="bad"), "schedule"), (body(extra=1), "extra"), (body(timeoutS=-1), "timeoutS"),
     ("[1,2]", "body"), (body(payload={"x": "y" * 70_000}), "payload")],
)
def test_bad_input_problem_json(env: Any, payload: Any, field: str) -> None:
    client, producer, _ = env
    kw = {"content": payload} if isinstance(payload, str) else {"json": payload}
    resp = client.post("/v1/jobs", headers=AUTH, **kw)
    assert resp.status_code == 422
    assert resp.headers["content-type"] == "application/problem+json"
    assert resp.json()["field"] == field
    assert producer.sent == []


def test_not_json_is_a_problem(env: Any) -> None:
    client, producer, _ = env
    resp = client.post("/v1/jobs", content=b"{nope", headers={**AUTH, "Content-Type": "application/json"})
    assert resp.status_code == 422 and resp.json()["field"] == "body" and producer.sent == []


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic abc"}])
def test_auth_required(env: Any, headers: dict[str, str]) -> None:
    client, producer, _ = env
    resp = client.post("/v1/jobs", json=body(), headers=headers)
    assert resp.status_code == 401 and resp.json()["field"] == "Authorization"
    assert producer.sent == []


def _registered(env: Any) -> str:
    client, producer, history = env
    job_id = client.post("/v1/jobs", json=body(), headers=AUTH).json()["id"]
    state = J.evolve(None, J.decide(None, producer.sent[-1][2])[0])
    history.put_job(state)
    return job_id


def test_trigger_is_idempotent_by_key(env: Any) -> None:
    client, producer, _ = env
    job_id = _registered(env)
    r1 = client.post(f"/v1/jobs/{job_id}:trigger", json={"idempotencyKey": "k1"}, headers=AUTH)
    r2 = client.post(f"/v1/jobs/{job_id}:trigger", json={"idempotencyKey": "k1"}, headers=AUTH)
    assert r1.json() == r2.json() == {"runId": f"{job_id}@manual:k1"}
    bad = client.post(f"/v1/jobs/{job_id}:trigger", json={"idempotencyKey": "has space"}, headers=AUTH)
    assert bad.status_code == 422 and bad.json()["field"] == "idempotencyKey"


def test_pause_resume_patch_delete_produce_commands(env: Any) -> None:
    client, producer, _ = env
    job_id = _registered(env)
    assert client.post(f"/v1/jobs/{job_id}:pause", headers=AUTH).status_code == 202
    assert client.post(f"/v1/jobs/{job_id}:resume", headers=AUTH).status_code == 202
    assert client.patch(f"/v1/jobs/{job_id}", json={"priority": "high"}, headers=AUTH).status_code == 202
    assert client.patch(f"/v1/jobs/{job_id}", json={"priority": "x"}, headers=AUTH).json()["field"] == "priority"
    assert client.delete(f"/v1/jobs/{job_id}", headers=AUTH).status_code == 202
    kinds = [type(c).__name__ for _, _, c in producer.sent]
    assert kinds == ["RegisterJob", "PauseJob", "ResumeJob", "UpdateJob", "DeleteJob"]


def test_other_tenant_gets_404(env: Any) -> None:
    client, _, _ = env
    job_id = _registered(env)
    assert client.get(f"/v1/jobs/{job_id}", headers=AUTH).status_code == 200
    resp = client.get(f"/v1/jobs/{job_id}", headers={"Authorization": "Bearer tok-b"})
    assert resp.status_code == 404 and resp.headers["content-type"] == "application/problem+json"


def test_openapi_is_served(env: Any) -> None:
    client, _, _ = env
    paths = client.get("/openapi.json").json()["paths"]
    assert "/v1/jobs" in paths and "/v1/jobs/{job_id}:trigger" in paths and "/v1/runs/{run_id}/logs" in paths
