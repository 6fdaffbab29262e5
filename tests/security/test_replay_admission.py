"""Issue 50, finding 7: a replay of a dead letter skipped admission. Manual triggers are
held to the tenant's ``triggers_per_min_max``; replays, which make the same new work,
were not: 11 replays were accepted at once under a limit of 2, and they did not count
against the manual triggers that followed either. Over REST, with the processor's real
deciders answering (``DecidingProducer``)."""

from __future__ import annotations

from fastapi.testclient import TestClient

from gnomon.api.app import CommandSink, create_app
from gnomon.core.clock import FakeClock, iso_to_ms
from gnomon.core.runs import RunState, RunStatus
from gnomon.core.tenants import TenantBook, TenantLimits
from gnomon.history.memory import InMemoryHistoryStore
from gnomon.testing import DecidingProducer
from gnomon.topology import load_topology
from gnomon.web.auth import Authenticator

NOW = iso_to_ms("2026-11-29T08:00:00.500Z")


def _stack(**limits: int) -> tuple[TestClient, DecidingProducer, FakeClock]:
    book = TenantBook()
    book.apply("acme", TenantLimits("acme", **limits))
    clock = FakeClock(NOW)
    history = InMemoryHistoryStore()
    producer = DecidingProducer(history, clock=clock, tenants=book)
    topo = load_topology()
    app = create_app(history=history, commands=CommandSink(producer, topo.job_commands),
                     auth=Authenticator({"tok-a": "acme"}), topology=topo, clock=clock, answers=producer.answers)
    return TestClient(app, headers={"Authorization": "Bearer tok-a"}), producer, clock


def _dead_letters(client: TestClient, producer: DecidingProducer, n: int) -> tuple[str, list[str]]:
    """A job of acme's and ``n`` of its runs failed for good, as the processor holds them."""
    job = client.post("/v1/jobs", json={"name": "n", "schedule": "0 * * * *",
                                        "target": {"type": "command", "argv": ["false"]}}).json()["id"]
    spec = producer.job(job).spec
    runs = [f"{job}@manual:f{i}" for i in range(n)]
    for run_id in runs:
        producer.adopt_run(RunState(run_id, job, "acme", spec, NOW - 1_000, NOW - 1_000, True, RunStatus.FAILED,
                                    NOW - 1_000, NOW - 1_000, attempt=3, finished_at_ms=NOW - 1_000, error="boom"))
    return job, runs


def test_replays_are_held_to_the_trigger_limit_and_count_as_triggers() -> None:
    client, producer, clock = _stack(triggers_per_min_max=2)
    job, runs = _dead_letters(client, producer, 11)
    answers = [client.post(f"/v1/runs/{run_id}:replay") for run_id in runs]
    assert [a.status_code for a in answers] == [200, 200] + [429] * 9, [a.text for a in answers]
    refused = answers[2]
    assert refused.headers["content-type"].startswith("application/problem+json")
    assert "triggers_per_min_max" in refused.text and int(refused.headers["retry-after"]) >= 1
    assert sum(producer.run(r).status is not RunStatus.FAILED for r in runs) == 2  # nothing else moved
    # the two replays count against the manual triggers of the same minute
    assert client.post(f"/v1/jobs/{job}:trigger", json={"idempotencyKey": "k"}).status_code == 429
    clock.advance(61_000)  # the minute has passed
    assert client.post(f"/v1/runs/{runs[2]}:replay").status_code == 200


def test_a_replay_of_a_run_under_way_again_is_no_new_work() -> None:
    """Replaying the same dead letter twice: the second finds it under way, changes nothing
    and is not counted, so it takes nothing from the tenant's limit."""
    client, producer, _clock = _stack(triggers_per_min_max=2)
    _job, runs = _dead_letters(client, producer, 2)
    assert client.post(f"/v1/runs/{runs[0]}:replay").status_code == 200
    client.post(f"/v1/runs/{runs[0]}:replay")  # (answered as the API answers a run not failed)
    assert client.post(f"/v1/runs/{runs[1]}:replay").status_code == 200
