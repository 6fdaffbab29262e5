"""Runs staged on workers ahead of their slot, in the whole-system simulation (moved here
from the chaos suite's real-stack version; kill -9 of real processes stays in
``tests/chaos/test_chaos.py``):

  1. a worker holding staged runs dies before their slot: its runs move to the other
     worker and still start at their slot (attempt 1, never early);
  2. every processor dies while runs are staged and stays down past their slot: the
     workers start them at the slot anyway, and the processors, back, account for them;
  3. a staged run is cancelled and a staged job is paused: neither ever starts.

Each seed draws the moments of the deaths, whether a processor keeps its disk, and the
plain producers' duplicates and reorders; the checker then accounts for every slot.
"On time" is loose (``ON_TIME_MS``): the fallback without staging (a lapsed lease, or a
processor that has to come back) would take the 8 s lease or the outage.
A failing seed replays: ``pytest tests/unit/test_sim_staging.py -k 'seed-17]'``."""

from __future__ import annotations

import random

import pytest

from gnomon import codec
from gnomon.core import jobs as J
from gnomon.core import runs as R
from gnomon.core.model import JobSpec, Schedule, slot_run_id
from gnomon.sim import HANDLER, TENANT, SimCluster, SimFaults

SEEDS = 200
ON_TIME_MS = 3_000
RUN_CFG = R.RunConfig(lease_ms=8_000, stage_ahead_ms=8_000, timeout_grace_ms=5_000)
SCHED = J.SchedulerConfig(lookahead_ms=10_000)

pytestmark = pytest.mark.usefixtures("quiet_logs")


def _one_time(c: SimCluster, job_id: str, slot_ms: int) -> None:
    from gnomon.core.model import RetryPolicy, Target, TargetType

    spec = JobSpec(name=job_id, schedule=Schedule(run_at_ms=slot_ms), target=Target(TargetType.HANDLER, handler=HANDLER),
                   timeout_s=30, retry=RetryPolicy(max_attempts=3, backoff_base_s=0.5, backoff_cap_s=2.0))
    c.submit(J.RegisterJob(job_id, TENANT, spec, c.clock.now_ms()))


def _latest(c: SimCluster) -> dict[str, R.RunState]:
    return {s.run_id: s for s in c.ledger()}


def _second(ms: int) -> int:
    return ms - ms % 1_000


