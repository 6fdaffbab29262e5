"""200 seeded fault scenarios: the real Processor and Worker loops (gnomon.sim) on the
in-memory event log, every fault of ``SimFaults.mixed()`` and records late on their way
(``late_records``, a processor stalling after such a commit) drawn from the seed, then a
quiet period; the history checker must find no slot missed or doubled, no grant
overlapping another and no stale report accepted. A failing seed replays exactly:
``pytest tests/unit/test_sim_scenarios.py -k 'seed-17'`` (the message names the seed
and the faults injected)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from gnomon.core import jobs as J
from gnomon.sim import TENANT, SimCluster, SimFaults

FAULT_MS = 16_000
SETTLE_MS = 14_000


def _three_jobs(c: SimCluster) -> None:
    c.register("a", "*/2 * * * * *")
    c.register("b", "*/3 * * * * *", fail_attempts=1)
    c.register("c", "*/5 * * * * *")


def _busy(c: SimCluster) -> None:
    for i in range(4):
        c.register(f"j{i}", f"*/{2 + i % 3} * * * * *", fail_attempts=i % 3 == 2)


def _commands_under_faults(c: SimCluster) -> None:
    """Pause, resume, a manual trigger and a job deleted while faults happen."""
    c.register("p", "*/2 * * * * *")
    c.register("d", "*/3 * * * * *")
    c.register("m", "*/4 * * * * *")
    now = c.clock.now_ms()
    c.at(now + 4_000, lambda: c.submit(J.PauseJob("p", TENANT, c.clock.now_ms())))
    c.at(now + 6_000, lambda: c.submit(J.TriggerJob("m", TENANT, "k1", c.clock.now_ms())))
    c.at(now + 9_000, lambda: c.submit(J.ResumeJob("p", TENANT, c.clock.now_ms())))
    c.at(now + 11_000, lambda: c.submit(J.DeleteJob("d", TENANT, c.clock.now_ms())))


def _exhausted_and_full(c: SimCluster) -> None:
    """Runs that exhaust their retries (dead letters) on a small, busy worker pool."""
    c.register("x", "*/2 * * * * *", fail_attempts=9, max_attempts=2)
    c.register("y", "*/2 * * * * *")
    c.register("z", "*/3 * * * * *")


MIXES: list[tuple[str, Callable[[SimCluster], None], dict[str, int]]] = [
    ("three-jobs", _three_jobs, {}),
    ("three-processors", _busy, {"processors": 3, "workers": 3}),
    ("commands", _commands_under_faults, {}),
    ("exhausted-small-pool", _exhausted_and_full, {"workers": 1, "worker_slots": 2}),
]


pytestmark = pytest.mark.usefixtures("quiet_logs")


def run_scenario(seed: int) -> tuple[SimCluster, str]:
    name, setup, kw = MIXES[seed % len(MIXES)]
    c = SimCluster(seed, faults=replace(SimFaults.mixed(), late_records=0.01), standbys=seed % 3 != 0, step_ms=200, **kw)
    setup(c)
    c.run_for(FAULT_MS)
    c.heal(SETTLE_MS)
    return c, name


@pytest.mark.sweep
@pytest.mark.parametrize("seed", range(200), ids=lambda s: f"seed-{s}")
def test_seeded_faults_lose_nothing_and_double_nothing(seed: int) -> None:
    c, mix = run_scenario(seed)
    rep = c.history_report()
    why = f"mix={mix} {rep.summary()}\n{c.describe()}\nproblems: {rep.problems[:10]}"
    assert rep.slots > 0, why
    assert rep.missed == 0 and rep.duplicates == 0 and rep.stale_accepted == 0, why
    assert rep.ok, why
