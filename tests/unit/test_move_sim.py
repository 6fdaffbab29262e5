"""Moving a job between regions (issue 27; ADR 0013, "Moving a job"), in the simulation:
two regions' namespaces on one in-memory log and one clock, each with the real loops of
its processors and workers, with seeded kills, aborts, rebalances, zombies and lost
workers in both.

The property: a job moved from region a to region b runs every slot once across the
move (the history checker over both regions' ledgers and inboxes): its slots before its
schedule position at the move run in a, the rest in b; an adoption that b refuses goes
back to a, which takes the job back where it left it; an adoption nobody signed is
refused and sent nowhere."""

from __future__ import annotations

import os

import pytest

from gnomon import codec
from gnomon.checker import CheckReport, HistoryChecker
from gnomon.core import jobs as J
from gnomon.core.clock import iso_to_ms
from gnomon.core.model import JobSpec, Schedule, Target, TargetType
from gnomon.core.replies import CommandResult
from gnomon.sim import HANDLER, TENANT, SimCluster, SimFaults
from gnomon.topology import load_topology

T0 = iso_to_ms("2026-12-25T11:58:00Z")
EVERY_S = "* * * * * *"
SEEDS = range(int(os.environ.get("GNOMON_SIM_SEEDS", "3")))


def regions(seed: int, faults: SimFaults | None = None) -> tuple[SimCluster, SimCluster]:
    a = SimCluster(seed, topology=load_topology(region="a"), faults=faults)
    a.clock.advance(T0 - a.clock.now_ms())
    b = SimCluster(seed, topology=load_topology(region="b"), faults=faults, shared=(a.clock, a.log))
    return a, b


def run_both(a: SimCluster, b: SimCluster, ms: int, *, faults: bool) -> None:
    """Both regions, step by step, on their shared clock (a's step moves it)."""
    a._faulting = b._faulting = faults  # (SimCluster.run_for, for two clusters)
    end = a.clock.now_ms() + ms
    while a.clock.now_ms() < end:
        a.step()
        b.step(advance=False)
    a._faulting = b._faulting = False


def heal_both(a: SimCluster, b: SimCluster) -> None:
    a.heal(settle_ms=0)
    b.heal(settle_ms=0)
    run_both(a, b, 30_000, faults=False)


def check(clusters: tuple[SimCluster, ...], jobs: list[J.JobState]) -> CheckReport:
    """The checker over every region's ledger and inbox, for ``jobs`` (their final states),
    each from its first slot in the first of ``clusters`` that had it (its home)."""
    checker = HistoryChecker()
    first: dict[str, int | None] = {}
    for c in clusters:
        for state in c.ledger():
            checker.observe(state)
        for r in c.log.records(c.topo.worker_inbox):
            if r.value is not None:
                checker.observe(codec.decode(r.value))
        for job_id, slot in c.job_history()[0].items():
            first.setdefault(job_id, slot)
    return checker.check(jobs, clusters[0].clock.now_ms(), first_slots=first, registered=[j.job_id for j in jobs])


def slots_of(c: SimCluster, job_id: str) -> list[int]:
    return sorted(s.slot_ms for s in {st.run_id: st for st in c.ledger() if st.job_id == job_id}.values())


def answers(c: SimCluster, kind: str) -> list[CommandResult]:
    out = []
    for r in c.log.records(c.topo.command_results):
        res = codec.decode(r.value, topic=c.topo.command_results)
        if res.command == kind:
            out.append(res)
    return out


