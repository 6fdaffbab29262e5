"""The history projector and the alerter in the whole-system simulation
(``SimCluster(history=True, alerts=True)``): the real ``HistoryProjector`` and ``Alerter``
read the in-memory log beside the real processors and workers, under every fault of
``SimFaults.mixed()`` plus their own (each crashes without committing; the history store
refuses writes for a while; the alert webhook fails calls and goes down). After a quiet
period, history must hold exactly the last committed state of every run and job, every
final run must have been exported, every alert the committed ledger raises must have
been delivered or given up (and nothing else sent), and the checker must account for
every slot once. Then the REST API reads that history. A failing seed replays:
``pytest tests/unit/test_sim_history.py -k 'seed-17'``."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from gnomon import codec
from gnomon.core import jobs as J
from gnomon.core.clock import ms_to_iso
from gnomon.core.runs import RunStatus
from gnomon.sim import HANDLER, TENANT, SimCluster, SimFaults

SEEDS = 200
FAULT_MS = 16_000
SETTLE_MS = 14_000
FINAL = {RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.SKIPPED}

pytestmark = pytest.mark.usefixtures("quiet_logs")


def _jobs(c: SimCluster) -> None:
    c.register("a", "*/2 * * * * *")
    c.register("b", "*/3 * * * * *", fail_attempts=1)
    c.register("x", "*/4 * * * * *", fail_attempts=9, max_attempts=2)  # dead letters
    c.register("d", "*/3 * * * * *")
    now = c.clock.now_ms()
    c.at(now + 5_000, lambda: c.submit(J.PauseJob("a", TENANT, c.clock.now_ms())))
    c.at(now + 8_000, lambda: c.submit(J.ResumeJob("a", TENANT, c.clock.now_ms())))
    c.at(now + 10_000, lambda: c.submit(J.DeleteJob("d", TENANT, c.clock.now_ms())))


@pytest.mark.sweep
@pytest.mark.parametrize("seed", range(SEEDS), ids=lambda s: f"seed-{s}")
def test_history_and_alerts_converge_to_the_ledger_under_faults(seed: int) -> None:
    c = SimCluster(seed, faults=SimFaults.mixed(), history=True, alerts=True, step_ms=200, standbys=seed % 3 != 0)
    c.set_alerts(late_s=1)
    _jobs(c)
    c.run_for(FAULT_MS)
    c.heal(SETTLE_MS)
    why = c.describe()
    rep = c.history_report()
    assert rep.ok and rep.slots > 0 and rep.missed == 0 and rep.duplicates == 0, f"{rep.summary()}\n{why}"
    assert c.history_gaps() == [], why
    assert c.history is not None and (deleted := c.history.get_job("d")) is not None \
        and deleted.status is J.JobStatus.DELETED and c.history.get_job("a") is not None
    final = {s.run_id for s in c.ledger() if s.status in FINAL}
    assert final, why
    exported = {codec.decode(r.value, topic=c.topo.run_exports).run_id
                for r in c.log.records(c.topo.run_exports) if r.value is not None}
    assert exported == final, f"not exported: {sorted(final - exported)[:5]}\n{why}"
    assert c.history.list_dead_letters(TENANT, 100, None).items, "x's exhausted runs are dead letters"
    assert c.alert_gaps() == [], why
    assert any(key.endswith(":dead_letter:0") for key in c.expected_alerts()), why


def test_the_projector_faults_are_really_injected() -> None:
    """Over the seeds above, the projector crashes and the store refuses writes (each a
    replayed batch), so the convergence is tested under them, not around them."""
    crashes = outages = refused = 0
    for seed in range(12):
        c = SimCluster(seed, faults=SimFaults.mixed(), history=True, step_ms=200, standbys=seed % 3 != 0)
        _jobs(c)
        c.run_for(FAULT_MS)
        c.heal(SETTLE_MS)
        crashes += c.counts.get("projector_crash", 0)
        outages += c.counts.get("history_outage", 0)
        assert c.history is not None
        refused += c.history.refused
        assert c.history_gaps() == [], c.describe()
    assert crashes > 0 and outages > 0 and refused > 0, (crashes, outages, refused)


def test_a_crashed_projector_replays_from_its_last_commit() -> None:
    c = SimCluster(5, history=True)
    c.register("a", "* * * * * *")
    c.run_for(6_000, faults=False)
    assert c.history is not None and c.history.get_job("a") is not None
    c.crash_projector(down_ms=1_000)
    c.run_for(6_000, faults=False)  # runs go on; a new projector takes over after the session lapses
    assert c.projector is not None
    c.run_for(6_000, faults=False)
    assert c.history_gaps() == []


AUTH = {"Authorization": "Bearer sim-token"}
JOB = {"name": "every second", "schedule": "* * * * * *", "target": {"type": "handler", "name": HANDLER},
       "timeoutS": 60}


def _answer(sim: SimCluster, client: TestClient, written: Any) -> dict[str, Any]:
    assert written.status_code == 202, written.text
    for _ in range(120):
        got: dict[str, Any] = client.get(written.headers["Location"]).json()
        if got["status"] != "pending":
            return got
        sim.run_for(500)
    raise AssertionError(f"no answer\n{sim.describe()}")


@pytest.mark.parametrize("seed", range(24), ids=lambda s: f"seed-{s}")
def test_rest_reads_what_the_projector_wrote_under_faults(seed: int) -> None:
    """REST to history: a job created over REST runs, and its page and its runs come
    from the projected history (not from the API's own writes)."""
    sim = SimCluster(seed, faults=SimFaults.mixed(), history=True)
    client = TestClient(sim.api(), headers=AUTH)
    created = _answer(sim, client, client.post("/v1/jobs", json=JOB))
    assert created["status"] == "accepted", created
    job_id = created["jobId"]
    sim.run_for(10_000)
    sim.heal(10_000)
    assert sim.history_gaps() == [], sim.describe()  # (the projector reads the last steps' commits)
    job = client.get(f"/v1/jobs/{job_id}")
    assert job.status_code == 200 and job.json()["id"] == job_id, job.text
    runs = client.get(f"/v1/jobs/{job_id}/runs", params={"limit": 100}).json()["items"]
    ledger = {s.run_id: s for s in sim.ledger() if s.job_id == job_id}
    assert runs and {r["id"] for r in runs} <= set(ledger), sim.describe()
    for r in runs:  # each as the ledger last has it
        assert r["status"] == ledger[r["id"]].status.value, (r, sim.describe())
    succeeded = [r for r in runs if r["status"] == "succeeded"]
    assert len(succeeded) >= 5, (len(succeeded), sim.describe())


def test_a_backfill_is_decided_by_the_processor_not_by_history() -> None:
    """History still shows the job active (the projector is down), but the processor has
    it paused: the API plans the backfill from history and writes it, and the answer at
    its Location is the processor's refusal (409), not an acceptance; no slot runs."""
    sim = SimCluster(3, history=True)
    client = TestClient(sim.api(), headers=AUTH)
    body = {**JOB, "schedule": "*/10 * * * * *"}
    created = _answer(sim, client, client.post("/v1/jobs", json=body))
    job_id = created["jobId"]
    sim.run_for(15_000, faults=False)
    # a minute paused and resumed: its slots are in history, skipped (what a backfill reopens)
    assert _answer(sim, client, client.post(f"/v1/jobs/{job_id}:pause"))["status"] == "accepted"
    paused_at = sim.clock.now_ms()
    sim.run_for(60_000, faults=False)
    assert _answer(sim, client, client.post(f"/v1/jobs/{job_id}:resume"))["status"] == "accepted"
    sim.run_for(15_000, faults=False)
    assert client.get(f"/v1/jobs/{job_id}").json()["status"] == "active"
    sim.crash_projector(down_ms=120_000)  # history stops here
    paused = _answer(sim, client, client.post(f"/v1/jobs/{job_id}:pause"))
    assert paused["status"] == "accepted", paused
    assert client.get(f"/v1/jobs/{job_id}").json()["status"] == "active"  # history's (stale) view
    window = {"from": ms_to_iso(paused_at + 1_000), "to": ms_to_iso(paused_at + 59_000)}
    written = client.post(f"/v1/jobs/{job_id}:backfill", json=window)
    assert written.status_code == 202 and written.json()["sent"] >= 5, written.text  # planned from history
    refused = _answer(sim, client, written)
    assert refused["status"] == "refused" and refused["problem"]["status"] == 409, refused
    assert "paused" in refused["problem"]["detail"]
    planned = set(written.json()["runIds"])
    final = {s.run_id: s for s in sim.ledger() if s.run_id in planned}
    assert all(s.status.value == "skipped" and s.started_at_ms is None for s in final.values())  # nothing ran


def test_the_alerter_faults_are_really_injected() -> None:
    """Over a few seeds of the scenario above, the alerter crashes with deliveries queued,
    the webhook fails calls and goes down: alerts are retried, sent again after a crash
    (the same key: receivers drop repeats) and some given up, all accounted for."""
    crashes = outages = repeats = retries = 0
    given_up: set[str] = set()
    for seed in range(16):
        c = SimCluster(seed, faults=SimFaults.mixed(), history=True, alerts=True, step_ms=200,
                       standbys=seed % 3 != 0)
        c.set_alerts(late_s=1)
        _jobs(c)
        c.run_for(FAULT_MS)
        c.heal(SETTLE_MS)
        assert c.alert_gaps() == [], c.describe()
        assert c.webhook is not None and c.alerter is not None
        crashes += c.counts.get("alerter_crash", 0)
        outages += c.counts.get("webhook_outage", 0)
        repeats += c.webhook.repeats
        retries += c.alerter.stats.retries
        given_up |= set(c.given_up)
    assert crashes > 0 and outages > 0 and repeats > 0 and retries > 0 and given_up, \
        (crashes, outages, repeats, retries, len(given_up))


def test_alerts_set_over_rest_reach_the_webhook_with_what_the_ledger_says() -> None:
    """``PUT /v1/alerts`` on the API goes to the alert-configs topic; the alerter reads it
    and sends a dead-letter alert for the exhausted run, a skipped alert for the slot
    missed while paused, and late alerts for the runs that started after the threshold while no worker was up."""
    c = SimCluster(3, history=True, alerts=True, step_ms=200, duration_ms=(100, 300))
    client = TestClient(c.api(), headers={"Authorization": "Bearer sim-token"})
    r = client.put("/v1/alerts", json={"url": "https://hooks.example.com/gnomon", "lateS": 1})
    assert r.status_code == 200, r.text
    c.register("x", "*/4 * * * * *", fail_attempts=9, max_attempts=2)
    c.register("p", "*/2 * * * * *")
    now = c.clock.now_ms()
    c.at(now + 3_000, lambda: c.submit(J.PauseJob("p", TENANT, c.clock.now_ms())))
    c.at(now + 7_000, lambda: c.submit(J.ResumeJob("p", TENANT, c.clock.now_ms())))
    for w in (0, 1):  # both workers gone for 4 s: the slots of then start late
        c.at(now + 12_000, lambda w=w: c.crash_worker(w, down_ms=4_000))  # type: ignore[misc]
    c.run_for(24_000, faults=False)
    assert c.alert_gaps() == [], c.describe()
    assert c.webhook is not None
    kinds = {a.kind.value for a in c.webhook.delivered.values()}
    assert kinds == {"dead_letter", "skipped", "late"}, kinds
    dead = next(a for a in c.webhook.delivered.values() if a.kind.value == "dead_letter")
    assert dead.job_id == "x" and dead.attempts == 2 and dead.tenant == TENANT
    skipped = next(a for a in c.webhook.delivered.values() if a.kind.value == "skipped")
    assert skipped.job_id == "p" and skipped.reason
    late = next(a for a in c.webhook.delivered.values() if a.kind.value == "late")
    assert late.lag_ms is not None and late.lag_ms > 1_000 and late.threshold_s == 1
