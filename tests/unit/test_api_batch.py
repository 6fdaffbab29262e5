"""POST /v1/jobs:batch: items judged one by one with the single create's rules, limits
and idempotency; one result per item, in order; the accepted ones produced together."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from gnomon.api.app import CommandSink, create_app
from gnomon.api.batch import BATCH_ITEMS_MAX, Answer, Send, plan_batch
from gnomon.api.tenants import TenantService
from gnomon.core import jobs as J
from gnomon.core.clock import FakeClock, iso_to_ms
from gnomon.core.errors import EventLogError
from gnomon.core.model import idempotent_job_id
from gnomon.core.tenants import TenantLimits
from gnomon.core.validation import parse_job_spec
from gnomon.history.memory import InMemoryHistoryStore
from gnomon.testing import DecidingProducer, ListProducer
from gnomon.topology import load_topology
from gnomon.web.auth import Authenticator

NOW = iso_to_ms("2026-11-29T08:00:00.500Z")
AUTH = {"Authorization": "Bearer tok-a"}
JOB = {"name": "n", "schedule": "0 * * * *", "target": {"type": "command", "argv": ["true"]}}
POOLS = frozenset(load_topology().pools)


class BatchProducer(DecidingProducer):
    """The processors' decisions (``DecidingProducer``) with ``send_many``; ``refuse``:
    keys whose write Kafka refuses."""

    def __init__(self, refuse: frozenset[str] = frozenset(), tenants: Any = None, history: Any = None) -> None:
        super().__init__(history, clock=FakeClock(NOW), tenants=tenants)
        self.refuse = refuse
        self.flushes = 0

    def send_many(self, topic: str, items: list[tuple[str, bytes]], timeout_s: float = 15.0,
                  positions: list[tuple[int, int] | None] | None = None) -> list[str | None]:
        self.flushes += 1
        out: list[str | None] = []
        where: list[tuple[int, int] | None] = []
        for key, value in items:
            if key in self.refuse:
                out.append("Kafka refused the write: broker says no")
                where.append(None)
            else:
                where.append(self.send(topic, key, value))
                out.append(None)
        if positions is not None:
            positions[:] = where
        return out


def _app(producer: Any, history: InMemoryHistoryStore | None = None) -> TestClient:
    topo = load_topology()
    app = create_app(history=history or InMemoryHistoryStore(), commands=CommandSink(producer, topo.job_commands),
                     auth=Authenticator({"tok-a": "acme"}), topology=topo, clock=FakeClock(NOW),
                     tenants=TenantService(writer=producer, topic=topo.tenants),
                     answers=getattr(producer, "answers", None))
    return TestClient(app, raise_server_exceptions=False)


def _sent(producer: ListProducer) -> list[Any]:
    topic = load_topology().job_commands
    return [value for t, _key, value in producer.sent if t == topic]


def test_a_batch_registers_every_valid_item_with_one_flush_and_refuses_the_bad_ones_by_field() -> None:
    producer = BatchProducer()
    items = [dict(JOB, name=f"j{i}") for i in range(5)]
    items[2] = dict(JOB, schedule="61 * * * *")
    items[4] = dict(JOB, name="k", idempotencyKey="bulk-1")
    r = _app(producer).post("/v1/jobs:batch", json={"jobs": items}, headers=AUTH)
    assert r.status_code == 200, r.text
    body = r.json()
    assert [x["status"] for x in body["results"]] == [201, 201, 422, 201, 201]
    assert [x["index"] for x in body["results"]] == [0, 1, 2, 3, 4]
    assert (body["created"], body["existing"], body["pending"], body["refused"]) == (4, 0, 0, 1)
    assert body["results"][2]["problem"]["field"] == "jobs[2].schedule"
    assert body["results"][4]["job"]["id"] == idempotent_job_id("acme", "bulk-1")
    sent = _sent(producer)
    assert producer.flushes == 1 and len(sent) == 4
    assert all(isinstance(c, J.RegisterJob) and c.tenant == "acme" for c in sent)
    assert {c.job_id for c in sent} == {x["job"]["id"] for x in body["results"] if x["status"] == 201}


def test_a_retried_batch_registers_nothing_twice_and_a_reused_key_with_another_definition_is_409() -> None:
    """Whether a key's job exists is the processor's to say (not history's): the first
    call registers it; a retry is the same job (200, shown as history has it); the key
    with another definition is the processor's 409; a key repeated in one batch is
    judged at once (it needs no state)."""
    history = InMemoryHistoryStore()
    producer = BatchProducer(history=history)
    app = _app(producer, history)
    first = app.post("/v1/jobs:batch", json={"jobs": [dict(JOB, name="k", idempotencyKey="bulk-1")]},
                     headers=AUTH).json()
    job_id = idempotent_job_id("acme", "bulk-1")
    assert [x["status"] for x in first["results"]] == [201] and first["results"][0]["job"]["id"] == job_id
    items = [dict(JOB, name="k", idempotencyKey="bulk-1"), dict(JOB, name="other", idempotencyKey="bulk-1"),
             dict(JOB, name="x", idempotencyKey="bulk-2"), dict(JOB, name="x", idempotencyKey="bulk-2"),
             dict(JOB, name="y", idempotencyKey="bulk-2")]
    body = app.post("/v1/jobs:batch", json={"jobs": items}, headers=AUTH).json()
    assert [x["status"] for x in body["results"]] == [200, 409, 201, 200, 409], body
    assert body["results"][0]["job"]["id"] == job_id
    assert body["results"][1]["problem"]["field"] == "jobs[1].idempotencyKey"
    assert body["results"][3]["job"]["id"] == body["results"][2]["job"]["id"]
    registered = [c.job_id for c in _sent(producer) if isinstance(c, J.RegisterJob)]
    assert registered.count(idempotent_job_id("acme", "bulk-2")) == 1


def test_limits_count_the_batch_itself() -> None:
    limits = TenantLimits("acme", jobs_max=3)
    items = [dict(JOB, name=f"j{i}") for i in range(5)]
    ids = iter(f"job_{i}" for i in range(10))
    out = plan_batch(items, tenant="acme", now_ms=NOW, pools=POOLS, existing={}, limits=limits, jobs=1, backlog=0,
                     new_id=lambda: next(ids))
    assert [type(d) for d in out] == [Send, Send, Answer, Answer, Answer]
    refused = [d for d in out if isinstance(d, Answer)]
    assert all(d.status == 422 and d.body["limit"] == "jobs_max" for d in refused)


def test_the_whole_call_is_refused_only_for_its_shape() -> None:
    client = _app(BatchProducer())
    for body, field in [({"jobs": []}, "jobs"), ({"items": [JOB]}, "jobs"), ([JOB], "jobs"),
                        ({"jobs": [JOB] * (BATCH_ITEMS_MAX + 1)}, "jobs")]:
        r = client.post("/v1/jobs:batch", json=body, headers=AUTH)
        assert r.status_code == 422 and r.headers["content-type"] == "application/problem+json", r.text
        assert r.json()["field"] == field
    assert client.post("/v1/jobs:batch", json={"jobs": [JOB]}).status_code == 401
    r = client.post("/v1/jobs:batch", json={"jobs": [JOB, 7, {"name": "x"}, dict(JOB, idempotencyKey="bad key")]},
                    headers=AUTH)
    assert [x["status"] for x in r.json()["results"]] == [201, 422, 422, 422]
    assert r.json()["results"][1]["problem"]["field"] == "jobs[1]"
    assert r.json()["results"][3]["problem"]["field"] == "jobs[3].idempotencyKey"


def test_an_item_kafka_refused_answers_503_outcome_unknown_and_the_others_stand() -> None:
    producer = BatchProducer(refuse=frozenset({idempotent_job_id("acme", "b")}))
    items = [dict(JOB, name="a", idempotencyKey="a"), dict(JOB, name="b", idempotencyKey="b")]
    body = _app(producer).post("/v1/jobs:batch", json={"jobs": items}, headers=AUTH).json()
    assert [x["status"] for x in body["results"]] == [201, 503]
    assert body["results"][1]["problem"]["outcome"] == "unknown"


def test_a_producer_without_send_many_gets_one_send_per_item() -> None:
    class Failing(ListProducer):
        def send(self, topic: str, key: str, value: bytes | None, **kw: Any) -> None:
            if key.endswith("2"):
                raise EventLogError("down")
            super().send(topic, key, value, **kw)

    producer = Failing()
    sink = CommandSink(producer, load_topology().job_commands)
    spec = parse_job_spec(JOB, NOW)
    errors = sink.send_many([(f"job_{i}", J.RegisterJob(f"job_{i}", "acme", spec, NOW)) for i in range(3)])
    assert [e is None for e in errors] == [True, True, False]
    assert len(producer.sent) == 2


def test_the_client_sends_a_batch_with_keys_and_reads_one_result_per_job() -> None:
    from gnomon.client import Client

    producer = BatchProducer()
    http = _app(producer)
    client = Client(url="http://testserver", token="tok-a")
    client._http = http  # the TestClient is an httpx.Client on the app
    http.headers["Authorization"] = "Bearer tok-a"
    answer = client.create_jobs([dict(JOB, name="a"), dict(JOB, name="b")], idempotency_keys=["ka", None])
    assert [r["status"] for r in answer["results"]] == [201, 201]
    assert answer["results"][0]["job"]["id"] == idempotent_job_id("acme", "ka")


def test_items_the_processor_refuses_answer_its_problem_and_unanswered_ones_202() -> None:
    from gnomon.core.tenants import TenantBook

    book = TenantBook()  # the processor's view: acme may have one job (the API's: the defaults)
    book.apply("acme", TenantLimits("acme", jobs_max=1))
    producer = BatchProducer(tenants=book)
    items = [dict(JOB, name="a"), dict(JOB, name="b")]
    body = _app(producer).post("/v1/jobs:batch", json={"jobs": items}, headers=AUTH).json()
    assert [x["status"] for x in body["results"]] == [201, 422], body
    assert body["results"][1]["problem"]["limit"] == "jobs_max"
    assert body["results"][1]["problem"]["field"].startswith("jobs[1]")
    producer.hold()
    body = _app(producer).post("/v1/jobs:batch", json={"jobs": [dict(JOB, name="c")]}, headers=AUTH).json()
    assert body["results"][0]["status"] == 202 and body["pending"] == 1
    assert body["results"][0]["pending"]["commandId"] is not None