@pytest.mark.parametrize("seed", SEEDS)
def test_a_moved_job_runs_every_slot_once_across_the_move(seed: int) -> None:
    a, b = regions(seed, SimFaults(abort=0.02, kill=0.01, rebalance=0.01, zombie=0.01, worker_crash=0.01))
    a.register("mv", EVERY_S)
    a.register("stays", EVERY_S)
    b.register("home-b", EVERY_S)
    run_both(a, b, 15_000, faults=True)
    a.submit(J.MoveJob("mv", TENANT, "b", a.clock.now_ms()))
    run_both(a, b, 30_000, faults=True)
    heal_both(a, b)
    moved, adopted = a.jobs()["mv"], b.jobs()["mv"]
    assert (moved.status, moved.moved_to, moved.next_run_at_ms) == (J.JobStatus.DONE, "b", None)
    assert adopted.status is J.JobStatus.ACTIVE and adopted.moved_to is None
    assert adopted.created_at_ms == moved.created_at_ms and adopted.version == moved.version
    in_a, in_b = slots_of(a, "mv"), slots_of(b, "mv")
    assert in_a and in_b and max(in_a) < min(in_b), (in_a[-3:], in_b[:3])  # the handover is one slot boundary
    report = check((a, b), [adopted, a.jobs()["stays"], b.jobs()["home-b"]])
    assert report.ok and report.missed == 0 and report.duplicates == 0, (report.summary(), report.problems[:5],
                                                                         a.events + b.events)
    assert all(tally.slots >= 60 for tally in report.jobs.values()) and len(report.jobs) == 3, report.jobs
    # (three jobs, each second for a minute and more)
    assert [r.accepted for r in answers(b, "AdoptJob")] == [True]


def test_an_adoption_refused_goes_back_and_its_old_home_runs_every_slot() -> None:
    a, b = regions(7)
    a.register("dup", EVERY_S)
    b.register("dup", "*/2 * * * * *")  # the same id in b: the adoption is refused there
    run_both(a, b, 10_000, faults=False)
    a.submit(J.MoveJob("dup", TENANT, "b", a.clock.now_ms()))
    run_both(a, b, 20_000, faults=False)
    back, theirs = a.jobs()["dup"], b.jobs()["dup"]
    assert back.status is J.JobStatus.ACTIVE and back.moved_to is None and back.next_run_at_ms is not None
    assert theirs.spec.schedule.cron == "*/2 * * * * *" and theirs.version == 1  # untouched
    refused = answers(b, "AdoptJob")
    assert [r.accepted for r in refused] == [False] and "exists in region b" in (refused[0].reason or "")
    assert [r.accepted for r in answers(a, "AdoptJob")] == [True]  # the return, taken
    report = check((a,), [back])
    assert report.ok and report.missed == 0 and report.duplicates == 0, (report.summary(), report.problems[:5])
    assert report.jobs["dup"].slots >= 29


def test_an_operator_key_made_after_the_processors_started_signs_the_move() -> None:
    """The operator's key is read when a move is decided, not when a partition is
    assigned: on a fresh install the key file is often made after the processors started
    (the real-stack region test found every move refused for it)."""
    a, b = regions(5)
    operator = a.keys.operator
    del a.keys._keys[operator.key_id]  # no operator key while a's partitions are assigned
    a.register("mv", EVERY_S)
    run_both(a, b, 5_000, faults=False)
    a.submit(J.MoveJob("mv", TENANT, "b", a.clock.now_ms()))
    run_both(a, b, 5_000, faults=False)
    (refused,) = answers(a, "MoveJob")
    assert not refused.accepted and "operator command key" in (refused.reason or "")
    assert a.jobs()["mv"].status is J.JobStatus.ACTIVE and "mv" not in b.jobs()  # nothing changed
    a.keys._keys[operator.key_id] = operator  # the operator makes the key; no restart
    a.submit(J.MoveJob("mv", TENANT, "b", a.clock.now_ms()))
    run_both(a, b, 40_000, faults=False)
    assert [r.accepted for r in answers(a, "MoveJob")] == [False, True]
    assert a.jobs()["mv"].moved_to == "b" and b.jobs()["mv"].status is J.JobStatus.ACTIVE
    report = check((a, b), [b.jobs()["mv"]])
    assert report.ok and report.missed == 0 and report.duplicates == 0, (report.summary(), report.problems[:5])


