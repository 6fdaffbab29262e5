"""Tenant limits and admission on the real stack (API -> Kafka -> processor -> Cassandra ->
API), limits set through the admin API and read by the API and the processor from
gnomon.tenants without a restart: refusals name the limit, and every job write answers
the processor's decision.

The concurrency quota under faults (a tenant at its quota never exceeds it while another
starts on time) moved into the simulation: tests/unit/test_sim_quota.py.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator

import httpx
import pytest
from harness import ADMIN_TOKEN, NEVER_DUE, OTHER_TOKEN, Stack, wait_for

from gnomon.client import ApiError, Client

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
