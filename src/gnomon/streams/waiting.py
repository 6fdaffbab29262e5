"""Who gets the next free worker slot when runs wait for room: across all the
partitions a processor owns, punctual before catch-up, the priority tiers in their
weights' proportions (``core.priorities``), and the partitions of a tier in turn.

Each partition keeps its own queue of READY runs (the ``rw/`` index, by tier and due
time); a processor owning eight partitions must not serve them one after the other (the
first partition would drain all of its high, then normal, then low runs before the
second got a slot, and the mix over the pool would be flat). So one weighted pick per
free slot chooses the tier over all partitions' queues, then the next partition (in
rotation) that has a run of that tier waiting.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from gnomon.core.priorities import WeightedPicker

if TYPE_CHECKING:
    from gnomon.streams.task import Output, PartitionTask

LANES = (b"0", b"1")  # punctual, then catch-up


def assign_waiting(tasks: Sequence[PartitionTask], now_ms: int, pickers: dict[str, WeightedPicker]) -> list[Output]:
    """Grant waiting runs of every pool while it has room; bounded per pool by the
    partitions' ``assign_misses_per_tick_max`` (runs tried without room)."""
    out: list[Output] = []
    if not tasks or tasks[0].directory is None:
        return out
    directory = tasks[0].directory
    weights = tasks[0].run_cfg.priority_weights
    misses_max = max(t.assign_misses_per_tick_max for t in tasks)
    for pool in directory.pools():
        if not directory.has_room(pool, now_ms):
            continue
        picker = pickers.setdefault(pool, WeightedPicker(weights))
        misses = 0
        for lane in LANES:
            cursors = [t.waiting_cursor(pool, lane) for t in tasks]
            turn = {tier: 0 for tier in range(len(weights))}
            while misses < misses_max:
                available = set().union(*(c.tiers for c in cursors))
                if not available:
                    break
                tier = picker.pick(available)
                having = [c for c in cursors if tier in c.tiers]
                cursor = having[turn[tier] % len(having)]
                turn[tier] += 1
                if not cursor.step(tier, now_ms, out):
                    misses += 1  # that run's start second is full (or no worker serves its tenant)
    return out
