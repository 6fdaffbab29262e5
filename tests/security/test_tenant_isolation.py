"""Tenant isolation, for every route of the app: tenant ``other`` using tenant ``acme``'s
job and run ids gets the same 404 problem as for ids that do not exist, and nothing of
acme's changes (a job write reaches the processor, which refuses it); ``other``'s
listings never show ``acme``'s items, nor its commands' answers. The matrix is checked
against ``app.routes``, so a new endpoint fails this test until it is added here."""

from __future__ import annotations

import time
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gnomon.core.clock import SystemClock
from gnomon.core.messages import LogLine, LogStream
from gnomon.core.runs import RunState, RunStatus

# Routes without tenant data: the contract, the docs, the health and readiness checks, the metrics.
PUBLIC_ROUTES = {("GET", "/openapi.json"), ("GET", "/docs"), ("GET", "/docs/oauth2-redirect"),
                 ("GET", "/redoc"), ("GET", "/healthz"), ("GET", "/readyz"), ("HEAD", "/openapi.json"), ("HEAD", "/docs"),
                 ("HEAD", "/docs/oauth2-redirect"), ("HEAD", "/redoc"), ("GET", "/metrics"), ("HEAD", "/metrics")}
JOB = {"name": "a-secret-job", "schedule": "0 * * * *", "target": {"type": "command", "argv": ["true"]}}

def _now_iso() -> str:
    from gnomon.core.clock import ms_to_iso

    return ms_to_iso(int(time.time() * 1000))


# (method, route path) -> (body, which of acme's ids to use); every such call by "other" is a 404.
BY_ID: dict[tuple[str, str], tuple[Any, str]] = {
    ("GET", "/v1/jobs/{job_id}"): (None, "job"),
    ("PATCH", "/v1/jobs/{job_id}"): ({"priority": "high"}, "job"),
    ("DELETE", "/v1/jobs/{job_id}"): (None, "job"),
    ("POST", "/v1/jobs/{job_id}:pause"): (None, "job"),
    ("POST", "/v1/jobs/{job_id}:resume"): (None, "job"),
    ("POST", "/v1/jobs/{job_id}:trigger"): ({"idempotencyKey": "k1"}, "job"),
    ("POST", "/v1/jobs/{job_id}:move"): ({"region": "b"}, "job"),
    # a range over the job's own life (a backfill covers none before it existed): built at the call
    ("POST", "/v1/jobs/{job_id}:backfill"): (lambda: {"from": "2026-01-01T00:00:00Z", "to": _now_iso()}, "job"),
    ("GET", "/v1/jobs/{job_id}/runs"): (None, "job"),
    ("GET", "/v1/jobs/{job_id}/fires"): (None, "job"),
    ("GET", "/v1/runs/{run_id}"): (None, "run"),
    ("GET", "/v1/runs/{run_id}/logs"): (None, "run"),
    ("POST", "/v1/runs/{run_id}:cancel"): (None, "run"),
    ("POST", "/v1/runs/{run_id}:replay"): (None, "failed_run"),
}
# Tenant-wide listings and the create: checked by the tests below.
LISTINGS = {("GET", "/v1/jobs"), ("GET", "/v1/dead-letters"), ("POST", "/v1/jobs"), ("POST", "/v1/jobs:batch")}
# The answer to a write that timed out (202), by its command id: another tenant's is "pending".
ANSWERS = {("GET", "/v1/commands/{command_id}")}
# Tenants' limits: the admin role only (a tenant token gets 403 and nothing is written) ...
ADMIN_ONLY = {("GET", "/v1/tenants"), ("GET", "/v1/tenants/{tenant}"), ("PUT", "/v1/tenants/{tenant}"),
              ("DELETE", "/v1/tenants/{tenant}")}
# ... and a tenant's own limits and usage, and its own alert webhook (the tenant is the token's).
OWN = {("GET", "/v1/tenant"), ("GET", "/v1/alerts"), ("PUT", "/v1/alerts"), ("DELETE", "/v1/alerts"),
       ("GET", "/v1/calendars"), ("GET", "/v1/calendars/{name}"), ("PUT", "/v1/calendars/{name}"),
       ("DELETE", "/v1/calendars/{name}")}
