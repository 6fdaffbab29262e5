"""Warm standbys (gnomon.processor.standby) against an in-memory changelog: a copy is built
in bulk, then tails per key; a promoted copy plus the tail from its positions equals a
full rebuild of the same changelog."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from gnomon import codec
from gnomon.adapters.kv import MemoryKV
from gnomon.core import jobs as J
from gnomon.core.clock import FakeClock
from gnomon.core.model import JobSpec, Schedule, Target, TargetType
from gnomon.eventlog.port import TP, Record
from gnomon.processor.output import Output
from gnomon.processor.standby import StandbySet
from gnomon.processor.task import PartitionTask
from gnomon.testing import InMemoryCluster
from gnomon.topology import load_topology

JOBS, RUNS = "gnomon.jobs", "gnomon.runs"


@dataclass
class FakeLog:
    """Changelog partitions in memory, and a reader over them (assign/consume/position)."""

    clock: FakeClock = field(default_factory=FakeClock)
    records: dict[tuple[str, int], list[Record]] = field(default_factory=dict)
    pos: dict[tuple[str, int], int] = field(default_factory=dict)
    paused: set[tuple[str, int]] = field(default_factory=set)

    def append(self, o: Output) -> None:
        assert o.partition is not None
        tp = (o.topic, o.partition)
        part = self.records.setdefault(tp, [])
        raw = None if o.value is None else (o.encoded or codec.encode(o.value, o.topic))
        part.append(Record(o.topic, o.partition, len(part), o.key.encode(), raw, self.clock.now_ms()))

    def assign(self, tps: list[tuple[str, int, int]]) -> None:
        self.pos = {(t, p): max(o, 0) for t, p, o in tps}

    def consume(self, n: int, timeout: float) -> list[Record]:
        out: list[Record] = []
        for tp, at in self.pos.items():
            if tp in self.paused:
                continue
            part = self.records.get(tp, [])
            take = part[at:at + n - len(out)]
            out.extend(take)
            self.pos[tp] = at + len(take)
        return out

    def position(self, tps: list[TP]) -> dict[TP, int]:
        return {tp: self.pos.get(tp, 0) for tp in tps}

    def watermarks(self, tp: TP, timeout: float = 0, *, cached: bool = False) -> tuple[int, int]:
        return 0, len(self.records.get(tp, []))

    def pause(self, tps: list[TP]) -> None:
        self.paused |= set(tps)

    def resume(self, tps: list[TP]) -> None:
        self.paused -= set(tps)

    def close(self) -> None:
        pass


def _state(task: PartitionTask) -> dict[bytes, bytes]:
    return dict(task.kv.scan(b"", b"\xff", 10_000_000))


def _rebuild(log: FakeLog, topo: Any, p: int) -> PartitionTask:
    task = PartitionTask(p, MemoryKV(), topo)
    latest: dict[str, dict[str, bytes | None]] = {JOBS: {}, RUNS: {}}
    for t in (JOBS, RUNS):
        for m in log.records.get((t, p), []):
            latest[t][(m.key or b"").decode()] = m.value
    task.bulk_load(latest[JOBS], latest[RUNS])
    return task


def _tail(task: PartitionTask, log: FakeLog, positions: dict[str, int]) -> None:
    for t, apply in ((JOBS, task.restore_job), (RUNS, task.restore_run)):
        last = {(m.key or b"").decode(): m.value for m in log.records.get((t, task.partition), [])[positions[t]:]}
        for k, v in last.items():
            apply(k, v)


@pytest.mark.parametrize("applies_per_poll", [100_000, 7])
def test_a_promoted_standby_plus_its_tail_equals_a_full_rebuild(applies_per_poll: int) -> None:
    """Whether the copy keeps up (its buffer empties) or lags (its positions stay at its
    oldest unapplied change), promotion plus the tail from its positions is exact."""
    topo = load_topology()
    cluster = InMemoryCluster(partitions=topo.partitions, seed=3)
    log = FakeLog(clock=cluster.clock)
    cluster.hooks.append(lambda o: log.append(o) if o.topic in (JOBS, RUNS) else None)
    spec = JobSpec(name="s", schedule=Schedule(cron="*/2 * * * * *"), target=Target(TargetType.COMMAND, argv=("true",)))
    for i in range(40):
        cluster.submit(J.RegisterJob(f"job{i}", "t", spec, cluster.clock.now_ms()))
    cluster.run_for(20_000)
    p = max(range(topo.partitions), key=lambda q: len(log.records.get((RUNS, q), [])))

    standby = StandbySet(None, (JOBS, RUNS), lambda q: (PartitionTask(q, MemoryKV(), topo), None, None), log.clock,
                         applies_per_poll_max=applies_per_poll, reader=log)  # type: ignore[arg-type]
    standby.track({p})
    assert standby.lag() == {p: -1}  # building
    standby.poll()
    assert standby.lag() == {p: 0} and standby.checkpoints()[p][0] == {JOBS: len(log.records.get((JOBS, p), [])),
                                                                   RUNS: len(log.records[(RUNS, p)])}
    for _ in range(5):  # the owner goes on writing; the copy tails it
        cluster.run_for(4_000)
        standby.poll()
    if applies_per_poll < 100:
        assert standby.lag()[p] > 0 and standby.checkpoints()[p][0][RUNS] < log.pos[(RUNS, p)]
    cluster.run_for(3_000)  # written after the copy's last read: the promotion's tail
    promoted = standby.promote(p)
    assert promoted is not None and standby.copies == {}
    task, positions = promoted
    assert positions[RUNS] < len(log.records[(RUNS, p)])
    _tail(task, log, positions)
    assert _state(task) == _state(_rebuild(log, topo, p))


def test_a_copy_still_building_is_not_promoted() -> None:
    topo = load_topology()
    log = FakeLog()
    log.records[(RUNS, 0)] = []
    standby = StandbySet(None, (JOBS, RUNS), lambda q: (PartitionTask(q, MemoryKV(), topo), None, None), log.clock,
                         reader=log)  # type: ignore[arg-type]
    standby.track({0})
    assert standby.promote(0) is None  # a full rebuild is as fast


def test_an_adopted_store_stays_warm_from_its_positions() -> None:
    topo = load_topology()
    log = FakeLog()
    task = PartitionTask(1, MemoryKV(), topo)
    standby = StandbySet(None, (JOBS, RUNS), lambda q: (PartitionTask(q, MemoryKV(), topo), None, None), log.clock,
                         reader=log)  # type: ignore[arg-type]
    standby.adopt(1, task, {JOBS: 5, RUNS: 7})
    assert standby.checkpoints() == {1: ({JOBS: 5, RUNS: 7}, log.clock.now_ms())}
    promoted = standby.promote(1)
    assert promoted is not None and promoted[0] is task and promoted[1] == {JOBS: 5, RUNS: 7}


def test_a_copy_behind_by_more_than_its_max_age_is_not_promoted() -> None:
    """Tombstones after its positions may have been cleaned away: a full rebuild instead."""
    topo = load_topology()
    log = FakeLog()
    standby = StandbySet(None, (JOBS, RUNS), lambda q: (PartitionTask(q, MemoryKV(), topo), None, None), log.clock,
                         max_age_ms=60_000, reader=log)  # type: ignore[arg-type]
    standby.adopt(1, PartitionTask(1, MemoryKV(), topo), {JOBS: 0, RUNS: 0})
    log.clock.advance(30_000)
    assert standby.checkpoints()[1][1] == log.clock.now_ms() - 30_000
    standby.poll()  # nothing to read: it is current now
    log.clock.advance(50_000)
    assert standby.promote(1) is not None
    standby.adopt(1, PartitionTask(1, MemoryKV(), topo), {JOBS: 0, RUNS: 0})
    log.records[(RUNS, 1)] = []
    standby._consumer.pause([(RUNS, 1)])  # stalled: it cannot read (a saturated owner)
    log.append(Output(RUNS, "r1", None, 1))
    log.clock.advance(61_000)
    standby.poll()
    assert standby.promote(1) is None


def test_a_full_buffer_pauses_only_its_own_copy_and_never_a_build() -> None:
    topo = load_topology()
    log = FakeLog()
    for i in range(30):
        log.append(Output(RUNS, f"gone{i}", None, 0))  # partition 0: a changelog to build from
        log.append(Output(RUNS, f"also-gone{i}", None, 1))
    standby = StandbySet(None, (JOBS, RUNS), lambda q: (PartitionTask(q, MemoryKV(), topo), None, None), log.clock,
                         pending_max=10, applies_per_poll_max=1, reader=log)  # type: ignore[arg-type]
    standby.adopt(1, PartitionTask(1, MemoryKV(), topo), {JOBS: 0, RUNS: 0})  # warm, 30 records behind
    standby.track({0, 1})
    for _ in range(5):
        standby.poll()
    assert standby.lag()[0] >= 0  # the build of partition 0 finished despite its 30 buffered records
    assert (RUNS, 1) in log.paused and 0 < standby.lag()[1] <= 30


class _NoPositionLog(FakeLog):
    """As librdkafka: no position (-1) for a partition nothing was fetched from."""

    def position(self, tps: list[TP]) -> dict[TP, int]:
        return {tp: (self.pos.get(tp, 0) if self.records.get(tp) else -1) for tp in tps}


def test_the_copy_of_an_empty_partition_is_promoted() -> None:
    """Seen in a CI log: 'standby for partition 0 is 1796682380 s behind; not used' for a
    partition with nothing in its changelogs (its copy claimed time 0)."""
    topo = load_topology()
    log = _NoPositionLog()
    standby = StandbySet(None, (JOBS, RUNS), lambda q: (PartitionTask(q, MemoryKV(), topo), None, None), log.clock,
                         max_age_ms=60_000, reader=log)  # type: ignore[arg-type]
    standby.track({0})
    for _ in range(3):
        standby.poll()
    assert standby.copies[0].warm
    log.clock.advance(5_000)
    promoted = standby.promote(0)
    assert promoted is not None and promoted[1] == {JOBS: 0, RUNS: 0}
