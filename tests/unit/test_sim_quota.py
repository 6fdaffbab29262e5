"""Tenant quotas in the whole-system simulation (moved here from the real-stack e2e suite):
tenant ``quota`` gets a concurrency quota of 2 (a limits record on the tenants topic, read
by the processors without a restart) and 20 runs of 4 s due at once; tenant ``other``'s 5
runs are due in the same second in the same pool (four workers: two serve ``quota``, two
``other``; a pool's worker that serves several tenants runs only sandboxed targets, and the
simulation's handlers run in process).

``quota`` never has more than 2 runs going at once (spans from the committed ledger), its
waiting runs say why (``waiting for quota``), all 20 finish, and ``other``'s runs start on
time. Faults: the processor's commits abort, it stops and rejoins, records are
duplicated and reordered. A failing seed replays:
``pytest tests/unit/test_sim_quota.py -k 'seed-17]'``.

With two processors, each may use the share of the quota homed on the partitions it owns
(``gnomon.core.quota``), which is meant to keep the sum at the quota. This scenario found
that it does not across a rebalance: grants counted on partitions that move stay with
their new owner, over its share, while the other instance's share is free again, so for
a while the tenant holds more than its quota (3 of 2 in 10 of the first 40 seeds). Shown by
the strict xfail below until the quota is fixed (docs/tenants.md says so)."""

from __future__ import annotations

import itertools
import random

import pytest

from gnomon.core import runs as R
from gnomon.sim import SimCluster, SimFaults

SEEDS = 200
RUN_MS = 4_000
QUOTA = 2
ON_TIME_MS = 1_000

pytestmark = pytest.mark.usefixtures("quiet_logs")


def run_quota_scenario(seed: int, processors: int = 1) -> SimCluster:
    rng = random.Random(f"{seed}/quota")
    c = SimCluster(seed, processors=processors, workers=4, worker_slots=16, duration_ms=(RUN_MS, RUN_MS),
                   worker_tenants=("quota", "other"), step_ms=200,
                   faults=SimFaults(abort=0.02, rebalance=0.01, duplicate=0.05, reorder=0.05))
    c.set_limits("quota", concurrency_max=QUOTA)
    c.run_for(2_000, faults=False)  # limits read, workers advertised
    slot = c.clock.now_ms() // 1_000 * 1_000 + 8_000 + rng.randint(0, 4) * 1_000
    for i in range(20):
        c.register(f"a{i:02d}", "", tenant="quota", run_at_ms=slot, max_attempts=1)
    for i in range(5):
        c.register(f"b{i}", "", tenant="other", run_at_ms=slot, max_attempts=1)
    c.run_for(slot - c.clock.now_ms() + 20 * RUN_MS // QUOTA // 2)  # faults while the quota is busy
    c.heal(20 * RUN_MS // QUOTA + 15_000)  # the rest drains in peace
    return c


@pytest.mark.sweep
@pytest.mark.parametrize("seed", range(SEEDS), ids=lambda s: f"seed-{s}")
def test_a_tenant_at_quota_never_exceeds_it_while_another_starts_on_time(seed: int) -> None:
    c = run_quota_scenario(seed)
    why = c.describe()
    rep = c.history_report()
    assert rep.ok and rep.missed == 0 and rep.duplicates == 0, f"{rep.summary()}\n{why}"
    states = c.ledger()
    final = {s.run_id: s for s in states}
    quota = [s for s in final.values() if s.tenant == "quota"]
    assert len(quota) == 20 and all(s.status is R.RunStatus.SUCCEEDED and s.attempt == 1 for s in quota), \
        ([(s.run_id, s.status.value, s.attempt) for s in quota], why)
    assert any(s.tenant == "quota" and (s.reason or "").startswith("waiting for quota") for s in states), \
        "quota's runs never said they waited for quota"
    spans = sorted((s.started_at_ms or 0, s.finished_at_ms or 0) for s in quota)
    running = peak = 0
    for _, d in sorted(itertools.chain(((a, 1) for a, _ in spans), ((b, -1) for _, b in spans)),
                       key=lambda e: (e[0], e[1])):  # an end before a start at the same ms
        running += d
        peak = max(peak, running)
    assert 1 <= peak <= QUOTA, f"tenant quota ran {peak} at once with a quota of {QUOTA}: {spans}\n{why}"
    other = [s for s in final.values() if s.tenant == "other"]
    assert len(other) == 5 and all(s.status is R.RunStatus.SUCCEEDED for s in other), why
    lags = [(s.started_at_ms or 0) - s.slot_ms for s in other]
    assert all(0 <= lag < ON_TIME_MS for lag in lags), f"tenant other started late: {lags}\n{why}"


def _peak(c: SimCluster, tenant: str) -> int:
    spans = [(s.started_at_ms or 0, s.finished_at_ms or 0) for s in {s.run_id: s for s in c.ledger()}.values()
             if s.tenant == tenant and s.started_at_ms is not None]
    return max((sum(1 for a, b in spans if a <= t < b) for t, _ in spans), default=0)


@pytest.mark.xfail(strict=True, reason="known bug: with two processors a rebalance lets a tenant exceed its "
                                       "concurrency quota for a while (module doc)")
def test_two_processors_keep_the_quota_through_a_rebalance() -> None:
    c = run_quota_scenario(0, processors=2)
    assert _peak(c, "quota") <= QUOTA, c.describe()


def test_one_processor_uses_the_whole_quota() -> None:
    """With one processor owning every partition, the quota is used in full: 2 at once."""
    peaks = []
    for seed in range(4):
        c = SimCluster(seed, processors=1, workers=2, worker_slots=16, duration_ms=(RUN_MS, RUN_MS),
                       worker_tenants=("quota",), step_ms=200)
        c.set_limits("quota", concurrency_max=QUOTA)
        c.run_for(2_000, faults=False)
        slot = c.clock.now_ms() // 1_000 * 1_000 + 8_000
        for i in range(10):
            c.register(f"a{i}", "", tenant="quota", run_at_ms=slot, max_attempts=1)
        c.run_for(slot - c.clock.now_ms() + 10 * RUN_MS // QUOTA + 10_000, faults=False)
        final = {s.run_id: s for s in c.ledger()}
        assert len(final) == 10 and all(s.status is R.RunStatus.SUCCEEDED for s in final.values())
        peaks.append(_peak(c, "quota"))
    assert peaks == [QUOTA] * 4, peaks
