"""Tenant quotas and admission on the real stack (API -> Kafka -> processor -> workers ->
Cassandra -> API), limits set through the admin API and read by the processor from
gnomon.tenants without a restart.

Tenant quota (a tenant of this test alone, so no other test's runs hold its quota) gets a
concurrency quota of 2 and 20 runs of 4 s due at once; tenant other's 5 runs are due at
the same second on the same shared pool. quota never has more than 2 running (spans from
history), its waiting runs say why, all 20 finish, and other's runs start on time.
"""

from __future__ import annotations

import itertools
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from harness import ADMIN_TOKEN, NEVER_DUE, OTHER_TOKEN, QUOTA_TOKEN, Stack, wait_for

from gnomon.client import ApiError, Client
from gnomon.core.clock import iso_to_ms, ms_to_iso

pytestmark = pytest.mark.integration

RUN_S = 4


def admin(stack: Stack) -> httpx.Client:
    return httpx.Client(base_url=stack.api_url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=10)


@pytest.fixture
def limits(stack: Stack) -> Iterator[httpx.Client]:
    """Set limits for the test, then put its tenants back on the defaults."""
    with admin(stack) as c:
        yield c
        for tenant in ("quota", "other"):
            c.delete(f"/v1/tenants/{tenant}")
        time.sleep(1)  # the processor polls gnomon.tenants between batches


@pytest.fixture
def shared_worker(stack: Stack) -> Iterator[None]:
    """A worker serving both tenants (the session worker serves acme only)."""
    stack.start("quota-worker", "worker", "--worker-id", "e2e-quota-w", "--concurrency", "16",
                "--tenant", "quota", "--tenant", "other", "--policy", str(Path(__file__).parent / "quota-policy.toml"))
    time.sleep(3)  # its adverts reach the processor
    yield
    stack.stop("quota-worker")


def one_time(client: Client, tag: str, at_ms: int) -> str:
    body = {"name": f"e2e-quota-{tag}-{secrets.token_hex(3)}", "runAt": ms_to_iso(at_ms),
            "target": {"type": "command", "argv": ["sleep", str(RUN_S)]}, "timeoutS": 60, "retry": {"max": 1}}
    return str(client.create_job(body)["id"])


def runs_of(client: Client, job_ids: list[str]) -> list[dict[str, Any]]:
    out = []
    for job_id in job_ids:
        try:
            out.extend(client.list_runs(job_id, limit=10)["items"])
        except ApiError as exc:
            if exc.status != 404:  # (history has not seen the job yet)
                raise
    return out


def test_a_tenant_at_quota_never_exceeds_it_while_another_starts_on_time(
        stack: Stack, limits: httpx.Client, shared_worker: None) -> None:
    r = limits.put("/v1/tenants/quota", json={"concurrencyMax": 2})
    assert r.status_code == 200, r.text
    time.sleep(1.5)
    quota = Client(stack.api_url, QUOTA_TOKEN)
    other = Client(stack.api_url, OTHER_TOKEN)
    slot = int(time.time() * 1000) + 12_000
    a_jobs = [one_time(quota, f"a{i}", slot) for i in range(20)]
    b_jobs = [one_time(other, f"b{i}", slot) for i in range(5)]

    def waiting_reasons() -> list[str]:
        return [r["reason"] for r in runs_of(quota, a_jobs)
                if r["status"] == "ready" and (r.get("reason") or "").startswith("waiting for quota")]

    seen_waiting = wait_for(waiting_reasons, 30, "tenant quota's runs shown waiting for quota")
    assert seen_waiting
    done = wait_for(lambda: [r for r in runs_of(quota, a_jobs) if r["status"] == "succeeded"]
                    if len([r for r in runs_of(quota, a_jobs) if r["status"] == "succeeded"]) == 20 else None,
                    20 * RUN_S / 2 + 60, "all 20 of tenant quota's runs to succeed")
    spans = sorted((iso_to_ms(r["startedAt"]), iso_to_ms(r["finishedAt"])) for r in done)
    events = sorted(itertools.chain(((s, 1) for s, _ in spans), ((f, -1) for _, f in spans)),
                    key=lambda e: (e[0], e[1]))  # an end before a start at the same ms
    running = peak = 0
    for _, d in events:
        running += d
        peak = max(peak, running)
    assert peak == 2, f"tenant quota ran {peak} at once with a quota of 2: {spans}"
    b_runs = runs_of(other, b_jobs)
    assert len(b_runs) == 5 and all(r["status"] == "succeeded" for r in b_runs), b_runs
    lags = [r["startLagS"] for r in b_runs]
    assert max(lags) < 1.0, f"tenant other started late while tenant quota was at its quota: {lags}"


