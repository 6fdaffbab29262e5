"""Bounded state in the whole-system simulation: purges through a rolling restart and
kill -9s, with stale triggers replayed from outside (moved here from the chaos suite's
real-stack version).

Processors purge a finished run ``retention_ms`` (3 s) after it ended, once the history
projector has its final state (the processors' history watermark reads the projector's
commits). Both processors are restarted one by one (a rolling restart), and every fault
of ``SimFaults.mixed()`` applies, kills that drop a processor's state and stalls past the
session (a stalled processor told to stop is one of the restarts) included: each restore
must come back with the purges and the runs as committed. Meanwhile, triggers for slots
already run are replayed onto the run-events topic at random later moments (as a stale
producer would): the processor triggers slots in place and that topic carries workers'
reports only, so each is refused on the poison topic with the reason, never a second run.

Then the checker accounts for every slot once, history holds every run's last committed
state (the purged ones too), and only finished runs were purged. This scenario found a
stalled processor's clean stop checkpointing its stale stores as current
(``test_sim_faults``, the stale-store test).
A failing seed replays: ``pytest tests/unit/test_sim_purge.py -k 'seed-17]'``."""

from __future__ import annotations

import random

import pytest

from gnomon import codec
from gnomon.core import jobs as J
from gnomon.core import runs as R
from gnomon.core.messages import PoisonRecord
from gnomon.sim import SimCluster, SimFaults

SEEDS = 200
FAULT_MS = 12_000
SETTLE_MS = 10_000
RETENTION_MS = 3_000
CFG = R.RunConfig(lease_ms=8_000, stage_ahead_ms=3_000, timeout_grace_ms=5_000, retention_ms=RETENTION_MS)

pytestmark = pytest.mark.usefixtures("quiet_logs")


def _replay(c: SimCluster, state: R.RunState) -> None:
    """A trigger for a slot already run, as a stale replay (or a second scheduler) sends it."""
    cmd = J.RunTriggered(state.run_id, state.job_id, state.tenant, state.spec, state.slot_ms, state.slot_ms,
                         False, state.created_at_ms)
    c.client.produce(c.topo.run_events, state.job_id.encode(), codec.encode(cmd))
    c.counts["replayed"] = c.counts.get("replayed", 0) + 1


def _rolling_restart(c: SimCluster, name: str) -> None:
    if c.procs[int(name[1:])].proc is not None:  # (a fault may have it down already)
        c.stop(name, down_ms=1_000)


def run_purge_scenario(seed: int) -> SimCluster:
    rng = random.Random(f"{seed}/replays")
    c = SimCluster(seed, faults=SimFaults.mixed(), history=True, run_cfg=CFG, step_ms=200, standbys=seed % 3 != 0)
    for i, cron in enumerate(("* * * * * *", "*/2 * * * * *", "* * * * * *", "*/3 * * * * *")):
        c.register(f"j{i}", cron, fail_attempts=1 if i == 3 else 0)
    now = c.clock.now_ms()
    c.at(now + 5_000, lambda: _rolling_restart(c, "p0"))
    c.at(now + 8_000, lambda: _rolling_restart(c, "p1"))
    replayed: set[str] = set()
    read = [0] * c.topo.partitions  # ledger records already looked at, per partition
    for _ in range(FAULT_MS // 1_000):
        c.run_for(1_000)
        for p in range(c.topo.partitions):
            records = c.log.records(c.topo.runs, p)
            fresh, read[p] = records[read[p]:], len(records)
            for rec in fresh:
                state = None if rec.value is None else codec.decode(rec.value, topic=c.topo.runs)
                if (state is not None and state.status.terminal and not state.manual
                        and state.run_id not in replayed and rng.random() < 0.5):
                    replayed.add(state.run_id)
                    c.at(c.clock.now_ms() + rng.randint(0, 8_000), lambda s=state: _replay(c, s))  # type: ignore[misc]
    c.heal(SETTLE_MS)
    return c


def refused_replays(c: SimCluster) -> list[PoisonRecord]:
    poison = [codec.decode(r.value) for r in c.log.records(c.topo.poison) if r.value is not None]
    return [p for p in poison if isinstance(p, PoisonRecord) and "refused" in p.reason]


@pytest.mark.sweep
@pytest.mark.parametrize("seed", range(SEEDS), ids=lambda s: f"seed-{s}")
def test_purges_race_replays_through_a_rolling_restart(seed: int) -> None:
    c = run_purge_scenario(seed)
    why = c.describe()
    rep = c.history_report()
    assert rep.ok and rep.slots > 0 and rep.missed == 0 and rep.duplicates == 0, f"{rep.summary()}\n{why}"
    assert c.counts.get("rebalance", 0) >= 1, why  # the rolling restart happened (or a fault did it)
    last = {s.run_id: s for s in c.ledger()}
    purged = {(r.key or b"").decode() for r in c.log.records(c.topo.runs) if r.value is None}
    assert purged, f"finished runs should have left state after {RETENTION_MS} ms\n{why}"
    assert all(last[run_id].status.terminal for run_id in purged), "only finished runs are purged"
    assert c.history_gaps() == [], why  # history keeps every purged run's last state


def test_replayed_triggers_are_refused_visibly() -> None:
    """Over a few seeds of the scenario, the replayed triggers are refused on the poison
    topic, with the reason (and the checker above finds no slot run twice)."""
    refused = replayed = 0
    for seed in range(6):
        c = run_purge_scenario(seed)
        replayed += c.counts.get("replayed", 0)
        refused += len(refused_replays(c))
    assert replayed > 0 and refused > 0, (replayed, refused)
