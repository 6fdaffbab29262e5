"""Tenant endpoints of the API and the admission answers it relays, in-process (no
Kafka): admin role, PUT validation, the processor's 422/429 problems naming the limit
(``DecidingProducer``: the partitions' real deciders, sharing the API's book of limits
as they would after reading gnomon.tenants), the trigger window, tokens."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gnomon.api.app import CommandSink, create_app
from gnomon.api.tenants import TenantPoller, TenantService
from gnomon.config import Settings
from gnomon.core import jobs as J
from gnomon.core.clock import FakeClock, iso_to_ms
from gnomon.core.tenants import DEFAULTS_KEY, TenantBook, TenantLimits
from gnomon.core.usage import TenantUsage, UsageBook
from gnomon.core.validation import parse_job_spec
from gnomon.history.memory import InMemoryHistoryStore
from gnomon.testing import DecidingProducer
from gnomon.topology import load_topology
from gnomon.web.auth import (
    Authenticator,
    Principal,
    dev_admin_token,
    dev_token,
    hash_token,
    load_principals,
    parse_principals,
    parse_tokens,
)

NOW = iso_to_ms("2026-11-29T08:00:00.500Z")
ADMIN = {"Authorization": "Bearer tok-admin"}
ACME = {"Authorization": "Bearer tok-a"}
JOB_ID = "job_tenants_aa"  # (an id of the derived form, job_ + 16 hex, needs its idempotency key)
TENANTS = "gnomon.tenants"


@dataclass
class Env:
    client: TestClient
    producer: DecidingProducer
    history: InMemoryHistoryStore
    book: TenantBook
    usage: UsageBook
    clock: FakeClock

    def limits(self, tenant: str, **limits: int) -> None:
        self.book.apply(tenant, TenantLimits(tenant, **limits))

    def use(self, tenant: str, partition: int = 0, **counts: int) -> None:
        c = {"jobs": 0, "backlog": 0, "running": 0, "triggers_last_min": 0, **counts}
        self.usage.apply(f"{tenant}/{partition}", TenantUsage(tenant, partition, at_ms=NOW, **c))

    def commands(self) -> list[Any]:
        return [v for t, _, v in self.producer.sent if t != TENANTS]


@pytest.fixture
def env() -> Env:
    history, clock = InMemoryHistoryStore(), FakeClock(NOW)
    book, usage = TenantBook(), UsageBook()
    producer = DecidingProducer(history, tenants=book, clock=clock)
    topo = load_topology()
    service = TenantService(book, usage, writer=producer, topic=topo.tenants)
    auth = Authenticator({"tok-a": "acme", "tok-b": "other", "tok-admin": Principal("ops", admin=True)})
    sink = CommandSink(producer, topo.job_commands)
    app = create_app(history=history, commands=sink, auth=auth, topology=topo, clock=clock, tenants=service,
                     answers=producer.answers)
    spec = parse_job_spec({"name": "n", "schedule": "0 * * * *", "target": {"type": "command", "argv": ["true"]}},
                          NOW)
    sink.send(JOB_ID, J.RegisterJob(JOB_ID, "acme", spec, NOW))
    producer.sent.clear()
    return Env(TestClient(app), producer, history, book, usage, clock)


def job_body(**over: Any) -> dict[str, Any]:
    b = {"name": "n", "schedule": "0 * * * *", "target": {"type": "command", "argv": ["true"]}}
    b.update(over)
    return b


def problem_of(resp: Any, status: int) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"] == "application/problem+json"
    body: dict[str, Any] = resp.json()
    return body


# ---- admin role -------------------------------------------------------------------------------

ADMIN_CALLS = [("GET", "/v1/tenants", None), ("GET", "/v1/tenants/acme", None),
               ("PUT", "/v1/tenants/acme", {"jobsMax": 5}), ("DELETE", "/v1/tenants/acme", None)]


@pytest.mark.parametrize(("method", "path", "body"), ADMIN_CALLS)
def test_admin_routes_are_403_for_tenant_tokens_and_write_nothing(env: Env, method: str, path: str,
                                                                  body: Any) -> None:
    kw = {} if body is None else {"json": body}
    problem = problem_of(env.client.request(method, path, headers=ACME, **kw), 403)
    assert problem["field"] == "Authorization" and "admin" in problem["detail"]
    assert env.producer.sent == [] and not env.book.configured("acme")
    problem_of(env.client.request(method, path, **kw), 401)


def test_admin_reads_limits_and_usage(env: Env) -> None:
    env.limits("acme", jobs_max=50)
    env.use("acme", 0, jobs=3, backlog=1)
    env.use("acme", 4, jobs=2, running=5, triggers_last_min=7)
    env.use("busy", 1, jobs=1)
    view = env.client.get("/v1/tenants/acme", headers=ADMIN).json()
    assert view["tenant"] == "acme" and view["configured"] is True
    d = TenantLimits("acme")
    assert view["limits"] == {"concurrencyMax": d.concurrency_max, "jobsMax": 50, "intervalMinS": d.interval_min_s,
                              "backlogMax": d.backlog_max, "triggersPerMinMax": d.triggers_per_min_max}
    assert view["usage"] == {"jobs": 5, "backlog": 1, "running": 5, "triggersLastMin": 7,
                             "countedAt": "2026-11-29T08:00:00.500Z"}
    listing = env.client.get("/v1/tenants", headers=ADMIN).json()
    assert listing["defaults"]["jobsMax"] == TenantLimits("x").jobs_max
    assert [(v["tenant"], v["configured"]) for v in listing["items"]] == [("acme", True), ("busy", False)]
    unknown = env.client.get("/v1/tenants/nobody", headers=ADMIN).json()
    assert unknown["configured"] is False and unknown["usage"]["countedAt"] is None


def test_a_tenant_reads_its_own_limits(env: Env) -> None:
    env.limits("acme", backlog_max=9)
    env.use("acme", backlog=2)
    mine = env.client.get("/v1/tenant", headers=ACME).json()
    assert mine["tenant"] == "acme" and mine["limits"]["backlogMax"] == 9 and mine["usage"]["backlog"] == 2
    theirs = env.client.get("/v1/tenant", headers={"Authorization": "Bearer tok-b"}).json()
    assert theirs["tenant"] == "other" and theirs["configured"] is False


def test_put_merges_with_the_defaults_and_writes_the_record(env: Env) -> None:
    env.limits(DEFAULTS_KEY, jobs_max=100, backlog_max=20)
    resp = env.client.put("/v1/tenants/acme", json={"backlogMax": 5}, headers=ADMIN)
    assert resp.status_code == 200, resp.text
    assert resp.json()["limits"]["jobsMax"] == 100 and resp.json()["limits"]["backlogMax"] == 5
    ((topic, key, record),) = env.producer.sent
    assert (topic, key) == (TENANTS, "acme")
    assert record == TenantLimits("acme", jobs_max=100, backlog_max=5, updated_at_ms=NOW)
    assert env.book.limits("acme") == record  # read-your-writes on this instance
    # a second partial PUT keeps what the first set
    env.client.put("/v1/tenants/acme", json={"jobsMax": 7}, headers=ADMIN)
    assert env.book.limits("acme").limits()["backlog_max"] == 5 and env.book.limits("acme").jobs_max == 7


def test_put_star_sets_the_defaults_of_everyone_unconfigured(env: Env) -> None:
    assert env.client.put("/v1/tenants/*", json={"jobsMax": 3}, headers=ADMIN).status_code == 200
    assert env.client.get("/v1/tenants/other", headers=ADMIN).json()["limits"]["jobsMax"] == 3
    assert env.producer.sent[-1][1] == DEFAULTS_KEY


@pytest.mark.parametrize(("body", "field"), [
    ({"jobsMax": 0}, "jobsMax"), ({"backlogMax": 10_000_001}, "backlogMax"), ({"intervalMinS": 1.5}, "intervalMinS"),
    ({"concurrencyMax": True}, "concurrencyMax"), ({"triggersPerMinMax": "5"}, "triggersPerMinMax"),
    ({"jobs_max": 5}, "jobs_max"), ([1], "body"), ("nope", "body"),
])
def test_put_validation_names_the_field(env: Env, body: Any, field: str) -> None:
    kw = {"content": body} if isinstance(body, str) else {"json": body}
    problem = problem_of(env.client.put("/v1/tenants/acme", headers=ADMIN, **kw), 422)
    assert problem["field"] == field
    assert env.producer.sent == []


@pytest.mark.parametrize("name", ["a b", "x" * 129, "a:b"])
def test_bad_tenant_names_are_422(env: Env, name: str) -> None:
    problem = problem_of(env.client.put(f"/v1/tenants/{name}", json={"jobsMax": 1}, headers=ADMIN), 422)
    assert problem["field"] == "tenant"


def test_delete_tombstones_back_to_the_defaults(env: Env) -> None:
    env.client.put("/v1/tenants/acme", json={"jobsMax": 7}, headers=ADMIN)
    resp = env.client.delete("/v1/tenants/acme", headers=ADMIN)
    assert resp.status_code == 200 and resp.json()["configured"] is False
    assert resp.json()["limits"]["jobsMax"] == TenantLimits("x").jobs_max
    assert env.producer.sent[-1] == (TENANTS, "acme", None)


def test_without_a_writer_changes_are_503(env: Env) -> None:
    topo = load_topology()
    app = create_app(history=InMemoryHistoryStore(), commands=CommandSink(None, topo.job_commands),
                     auth=Authenticator({"tok-admin": Principal("ops", admin=True)}), topology=topo)
    client = TestClient(app)
    problem_of(client.put("/v1/tenants/acme", json={"jobsMax": 1}, headers=ADMIN), 503)
    assert client.get("/v1/tenants/acme", headers=ADMIN).json()["limits"]["jobsMax"] == TenantLimits("x").jobs_max


# ---- admission: the processor's answers, relayed -------------------------------------------


def trigger(env: Env, key: str, job_id: str = JOB_ID, headers: dict[str, str] = ACME) -> Any:
    return env.client.post(f"/v1/jobs/{job_id}:trigger", json={"idempotencyKey": key}, headers=headers)


def test_triggers_over_the_rate_are_429_with_retry_after(env: Env) -> None:
    env.limits("acme", triggers_per_min_max=3)
    for i in range(3):
        assert trigger(env, f"k{i}").status_code == 200
        env.clock.advance(10_000)  # triggers at +0, +10 s, +20 s; now +30 s
    problem = problem_of(trigger(env, "k3"), 429)
    assert problem["limit"] == "triggers_per_min_max" and "3" in problem["detail"]
    resp = trigger(env, "k3")
    assert resp.headers["Retry-After"] == "30"  # the first leaves the window at +60 s
    env.clock.advance(30_000)
    assert trigger(env, "k3").status_code == 200
    assert trigger(env, "k4").status_code == 429  # +10 s and +20 s still count, and the new one
    assert trigger(env, "k0").status_code == 200  # the same key again is the same run: nothing new


def test_trigger_window_is_per_tenant(env: Env) -> None:
    env.limits("acme", triggers_per_min_max=1)
    assert trigger(env, "k1").status_code == 200
    assert trigger(env, "k2").status_code == 429
    other = {"Authorization": "Bearer tok-b"}
    job = env.client.post("/v1/jobs", json=job_body(), headers=other).json()
    assert trigger(env, "k", job["id"], other).status_code == 200


def test_trigger_over_backlog_is_429(env: Env) -> None:
    env.limits("acme", backlog_max=1)
    one_time = job_body(schedule=None, runAt="2099-01-01T00:00:00Z")
    assert env.client.post("/v1/jobs", json=one_time, headers=ACME).status_code == 201  # backlog 1
    problem = problem_of(trigger(env, "k"), 429)
    assert problem["limit"] == "backlog_max" and int(trigger(env, "k").headers["Retry-After"]) >= 1


def test_one_time_job_over_backlog_is_429(env: Env) -> None:
    env.limits("acme", backlog_max=2)
    one_time = job_body(schedule=None, runAt="2099-01-01T00:00:00Z")
    assert [env.client.post("/v1/jobs", json=one_time, headers=ACME).status_code for _ in range(2)] == [201, 201]
    problem = problem_of(env.client.post("/v1/jobs", json=one_time, headers=ACME), 429)
    assert problem["limit"] == "backlog_max" and "Retry-After" in env.client.post(
        "/v1/jobs", json=one_time, headers=ACME).headers
    assert env.client.post("/v1/jobs", json=job_body(), headers=ACME).status_code == 201  # a cron job is fine


def test_jobs_over_jobs_max_is_422_naming_the_limit(env: Env) -> None:
    env.limits("acme", jobs_max=2)  # the fixture's job is one
    assert env.client.post("/v1/jobs", json=job_body(), headers=ACME).status_code == 201
    problem = problem_of(env.client.post("/v1/jobs", json=job_body(), headers=ACME), 422)
    assert problem["limit"] == "jobs_max" and "Retry-After" not in problem
    assert sum(1 for c in env.commands() if isinstance(c, J.RegisterJob)) == 2  # both written; one refused


def test_schedule_under_interval_min_is_422_on_create_and_patch(env: Env) -> None:
    env.limits("acme", interval_min_s=3600)
    problem = problem_of(env.client.post("/v1/jobs", json=job_body(schedule="*/30 * * * *"), headers=ACME), 422)
    assert (problem["limit"], problem["field"]) == ("interval_min_s", "schedule")
    problem = problem_of(env.client.patch(f"/v1/jobs/{JOB_ID}", json={"schedule": "*/10 * * * *"},
                                          headers=ACME), 422)
    assert (problem["limit"], problem["field"]) == ("interval_min_s", "schedule")
    assert env.producer.job(JOB_ID).spec.schedule.cron == "0 * * * *"  # type: ignore[union-attr]
    # a patch that leaves the schedule alone is not checked against it
    env.limits("acme", interval_min_s=86_400)
    assert env.client.patch(f"/v1/jobs/{JOB_ID}", json={"priority": "high"}, headers=ACME).status_code == 200
    assert env.client.patch(f"/v1/jobs/{JOB_ID}", json={"schedule": "0 0 * * *"}, headers=ACME).status_code == 200


def test_limits_change_without_a_restart(env: Env) -> None:
    env.limits("acme", jobs_max=1)
    problem_of(env.client.post("/v1/jobs", json=job_body(), headers=ACME), 422)
    assert env.client.put("/v1/tenants/acme", json={"jobsMax": 2}, headers=ADMIN).status_code == 200
    assert env.client.post("/v1/jobs", json=job_body(), headers=ACME).status_code == 201


# ---- pieces ----------------------------------------------------------------------------------


def test_poller_polls_the_feed() -> None:
    polled = threading.Event()

    class Feed:
        def poll(self) -> int:
            polled.set()
            return 0

    poller = TenantPoller(TenantService(feed=Feed()), interval_s=0.01).start()
    try:
        assert polled.wait(5)
    finally:
        poller.stop()


def test_admin_token_entries(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    digest = hash_token("t2")
    table = parse_principals(f"t1:acme, sha256:{digest}:ops:admin, t3:ops2 : admin")
    assert table == {hash_token("t1"): Principal("acme"), digest: Principal("ops", admin=True),
                     hash_token("t3"): Principal("ops2", admin=True)}
    assert parse_tokens(f"t1:acme,sha256:{digest}:ops:admin") == {hash_token("t1"): "acme", digest: "ops"}
    with pytest.raises(SystemExit, match="the only role is 'admin'"):
        parse_principals("t1:acme:root")
    auth = Authenticator.from_hashes(table)
    assert auth.principal_for("Bearer t2") == Principal("ops", admin=True)
    assert auth.tenant_for("Bearer t1") == "acme" and not auth.principal_for("Bearer t1").admin
    # dev mode: the dev token (tenant dev) and a dev admin token
    monkeypatch.delenv("GNOMON_API_TOKENS", raising=False)
    settings = Settings(state_dir=tmp_path)
    dev = load_principals(settings, dev=True)
    assert dev == {hash_token(dev_token(settings)): Principal("dev"),
                   hash_token(dev_admin_token(settings)): Principal("dev", admin=True)}
    assert dev_admin_token(settings).startswith("gnomon-dev-admin-") and dev_admin_token(settings) != dev_token(
        settings)
    assert (tmp_path / "dev-admin-token").stat().st_mode & 0o777 == 0o600
    with pytest.raises(SystemExit):
        load_principals(settings, dev=False)