# The web UI: signed in by cookie, not by bearer header; its isolation, sign-in and CSRF
# matrix is tests/security/test_ui.py (which checks these routes against app.routes too).
UI = {("GET", "/ui"), ("GET", "/ui/login"), ("POST", "/ui/login"), ("POST", "/ui/logout"),
      ("GET", "/ui/static/{name}"), ("GET", "/ui/jobs"), ("GET", "/ui/jobs/{job_id}"),
      ("GET", "/ui/jobs/{job_id}/runs"), ("GET", "/ui/runs/{run_id}"), ("GET", "/ui/runs/{run_id}/tail"),
      ("GET", "/ui/dead-letters"), ("GET", "/ui/calendars"),
      *((m, "/ui/api/v1/{rest:path}") for m in ("GET", "POST", "PUT", "PATCH", "DELETE"))}


def _app_routes(app: Any) -> set[tuple[str, str]]:
    return {(method, route.path) for route in app.routes for method in (getattr(route, "methods", None) or ())}


@pytest.fixture
def world(gnomon_api: Any) -> dict[str, Any]:
    """acme's job (created through the API), a running and a failed run of it, a log line."""
    client = TestClient(gnomon_api.app)
    job = client.post("/v1/jobs", json=JOB, headers={**gnomon_api.auth("acme"), "Idempotency-Key": "shared"}).json()
    now = SystemClock().now_ms()
    spec = gnomon_api.history.get_job(job["id"]).spec
    ids = {"job": job["id"], "run": f"{job['id']}@manual:a", "failed_run": f"{job['id']}@manual:b"}
    running = {"lease_until_ms": now + 30_000, "deadline_ms": now + 3_600_000, "worker_id": "w1", "token": 1}
    for run_id, status in ((ids["run"], RunStatus.RUNNING), (ids["failed_run"], RunStatus.FAILED)):
        failed = status is RunStatus.FAILED
        gnomon_api.producer.adopt_run(RunState(  # the processor's store and history
            run_id, job["id"], "acme", spec, now, now, True, status, now, now, attempt=1,
            finished_at_ms=now if failed else None, error="secret error" if failed else None,
            **({} if failed else running)))
    gnomon_api.history.put_log(LogLine(ids["run"], job["id"], "acme", 1, 0, LogStream.STDOUT, "secret", now))
    gnomon_api.producer.sent.clear()
    return {"client": client, "ids": ids}


def test_every_route_is_in_the_matrix(gnomon_api: Any) -> None:
    routes = _app_routes(gnomon_api.app) - PUBLIC_ROUTES
    covered = set(BY_ID) | LISTINGS | ADMIN_ONLY | OWN | UI | ANSWERS
    assert routes - covered == set(), "new route(s): add them to BY_ID or LISTINGS (or UI)"
    assert covered - routes == set(), "the matrix lists routes the app no longer has"


@pytest.mark.parametrize(("method", "path"), sorted(BY_ID))
def test_other_tenant_gets_404_and_nothing_is_produced(gnomon_api: Any, world: dict[str, Any], method: str,
                                                       path: str) -> None:
    client, ids = world["client"], world["ids"]
    body, which = BY_ID[(method, path)]
    body = body() if callable(body) else body
    url = path.replace("{job_id}", ids["job"]).replace("{run_id}", ids[which])
    kwargs = {} if body is None else {"json": body}
    job_before, answers_before = gnomon_api.producer.job(ids["job"]), len(gnomon_api.producer.results)
    theirs = client.request(method, url, headers=gnomon_api.auth("other"), **kwargs)
    assert theirs.status_code == 404, theirs.text
    assert theirs.headers["content-type"] == "application/problem+json"
    assert "acme" not in theirs.text and "secret" not in theirs.text
    # a job or run write reached the processor, which refused it; nothing else is written
    assert gnomon_api.producer.job(ids["job"]) == job_before
    assert not any(r.accepted for r in list(gnomon_api.producer.results.values())[answers_before:])
    assert all(t == "gnomon.job-commands" for t, _, _ in gnomon_api.producer.sent)
    # ... exactly as for an id that does not exist, so ids cannot be probed
    missing = url.replace(ids["job"], "job_ffffffffffffffff")
    nobody = client.request(method, missing, headers=gnomon_api.auth("other"), **kwargs)
    assert nobody.status_code == 404
    assert theirs.json()["title"] == nobody.json()["title"]
    # and the owner does reach it (the ids are real)
    mine = client.request(method, url, headers=gnomon_api.auth("acme"), **kwargs)
    if path.endswith(":move"):  # (this API serves the default namespace: its processor refuses the move there)
        assert mine.status_code == 409 and "no region" in mine.text, mine.text
        return
    assert mine.status_code in (200, 202), mine.text


