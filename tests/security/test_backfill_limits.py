"""Issue 24, finding 1: backfill bypassed the tenant's limits. The processor checked
``backlog_max`` and ``triggers_per_min_max`` only for manual runs, the API checked no
limit, and nothing bounded ``from`` by the job's creation: five backfills of 1,000 slots
from 1970-01-01 on a per-second job created 5,002 runs for a tenant held to
``backlog_max=5``. Here the same over REST, with the processor's real deciders answering
(``DecidingProducer``) and no worker, so every backfilled run stays queued."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from gnomon.api.app import CommandSink, create_app
from gnomon.core import jobs as J
from gnomon.core.admission import BACKFILL_RUNS_PER_DAY_MAX
from gnomon.core.clock import FakeClock, iso_to_ms, ms_to_iso
from gnomon.core.runs import RunStatus
from gnomon.core.tenants import TenantBook, TenantLimits
from gnomon.history.memory import InMemoryHistoryStore
from gnomon.testing import DecidingProducer
from gnomon.topology import load_topology
from gnomon.web.auth import Authenticator

NOW = iso_to_ms("2026-11-29T08:00:00.500Z")
HOUR = 3_600_000
AUTH = {"Authorization": "Bearer tok-a"}


def stack(**limits: int) -> tuple[TestClient, DecidingProducer, FakeClock]:
    book = TenantBook()
    book.apply("acme", TenantLimits("acme", **limits))
    clock = FakeClock(NOW - HOUR)
    history = InMemoryHistoryStore()
    producer = DecidingProducer(history, clock=clock, tenants=book)
    topo = load_topology()
    app = create_app(history=history, commands=CommandSink(producer, topo.job_commands),
                     auth=Authenticator({"tok-a": "acme"}), topology=topo, clock=clock, answers=producer.answers)
    return TestClient(app, headers=AUTH), producer, clock


def per_second_job_paused_for_an_hour(client: TestClient, clock: FakeClock) -> str:
    """Created an hour ago and paused since: 3,600 past slots, skipped, the job's own."""
    created = client.post("/v1/jobs", json={"name": "every-second", "schedule": "* * * * * *",
                                            "target": {"type": "command", "argv": ["true"]}})
    assert created.status_code == 201, created.text
    job_id: str = created.json()["id"]
    assert client.post(f"/v1/jobs/{job_id}:pause").status_code == 200
    clock.set(NOW)
    assert client.post(f"/v1/jobs/{job_id}:resume").status_code == 200
    return job_id


def backfill(client: TestClient, job_id: str, frm: int | str, to: int) -> Any:
    start = frm if isinstance(frm, str) else ms_to_iso(frm)
    return client.post(f"/v1/jobs/{job_id}:backfill", json={"from": start, "to": ms_to_iso(to)})


def queued(producer: DecidingProducer, job_id: str) -> list[str]:
    first = (NOW - HOUR) // 1000 * 1000
    runs = [producer.run(f"{job_id}@{ms_to_iso(s)}") for s in range(first, NOW, 1000)]
    return [r.run_id for r in runs if r is not None and r.status is not RunStatus.SKIPPED]


def test_a_range_wholly_before_the_job_is_refused_naming_from() -> None:
    client, producer, clock = stack()
    job_id = per_second_job_paused_for_an_hour(client, clock)
    created_at = producer.job(job_id).created_at_ms  # type: ignore[union-attr]
    r = backfill(client, job_id, "1970-01-01T00:00:00Z", created_at - 1000)
    assert r.status_code == 422 and r.json()["field"] == "from", r.text


def test_a_backfill_from_1970_holds_only_the_jobs_own_slots() -> None:
    client, producer, clock = stack()
    job_id = per_second_job_paused_for_an_hour(client, clock)
    created_at = producer.job(job_id).created_at_ms  # type: ignore[union-attr]
    r = backfill(client, job_id, "1970-01-01T00:00:00Z", created_at + 9_000)
    assert r.status_code == 200, r.text
    assert r.json()["runIds"] and all(rid >= f"{job_id}@{ms_to_iso(created_at)}" for rid in r.json()["runIds"])
    assert r.json()["sent"] <= 10  # the slots from its creation on, not 1970's


