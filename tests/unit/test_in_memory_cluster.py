"""The whole core in memory (the shipped harness), checked by the history checker."""

from __future__ import annotations

import pytest

from gnomon.adapters.kv import MemoryKV
from gnomon.core import jobs as J
from gnomon.core import runs as R
from gnomon.core.errors import ValidationError
from gnomon.core.model import CatchUp, JobSpec, Priority, RetryPolicy, Schedule, Target, TargetType
from gnomon.core.runs import RunStatus
from gnomon.processor.task import PartitionTask
from gnomon.testing import FakeWorkerPolicy, InMemoryCluster
from gnomon.topology import Topology

CMD = Target(TargetType.COMMAND, argv=("true",))


def spec(cron: str = "*/5 * * * * *", **kw: object) -> JobSpec:
    return JobSpec(name="j", schedule=Schedule(cron=cron), target=CMD,
                   retry=RetryPolicy(max_attempts=3, backoff_base_s=1, backoff_cap_s=5), **kw)  # type: ignore[arg-type]


def check(cluster: InMemoryCluster, job_ids: list[str]) -> None:
    rep = cluster.history_report(job_ids)
    assert rep.ok, (rep.summary(), rep.problems[:5])
    assert cluster.stale_accepted == []
    return rep  # type: ignore[return-value]


def check_stale(cluster: InMemoryCluster) -> int:
    from gnomon.core.messages import Stop, StopReason

    return sum(1 for _, rec in cluster.log if isinstance(rec, Stop) and rec.kind is StopReason.STALE)


def test_a_job_runs_every_slot_once() -> None:
    c = InMemoryCluster(seed=1)
    t0 = c.clock.now_ms()
    c.submit(J.RegisterJob("job1", "t", spec(), t0))
    c.run_for(60_000)
    runs = [r for r in c.runs_of("job1") if r.slot_ms <= t0 + 50_000]
    assert len(runs) == 11 and all(r.status is RunStatus.SUCCEEDED for r in runs)
    check(c, ["job1"])


def test_manual_trigger_is_idempotent() -> None:
    c = InMemoryCluster(seed=2)
    c.submit(J.RegisterJob("job1", "t", spec("0 0 1 1 *"), c.clock.now_ms()))
    c.drain()
    for _ in range(3):
        c.submit(J.TriggerJob("job1", "t", "key-1", c.clock.now_ms()))
    c.run_for(5_000)
    manual = [r for r in c.runs_of("job1") if r.manual]
    assert [r.run_id for r in manual] == ["job1@manual:key-1"]
    assert manual[0].status is RunStatus.SUCCEEDED


@pytest.mark.parametrize("seed", range(6))
def test_chaos_in_memory_failures_and_crashes(seed: int) -> None:
    """Workers fail 20%, crash (silently) 10% and turn zombie (complete late, after their
    lease lapsed) 10% of attempts; leases lapse, retries run, and still every slot is one
    run, no grants overlap, no stale token wins."""
    c = InMemoryCluster(seed=seed, policy=FakeWorkerPolicy(p_fail=0.2, p_crash=0.1, p_zombie=0.1,
                                                            duration_ms=(100, 3000)))
    ids = [f"job{i}" for i in range(12)]
    for i, job_id in enumerate(ids):
        cron = ["*/5 * * * * *", "*/7 * * * * *", "*/10 * * * * *"][i % 3]
        c.submit(J.RegisterJob(job_id, "t", spec(cron, catch_up=CatchUp.ALL), c.clock.now_ms()))
    c.run_for(120_000, step_ms=250)
    c.run_for(120_000, step_ms=500)  # long enough for lapsed leases and retries to settle
    check(c, ids)
    assert check_stale(c) > 0, "the scenario should have produced late zombie completions"
    statuses = {r.status for j in ids for r in c.runs_of(j)}
    assert RunStatus.FAILED in statuses or RunStatus.SUCCEEDED in statuses


def test_edits_near_the_slot_apply_to_runs_already_in_the_lookahead() -> None:
    """Runs triggered up to 30 s ahead look at their job at the slot: a pause or delete
    withdraws them (recorded skipped), an update's definition is the one that runs."""
    c = InMemoryCluster(seed=3)
    t0 = c.clock.now_ms()
    c.submit(J.RegisterJob("job1", "t", spec(), t0))
    c.submit(J.RegisterJob("job2", "t", spec(), t0))
    c.submit(J.RegisterJob("job3", "t", spec(), t0))
    c.run_for(10_000)
    pause_at = c.clock.now_ms()
    c.submit(J.PauseJob("job1", "t", pause_at))
    c.submit(J.DeleteJob("job2", "t", pause_at))
    new_target = Target(TargetType.COMMAND, argv=("echo", "v2"))
    c.submit(J.UpdateJob("job3", "t", JobSpec(name="j", schedule=Schedule(cron="*/5 * * * * *"), target=new_target,
                                             retry=RetryPolicy(max_attempts=3, backoff_base_s=1, backoff_cap_s=5)),
                         pause_at))
    c.run_for(40_000)
    after = [r for r in c.runs_of("job1") if r.slot_ms > pause_at]
    assert after and all(r.status is RunStatus.SKIPPED and r.reason == "paused" for r in after)
    gone = [r for r in c.runs_of("job2") if r.slot_ms > pause_at]
    assert gone and all(r.status is RunStatus.SKIPPED and "deleted" in (r.reason or "") for r in gone)
    updated = [r for r in c.runs_of("job3") if r.slot_ms > pause_at and r.status is RunStatus.SUCCEEDED]
    assert updated and all(r.spec.target == new_target for r in updated)
    resume_at = c.clock.now_ms()
    c.submit(J.ResumeJob("job1", "t", resume_at))
    c.run_for(20_000)
    resumed = [r for r in c.runs_of("job1") if r.slot_ms >= resume_at]
    assert resumed and all(r.status is RunStatus.SUCCEEDED for r in resumed if r.slot_ms <= resume_at + 10_000)
    check(c, ["job1", "job3"])


