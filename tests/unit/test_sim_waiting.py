"""Runs waiting for room are granted oldest first across a processor's partitions
(``processor.waiting``), in the simulation with the real processor and worker loops.

Found by ``bench/steady.py --jobs 1000 --duration-s 600 --concurrency 3000``
(2026-12-04): two workers accept 10,000 staged attempts each, fewer than 30 s of
1,000 runs a second, so runs wait for staging room. The waiting runs were taken from
the partitions in turn, one each, so the partitions holding the most jobs fell behind
without bound (start lag p99 43-90 s there, about 1 s elsewhere) while each
partition got the same number of grants; and a run released 30 s ahead of its slot
took the staging room before runs already late, so the room went to runs that held it
for 30 s: 20,000 staged / 30 s = 667 runs a second could be staged, of the 1,000 asked."""

from __future__ import annotations

import pytest

from gnomon.adapters.kafka import partition_for
from gnomon.core import jobs as J
from gnomon.core import runs as R
from gnomon.sim import SimCluster

PARTITIONS = 4


pytestmark = pytest.mark.usefixtures("quiet_logs")


def _job_ids(heavy: int, light: int) -> list[str]:
    """``heavy`` job ids on partition 0, ``light`` on each other partition."""
    want = {0: heavy} | {p: light for p in range(1, PARTITIONS)}
    ids: list[str] = []
    i = 0
    while any(want.values()):
        job_id, i = f"j{i}", i + 1
        p = partition_for(job_id, PARTITIONS)
        if want[p]:
            want[p] -= 1
            ids.append(job_id)
    return ids


@pytest.mark.parametrize("seed", range(3), ids=lambda s: f"seed-{s}")
def test_waiting_runs_are_granted_oldest_first_across_partitions(seed: int) -> None:
    # 32 per-second jobs, 20 of them on partition 0; 3 s staged ahead would be 96 staged
    # attempts, the two workers accept 80: runs wait for staging room all the time. Room
    # spent on runs 3 s ahead passes 80 / 3 s = 27 runs a second, fewer than asked: the
    # runs due first must get it (before: runs never started, 39 s late at the end)
    c = SimCluster(seed, processors=1, workers=2, worker_slots=40, worker_stage_max=40, partitions=PARTITIONS,
                   step_ms=100, duration_ms=(20, 100),
                   run_cfg=R.RunConfig(lease_ms=8_000, stage_ahead_ms=3_000, timeout_grace_ms=5_000),
                   sched_cfg=J.SchedulerConfig(lookahead_ms=5_000))
    c.run_for(1_000, faults=False)
    for job_id in _job_ids(heavy=20, light=4):
        c.register(job_id, "* * * * * *")
    c.run_for(40_000, faults=False)
    c.heal(5_000)
    rep = c.history_report()
    assert rep.missed == 0 and rep.duplicates == 0, f"{rep.summary()} {rep.problems[:5]}"
    last = {state.run_id: state for state in c.ledger()}  # each run's final state
    lag: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
    now = c.clock.now_ms()
    for run in last.values():
        if now - 25_000 <= run.slot_ms <= now - 10_000:  # the second half; a run not started is as late as now
            started = run.started_at_ms if run.started_at_ms is not None else now
            lag[partition_for(run.job_id, PARTITIONS)].append(started - run.slot_ms)
    assert all(lag.values()), lag
    worst = {p: max(v) for p, v in lag.items()}
    # every partition's runs on time, none left behind by the others' newer runs
    assert max(worst.values()) <= 1_500, worst
