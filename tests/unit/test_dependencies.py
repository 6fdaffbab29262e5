"""Dependencies, the pure core (core.dependencies; docs/adr/0011 decision 4); the wiring
is tested in test_dependencies_sim.py. Property tests
over random DAGs (no accepted edge set ever holds a cycle; limits hold) and random
upstream outcomes (a downstream slot is released only when every upstream's covering end
satisfies it, is skipped with a reason naming the upstream run otherwise, and never waits
past its bound)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gnomon.core import schedule as S
from gnomon.core.dependencies import (
    DAG_DEPTH_MAX,
    On,
    Outcome,
    Release,
    Skip,
    Upstream,
    UpstreamEnded,
    Wait,
    check_dag,
    decide_waiting,
    reopens,
)
from gnomon.core.errors import ValidationError
from gnomon.core.model import Schedule

H = 3_600_000


def end(up: str, first: int, nxt: int | None, outcome: Outcome, at: int = 0, last: int | None = None) -> UpstreamEnded:
    return UpstreamEnded("d", up, f"{up}@{first}", first, first if last is None else last, nxt, outcome, at)


def test_the_logical_time_is_the_latest_upstream_slot_at_or_before_the_downstream_slot() -> None:
    # extract hourly, load daily at 02:30: the 02:00 extract (next 03:00) covers it
    e = end("extract", 2 * H, 3 * H, Outcome.SUCCEEDED)
    assert e.covers(2 * H + H // 2) and not e.covers(2 * H - 1) and not e.covers(3 * H)
    ups = (Upstream("extract"),)
    assert decide_waiting(2 * H + H // 2, ups, {"extract": [e]}, now_ms=0) == Release()
    assert decide_waiting(3 * H + H // 2, ups, {"extract": [e]}, now_ms=3 * H + H // 2) == \
        Wait(("extract",), 3 * H + H // 2 + 86_400_000)


def test_failed_skipped_and_deleted_upstreams_skip_with_the_reason_unless_finished_is_enough() -> None:
    failed = end("u", 0, H, Outcome.FAILED, at=1)
    assert decide_waiting(0, (Upstream("u"),), {"u": [failed]}, 0) == Skip("upstream u@0 failed")
    assert decide_waiting(0, (Upstream("u", On.FINISHED),), {"u": [failed]}, 0) == Release()
    # a replay that succeeds is newer: it releases (and a run skipped for the failure reopens)
    replayed = end("u", 0, H, Outcome.SUCCEEDED, at=2)
    assert decide_waiting(0, (Upstream("u"),), {"u": [failed, replayed]}, 0) == Release()
    assert reopens("upstream u@0 failed") and not reopens("upstream job u was deleted") and not reopens("paused")
    skipped_range = end("u", 0, 5 * H, Outcome.SKIPPED, last=4 * H)
    assert decide_waiting(4 * H + 1, (Upstream("u"),), {"u": [skipped_range]}, 0) == Skip("upstream u@0 skipped")
    gone = end("u", 0, None, Outcome.DELETED)
    assert decide_waiting(100 * H, (Upstream("u", On.FINISHED),), {"u": [gone]}, 0) == \
        Skip("upstream job u was deleted")


def test_fan_in_waits_for_all_and_the_wait_has_a_bound() -> None:
    ups = (Upstream("a"), Upstream("b"))
    a = end("a", 0, H, Outcome.SUCCEEDED)
    assert decide_waiting(10, ups, {"a": [a]}, now_ms=10, wait_max_s=60) == Wait(("b",), 60_010)
    assert decide_waiting(10, ups, {"a": [a]}, now_ms=60_010, wait_max_s=60) == \
        Skip("waited 60 s (waitMaxS) for upstream b")
    assert decide_waiting(10, ups, {"a": [a], "b": [end("b", 0, None, Outcome.SUCCEEDED)]}, 60_010) == Release()


def test_the_dag_refuses_cycles_naming_them_and_keeps_its_limits() -> None:
    edges = {"load": ["transform"], "transform": ["extract"]}
    with pytest.raises(ValidationError) as err:
        check_dag("extract", [Upstream("load")], edges)
    assert err.value.field == "after[0].job" and "extract -> load -> transform -> extract" in err.value.message
    with pytest.raises(ValidationError, match="itself"):
        check_dag("x", [Upstream("x")], {})
    with pytest.raises(ValidationError, match="twice"):
        check_dag("x", [Upstream("a"), Upstream("a", On.FINISHED)], {})
    with pytest.raises(ValidationError) as err:
        check_dag("x", [Upstream(f"u{i}") for i in range(11)], {})
    assert err.value.field == "after"
    chain = {f"j{i}": [f"j{i - 1}"] for i in range(1, DAG_DEPTH_MAX + 1)}
    with pytest.raises(ValidationError, match="chain"):
        check_dag("top", [Upstream(f"j{DAG_DEPTH_MAX}")], chain)
    check_dag("top", [Upstream(f"j{DAG_DEPTH_MAX - 1}")], chain)
    fan = {f"d{i}": ["hub"] for i in range(100)}
    with pytest.raises(ValidationError, match="downstream"):
        check_dag("d100", [Upstream("hub")], fan)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 12), st.integers(0, 12)), max_size=60))
def test_no_sequence_of_accepted_edges_holds_a_cycle(pairs: list[tuple[int, int]]) -> None:
    edges: dict[str, list[str]] = {}
    for down, up in pairs:
        job, wanted = f"j{down}", sorted({*edges.get(f"j{down}", []), f"j{up}"})
        try:
            check_dag(job, [Upstream(u) for u in wanted], edges)
        except ValidationError:
            continue
        edges[job] = wanted
    # a topological order exists: repeatedly remove jobs with no remaining upstreams
    left = {k: set(v) for k, v in edges.items()}
    nodes = set(left) | {u for v in left.values() for u in v}
    while nodes:
        free = {n for n in nodes if not (left.get(n, set()) & nodes)}
        assert free, f"cycle among {sorted(nodes)}"
        nodes -= free


@settings(max_examples=200, deadline=None)
@given(up_every_s=st.integers(1, 50), down_every_s=st.integers(1, 50), anchor_s=st.integers(0, 30),
       outcomes=st.lists(st.sampled_from(list(Outcome)[:4]), min_size=1, max_size=40),
       on=st.sampled_from(list(On)), arrive_late=st.lists(st.booleans(), min_size=1, max_size=40))
def test_a_downstream_slot_is_released_only_by_its_covering_upstream_end(
        up_every_s: int, down_every_s: int, anchor_s: int, outcomes: list[Outcome], on: On,
        arrive_late: list[bool]) -> None:
    up = Schedule(every_s=up_every_s, anchor_ms=anchor_s * 1000)
    down = Schedule(every_s=down_every_s)
    up_slots = S.next_n(up, -1, len(outcomes) + 1)
    ends = [UpstreamEnded("d", "u", f"u@{s}", s, s, up_slots[i + 1], outcomes[i], at_ms=s + 500)
            for i, s in enumerate(up_slots[:-1])]
    horizon = up_slots[-1]
    for slot in S.next_n(down, -1, 200):
        if slot >= horizon:
            break
        # what the downstream partition has received by now: ends arrive in order, some later
        received = [e for i, e in enumerate(ends) if not arrive_late[i % len(arrive_late)]]
        verdict = decide_waiting(slot, (Upstream("u", on),), {"u": received}, now_ms=slot, wait_max_s=3600)
        covering = [e for e in ends if e.covers(slot)]
        assert len(covering) <= 1  # the upstream's slots partition time: one end covers a slot
        mine = [e for e in received if e.covers(slot)]
        if isinstance(verdict, Release):
            assert mine and (on is On.FINISHED or mine[0].outcome is Outcome.SUCCEEDED)
        elif isinstance(verdict, Skip):
            assert mine and on is On.SUCCEEDED and mine[0].outcome is not Outcome.SUCCEEDED
            assert mine[0].upstream_run in verdict.reason
        else:
            assert isinstance(verdict, Wait) and not mine and verdict.until_ms == slot + 3_600_000
            # past its bound it never waits
            late = decide_waiting(slot, (Upstream("u", on),), {"u": received}, now_ms=verdict.until_ms,
                                  wait_max_s=3600)
            assert isinstance(late, Skip) and "waitMaxS" in late.reason
