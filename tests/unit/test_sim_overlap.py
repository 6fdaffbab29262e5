"""Overlap policies from REST to history, in the whole-system simulation under seeded
faults (moved here from the real-stack e2e suite): a job every 4 s whose runs take 10 s.

``forbid`` never has two runs going at once and records the slots it skipped
("overlap: ..."); ``replace`` cancels the running one ("overlap: replace ...") when the
next slot starts. The REST API creates the job, the real processors and workers run it
(processor kills, fenced zombies, worker crashes, duplicated and reordered records), the
real history projector writes history (it crashes too, and the store goes down), and the
REST API reads the runs back. Worker clocks are not skewed here: the check compares a
run's start (worker clock) with the previous run's end.
A failing seed replays: ``pytest tests/unit/test_sim_overlap.py -k 'forbid and seed-3'``."""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gnomon.core.clock import iso_to_ms
from gnomon.sim import HANDLER, SimCluster, SimFaults

SEEDS = 200
AUTH = {"Authorization": "Bearer sim-token"}

pytestmark = pytest.mark.usefixtures("quiet_logs")


def _cluster(seed: int) -> tuple[SimCluster, TestClient]:
    sim = SimCluster(seed, faults=replace(SimFaults.mixed(), skew_ms=0), history=True, duration_ms=(10_000, 10_000),
                     step_ms=200)
    return sim, TestClient(sim.api(), headers=AUTH)


def _create(sim: SimCluster, client: TestClient, overlap: str) -> str:
    body = {"name": f"overlap-{overlap}", "schedule": "*/4 * * * * *", "timeoutS": 60, "retry": {"max": 1},
            "target": {"type": "handler", "name": HANDLER}, "overlap": overlap}
    written = client.post("/v1/jobs", json=body)
    assert written.status_code == 202, written.text
    for _ in range(120):
        got: dict[str, Any] = client.get(written.headers["Location"]).json()
        if got["status"] != "pending":
            assert got["status"] == "accepted", got
            return str(got["jobId"])
        sim.run_for(500)
    raise AssertionError(f"no answer\n{sim.describe()}")


def _runs(sim: SimCluster, client: TestClient, job_id: str) -> list[dict[str, Any]]:
    assert sim.history_gaps() == [], sim.describe()  # the projector has read every commit
    got = client.get(f"/v1/jobs/{job_id}/runs", params={"limit": 100})
    assert got.status_code == 200, got.text
    return list(got.json()["items"])


def _run_then_pause(seed: int, overlap: str, run_ms: int) -> tuple[SimCluster, list[dict[str, Any]]]:
    """Create the job over REST, run it ``run_ms`` under faults, heal, pause it, and read
    its runs back from history."""
    sim, client = _cluster(seed)
    job_id = _create(sim, client, overlap)
    sim.run_for(run_ms)
    sim.heal(10_000)
    assert client.post(f"/v1/jobs/{job_id}:pause").status_code == 202
    sim.run_for(3_000, faults=False)
    return sim, _runs(sim, client, job_id)


def _clean(sim: SimCluster) -> None:
    rep = sim.history_report()
    assert rep.ok and rep.missed == 0 and rep.duplicates == 0, f"{rep.summary()}\n{sim.describe()}"


@pytest.mark.sweep
@pytest.mark.parametrize("seed", range(SEEDS), ids=lambda s: f"seed-{s}")
def test_forbid_skips_slots_while_a_run_is_active(seed: int) -> None:
    sim, items = _run_then_pause(seed, "forbid", 30_000)
    # (the pause at the end skips the slots in its lookahead: "paused")
    skipped = [r for r in items if r["status"] == "skipped" and r["reason"] != "paused"]
    assert len(skipped) >= 3 and all((r["reason"] or "").startswith("overlap:") for r in skipped), (
        [r["reason"] for r in skipped], sim.describe())
    spans = sorted((iso_to_ms(r["startedAt"]), iso_to_ms(r["finishedAt"]) if r["finishedAt"] else 10**15)
                   for r in items if r["startedAt"])
    assert spans, "some slot ran"
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert start >= end, f"two runs overlapped: {spans}\n{sim.describe()}"
    _clean(sim)


@pytest.mark.sweep
@pytest.mark.parametrize("seed", range(SEEDS), ids=lambda s: f"seed-{s}")
def test_replace_cancels_the_running_one(seed: int) -> None:
    sim, items = _run_then_pause(seed, "replace", 24_000)
    cancelled = [r for r in items if r["status"] == "cancelled"]
    assert len(cancelled) >= 2, ([(r["status"], r["reason"]) for r in items], sim.describe())
    assert all("overlap: replace" in (r["reason"] or "") for r in cancelled), cancelled
    assert not [r for r in items if (r["reason"] or "").startswith("overlap:")]
    _clean(sim)