def test_an_unsigned_adoption_is_refused_and_sent_nowhere() -> None:
    a, b = regions(3)
    spec = JobSpec(name="forged", schedule=Schedule(cron=EVERY_S), target=Target(TargetType.HANDLER, handler=HANDLER))
    forged = J.AdoptJob("forged", TENANT, spec, a.clock.now_ms() + 1_000, False, 0, 1, a.clock.now_ms(), "a",
                        a.clock.now_ms())
    raw = codec.encode(forged, b.topo.job_commands)
    forger = b.log.producer(client_id="forger")
    forger.produce(b.topo.job_commands, b"forged", raw)
    forger.flush(1.0)
    run_both(a, b, 5_000, faults=False)
    assert "forged" not in b.jobs() and "forged" not in a.jobs()
    (res,) = answers(b, "AdoptJob")
    assert not res.accepted and res.field == "signature"
    assert answers(a, "AdoptJob") == []  # not returned: nobody proved the tenant


def test_an_adoption_signed_by_a_tenant_is_refused() -> None:
    """A tenant's key proves the tenant's own commands, not the processors' word: a return
    forged by the tenant would make its moved job run in both regions."""
    a, b = regions(5)
    a.register("mv", EVERY_S)
    run_both(a, b, 5_000, faults=False)
    a.submit(J.MoveJob("mv", TENANT, "b", a.clock.now_ms()))
    run_both(a, b, 10_000, faults=False)
    assert a.jobs()["mv"].moved_to == "b" and b.jobs()["mv"].status is J.JobStatus.ACTIVE
    state = a.jobs()["mv"]
    forged = J.AdoptJob("mv", TENANT, state.spec, a.clock.now_ms() + 2_000, False, 0, 9, state.created_at_ms, "b",
                        a.clock.now_ms(), returned=True)
    a.submit(forged)  # signed with the tenant's own key, as a tenant's producer can
    run_both(a, b, 5_000, faults=False)
    assert a.jobs()["mv"].moved_to == "b"  # still moved: not taken back
    (res,) = [r for r in answers(a, "AdoptJob")]
    assert not res.accepted and res.field == "signature" and "operator" in (res.reason or "")



def test_a_move_through_the_api(monkeypatch: pytest.MonkeyPatch) -> None:
    """``POST /v1/jobs/{id}:move`` on region a's API: its fields checked (422 naming
    ``region``), then the processor's decision at the write's Location."""
    from fastapi.testclient import TestClient

    monkeypatch.setenv("GNOMON_REGIONS", "a,b")
    a, b = regions(11)
    a.register("mv", EVERY_S)
    run_both(a, b, 5_000, faults=False)
    client = TestClient(a.api(), headers={"Authorization": "Bearer sim-token"})
    for body, words in (({}, "is required"), ({"region": "B!"}, "not a region name"), ({"region": "a"}, "already"),
                        ({"region": "c"}, "no region 'c' here (the regions: a, b)"), ({"region": "b", "x": 1}, "x")):
        bad = client.post("/v1/jobs/mv:move", json=body)
        assert bad.status_code == 422 and bad.headers["content-type"] == "application/problem+json", bad.text
        assert words in bad.text, bad.text
    written = client.post("/v1/jobs/mv:move", json={"region": "b"})
    assert written.status_code == 202, written.text
    run_both(a, b, 3_000, faults=False)
    got = client.get(written.headers["Location"]).json()
    assert got["status"] == "accepted", got
    run_both(a, b, 20_000, faults=False)
    assert a.jobs()["mv"].moved_to == "b" and b.jobs()["mv"].status is J.JobStatus.ACTIVE
    again = client.post("/v1/jobs/mv:move", json={"region": "b"})
    run_both(a, b, 3_000, faults=False)
    refused = client.get(again.headers["Location"]).json()
    assert refused["status"] == "refused" and "moved to region b" in refused["problem"]["detail"], refused
    report = check((a, b), [b.jobs()["mv"]])
    assert report.ok and report.missed == 0 and report.duplicates == 0, report.summary()
