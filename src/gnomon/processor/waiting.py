"""Who gets the next free worker slot when runs wait for room: across all the
partitions a processor owns, punctual before catch-up, the priority tiers in their
weights' proportions (``core.priorities``), and within a tier the run that has waited
longest, whichever partition holds it.

Each partition keeps its own queue of READY runs (the ``rw/`` index, by tier and due
time); a processor owning eight partitions must not serve them one after the other (the
first partition would drain all of its high, then normal, then low runs before the
second got a slot, and the mix over the pool would be flat). So one weighted pick per
free slot chooses the tier over all partitions' queues, then the partition whose run of
that tier is due first. (Taking the partitions in turn, one run each, left the
partitions holding more jobs behind without bound when room was short: measured with
1,000 per-second jobs, 2026-12-04.) While runs are left waiting, a run released in the
meantime queues behind them (``WorkerDirectory.queued_pools``) instead of taking the
room first.

A pick goes to a run that can be placed. A tier's pick that lands on a run with no room
(its start second is full, or no live worker of the pool serving its tenant has a slot)
moves on to the tier's next run, rather than losing the tier its share. Runs of a
tenant found without room *now* while the pool has room (no worker serves that tenant,
or its workers are full) are passed over for the rest of the tick without counting as
misses: otherwise a few hundred runs of a tenant nobody serves, at the head of a
partition's queue, would take every pick of their tier there, each tick, and the runs
behind them would never start (measured: 122 normal runs left waiting with 100 free
slots, and normal 5 points under its share, tests/e2e/test_0_priority_mix.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from gnomon.core.priorities import WeightedPicker
from gnomon.core.runs import RunConfig, RunState
from gnomon.core.workers import WorkerDirectory
from gnomon.processor.output import Output

LANES = (b"0", b"1")  # punctual, then catch-up


class Cursor(Protocol):
    """One partition's READY runs of a pool and lane, per tier (``task.WaitingCursor``)."""

    @property
    def tiers(self) -> set[int]: ...

    def head(self, tier: int) -> RunState | None: ...

    def head_key(self, tier: int) -> bytes: ...

    def step(self, tier: int, now_ms: int, out: list[Output]) -> str: ...


class Queues(Protocol):
    """What this module reads of a partition's task (``task.PartitionTask``): a protocol,
    so the task and the assignment across partitions do not import each other."""

    @property
    def directory(self) -> WorkerDirectory: ...

    @property
    def run_cfg(self) -> RunConfig: ...

    @property
    def assign_misses_per_tick_max(self) -> int: ...

    def waiting_cursor(self, pool: str, lane: bytes) -> Cursor: ...


def assign_waiting(tasks: Sequence[Queues], now_ms: int, pickers: dict[str, WeightedPicker]) -> list[Output]:
    """Grant waiting runs of every pool while it has room; bounded per pool by the
    partitions' ``assign_misses_per_tick_max`` (runs tried without room, not counting
    those of a tenant already found without room now; the partitions' scans bound those)."""
    out: list[Output] = []
    if not tasks:
        return out
    directory = tasks[0].directory
    weights = tasks[0].run_cfg.priority_weights
    misses_max = max(t.assign_misses_per_tick_max for t in tasks)
    now_s = now_ms // 1000
    for pool in directory.pools():
        if not directory.has_room(pool, now_ms):
            continue
        picker = pickers.setdefault(pool, WeightedPicker(weights))
        misses = 0
        no_room_now: set[str] = set()  # tenants whose runs found no room at now_s (this tick)
        left = False
        for lane in LANES:
            cursors = [t.waiting_cursor(pool, lane) for t in tasks]
            while misses < misses_max:
                available = set().union(*(c.tiers for c in cursors))
                if not available:
                    break
                tier = picker.pick(available)
                while misses < misses_max:  # the tier's pick goes to its next run that can be placed
                    having = [c for c in cursors if tier in c.tiers]
                    if not having:
                        break  # none left this tick: the next pick is among the others
                    # the run of this tier that has waited longest, across partitions
                    # (ties: the first in ``tasks``, whose order the processor turns)
                    cursor = min(having, key=lambda c: c.head_key(tier))
                    run = cursor.head(tier)
                    due_now = run is not None and max(now_ms, run.not_before_ms) // 1000 == now_s
                    result = cursor.step(tier, now_ms, out)
                    if result == "granted":
                        break
                    if result in ("quota", "stale"):
                        continue  # its tenant is at quota (bounded by the partition), or gone: no pick spent
                    if run is not None and due_now and run.tenant in no_room_now:
                        continue  # as expected: passed over, not a miss
                    misses += 1  # its start second is full, or no worker with room serves its tenant
                    if run is not None and due_now and directory.has_room(pool, now_ms):
                        no_room_now.add(run.tenant)  # the pool has room, not for this tenant
            left = left or any(c.tiers for c in cursors)
        if left:
            directory.queued_pools.add(pool)
        else:
            directory.queued_pools.discard(pool)
    return out
