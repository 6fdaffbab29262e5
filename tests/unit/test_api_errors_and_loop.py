"""The API's answers to gnomon's own bugs (500, not 422), and where its blocking sends run:
never on the event loop (a send may wait for Kafka for up to the delivery timeout)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gnomon.api.app import CommandSink, create_app
from gnomon.api.tenants import TenantService
from gnomon.codec import EncodeError
from gnomon.core import jobs as J
from gnomon.core.clock import FakeClock, iso_to_ms
from gnomon.core.errors import InternalError, ValidationError
from gnomon.core.model import job_id_of
from gnomon.core.runs import RunState, RunStatus
from gnomon.core.validation import parse_job_spec
from gnomon.history.memory import InMemoryHistoryStore
from gnomon.testing import ListProducer
from gnomon.topology import load_topology
from gnomon.web.auth import Authenticator, Principal

NOW = iso_to_ms("2026-11-29T08:00:00.500Z")
AUTH = {"Authorization": "Bearer tok-a"}
ADMIN = {"Authorization": "Bearer tok-admin"}
JOB = {"name": "n", "schedule": "0 * * * *", "target": {"type": "command", "argv": ["true"]}}


def _on_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class LoopWatchingProducer(ListProducer):
    """A ListProducer that notes, for every send, whether an event loop runs in its thread."""

    def __init__(self) -> None:
        super().__init__()
        self.on_loop: list[bool] = []

    def send(self, topic: str, key: str, value: bytes | None, **kw: Any) -> None:
        self.on_loop.append(_on_loop())
        super().send(topic, key, value, **kw)


def _app(producer: Any, command_topic: str | None = None) -> tuple[TestClient, InMemoryHistoryStore]:
    topo = load_topology()
    history = InMemoryHistoryStore()
    auth = Authenticator({"tok-a": "acme", "tok-admin": Principal("ops", admin=True)})
    service = TenantService(writer=producer, topic=topo.tenants)
    app = create_app(history=history, commands=CommandSink(producer, command_topic or topo.job_commands),
                     auth=auth, topology=topo, clock=FakeClock(NOW), tenants=service)
    return TestClient(app, raise_server_exceptions=False), history


def test_encode_error_is_an_internal_error_not_a_validation_error() -> None:
    assert issubclass(EncodeError, InternalError)
    assert not issubclass(EncodeError, ValidationError)
    exc = EncodeError("no schema")
    assert (exc.field, exc.message, str(exc)) == ("value", "no schema", "value: no schema")


def test_an_encoding_bug_answers_500_and_bad_input_still_422() -> None:
    # A command sink on a topic whose schema does not carry RegisterJob: every send is an
    # EncodeError, as if gnomon built a value its schema refuses.
    producer = ListProducer()
    client, _ = _app(producer, command_topic=load_topology().jobs)
    resp = client.post("/v1/jobs", json=JOB, headers=AUTH)
    assert resp.status_code == 500, resp.text
    assert resp.headers["content-type"] == "application/problem+json"
    problem = resp.json()
    assert problem["type"].endswith("/internal") and "field" not in problem
    assert "schema" not in problem["detail"]  # no internals leak to the client
    resp = client.post("/v1/jobs", json={**JOB, "schedule": "bad"}, headers=AUTH)
    assert resp.status_code == 422 and resp.json()["field"] == "schedule"
    assert producer.sent == []


@pytest.fixture
def watched() -> tuple[TestClient, LoopWatchingProducer, InMemoryHistoryStore]:
    producer = LoopWatchingProducer()
    client, history = _app(producer)
    return client, producer, history


def test_every_command_is_sent_off_the_event_loop(watched: Any) -> None:
    client, producer, history = watched
    resp = client.post("/v1/jobs", json=JOB, headers=AUTH)
    assert resp.status_code == 202, resp.text  # no decider wired here: written, answer pending
    job_id = resp.json()["jobId"]
    registered = J.evolve(None, J.decide(None, producer.sent[-1][2])[0])
    history.put_job(replace(registered, created_at_ms=NOW - 4 * 3_600_000))  # the backfill's range is its own
    spec = parse_job_spec({"name": "n", "runAt": "2026-11-29T08:00:05Z", "target": JOB["target"]}, NOW)
    slot = iso_to_ms("2026-11-29T08:00:05Z")
    run_id = f"{job_id}@2026-11-29T08:00:05Z"
    history.put_run(RunState(run_id, job_id_of(run_id), "acme", spec, slot, slot, False, RunStatus.RUNNING,
                             NOW, NOW))
    calls = [
        ("POST", f"/v1/jobs/{job_id}:pause", None, AUTH, 202),
        ("POST", f"/v1/jobs/{job_id}:resume", None, AUTH, 202),
        ("POST", f"/v1/jobs/{job_id}:trigger", {"idempotencyKey": "k1"}, AUTH, 202),
        ("PATCH", f"/v1/jobs/{job_id}", {"priority": "high"}, AUTH, 202),
        ("POST", f"/v1/runs/{run_id}:cancel", None, AUTH, 202),
        ("POST", f"/v1/jobs/{job_id}:backfill", {"from": "2026-11-29T05:30:00Z", "to": "2026-11-29T07:30:00Z"},
         AUTH, 202),
        ("DELETE", f"/v1/jobs/{job_id}", None, AUTH, 202),
        ("PUT", "/v1/tenants/acme", {"jobsMax": 5}, ADMIN, 200),
        ("DELETE", "/v1/tenants/acme", None, ADMIN, 200),
    ]
    for method, path, payload, headers, status in calls:
        resp = client.request(method, path, json=payload, headers=headers)
        assert resp.status_code == status, (method, path, resp.text)
    assert len(producer.on_loop) == 1 + len(calls)
    assert not any(producer.on_loop), producer.on_loop
