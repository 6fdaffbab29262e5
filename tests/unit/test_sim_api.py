"""The REST API in the whole-system simulation (``SimCluster.api``): its writes go to the
in-memory log, the cluster's real processors decide them under seeded faults (crashes,
fenced zombies, stalls, duplicated and reordered records), and the answer each write
gets at its Location is the processor's decision; the history checker still accounts
for every slot exactly once."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from gnomon.sim import HANDLER, SimCluster, SimFaults

SEEDS = 48
AUTH = {"Authorization": "Bearer sim-token"}
JOB = {"name": "every second", "schedule": "* * * * * *", "target": {"type": "handler", "name": HANDLER},
       "retry": {"max": 2, "backoffS": 0.5}, "timeoutS": 60}


pytestmark = pytest.mark.usefixtures("quiet_logs")


def answered(sim: SimCluster, client: TestClient, written: Any, within_ms: int = 60_000) -> dict[str, Any]:
    """Step the cluster (faults on) until the processor's answer to a 202 write is there."""
    assert written.status_code == 202, written.text
    where = written.headers["Location"]
    end = sim.clock.now_ms() + within_ms
    while True:
        got: dict[str, Any] = client.get(where).json()
        if got["status"] != "pending" or sim.clock.now_ms() >= end:
            return got
        sim.run_for(500)


@pytest.mark.parametrize("seed", range(SEEDS))
def test_rest_writes_are_decided_by_the_processors_under_faults(seed: int) -> None:
    sim = SimCluster(seed, faults=SimFaults.mixed())
    client = TestClient(sim.api(), headers=AUTH)
    created = client.post("/v1/jobs", json=JOB, headers={"Idempotency-Key": f"sim-{seed}"})
    job_id = created.json()["jobId"]
    first = answered(sim, client, created)
    assert (first["status"], first["version"], first["jobId"]) == ("accepted", 1, job_id), (first, sim.describe())
    sim.run_for(8_000)
    again = answered(sim, client, client.post("/v1/jobs", json=JOB, headers={"Idempotency-Key": f"sim-{seed}"}))
    assert again["status"] == "accepted" and again["version"] == 1  # a retry: the same job, unchanged
    other = answered(sim, client, client.post("/v1/jobs", json={**JOB, "name": "x"},
                                              headers={"Idempotency-Key": f"sim-{seed}"}))
    assert other["status"] == "refused" and other["problem"]["status"] == 409
    patched = answered(sim, client, client.patch(f"/v1/jobs/{job_id}", json={"priority": "high"}))
    assert patched["status"] == "accepted" and patched["version"] == 2, patched
    stale = answered(sim, client, client.patch(f"/v1/jobs/{job_id}", json={"priority": "low"},
                                               headers={"If-Match": '"1"'}))
    assert stale["status"] == "refused" and stale["problem"]["status"] == 409
    missing = answered(sim, client, client.post("/v1/jobs/job_missing:pause"))
    assert missing["status"] == "refused" and missing["problem"]["status"] == 404
    sim.run_for(8_000)
    paused = answered(sim, client, client.post(f"/v1/jobs/{job_id}:pause"))
    assert paused["status"] == "accepted" and paused["version"] == 3
    sim.heal(20_000)
    job = sim.jobs()[job_id]
    assert (job.status.value, job.spec.priority.value, job.version) == ("paused", "high", 3)
    report = sim.history_report()
    assert report.slots > 0 and report.ok and report.missed == 0 and report.duplicates == 0, (
        f"{report.summary()}\n{sim.describe()}\n{report.problems[:10]}")