# ---- security: tenant on run commands, patches merged by the processor -------------------


def test_cancel_or_replay_from_another_tenant_is_refused_and_the_run_goes_on() -> None:
    """Anyone who can write gnomon.run-events is not the API: the processor itself refuses
    a cancel or replay that does not carry the run's tenant (to poison, with the reason)."""
    c = InMemoryCluster(seed=4, policy=FakeWorkerPolicy(duration_ms=(20_000, 20_000)))
    c.submit(J.RegisterJob("job1", "t", spec("0 0 1 1 *"), c.clock.now_ms()))
    c.drain()
    c.submit(J.TriggerJob("job1", "t", "k", c.clock.now_ms()))
    c.run_for(2_000)
    rid = "job1@manual:k"
    before = c.run_state(rid)
    assert before is not None and before.status is RunStatus.RUNNING
    for tenant in ("intruder", ""):
        c.submit(R.CancelRun(rid, tenant, c.clock.now_ms()))
        c.submit(R.ReplayRun(rid, tenant, c.clock.now_ms()))
    c.drain()
    refused = [(type(cmd).__name__, why) for cmd, why in c.rejected]
    assert [name for name, _ in refused] == ["CancelRun", "ReplayRun"] * 2
    # (another tenant's run is answered as an unknown one: "no run ...")
    assert all("refused" in why or why.startswith(f"no run {rid!r}") for _, why in refused), refused
    assert c.run_state(rid) == before
    c.run_for(25_000)
    done = c.run_state(rid)
    assert done is not None and done.status is RunStatus.SUCCEEDED


def test_cancel_from_the_runs_tenant_cancels() -> None:
    c = InMemoryCluster(seed=5, policy=FakeWorkerPolicy(duration_ms=(20_000, 20_000)))
    c.submit(J.RegisterJob("job1", "t", spec("0 0 1 1 *"), c.clock.now_ms()))
    c.drain()
    c.submit(J.TriggerJob("job1", "t", "k", c.clock.now_ms()))
    c.run_for(2_000)
    c.submit(R.CancelRun("job1@manual:k", "t", c.clock.now_ms()))
    c.drain()
    run = c.run_state("job1@manual:k")
    assert c.rejected == [] and run is not None and run.status is RunStatus.CANCELLED


def test_patches_are_merged_by_the_processor_in_log_order() -> None:
    c = InMemoryCluster(seed=6)
    c.submit(J.RegisterJob("job1", "t", spec(), c.clock.now_ms()))
    c.drain()
    now = c.clock.now_ms()
    # two clients edit different fields of version 1, back to back, without If-Match
    c.submit(J.PatchJob("job1", "t", J.canonical_patch({"priority": "high"}), None, now))
    c.submit(J.PatchJob("job1", "t", J.canonical_patch({"timeoutS": 30}), None, now))
    # a third one expected version 1 (If-Match), which is gone: refused, nothing changes
    c.submit(J.PatchJob("job1", "t", J.canonical_patch({"name": "late"}), 1, now))
    # and one that does not validate
    c.submit(J.PatchJob("job1", "t", J.canonical_patch({"pool": "gpu"}), None, now))
    c.drain()
    job = c.job_state("job1")
    assert job is not None and job.version == 3
    assert job.spec.priority is Priority.HIGH and job.spec.timeout_s == 30 and job.spec.name == "j"
    (conflict, invalid) = c.rejected
    assert "version 3, not the expected 1" in conflict[1]
    assert invalid[1].startswith("pool: patch of job job1 refused")
    c.run_for(10_000)
    assert all(r.spec.timeout_s == 30 for r in c.runs_of("job1") if r.status is RunStatus.SUCCEEDED)
    check(c, ["job1"])


def test_the_processor_checks_patches_against_its_topologys_pools() -> None:
    topo = Topology(partitions=1, pools=("default", "gpu"))
    task = PartitionTask(0, MemoryKV(), topo)
    task.handle(J.RegisterJob("job1", "t", spec(), 0), 0)
    task.handle(J.PatchJob("job1", "t", J.canonical_patch({"pool": "gpu"}), 1, 1), 1)
    job = task.job("job1")
    assert job is not None and job.spec.pool == "gpu" and job.version == 2
    with pytest.raises(ValidationError, match="unknown pool 'batch'"):
        task.handle(J.PatchJob("job1", "t", J.canonical_patch({"pool": "batch"}), None, 2), 2)
    assert task.job("job1") == job
