"""Warm standbys (gnomon.streams.standby) against an in-memory changelog: a copy is built
in bulk, then tails per key; a promoted copy plus the tail from its positions equals a
full rebuild of the same changelog."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from gnomon import codec
from gnomon.adapters.kv import MemoryKV
from gnomon.core import jobs as J
from gnomon.core.model import JobSpec, Schedule, Target, TargetType
from gnomon.streams.standby import StandbySet
from gnomon.streams.task import Output, PartitionTask
from gnomon.testing import InMemoryCluster
from gnomon.topology import load_topology

JOBS, RUNS = "gnomon.jobs", "gnomon.runs"


@dataclass
class _Msg:
    _topic: str
    _partition: int
    _offset: int
    _key: bytes
    _value: bytes | None

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes:
        return self._key

    def value(self) -> bytes | None:
        return self._value


@dataclass
class FakeLog:
    """Changelog partitions in memory, and a consumer over them (assign/consume/position)."""

    records: dict[tuple[str, int], list[_Msg]] = field(default_factory=dict)
    pos: dict[tuple[str, int], int] = field(default_factory=dict)

    def append(self, o: Output) -> None:
        assert o.partition is not None
        tp = (o.topic, o.partition)
        part = self.records.setdefault(tp, [])
        raw = None if o.value is None else (o.encoded or codec.encode(o.value, o.topic))
        part.append(_Msg(o.topic, o.partition, len(part), o.key.encode(), raw))

    def assign(self, tps: list[TopicPartition]) -> None:
        self.pos = {(tp.topic, tp.partition): max(tp.offset, 0) for tp in tps}

    def consume(self, n: int, timeout: float) -> list[_Msg]:
        out: list[_Msg] = []
        for tp, at in self.pos.items():
            part = self.records.get(tp, [])
            take = part[at:at + n - len(out)]
            out.extend(take)
            self.pos[tp] = at + len(take)
        return out

    def position(self, tps: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, self.pos.get((tp.topic, tp.partition), 0)) for tp in tps]

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float) -> tuple[int, int]:
        return 0, len(self.records.get((tp.topic, tp.partition), []))

    def close(self) -> None:
        pass


def _state(task: PartitionTask) -> dict[bytes, bytes]:
    return dict(task.kv.scan(b"", b"\xff", 10_000_000))


def _rebuild(log: FakeLog, topo: Any, p: int) -> PartitionTask:
    task = PartitionTask(p, MemoryKV(), topo)
    latest: dict[str, dict[str, bytes | None]] = {JOBS: {}, RUNS: {}}
    for t in (JOBS, RUNS):
        for m in log.records.get((t, p), []):
            latest[t][m.key().decode()] = m.value()
    task.bulk_load(latest[JOBS], latest[RUNS])
    return task


def _tail(task: PartitionTask, log: FakeLog, positions: dict[str, int]) -> None:
    for t, apply in ((JOBS, task.restore_job), (RUNS, task.restore_run)):
        last = {m.key().decode(): m.value() for m in log.records.get((t, task.partition), [])[positions[t]:]}
        for k, v in last.items():
            apply(k, v)


@pytest.mark.parametrize("applies_per_poll", [100_000, 7])
def test_a_promoted_standby_plus_its_tail_equals_a_full_rebuild(applies_per_poll: int) -> None:
    """Whether the copy keeps up (its buffer empties) or lags (its positions stay at its
    oldest unapplied change), promotion plus the tail from its positions is exact."""
    topo = load_topology()
    cluster = InMemoryCluster(partitions=topo.partitions, seed=3)
    log = FakeLog()
    cluster.hooks.append(lambda o: log.append(o) if o.topic in (JOBS, RUNS) else None)
    spec = JobSpec(name="s", schedule=Schedule(cron="*/2 * * * * *"), target=Target(TargetType.COMMAND, argv=("true",)))
    for i in range(40):
        cluster.submit(J.RegisterJob(f"job{i}", "t", spec, cluster.clock.now_ms()))
    cluster.run_for(20_000)
    p = max(range(topo.partitions), key=lambda q: len(log.records.get((RUNS, q), [])))

    standby = StandbySet("unused", (JOBS, RUNS), lambda q: (PartitionTask(q, MemoryKV(), topo), None),
                         applies_per_poll_max=applies_per_poll, consumer=log)  # type: ignore[arg-type]
    standby.track({p})
    assert standby.lag() == {p: -1}  # building
    standby.poll()
    assert standby.lag() == {p: 0} and standby.positions()[p] == {JOBS: len(log.records.get((JOBS, p), [])),
                                                                   RUNS: len(log.records[(RUNS, p)])}
    for _ in range(5):  # the owner goes on writing; the copy tails it
        cluster.run_for(4_000)
        standby.poll()
    if applies_per_poll < 100:
        assert standby.lag()[p] > 0 and standby.positions()[p][RUNS] < log.pos[(RUNS, p)]
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
    standby = StandbySet("unused", (JOBS, RUNS), lambda q: (PartitionTask(q, MemoryKV(), topo), None),
                         consumer=log)  # type: ignore[arg-type]
    standby.track({0})
    assert standby.promote(0) is None  # a full rebuild is as fast


def test_an_adopted_store_stays_warm_from_its_positions() -> None:
    topo = load_topology()
    log = FakeLog()
    task = PartitionTask(1, MemoryKV(), topo)
    standby = StandbySet("unused", (JOBS, RUNS), lambda q: (PartitionTask(q, MemoryKV(), topo), None),
                         consumer=log)  # type: ignore[arg-type]
    standby.adopt(1, task, {JOBS: 5, RUNS: 7})
    assert standby.positions() == {1: {JOBS: 5, RUNS: 7}}
    promoted = standby.promote(1)
    assert promoted is not None and promoted[0] is task and promoted[1] == {JOBS: 5, RUNS: 7}
