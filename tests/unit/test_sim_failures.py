"""Failures from REST to history, in the whole-system simulation under seeded faults (moved
here from the real-stack e2e suite, which keeps what needs a real process: a timeout that
kills it, a cancel that stops it): retries with backoff, the dead letter and its replay
with a fresh budget, and cancelling a run staged ahead of its slot. Processors are killed,
stalled and fenced, records duplicated and reordered, the projector crashes and the
history store goes down; workers do not crash here, and commit markers are not delayed
(either can end an attempt by its lease, without the handler's exit code, which these
tests check: a late grant starts the attempt after the processor gave it up). The job ids
come from the API (random), so a seed replays its faults, not always the same partition.
A failing seed replays: ``pytest tests/unit/test_sim_failures.py -k 'replay and seed-3'``."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gnomon.core.clock import iso_to_ms, ms_to_iso
from gnomon.core.runs import RunStatus
from gnomon.sim import HANDLER, SimCluster, SimFaults

SEEDS = 200
AUTH = {"Authorization": "Bearer sim-token"}
OTHER = {"Authorization": "Bearer other-token"}

pytestmark = pytest.mark.usefixtures("quiet_logs")


FAULTS_MS = 20_000  # faults for the first 20 s of simulated time, then quiet


class Scenario:
    """A SimCluster with the REST API in front: faults for ``FAULTS_MS``, then quiet."""

    def __init__(self, seed: int, faults_ms: int = FAULTS_MS) -> None:
        self.sim = SimCluster(seed, faults=replace(SimFaults.mixed(), worker_crash=0.0, slow_markers=0.0), history=True,
                              step_ms=200, duration_ms=(100, 500))
        self.client = TestClient(self.sim.api({"sim-token": "sim", "other-token": "other"}), headers=AUTH)
        self.faults_until_ms = self.sim.clock.now_ms() + faults_ms

    def step(self) -> None:
        self.sim.run_for(500, faults=self.sim.clock.now_ms() < self.faults_until_ms)

    def answer(self, written: Any, headers: dict[str, str] | None = None) -> dict[str, Any]:
        """The processor's answer to a write: at once (200/4xx) or at its Location (202),
        polled as the tenant that wrote it (``headers``)."""
        if written.status_code != 202:
            return {"status": "answered", "code": written.status_code, "body": written.json()}
        for _ in range(120):
            got: dict[str, Any] = self.client.get(written.headers["Location"], headers=headers).json()
            if got["status"] != "pending":
                return got
            self.step()
        raise AssertionError(f"no answer\n{self.sim.describe()}")

    def one_time(self, ahead_ms: int, **over: Any) -> tuple[str, str]:
        at_ms = (self.sim.clock.now_ms() + ahead_ms) // 1000 * 1000
        body: dict[str, Any] = {"name": "fail", "runAt": ms_to_iso(at_ms), "timeoutS": 30, "retry": {"max": 1},
                                "target": {"type": "handler", "name": HANDLER}, **over}
        got = self.answer(self.client.post("/v1/jobs", json=body))
        assert got["status"] == "accepted", got
        return got["jobId"], f"{got['jobId']}@{ms_to_iso(at_ms)}"

    def until(self, run_id: str, done: Any, within_ms: int, what: str) -> dict[str, Any]:
        """Step until the run's REST view, as history has it, satisfies ``done``."""
        end = self.sim.clock.now_ms() + within_ms
        while True:
            self.step()
            self.sim.project_all()  # history as up to date as the projector can make it (the store may be down)
            got = self.client.get(f"/v1/runs/{run_id}")
            if got.status_code == 200 and done(got.json()):
                return dict(got.json())
            if self.sim.clock.now_ms() >= end:
                raise AssertionError(f"{what}: not within {within_ms} ms\n{self.sim.describe()}")

    def run(self, run_id: str) -> dict[str, Any]:
        """The run's REST view once history holds every commit."""
        assert self.sim.history_gaps() == [], self.sim.describe()
        got = self.client.get(f"/v1/runs/{run_id}")
        assert got.status_code == 200, got.text
        return dict(got.json())


def _status(answer: dict[str, Any]) -> int:
    """The HTTP status the processor's answer amounts to."""
    if answer["status"] == "answered":
        return int(answer["code"])
    return 200 if answer["status"] == "accepted" else int(answer["problem"]["status"])


