"""Tenant quotas and admission in the processor: shares across partitions and instances,
counts that follow the state, a tenant at quota waits (visibly) while others start on
time, and commands over a limit are refused before anything is written."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gnomon.core import jobs as J
from gnomon.core import quota as Q
from gnomon.core import runs as R
from gnomon.core.errors import LimitExceeded
from gnomon.core.model import JobSpec, RetryPolicy, Schedule, Target, TargetType
from gnomon.core.tenants import DEFAULTS_KEY, TenantBook, TenantLimits
from gnomon.processor.output import Output
from gnomon.testing import FakeWorkerPolicy, InMemoryCluster

CMD = Target(TargetType.COMMAND, argv=("true",))


# ---- shares ---------------------------------------------------------------------------


@given(st.text(min_size=1, max_size=20), st.integers(0, 500), st.integers(1, 64), st.data())
def test_shares_of_disjoint_owners_add_up_to_the_limit(tenant: str, limit: int, partitions: int,
                                                       data: st.DataObject) -> None:
    owner_of = data.draw(st.lists(st.integers(0, 5), min_size=partitions, max_size=partitions))
    owners: dict[int, set[int]] = {}
    for p, o in enumerate(owner_of):
        owners.setdefault(o, set()).add(p)
    shares = [Q.units_homed(tenant, limit, partitions, frozenset(ps)) for ps in owners.values()]
    assert sum(shares) == limit
    assert all(s >= 0 for s in shares)


@given(st.text(min_size=1, max_size=20), st.integers(0, 500), st.integers(1, 64))
def test_units_spread_evenly_over_partitions(tenant: str, limit: int, partitions: int) -> None:
    per = [Q.units_homed(tenant, limit, partitions, frozenset({p})) for p in range(partitions)]
    assert max(per) - min(per) <= 1
    assert Q.units_homed(tenant, limit, partitions, frozenset(range(partitions))) == limit


# ---- counts follow the state -------------------------------------------------------------


def one_time(name: str, at_ms: int, pool: str = "default") -> JobSpec:
    return JobSpec(name=name, schedule=Schedule(run_at_ms=at_ms), target=CMD, retry=RetryPolicy(max_attempts=1),
                   pool=pool)


def granted_by_tenant(c: InMemoryCluster) -> Counter[str]:
    """Runs granted (staged or running) per tenant, from the state itself."""
    n: Counter[str] = Counter()
    for task in c.tasks.values():
        for key, _ in task.kv.scan(b"r/", b"r0", 10**9):
            run = task.run(key[2:].decode())
            if run is not None and run.status is R.RunStatus.RUNNING:
                n[run.tenant] += 1
    return n


def watch_concurrency(c: InMemoryCluster) -> dict[str, int]:
    """Peak of runs granted at once per tenant, over every ledger write."""
    held: dict[str, tuple[str, bool]] = {}
    peak: dict[str, int] = {}

    def hook(o: Output) -> None:
        if o.topic != c.topo.runs or not isinstance(o.value, R.RunState):
            return
        run = o.value
        held[run.run_id] = (run.tenant, run.status is R.RunStatus.RUNNING)
        now = sum(1 for t, h in held.values() if h and t == run.tenant)
        peak[run.tenant] = max(peak.get(run.tenant, 0), now)

    c.hooks.append(hook)
    return peak


def quota_cluster(tenants: dict[str, int], **kw: Any) -> InMemoryCluster:
    book = TenantBook()
    for tenant, quota in tenants.items():
        book.apply(tenant, TenantLimits(tenant, concurrency_max=quota))
    kw.setdefault("policy", FakeWorkerPolicy(duration_ms=(10_000, 10_000)))
    return InMemoryCluster(partitions=8, tenants=book, **kw)


def test_a_tenant_at_quota_waits_visibly_while_another_starts_on_time() -> None:
    c = quota_cluster({"a": 2})
    peak = watch_concurrency(c)
    slot = c.clock.now_ms() + 5_000
    for i in range(20):
        c.submit(J.RegisterJob(f"a{i:02d}", "a", one_time(f"a{i}", slot), c.clock.now_ms()))
    for i in range(5):
        c.submit(J.RegisterJob(f"b{i:02d}", "b", one_time(f"b{i}", slot), c.clock.now_ms()))
    c.run_for(6_000)
    starts = {run_id.partition("@")[0]: ms for run_id, ms, _ in c.started}
    assert all(starts.get(f"b{i:02d}") == slot for i in range(5)), starts  # on time, to the tick
    assert sum(1 for j in starts if j.startswith("a")) == 2
    waiting = [r for i in range(20) for r in c.runs_of(f"a{i:02d}") if r.status is R.RunStatus.READY]
    assert len(waiting) == 18
    assert all((r.reason or "").startswith(Q.WAITING_FOR_QUOTA) for r in waiting), [r.reason for r in waiting]
    c.run_for(120_000)
    assert peak["a"] == 2, peak
    assert all(r.status is R.RunStatus.SUCCEEDED and not (r.reason or "").startswith(Q.WAITING_FOR_QUOTA)
               for i in range(20) for r in c.runs_of(f"a{i:02d}"))


@settings(max_examples=15, deadline=None)
@given(st.integers(1, 5), st.integers(0, 10_000), st.integers(1, 6))
def test_quota_is_never_exceeded_and_never_idle_while_runs_wait(quota: int, seed: int, workers: int) -> None:
    """Random durations, failures and worker counts: the tenant never holds more than its
    quota, and once the pool has room it keeps its quota busy while runs wait."""
    c = quota_cluster({"a": quota}, seed=seed, workers=workers, worker_slots=3,
                      policy=FakeWorkerPolicy(p_fail=0.2, duration_ms=(500, 5_000)))
    peak = watch_concurrency(c)
    slot = c.clock.now_ms() + 2_000
    for i in range(12):
        c.submit(J.RegisterJob(f"a{i:02d}", "a", one_time(f"a{i}", slot), c.clock.now_ms()))
    idle_ticks = 0
    for _ in range(600):
        c.run_for(100)
        granted = granted_by_tenant(c)["a"]
        assert granted == c.quota.count(Q.Family.GRANTED, "a", "default")  # the count is the state's
        waiting = sum(1 for i in range(12) for r in c.runs_of(f"a{i:02d}") if r.status is R.RunStatus.READY)
        free = c.directory.free_slots("default", c.clock.now_ms()) if c.directory else 0
        if waiting and granted < quota and free >= quota:
            idle_ticks += 1
        else:
            idle_ticks = 0
        assert idle_ticks <= 15, "runs waited while the tenant had quota and the pool had room"
    assert peak.get("a", 0) <= quota


def test_counts_are_rebuilt_from_state_on_open() -> None:
    c = quota_cluster({"a": 3})
    slot = c.clock.now_ms() + 2_000
    for i in range(6):
        c.submit(J.RegisterJob(f"a{i}", "a", one_time(f"a{i}", slot), c.clock.now_ms()))
    c.run_for(4_000)
    before = (c.quota.count(Q.Family.GRANTED, "a", "default"), c.quota.count(Q.Family.JOBS, "a"))
    assert before == (3, 6)
    fresh = Q.QuotaBook(c.tenants, c.partitions)
    for task in c.tasks.values():
        task.quota = fresh
        task.load_counts()
    assert (fresh.count(Q.Family.GRANTED, "a", "default"), fresh.count(Q.Family.JOBS, "a")) == before


def test_an_instance_owning_some_partitions_uses_only_their_units() -> None:
    book = TenantBook()
    book.apply("a", TenantLimits("a", concurrency_max=4))
    halves = [Q.QuotaBook(book, 8), Q.QuotaBook(book, 8)]
    for p in range(8):
        halves[p % 2].open(p)
    assert sum(h.may_grant("a", "default").share for h in halves) == 4
    whole = Q.QuotaBook(book, 8)
    for p in range(8):
        whole.open(p)
    assert whole.may_grant("a", "default").share == 4


# ---- admission -------------------------------------------------------------------------


def admission_cluster(**limits: int) -> InMemoryCluster:
    book = TenantBook()
    book.apply("a", TenantLimits("a", **limits))
    return InMemoryCluster(partitions=4, tenants=book)


def refusals(c: InMemoryCluster) -> list[str]:
    return [msg for _, msg in c.rejected]


def test_registrations_over_jobs_max_are_refused_naming_the_limit() -> None:
    c = admission_cluster(jobs_max=3)
    for i in range(5):
        c.submit(J.RegisterJob(f"j{i}", "a", JobSpec(name="x", schedule=Schedule(cron="0 * * * *"), target=CMD),
                               c.clock.now_ms()))
    c.drain()
    assert sum(1 for i in range(5) if c.job_state(f"j{i}") is not None) == 3
    assert len(refusals(c)) == 2 and all(m.startswith("jobs_max:") for m in refusals(c))
    c.submit(J.DeleteJob("j0", "a", c.clock.now_ms()) if c.job_state("j0") else J.DeleteJob("j1", "a", 0))
    c.drain()
    c.submit(J.RegisterJob("j9", "a", JobSpec(name="x", schedule=Schedule(cron="0 * * * *"), target=CMD),
                           c.clock.now_ms()))
    c.drain()
    assert c.job_state("j9") is not None  # a deleted job gave its place back


def test_schedules_under_the_minimum_interval_are_refused() -> None:
    c = admission_cluster(interval_min_s=60)
    c.submit(J.RegisterJob("fast", "a", JobSpec(name="x", schedule=Schedule(cron="*/10 * * * * *"), target=CMD),
                           c.clock.now_ms()))
    c.submit(J.RegisterJob("ok", "a", JobSpec(name="x", schedule=Schedule(cron="*/5 * * * *"), target=CMD),
                           c.clock.now_ms()))
    c.drain()
    assert c.job_state("fast") is None and c.job_state("ok") is not None
    assert refusals(c) and refusals(c)[0].startswith("interval_min_s:")
    c.submit(J.PatchJob("ok", "a", J.canonical_patch({"schedule": "* * * * * *"}), None, c.clock.now_ms()))
    c.drain()
    job = c.job_state("ok")
    assert job is not None and job.spec.schedule.cron == "*/5 * * * *"  # the edit was refused whole


def test_manual_triggers_over_the_rate_and_one_offs_over_the_backlog_are_refused() -> None:
    c = admission_cluster(triggers_per_min_max=5, backlog_max=100)
    c.submit(J.RegisterJob("j", "a", JobSpec(name="x", schedule=Schedule(cron="0 0 1 1 *"), target=CMD),
                           c.clock.now_ms()))
    for i in range(8):
        c.submit(J.TriggerJob("j", "a", f"k{i}", c.clock.now_ms()))
    c.submit(J.TriggerJob("j", "a", "k0", c.clock.now_ms()))  # the same key again: no new run, not refused
    c.drain()
    assert len(refusals(c)) == 3 and all(m.startswith("triggers_per_min_max:") for m in refusals(c))
    c.clock.advance(61_000)
    c.submit(J.TriggerJob("j", "a", "later", c.clock.now_ms()))
    c.drain()
    assert c.run_state("j@manual:later") is not None  # the window moved on

    d = admission_cluster(backlog_max=2)
    far = d.clock.now_ms() + 3_600_000
    for i in range(4):
        d.submit(J.RegisterJob(f"once{i}", "a", one_time(f"o{i}", far), d.clock.now_ms()))
    d.drain()
    assert sum(1 for i in range(4) if d.job_state(f"once{i}") is not None) == 2
    assert all(m.startswith("backlog_max:") for m in refusals(d)) and len(refusals(d)) == 2


def test_limit_refusals_say_when_to_retry() -> None:
    from gnomon.core.admission import check_trigger

    lim = TenantLimits("a", triggers_per_min_max=2)
    with pytest.raises(LimitExceeded) as exc:
        check_trigger(lim, backlog=0, triggers_last_min=2, oldest_trigger_ms=1_000, now_ms=31_000)
    assert exc.value.limit == "triggers_per_min_max" and exc.value.retry_after_s == 30


def test_defaults_record_applies_to_unconfigured_tenants() -> None:
    book = TenantBook()
    book.apply(DEFAULTS_KEY, TenantLimits(DEFAULTS_KEY, concurrency_max=1))
    c = quota_cluster({}, policy=FakeWorkerPolicy(duration_ms=(10_000, 10_000)))
    c.tenants.apply(DEFAULTS_KEY, TenantLimits(DEFAULTS_KEY, concurrency_max=1))
    peak = watch_concurrency(c)
    slot = c.clock.now_ms() + 2_000
    for i in range(3):
        c.submit(J.RegisterJob(f"z{i}", "zed", one_time(f"z{i}", slot), c.clock.now_ms()))
    c.run_for(40_000)
    assert peak["zed"] == 1
    assert book.limits("zed").concurrency_max == 1


def test_published_trigger_counts_forget_triggers_older_than_the_window() -> None:
    """Review finding: the published per-partition trigger count never dropped old
    triggers, and the API takes the larger of its count and the published one, so a
    tenant that once reached triggers_per_min_max was refused for good."""
    book = Q.QuotaBook(TenantBook(), 1)
    book.open(0)
    t0 = 1_000_000
    for i in range(5):
        book.trigger_accepted(0, "acme", t0 + i)
    assert book.partition_counts(0, t0 + 10)["acme"]["triggers_last_min"] == 5
    assert book.partition_counts(0, t0 + Q.TRIGGER_WINDOW_MS + 2)["acme"]["triggers_last_min"] == 2
    assert "acme" not in book.partition_counts(0, t0 + Q.TRIGGER_WINDOW_MS + 5)


def test_moving_a_pending_one_time_job_is_not_refused_at_the_backlog_limit() -> None:
    """Review finding: a one-time job not yet triggered is counted in the backlog; moving
    it to another instant was checked as if it added a second entry, and refused."""
    d = admission_cluster(backlog_max=2)
    far = d.clock.now_ms() + 3_600_000
    for i in range(2):
        d.submit(J.RegisterJob(f"once{i}", "a", one_time(f"o{i}", far), d.clock.now_ms()))
    d.drain()
    d.submit(J.UpdateJob("once0", "a", one_time("o0", far + 60_000), d.clock.now_ms()))
    d.drain()
    assert refusals(d) == []
    job = d.job_state("once0")
    assert job is not None and job.spec.schedule.run_at_ms == far + 60_000
    # a third one-off is still refused: the move did not free or take a backlog place
    d.submit(J.RegisterJob("once2", "a", one_time("o2", far), d.clock.now_ms()))
    d.drain()
    assert d.job_state("once2") is None and [m[:12] for m in refusals(d)] == ["backlog_max:"]


def test_a_manual_trigger_read_from_run_events_is_refused() -> None:
    """Review finding: workers may write gnomon.run-events; a manual RunTriggered read
    from there would create a run without admission (trigger rate, backlog)."""
    from gnomon.core.errors import TransitionError
    from gnomon.testing import partition_for

    c = admission_cluster(triggers_per_min_max=1)
    c.submit(J.RegisterJob("j", "a", JobSpec(name="x", schedule=Schedule(cron="0 0 1 1 *"), target=CMD),
                           c.clock.now_ms()))
    c.drain()
    job = c.job_state("j")
    assert job is not None
    now = c.clock.now_ms()
    forged = J.RunTriggered("j@manual:forged", "j", "a", job.spec, now, now, True, now)
    task = c.tasks[partition_for("j", c.partitions)]
    with pytest.raises(TransitionError, match="only as a TriggerJob"):
        task.handle(forged, now, c.topo.run_events)
    assert task.run("j@manual:forged") is None


@given(st.lists(st.tuples(st.sampled_from(["open", "close", "entry"]), st.integers(0, 3),
                          st.sampled_from(["t1", "t2"]), st.booleans()), max_size=60))
def test_the_totals_read_per_grant_are_the_sum_of_the_partitions_counts(script: list[tuple[str, int, str, bool]]) -> None:
    """``count`` reads a running total (it was a sum over partitions per grant): it stays
    the sum of the per-partition counts through opens, closes and entries."""
    book = Q.QuotaBook(partitions_total=4)
    spec = JobSpec(name="j", schedule=Schedule(cron="* * * * *"), target=CMD)
    held: dict[int, Counter[bytes]] = {}
    for op, p, tenant, up in script:
        if op == "open":
            book.open(p)
            held[p] = Counter()
        elif op == "close":
            book.close(p)
            held.pop(p, None)
        elif p in held:
            key = (Q.Family.GRANTED.value + tenant + "\0" + spec.pool + "\0" + tenant + "-j@1").encode()
            if up or held[p][key] == 0:
                book.entry(p, key, +1)
                held[p][key] += 1
            else:
                book.entry(p, key, -1)
                held[p][key] -= 1
        for t in ("t1", "t2"):
            expected = sum(c[k] for c in held.values() for k in c if Q.parse_key(k) == (Q.Family.GRANTED, t, spec.pool))
            assert book.count(Q.Family.GRANTED, t, spec.pool) == expected
