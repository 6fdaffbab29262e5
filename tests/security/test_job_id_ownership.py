"""Issue 50, finding 1: a deleted job's id could be registered again by another tenant,
who then read the old owner's runs (``GET /v1/jobs/{id}/runs`` checked who owned the job
now, not whose runs they were): in the audit acme listed 4 of globex's runs with their
output. The processor now keeps a deleted job's owner for ever (a DELETED state: its
tenant may register the id again, no other may), and every read of runs and logs checks
each one's own tenant. Over REST and a team's producer on the job-commands topic, with the
processor's real deciders answering (``DecidingProducer``).

Its second half: an id derived from another tenant's idempotency key could be registered
first over Kafka by a tenant who guessed the key (the derivation is public: a hash of
tenant and key), and the owner's ``POST /v1/jobs`` with that key then answered 409 for
ever. A registration of an id of that form now carries its key, and the processor checks
that the id was derived from it with the command's own tenant (checked against the code
before: the squatter's registration was accepted and acme's create answered 409)."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from gnomon import codec
from gnomon.core import jobs as J
from gnomon.core.clock import SystemClock
from gnomon.core.messages import LogLine, LogStream
from gnomon.core.replies import CommandResult
from gnomon.core.runs import RunState, RunStatus
from gnomon.topology import load_topology

JOB = {"name": "nightly", "schedule": "0 3 * * *", "target": {"type": "command", "argv": ["true"]}}
TOPO = load_topology()


def _kafka(gnomon_api: Any, cmd: Any) -> CommandResult:
    """``cmd`` from a team's producer on the job-commands topic; the processor's answer."""
    at = gnomon_api.producer.send(TOPO.job_commands, cmd.job_id, codec.encode(cmd, TOPO.job_commands))
    assert at is not None
    return gnomon_api.producer.results[at]


def test_a_deleted_jobs_id_stays_its_tenants(gnomon_api: Any) -> None:
    client = TestClient(gnomon_api.app)
    acme, other = gnomon_api.auth("acme"), gnomon_api.auth("other")
    job_id = client.post("/v1/jobs", json=JOB, headers=acme).json()["id"]
    spec = gnomon_api.producer.job(job_id).spec
    now = SystemClock().now_ms()
    run_id = f"{job_id}@manual:a"
    gnomon_api.producer.adopt_run(RunState(run_id, job_id, "acme", spec, now, now, True, RunStatus.SUCCEEDED, now,
                                           now, attempt=1, finished_at_ms=now, output='{"secret": 1}'))
    gnomon_api.history.put_log(LogLine(run_id, job_id, "acme", 1, 0, LogStream.STDOUT, "acme's secret", now))
    assert client.delete(f"/v1/jobs/{job_id}", headers=acme).status_code in (200, 202, 204)
    assert gnomon_api.producer.job(job_id) is None  # deleted: no job

    taken = _kafka(gnomon_api, J.RegisterJob(job_id, "other", spec, SystemClock().now_ms()))
    assert not taken.accepted and taken.reason == f"job {job_id} already exists", taken  # before: accepted
    assert gnomon_api.producer.job(job_id) is None
    listed = client.get(f"/v1/jobs/{job_id}/runs", headers=other)
    assert listed.status_code == 404 and "secret" not in listed.text, listed.text  # before: 200, acme's run
    assert client.get(f"/v1/runs/{run_id}/logs", headers=other).status_code == 404
    # its own tenant may register it again
    again = _kafka(gnomon_api, J.RegisterJob(job_id, "acme", spec, SystemClock().now_ms()))
    assert again.accepted, again
    job = gnomon_api.producer.job(job_id)
    assert job is not None and job.tenant == "acme" and job.status is J.JobStatus.ACTIVE


def test_runs_and_logs_are_listed_for_their_own_tenant_only(gnomon_api: Any) -> None:
    """History written before ids stayed their tenant's may hold another tenant's runs under
    a job id that is now the caller's: they are not listed."""
    client = TestClient(gnomon_api.app)
    other = gnomon_api.auth("other")
    job_id = client.post("/v1/jobs", json=JOB, headers=other).json()["id"]
    spec = gnomon_api.producer.job(job_id).spec
    now = SystemClock().now_ms()
    old = RunState(f"{job_id}@manual:old", job_id, "acme", spec, now, now, True, RunStatus.SUCCEEDED, now, now,
                   attempt=1, finished_at_ms=now, output='{"secret": 1}')
    gnomon_api.history.put_run(old)
    mine = RunState(f"{job_id}@manual:mine", job_id, "other", spec, now, now, True, RunStatus.SUCCEEDED, now, now,
                    attempt=1, finished_at_ms=now)
    gnomon_api.history.put_run(mine)
    gnomon_api.history.put_log(LogLine(mine.run_id, job_id, "acme", 1, 0, LogStream.STDOUT, "acme's secret", now))
    gnomon_api.history.put_log(LogLine(mine.run_id, job_id, "other", 1, 1, LogStream.STDOUT, "mine", now))
    runs = client.get(f"/v1/jobs/{job_id}/runs", headers=other)
    assert runs.status_code == 200 and [r["id"] for r in runs.json()["items"]] == [mine.run_id], runs.text
    logs = client.get(f"/v1/runs/{mine.run_id}/logs", headers=other).json()["items"]
    assert [x["line"] for x in logs] == ["mine"], logs


def test_an_id_derived_from_another_tenants_key_cannot_be_taken_first(gnomon_api: Any) -> None:
    from gnomon.core.model import idempotent_job_id
    from gnomon.core.validation import parse_job_spec

    client = TestClient(gnomon_api.app)
    now = SystemClock().now_ms()
    spec = parse_job_spec(JOB, now)
    theirs = idempotent_job_id("acme", "billing-close")  # what other computes from acme's guessed key
    for cmd in (J.RegisterJob(theirs, "other", spec, now),  # no key: the form is reserved
                J.RegisterJob(theirs, "other", spec, now, idempotency_key="billing-close"),  # other's own derivation
                J.RegisterJob(theirs, "other", spec, now, idempotency_key="guess")):  # any other key
        taken = _kafka(gnomon_api, cmd)
        assert not taken.accepted and taken.field == "jobId", taken  # before: the first was accepted
    assert gnomon_api.producer.job(theirs) is None
    made = client.post("/v1/jobs", json=JOB, headers={**gnomon_api.auth("acme"), "Idempotency-Key": "billing-close"})
    assert made.status_code == 201 and made.json()["id"] == theirs, made.text  # before: 409
    again = client.post("/v1/jobs", json=JOB, headers={**gnomon_api.auth("acme"), "Idempotency-Key": "billing-close"})
    assert again.status_code == 200 and again.json()["id"] == theirs, again.text  # a retry is the same job
    # other's own key derives another id, which other gets
    mine = client.post("/v1/jobs", json=JOB, headers={**gnomon_api.auth("other"), "Idempotency-Key": "billing-close"})
    assert mine.status_code == 201 and mine.json()["id"] == idempotent_job_id("other", "billing-close") != theirs