def run_staging_scenario(seed: int) -> tuple[SimCluster, dict[str, object]]:
    rng = random.Random(f"{seed}/staging")
    c = SimCluster(seed, processors=rng.choice((1, 2)), workers=2, worker_slots=16, run_cfg=RUN_CFG, sched_cfg=SCHED,
                   duration_ms=(100, 400), faults=SimFaults(duplicate=0.05, reorder=0.05, skew_ms=0), step_ms=100)
    c.run_for(2_000, faults=False)  # workers advertise
    # 1. a worker holding staged runs dies before their slot
    slot1 = _second(c.clock.now_ms()) + 14_000
    for i in range(10):
        _one_time(c, f"a{i}", slot1)
    # (a worker is found lost 4 advert intervals after its last one: 4 s here)
    c.run_for(slot1 - c.clock.now_ms() - rng.randint(5_500, 6_500))
    staged = {rid: s for rid, s in _latest(c).items() if rid.startswith("a") and s.staged}
    assert len(staged) == 10, f"not all staged before the slot: {sorted(staged)}\n{c.describe()}"
    victim = rng.choice(sorted({s.worker_id or "" for s in staged.values()}))
    index = next(w.index for w in c.workers if w.worker is not None and w.worker.worker_id == victim)
    moved = sorted(rid for rid, s in staged.items() if s.worker_id == victim)
    c.crash_worker(index, down_ms=60_000)
    # 3. cancel a staged run; pause a staged cron job (each started from a worker, never)
    slot3 = _second(c.clock.now_ms()) + 7_000
    _one_time(c, "cancel", slot3)
    c.register("pause", f"{(slot3 // 1_000) % 60} * * * * *")  # once a minute, first slot at slot3
    c.run_for(2_000)
    cancel_run, pause_run = slot_run_id("cancel", slot3), slot_run_id("pause", slot3)
    latest = _latest(c)
    assert latest[cancel_run].staged and latest[pause_run].staged, c.describe()
    c.client.produce(c.topo.job_commands, b"cancel", codec.encode(R.CancelRun(cancel_run, TENANT, c.clock.now_ms())))
    c.submit(J.PauseJob("pause", TENANT, c.clock.now_ms()))
    # 2. every processor dies with runs staged, and stays down past their slot
    c.run_for(max(0, slot1 + 2_000 - c.clock.now_ms()))
    slot2 = _second(c.clock.now_ms()) + 9_000
    for i in range(10):
        _one_time(c, f"b{i}", slot2)
    c.run_for(slot2 - c.clock.now_ms() - rng.randint(2_000, 4_000))
    staged2 = [rid for rid, s in _latest(c).items() if rid.startswith("b") and s.staged]
    assert len(staged2) == 10, f"b not all staged: {staged2}\n{c.describe()}"
    for s in c.procs:
        if s.proc is not None:
            c.kill(s.name, drop_state=rng.random() < 0.5, down_ms=slot2 - c.clock.now_ms() + rng.randint(1_000, 5_000))
    c.run_for(slot2 + 6_000 - c.clock.now_ms(), faults=False)
    c.heal(12_000)
    return c, {"slot1": slot1, "slot2": slot2, "moved": moved, "victim": victim, "cancel": cancel_run,
               "pause": pause_run}


@pytest.mark.sweep
@pytest.mark.parametrize("seed", range(SEEDS), ids=lambda s: f"seed-{s}")
def test_staged_runs_survive_worker_and_processor_deaths(seed: int) -> None:
    c, facts = run_staging_scenario(seed)
    why = c.describe()
    rep = c.history_report()
    assert rep.ok and rep.missed == 0 and rep.duplicates == 0, f"{rep.summary()}\n{why}"
    final = _latest(c)
    for group, slot in (("a", facts["slot1"]), ("b", facts["slot2"])):
        assert isinstance(slot, int)
        mine = {rid: s for rid, s in final.items() if rid.startswith(group) and s.job_id.startswith(group)}
        assert len(mine) == 10 and all(s.status is R.RunStatus.SUCCEEDED for s in mine.values()), \
            ({rid: s.status.value for rid, s in mine.items()}, why)
        lags = sorted((s.started_at_ms or 0) - slot for s in mine.values())
        assert all(0 <= lag <= ON_TIME_MS for lag in lags), (group, lags, why)  # never early; on time
    moved = facts["moved"]
    assert isinstance(moved, list) and moved
    assert all(final[rid].worker_id != facts["victim"] and final[rid].attempt == 1 for rid in moved), why
    cancelled, paused = final[str(facts["cancel"])], final[str(facts["pause"])]
    assert cancelled.status is R.RunStatus.CANCELLED and cancelled.started_at_ms is None, why
    assert paused.status is R.RunStatus.SKIPPED and paused.reason == "paused" and paused.started_at_ms is None, why


def test_the_scenario_kills_what_it_says() -> None:
    """Over a few seeds: one worker and every processor die each time, the processors
    sometimes with their disks, and the plain producers duplicate and reorder."""
    kills = dropped = noisy = 0
    for seed in range(8):
        c, facts = run_staging_scenario(seed)
        assert c.counts.get("worker_crash", 0) == 1 and facts["moved"], (c.counts, facts)
        kills += c.counts.get("kill", 0)
        dropped += sum("with its state" in e for e in c.events)
        assert c.log.plain_faults is not None
        noisy += c.log.plain_faults.duplicated + c.log.plain_faults.reordered
    assert kills >= 8 and 0 < dropped < kills and noisy > 0, (kills, dropped, noisy)