def test_admission_refusals_name_the_limit(stack: Stack, limits: httpx.Client) -> None:
    assert limits.put("/v1/tenants/other", json={"intervalMinS": 60, "triggersPerMinMax": 3}).status_code == 200
    time.sleep(2)  # the API reads gnomon.tenants too
    other = Client(stack.api_url, OTHER_TOKEN)
    fast = {"name": "e2e-fast", "schedule": "*/10 * * * * *", "target": {"type": "command", "argv": ["true"]}}
    with pytest.raises(ApiError) as exc:
        other.create_job(fast)
    assert exc.value.status == 422 and "interval_min_s" in str(exc.value.problem)
    slow = {**fast, "name": "e2e-slow", "schedule": NEVER_DUE}
    job_id = str(other.create_job(slow)["id"])
    wait_for(lambda: _exists(other, job_id), 30, "the job in history")
    statuses = [_trigger(other, job_id, f"k{i}-{secrets.token_hex(2)}") for i in range(5)]
    assert statuses.count(429) >= 2, statuses
    with httpx.Client(base_url=stack.api_url, headers={"Authorization": f"Bearer {OTHER_TOKEN}"}) as c:
        r = c.post(f"/v1/jobs/{job_id}:trigger", json={"idempotencyKey": "one-more"})
        assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1, r.text
        assert r.headers["content-type"].startswith("application/problem+json")
        # a normal tenant may not change limits
        assert c.put("/v1/tenants/other", json={"concurrencyMax": 1000}).status_code == 403


def _trigger(client: Client, job_id: str, key: str, overloaded_wait_s: float = 60.0) -> int:
    """A manual trigger's status; a 429 must name the trigger-rate limit. A refusal for
    overload (the processor defers due jobs on a box this test shares with the previous
    ones' backlog) is not this test's subject: retried, as a client would, after a second."""
    deadline = time.monotonic() + overloaded_wait_s
    while True:
        try:
            client.trigger(job_id, idempotency_key=key)
            return 202
        except ApiError as e:
            if e.status == 429 and "overloaded" in str(e.problem) and time.monotonic() < deadline:
                time.sleep(1)
                continue
            assert e.status != 429 or "triggers_per_min_max" in str(e.problem), e.problem
            return e.status


def _exists(client: Client, job_id: str) -> bool:
    try:
        client.get_job(job_id)
        return True
    except ApiError:
        return False


def test_one_decider_every_job_write_answers_the_processors_decision(stack: Stack, limits: httpx.Client) -> None:
    """The API writes the command and returns the processor's answer (issue 23): a 201 is
    an acceptance, a refusal is the processor's own problem, and a GET right after a 201
    finds the job (the API keeps what it answered; Cassandra may not have it yet)."""
    job = {"name": "e2e-decider", "schedule": NEVER_DUE, "target": {"type": "command", "argv": ["true"]}}
    with httpx.Client(base_url=stack.api_url, headers={"Authorization": f"Bearer {OTHER_TOKEN}"}, timeout=15) as c:
        created = c.post("/v1/jobs", json=job)
        assert created.status_code == 201, created.text
        job_id = created.json()["id"]
        got = c.get(f"/v1/jobs/{job_id}")
        assert got.status_code == 200 and got.json()["version"] == 1, got.text
        paused = c.post(f"/v1/jobs/{job_id}:pause")  # decided by the processor, not by history
        assert paused.status_code == 200 and paused.json()["version"] == 2, paused.text
        assert c.get(f"/v1/jobs/{job_id}").json()["status"] == "paused"
        missing = c.post("/v1/jobs/job_0000000000000000:pause")
        assert missing.status_code == 404 and missing.headers["content-type"].startswith("application/problem+json")
        # the processor's limit: the tenant's jobs now (this one at least), read from gnomon.tenants
        assert limits.put("/v1/tenants/other", json={"jobsMax": 1}).status_code == 200
        deadline = time.monotonic() + 30
        while True:  # until the processor has read the new limit
            refused = c.post("/v1/jobs", json={**job, "name": "e2e-decider-2"})
            if refused.status_code != 201 or time.monotonic() > deadline:
                break
            assert c.delete(f"/v1/jobs/{refused.json()['id']}").status_code == 200
            time.sleep(0.5)
        assert refused.status_code == 422, refused.text
        assert refused.json()["limit"] == "jobs_max" and refused.headers["content-type"].startswith(
            "application/problem+json")
        assert c.delete(f"/v1/jobs/{job_id}").status_code == 200