def test_the_processor_refuses_a_slot_before_the_job_existed() -> None:
    """The decider's own rule (an outside producer writes BackfillJob directly)."""
    client, producer, clock = stack()
    job_id = per_second_job_paused_for_an_hour(client, clock)
    task = producer.tasks[next(p for p, t in producer.tasks.items() if t.job(job_id) is not None)]
    created_at = task.job(job_id).created_at_ms  # type: ignore[union-attr]
    with pytest.raises(Exception, match="before the job existed"):
        J.decide(task.job(job_id), J.BackfillJob(job_id, "acme", (created_at - created_at % 1000 - 1000,), NOW),
                 J.SchedulerConfig())


def test_a_backfill_over_the_backlog_limit_is_refused_whole() -> None:
    client, producer, clock = stack(backlog_max=5)
    job_id = per_second_job_paused_for_an_hour(client, clock)
    start = NOW - HOUR + 60_000
    big = backfill(client, job_id, start, start + 599_000)  # 600 slots: more than the limit itself
    assert big.status_code == 422, big.text
    assert big.json()["limit"] == "backlog_max" and big.json()["field"] == "to" and not big.headers.get("Retry-After")
    assert queued(producer, job_id) == [], "refused whole: no run of it was created"
    assert backfill(client, job_id, start, start + 5_000).json()["sent"] == 5  # 5 runs: at the limit
    assert len(queued(producer, job_id)) == 5
    again = backfill(client, job_id, start + 10_000, start + 11_000)  # one more: waiting helps
    assert again.status_code == 429 and again.json()["limit"] == "backlog_max" and again.headers.get("Retry-After")
    assert len(queued(producer, job_id)) == 5


def test_five_backfills_of_1000_slots_do_not_make_5000_runs_for_a_small_tenant() -> None:
    """The audit's reproduction: 5 x 1,000 slots for a tenant held to backlog_max=5."""
    client, producer, clock = stack(backlog_max=5)
    job_id = per_second_job_paused_for_an_hour(client, clock)
    created_at = producer.job(job_id).created_at_ms  # type: ignore[union-attr]
    codes = [backfill(client, job_id, "1970-01-01T00:00:00Z", created_at + 999_000).status_code for _ in range(5)]
    assert codes == [422] * 5  # 1,000 runs each: more than backlog_max itself
    assert len(queued(producer, job_id)) == 0


def test_a_backfill_counts_toward_the_trigger_rate() -> None:
    client, _, clock = stack(triggers_per_min_max=10)
    job_id = per_second_job_paused_for_an_hour(client, clock)
    start = NOW - HOUR + 60_000
    assert backfill(client, job_id, start, start + 8_000).json()["sent"] == 8  # 8 triggers
    over = backfill(client, job_id, start + 20_000, start + 23_000)  # 3 more: 11 in the minute
    assert over.status_code == 429 and over.json()["limit"] == "triggers_per_min_max", over.text
    clock.set(NOW + 61_000)  # the minute has passed
    assert backfill(client, job_id, start + 20_000, start + 23_000).json()["sent"] == 3


def test_a_tenant_backfills_at_most_the_daily_allowance() -> None:
    """Per tenant-day: the processor's count of backfilled runs over a sliding day."""
    from gnomon.core.admission import check_backfill
    from gnomon.core.errors import LimitExceeded
    from gnomon.core.quota import QuotaBook

    book = QuotaBook(partitions_total=2)
    book.open(0)
    book.open(1)
    book.backfill_accepted(0, "acme", BACKFILL_RUNS_PER_DAY_MAX - 600, NOW)
    book.backfill_accepted(1, "acme", 500, NOW + HOUR)
    assert book.backfilled("acme", NOW + 2 * HOUR) == BACKFILL_RUNS_PER_DAY_MAX - 100
    limits = TenantLimits("acme", backlog_max=10_000_000, triggers_per_min_max=1_000_000)
    kw: dict[str, Any] = {"backlog": 0, "triggers_last_min": 0, "oldest_trigger_ms": None, "now_ms": NOW}
    check_backfill(limits, 100, backfilled_last_day=book.backfilled("acme", NOW + 2 * HOUR), **kw)
    with pytest.raises(LimitExceeded) as over:
        check_backfill(limits, 101, backfilled_last_day=book.backfilled("acme", NOW + 2 * HOUR), **kw)
    assert over.value.limit == "backfill_runs_per_day" and over.value.retry_after_s
    assert book.backfilled("acme", NOW + 24 * HOUR) == 500  # the first is a day old: out of the window
    assert book.backfilled("other", NOW) == 0
