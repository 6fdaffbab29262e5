"""A team's service registers and manages jobs by producing to Kafka with gnomon.events
(no REST call): the processor applies them like the API's commands and the job runs."""

from __future__ import annotations

import secrets

import pytest
from harness import NEVER_DUE, OTHER_TOKEN, TOKEN, Stack, job_or_none, wait_for

from gnomon.client import Client
from gnomon.config import load
from gnomon.events import JobEvents

pytestmark = pytest.mark.integration


def _job(stack: Stack, job_id: str) -> dict[str, object] | None:
    return job_or_none(stack.client, job_id)


def test_jobs_registered_over_kafka_run_and_obey_later_commands(stack: Stack) -> None:
    key = "events-" + secrets.token_hex(4)
    with JobEvents("acme", load().kafka_bootstrap) as events:
        job_id = events.register({"name": key, "schedule": "*/2 * * * * *",
                                  "target": {"type": "command", "argv": ["sh", "-c", "echo over kafka"]},
                                  "timeoutS": 30, "retry": {"max": 1}}, idempotency_key=key)
    wait_for(lambda: _job(stack, job_id), 30, f"job {job_id} in history")
    ran = wait_for(lambda: stack.client.list_runs(job_id, status="succeeded", limit=5)["items"], 60,
                   f"a succeeded run of {job_id}")
    assert ran[0]["id"].startswith(job_id + "@")
    logs = stack.client.get_logs(ran[0]["id"])["items"]
    assert any(line["line"] == "over kafka" for line in logs), logs

    with JobEvents("acme", load().kafka_bootstrap) as events:
        events.pause(job_id)
    wait_for(lambda: (_job(stack, job_id) or {}).get("status") == "paused", 30, f"{job_id} paused")
    with JobEvents("acme", load().kafka_bootstrap) as events:
        events.delete(job_id)
    wait_for(lambda: _job(stack, job_id) is None or (_job(stack, job_id) or {}).get("status") == "deleted", 30,
             f"{job_id} deleted")


def test_every_command_gets_an_answer_accepted_or_refused_with_the_reason(stack: Stack) -> None:
    """Replies: the processor answers each command on the command-results topic, and a
    team's producer reads its answers through the API (its Kafka credential cannot read
    that topic: docs/adr/0006, decision 4); a refusal names what the API would name, and
    no longer goes to the poison topic."""
    key = "replies-" + secrets.token_hex(4)
    spec = {"name": key, "schedule": NEVER_DUE, "target": {"type": "command", "argv": ["true"]}}
    with JobEvents("acme", load().kafka_bootstrap, replies=True, answers_url=stack.api_url,
                   api_token=TOKEN) as events:
        job_id = events.register(spec, idempotency_key=key)
        events.register(spec, idempotency_key=key)  # the same registration again: changes nothing
        events.patch(job_id, {"priority": "high"}, expected_version=1)
        events.patch(job_id, {"priority": "low"}, expected_version=1)  # stale: the job is at 2 by then
        events.pause("job_" + secrets.token_hex(8))  # no such job
        events.delete(job_id)
        results = events.results(timeout_s=60)
    assert [r.command for r in results] == ["RegisterJob", "RegisterJob", "PatchJob", "PatchJob", "PauseJob",
                                            "DeleteJob"]
    assert [r.code.value for r in results] == ["accepted", "accepted", "accepted", "conflict", "refused",
                                               "accepted"], results
    assert [r.job_version for r in results[:3]] == [1, 1, 2]
    assert "not the expected 1" in (results[3].reason or "")
    assert "does not exist" in (results[4].reason or "")
    assert all(r.tenant == "acme" for r in results)


def test_a_producer_with_one_tenants_key_cannot_act_for_another_tenant(stack: Stack) -> None:
    """ADR 0006 (b) on real Kafka: tenant ``other`` registers a job through the API (which
    signs with other's key). A producer that holds a team's Kafka credential (``producer``) and acme's
    command key rewrites its commands' tenant to ``other`` and tries to register over,
    patch and delete that job: each is refused on the command-results topic, naming
    ``signature`` (answers to commands naming ``other``: other's token reads them), and the
    job is as it was."""
    key = "victim-" + secrets.token_hex(4)
    other = Client(stack.api_url, OTHER_TOKEN)
    created = other.create_job({"name": key, "schedule": NEVER_DUE, "target": {"type": "command", "argv": ["true"]}})
    job_id = created["id"]
    wait_for(lambda: job_or_none(other, job_id), 30, f"job {job_id} in history")
    try:
        with JobEvents("acme", load().kafka_bootstrap, replies=True, answers_url=stack.api_url,
                       api_token=OTHER_TOKEN) as forger:
            forger.tenant = "other"  # the record says "other"; the signature is acme's
            forger.register({"name": "taken over", "schedule": "* * * * *",
                             "target": {"type": "command", "argv": ["true"]}}, job_id=job_id)
            forger.patch(job_id, {"priority": "high"})
            forger.delete(job_id)
            results = forger.results(timeout_s=60)
        assert [(r.command, r.code.value, r.field) for r in results] == [
            ("RegisterJob", "refused", "signature"), ("PatchJob", "refused", "signature"),
            ("DeleteJob", "refused", "signature")], results
        assert all("signed with key" in (r.reason or "") and "'acme'" in (r.reason or "") for r in results)
        after = other.get_job(job_id)
        assert after["status"] == "active" and after["name"] == key and after["version"] == created["version"]
    finally:
        other.delete(job_id)
