"""Catch-up without a flood: after a long outage a job's missed slots become one
skipped-range record, and the backlog is paced so the slots due now go first."""

from __future__ import annotations

from gnomon.adapters.kv import MemoryKV
from gnomon.checker import HistoryChecker
from gnomon.core import jobs as J
from gnomon.core import runs as R
from gnomon.core.model import CatchUp, JobSpec, Schedule, Target, TargetType
from gnomon.processor.task import PartitionTask
from gnomon.topology import load_topology

T0 = 1_803_859_200_000  # 2027-03-01T00:00:00Z
CMD = Target(TargetType.COMMAND, argv=("true",))
EVERY_S = JobSpec(name="s", schedule=Schedule(cron="* * * * * *"), target=CMD, catch_up=CatchUp.SKIP)


def test_a_long_outage_is_one_range_per_job_accounted_slot_by_slot() -> None:
    task = PartitionTask(0, MemoryKV(), load_topology())
    task.handle(J.RegisterJob("j", "t", EVERY_S, T0))
    outage_end = T0 + 20 * 60_000  # 20 minutes without a processor
    out = task.tick(outage_end)
    ledger = [o.value for o in out if o.topic == "gnomon.runs"]
    skipped = [r for r in ledger if r.status is R.RunStatus.SKIPPED]
    assert len(skipped) == 1  # not 1,201 records
    (rng,) = skipped
    assert rng.skipped_from_ms == T0 and rng.reason == "catch-up policy skip"
    # slots T0 .. now: the policy decides the whole backlog, the grace's last minute included
    assert rng.skipped_count == (rng.slot_ms - T0) // 1000 + 1 == 1201
    checker = HistoryChecker()
    for r in ledger:
        checker.observe(r)
    job = task.job("j")
    assert job is not None
    rep = checker.check([job], outage_end, first_slots={"j": T0})
    assert rep.ok and rep.missed == 0 and rep.skips == 1201, rep.summary()


def test_slots_due_now_go_before_a_catch_up_backlog() -> None:
    # (a caught-up job costs a range and its next 2 s of slots in the budget: ~4 records)
    task = PartitionTask(0, MemoryKV(), load_topology(), J.SchedulerConfig(catch_up_records_per_tick_max=100))
    for i in range(60):
        task.handle(J.RegisterJob(f"old{i:03d}", "t", EVERY_S, T0))
    now = T0 + 10 * 60_000
    for i in range(5):
        task.handle(J.RegisterJob(f"new{i}", "t", EVERY_S, now - 500))
    out = task.tick(now)
    triggered = {o.value.job_id for o in out if o.topic == "gnomon.runs" and not o.value.status.terminal}
    assert {f"new{i}" for i in range(5)} <= triggered  # on time, whatever the backlog
    behind = [f"old{i:03d}" for i in range(60) if (j := task.job(f"old{i:03d}")) and j.next_run_at_ms < now - 60_000]
    assert 20 < len(behind) < 60 and task.stats.catch_up_deferred == 1  # the backlog is paced
    ticks = 1
    while behind and ticks < 200:
        now += 200
        task.tick(now)
        ticks += 1
        behind = [j for j in behind if (s := task.job(j)) and s.next_run_at_ms < now - 60_000]
    assert behind == [] and ticks > 2  # drained over several ticks


def test_a_busy_tick_emits_every_job_s_near_slots_before_the_rest_of_the_lookahead() -> None:
    """After an outage (or on a restart) one tick fills 30 s of lookahead for many jobs:
    the runs due in the next seconds come first in the output (and so in each worker's
    inbox), whatever the job order."""
    task = PartitionTask(0, MemoryKV(), load_topology())
    for i in range(30):
        task.handle(J.RegisterJob(f"j{i:02d}", "t", EVERY_S, T0))
    now = T0 + 20 * 60_000
    created: dict[str, R.RunState] = {}  # runs in order of first appearance
    for o in task.tick(now):
        if o.topic == "gnomon.runs" and o.value.status is not R.RunStatus.SKIPPED:
            created.setdefault(o.value.run_id, o.value)
    order = list(created.values())
    near = [i for i, r in enumerate(order) if r.slot_ms <= now + 2_000]
    far = [i for i, r in enumerate(order) if r.slot_ms > now + 2_000]
    assert len(near) == 30 * 2 and len(far) == 30 * 28  # (the slot at "now" is in the skipped range)
    assert max(near) < min(far)