def test_another_tenants_command_answer_is_only_ever_pending(gnomon_api: Any, world: dict[str, Any]) -> None:
    client, ids = world["client"], world["ids"]
    (position,) = [p for p, r in gnomon_api.producer.results.items() if r.job_id == ids["job"]]
    url = f"/v1/commands/{position[0]}-{position[1]}"
    assert client.get(url, headers=gnomon_api.auth("acme")).json()["status"] == "accepted"
    theirs = client.get(url, headers=gnomon_api.auth("other"))
    assert theirs.json() == {"commandId": f"{position[0]}-{position[1]}", "status": "pending"}
    assert "acme" not in theirs.text and ids["job"] not in theirs.text


def test_listings_never_show_another_tenants_items(gnomon_api: Any, world: dict[str, Any]) -> None:
    client = world["client"]
    for path in ("/v1/jobs", "/v1/dead-letters"):
        assert client.get(path, headers=gnomon_api.auth("other")).json() == {"items": [], "cursor": None}
        assert client.get(path, headers=gnomon_api.auth("acme")).json()["items"], path
    assert gnomon_api.producer.sent == []


def test_the_same_idempotency_key_is_another_job_for_another_tenant(gnomon_api: Any, world: dict[str, Any]) -> None:
    client, ids = world["client"], world["ids"]
    theirs = client.post("/v1/jobs", json=JOB, headers={**gnomon_api.auth("other"), "Idempotency-Key": "shared"})
    assert theirs.status_code == 201 and theirs.json()["id"] != ids["job"] and theirs.json()["tenant"] == "other"
    assert [key for _, key, _ in gnomon_api.producer.sent] == [theirs.json()["id"]]
    listed = client.get("/v1/jobs", headers=gnomon_api.auth("other")).json()["items"]
    assert [j["id"] for j in listed] == [theirs.json()["id"]]


def test_a_batch_key_another_tenant_used_is_a_new_job_of_ones_own(gnomon_api: Any, world: dict[str, Any]) -> None:
    client, ids = world["client"], world["ids"]
    r = client.post("/v1/jobs:batch", json={"jobs": [{**JOB, "idempotencyKey": "shared"}]},
                    headers=gnomon_api.auth("other"))
    result = r.json()["results"][0]
    assert result["status"] == 201 and result["job"]["id"] != ids["job"] and result["job"]["tenant"] == "other"
    assert ids["job"] not in r.text  # nothing of acme's job in the answer
    assert [key for _, key, _ in gnomon_api.producer.sent] == [result["job"]["id"]]


@pytest.mark.parametrize(("method", "path"), sorted(ADMIN_ONLY))
def test_tenant_tokens_cannot_read_or_change_limits(gnomon_api: Any, method: str, path: str) -> None:
    client = TestClient(gnomon_api.app)
    url = path.replace("{tenant}", "acme")
    kwargs = {"json": {"concurrencyMax": 100000}} if method == "PUT" else {}
    for tenant in ("acme", "other"):
        r = client.request(method, url, headers=gnomon_api.auth(tenant), **kwargs)
        assert r.status_code == 403, r.text
        assert r.headers["content-type"] == "application/problem+json"
    assert gnomon_api.producer.sent == []


def test_a_tenant_sees_only_its_own_limits(gnomon_api: Any) -> None:
    client = TestClient(gnomon_api.app)
    for tenant in ("acme", "other"):
        body = client.get("/v1/tenant", headers=gnomon_api.auth(tenant)).json()
        assert body["tenant"] == tenant, body
        assert ("acme" if tenant == "other" else "other") not in str(body)


def test_a_tenant_sets_and_sees_only_its_own_alert_webhook(gnomon_api: Any) -> None:
    client = TestClient(gnomon_api.app)
    r = client.put("/v1/alerts", json={"url": "https://acme.example.com/alerts"}, headers=gnomon_api.auth("acme"))
    assert r.status_code == 200 and r.json()["tenant"] == "acme"
    assert client.get("/v1/alerts", headers=gnomon_api.auth("other")).json()["configured"] is False
    assert client.delete("/v1/alerts", headers=gnomon_api.auth("other")).json()["tenant"] == "other"
    assert client.get("/v1/alerts", headers=gnomon_api.auth("acme")).json()["url"] == "https://acme.example.com/alerts"
    # every record is keyed by the caller's own tenant: other's delete tombstoned "other", not acme
    assert [(key, value is None) for _, key, value in gnomon_api.producer.sent] == [("acme", False), ("other", True)]
