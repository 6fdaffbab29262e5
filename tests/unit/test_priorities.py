"""Weighted priorities: the mix under contention, no starvation, work conservation, and
the processor's queue of waiting runs served in that mix."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gnomon.core import jobs as J
from gnomon.core import runs as R
from gnomon.core.model import JobSpec, Priority, RetryPolicy, Schedule, Target, TargetType
from gnomon.core.priorities import WeightedPicker, parse_weights
from gnomon.testing import FakeWorkerPolicy, InMemoryCluster

weights_st = st.tuples(*(st.integers(1, 100),) * 3)


@given(weights_st, st.integers(1, 50))
def test_the_mix_follows_the_weights_within_one_pick_per_tier(weights: tuple[int, int, int], rounds: int) -> None:
    picker = WeightedPicker(weights)
    total = sum(weights)
    picks = Counter(picker.pick({0, 1, 2}) for _ in range(total * rounds))
    for tier in range(3):
        assert picks[tier] == weights[tier] * rounds  # exact over whole rounds


@given(weights_st)
def test_no_tier_with_a_backlog_starves(weights: tuple[int, int, int]) -> None:
    picker = WeightedPicker(weights)
    seen: dict[int, int] = {}
    for i in range(sum(weights) * 3):
        seen[picker.pick({0, 1, 2})] = i
        if i >= sum(weights):
            assert all(i - last <= sum(weights) for last in seen.values()), seen


@settings(max_examples=50)
@given(weights_st, st.lists(st.sets(st.integers(0, 2), min_size=1), min_size=1, max_size=200))
def test_only_available_tiers_are_picked(weights: tuple[int, int, int], availability: list[set[int]]) -> None:
    picker = WeightedPicker(weights)
    for available in availability:
        assert picker.pick(available) in available


@pytest.mark.parametrize(("text", "ok"), [("70,20,10", True), ("1,1,1", True), ("70,20", False),
                                          ("70,0,10", False), ("a,b,c", False), ("70,20,1001", False)])
def test_parse_weights(text: str, ok: bool) -> None:
    if ok:
        assert sum(parse_weights(text)) > 0
    else:
        with pytest.raises(ValueError):
            parse_weights(text)


def test_a_backlog_starts_in_the_weighted_mix_while_every_tier_waits() -> None:
    """600 one-time runs due at once, 200 per tier, over 8 partitions; 10 worker slots in
    all, runs of 1 s:
    the first 200 starts (every tier still has a backlog then) are 70/20/10 within 5
    points. Strict priority would start 200 high runs first."""
    cfg = R.RunConfig(priority_weights=(70, 20, 10))
    c = InMemoryCluster(partitions=8, workers=2, worker_slots=5, run_cfg=cfg,
                        policy=FakeWorkerPolicy(duration_ms=(1_000, 1_000)))
    slot = c.clock.now_ms() + 40_000
    cmd = Target(TargetType.COMMAND, argv=("true",))
    for i in range(600):
        prio = (Priority.HIGH, Priority.NORMAL, Priority.LOW)[i % 3]
        spec = JobSpec(name=f"j{i}", schedule=Schedule(run_at_ms=slot), target=cmd, priority=prio,
                       retry=RetryPolicy(max_attempts=1))
        c.submit(J.RegisterJob(f"job{i:04d}", "t", spec, c.clock.now_ms()))
    c.run_for(120_000)
    prio_of = {f"job{i:04d}": ("high", "normal", "low")[i % 3] for i in range(600)}
    started = sorted(c.started, key=lambda s: s[1])
    assert len(started) >= 200
    first = Counter(prio_of[run_id.partition("@")[0]] for run_id, _, _ in started[:200])
    assert first["high"] < 200 and first["normal"] < 200 and first["low"] < 200  # every tier still waits
    assert abs(first["high"] / 200 - 0.70) <= 0.05, first
    assert abs(first["normal"] / 200 - 0.20) <= 0.05, first
    assert abs(first["low"] / 200 - 0.10) <= 0.05, first


def test_cli_refuses_bad_weights_with_exit_2() -> None:
    from typer.testing import CliRunner

    from gnomon.cli.main import app

    result = CliRunner().invoke(app, ["processor", "--priority-weights", "70,0,10"])
    assert result.exit_code == 2 and "--priority-weights" in result.output


def test_runs_no_worker_serves_take_no_picks_from_their_tier() -> None:
    """Ahead of the backlog in every tier wait 300 runs of a tenant no worker serves. The
    mix still holds, every run of the served tenant starts, and theirs none. (Before:
    each pick of a tier that landed on them was lost, so normal started far under its
    share and runs behind them never started.)"""
    cfg = R.RunConfig(priority_weights=(70, 20, 10))
    c = InMemoryCluster(partitions=8, workers=2, worker_slots=5, run_cfg=cfg, worker_tenants=("t",),
                          policy=FakeWorkerPolicy(duration_ms=(1_000, 1_000)))
    slot = c.clock.now_ms() + 40_000
    cmd = Target(TargetType.COMMAND, argv=("true",))
    tiers = (Priority.HIGH, Priority.NORMAL, Priority.LOW)
    for i in range(300):
        spec = JobSpec(name=f"u{i}", schedule=Schedule(run_at_ms=slot - 1_000), target=cmd, priority=tiers[i % 3],
                       retry=RetryPolicy(max_attempts=1))
        c.submit(J.RegisterJob(f"unserved{i:04d}", "nobody", spec, c.clock.now_ms()))
    for i in range(600):
        spec = JobSpec(name=f"j{i}", schedule=Schedule(run_at_ms=slot), target=cmd, priority=tiers[i % 3],
                       retry=RetryPolicy(max_attempts=1))
        c.submit(J.RegisterJob(f"job{i:04d}", "t", spec, c.clock.now_ms()))
    c.run_for(150_000)
    prio_of = {f"job{i:04d}": ("high", "normal", "low")[i % 3] for i in range(600)}
    started = sorted(c.started, key=lambda s: s[1])
    assert not [run_id for run_id, _, _ in started if run_id.startswith("unserved")]
    assert len(started) == 600, f"{600 - len(started)} runs of the served tenant never started"
    first = Counter(prio_of[run_id.partition("@")[0]] for run_id, _, _ in started[:200])
    for tier, weight in (("high", 0.70), ("normal", 0.20), ("low", 0.10)):
        assert abs(first[tier] / 200 - weight) <= 0.05, first