@pytest.mark.sweep
@pytest.mark.parametrize("seed", range(SEEDS), ids=lambda s: f"seed-{s}")
def test_retries_with_backoff_then_dead_letter_then_replay(seed: int) -> None:
    sc = Scenario(seed)
    sim, client = sc.sim, sc.client
    job_id, run_id = sc.one_time(3_000, payload={"fail_attempts": 9}, retry={"max": 3, "backoffS": 1})
    sc.until(run_id, lambda v: v["status"] == "failed", 60_000, "3 attempts exhausted")
    final = sc.run(run_id)
    assert (final["attempt"], final["maxAttempts"], final["exitCode"], final["replays"]) == (3, 3, 1, 0), (
        final, sim.describe())
    assert final["finishedAt"] is not None and final["nextAttemptAt"] is None
    # the retry waits, from the ledger itself (every state of the run)
    waits = [r for r in sim.ledger() if r.run_id == run_id and r.status is RunStatus.RETRY_WAIT]
    assert sorted({r.attempt for r in waits}) == [1, 2], sim.describe()
    for r in waits:  # full jitter: released within backoffS * 2**(attempt-1) of the failure
        assert r.next_attempt_at_ms is not None and 0 <= r.next_attempt_at_ms - r.updated_at_ms <= 1000 * 2 ** (
            r.attempt - 1), r
    dead = client.get("/v1/dead-letters", params={"limit": 100}).json()["items"]
    assert [d["id"] for d in dead] == [run_id] and dead[0]["jobId"] == job_id
    assert client.get("/v1/dead-letters", headers=OTHER).json()["items"] == []  # another tenant's view
    assert _status(sc.answer(client.post(f"/v1/runs/{run_id}:replay", headers=OTHER), OTHER)) == 404
    assert _status(sc.answer(client.post(f"/v1/runs/{run_id}:cancel"))) == 409  # already finished

    assert _status(sc.answer(client.post(f"/v1/runs/{run_id}:replay"))) == 200
    again = sc.until(run_id, lambda v: v["attempt"] >= 4, 30_000, "attempt 4 after the replay")
    assert again["replays"] == 1 and again["maxAttempts"] == 6, again
    sc.until(run_id, lambda v: v["status"] == "failed", 60_000, "the fresh budget exhausted")
    again = sc.run(run_id)
    assert again["attempt"] == 6 and again["replays"] == 1, again
    rep = sim.history_report()
    assert rep.ok and rep.missed == 0 and rep.duplicates == 0, f"{rep.summary()}\n{sim.describe()}"


@pytest.mark.sweep
@pytest.mark.parametrize("seed", range(SEEDS), ids=lambda s: f"seed-{s}")
def test_cancel_a_run_staged_ahead_of_its_slot_it_never_runs(seed: int) -> None:
    # faults for the first 8 s (processors killed, stalled, restored), settled before the
    # run is staged about 3 s ahead of its slot 20 s away: the cancel must win that race
    # on purpose, not by luck
    sc = Scenario(seed, faults_ms=8_000)
    sim, client = sc.sim, sc.client
    job_id, run_id = sc.one_time(20_000)
    slot_ms = iso_to_ms(run_id.split("@", 1)[1])
    staged = sc.until(run_id, lambda v: v["staged"], 20_000, "the run staged on a worker")
    assert staged["status"] == "running" and staged["startedAt"] is None and staged["grantedAt"], staged
    assert sim.clock.now_ms() < slot_ms - 1_000, "staged ahead of its slot (lookahead)"
    assert _status(sc.answer(client.post(f"/v1/runs/{run_id}:cancel"))) == 200
    final = sc.until(run_id, lambda v: v["status"] == "cancelled", 10_000, "cancelled")
    assert final["attempt"] == 0 and final["startedAt"] is None
    assert _status(sc.answer(client.post(f"/v1/runs/{run_id}:replay"))) == 409  # not a dead letter
    # past its slot: still cancelled, never started
    while sim.clock.now_ms() < slot_ms + 5_000:
        sc.step()
    after = sc.run(run_id)
    assert after["status"] == "cancelled" and after["attempt"] == 0, after
    assert not [r for r in sim.ledger() if r.run_id == run_id and r.started_at_ms is not None]
    assert [r["id"] for r in client.get(f"/v1/jobs/{job_id}/runs").json()["items"]] == [run_id]
