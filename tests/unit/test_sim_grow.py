"""Growing the partition count of a live system (gnomon.processor.growth, ADR 0012) in
the simulation: the real Processor and Worker loops on the in-memory log, jobs firing
every second or two, the co-partitioned topics grown from 4 to 8 (and on to 16) while
they run. The history checker must find no slot missed or doubled, and every job must
run on its new partition afterwards."""

from __future__ import annotations

import pytest

from gnomon import codec
from gnomon.adapters.kafka import partition_for
from gnomon.core import jobs as J
from gnomon.processor import growth
from gnomon.sim import TENANT, SimCluster, SimFaults

pytestmark = pytest.mark.usefixtures("quiet_logs")

JOBS = 16


def _jobs(c: SimCluster) -> None:
    for i in range(JOBS):
        c.register(f"g{i}", f"*/{1 + i % 3} * * * * *", fail_attempts=int(i % 5 == 4))


def _ran_after(c: SimCluster, since_ms: int) -> dict[str, int]:
    """job -> how many of its runs were created at or after ``since_ms``."""
    out: dict[str, int] = {}
    for state in c.ledger():
        if state.created_at_ms >= since_ms:
            out[state.job_id] = out.get(state.job_id, 0) + 1
    return out


def _moved(old: int, new: int) -> str:
    """A job of ``_jobs`` that changes partition when ``old`` partitions grow to ``new``."""
    return next(f"g{i}" for i in range(JOBS) if partition_for(f"g{i}", new) != partition_for(f"g{i}", old))


def _write_signed(c: SimCluster, cmd: J.JobCommand, partition: int, extra: tuple[tuple[str, bytes], ...] = ()) -> int:
    """``cmd`` written to ``partition`` as a producer that places it itself would; its offset."""
    key, value = cmd.job_id.encode(), codec.encode(cmd)
    return c.log.append(c.topo.job_commands, key, value, partition,
                        headers=(*c.keys.sign(cmd.tenant, c.topo.job_commands, key, value), *extra))


def _check(c: SimCluster) -> None:
    rep = c.history_report()
    why = f"{rep.summary()}\n{c.describe()}\nproblems: {rep.problems[:10]}"
    assert rep.slots > 0, why
    assert rep.missed == 0 and rep.duplicates == 0 and rep.stale_accepted == 0, why
    assert rep.ok, why


@pytest.mark.parametrize("seed", range(4), ids=lambda s: f"seed-{s}")
def test_growing_4_to_8_under_load_misses_and_doubles_nothing(seed: int) -> None:
    c = SimCluster(seed, processors=3, workers=2, partitions=4, step_ms=100)
    _jobs(c)
    c.run_for(8_000, faults=False)
    grown_at = c.clock.now_ms()
    c.grow(8)
    c.run_for(12_000, faults=False)
    c.heal(10_000)
    _check(c)
    # every job's state now lives on its partition under 8, and it ran after the grow
    latest: dict[str, int] = {}
    for rec in c.log.records(c.topo.jobs):
        if rec.key is not None and not rec.key.startswith(b"\0") and rec.value is not None:
            latest[rec.key.decode()] = rec.partition
    assert {j: partition_for(j, 8) for j in latest} == latest
    moved = [j for j in latest if partition_for(j, 8) != partition_for(j, 4)]
    assert moved, "no job changed partition: the test proves nothing"
    ran = _ran_after(c, grown_at + 3_000)
    assert all(ran.get(f"g{i}", 0) > 0 for i in range(JOBS)), ran


def test_a_grow_under_faults_twice_misses_and_doubles_nothing() -> None:
    c = SimCluster(7, processors=3, workers=3, partitions=2, step_ms=200, faults=SimFaults.mixed())
    _jobs(c)
    c.run_for(6_000)
    c.grow(4)
    c.run_for(8_000)
    c.grow(8)
    c.run_for(8_000)
    c.heal(14_000)
    _check(c)


def test_commands_after_a_grow_reach_the_jobs_new_partition() -> None:
    c = SimCluster(3, processors=2, workers=2, partitions=2, step_ms=100)
    _jobs(c)
    c.run_for(3_000, faults=False)
    c.grow(4)
    c.run_for(3_000, faults=False)
    moved = _moved(2, 4)
    c.submit(J.PauseJob(moved, TENANT, c.clock.now_ms()))
    c.run_for(3_000, faults=False)
    assert c.jobs()[moved].status is J.JobStatus.PAUSED


def test_a_stale_producers_command_is_forwarded_and_answered_where_it_was_written() -> None:
    """A producer that has not seen the new partitions writes to the job's old one: the
    old partition's processor forwards it, the new one applies it and answers under the
    position the producer knows."""
    c = SimCluster(1, processors=3, workers=2, partitions=4, step_ms=100)
    _jobs(c)
    c.run_for(4_000, faults=False)
    c.grow(8)
    c.run_for(3_000, faults=False)
    moved = _moved(4, 8)
    old = partition_for(moved, 4)
    offset = _write_signed(c, J.PauseJob(moved, TENANT, c.clock.now_ms()), old)
    c.run_for(3_000, faults=False)
    assert c.jobs()[moved].status is J.JobStatus.PAUSED
    assert sum(p.forwarded for p in c.live_processors()) >= 1
    answers = [codec.decode(r.value) for r in c.log.records(c.topo.command_results) if r.value is not None]
    mine = [a for a in answers if (a.source_partition, a.source_offset) == (old, offset)]
    assert len(mine) == 1 and mine[0].command == "PauseJob" and mine[0].code.value == "accepted", mine


def test_a_grow_marker_for_fewer_or_missing_partitions_is_poisoned_and_the_partition_goes_on() -> None:
    c = SimCluster(2, processors=2, workers=2, partitions=2, step_ms=100)
    _jobs(c)
    c.run_for(3_000, faults=False)
    c.log.append(c.topo.job_commands, growth.GROW_KEY.encode(), growth.encode_count(8), 0)  # no such partitions
    c.log.append(c.topo.job_commands, growth.GROW_KEY.encode(), b"three", 1)
    c.run_for(3_000, faults=False)
    reasons = [codec.decode(r.value).reason for r in c.log.records(c.topo.poison) if r.value is not None]
    assert any("a grow to 8 partitions, but gnomon.job-commands has 2" in r for r in reasons), reasons
    assert any("not a partition count" in r for r in reasons), reasons
    c.heal(6_000)
    _check(c)


@pytest.mark.sweep
@pytest.mark.parametrize("seed", range(40), ids=lambda s: f"seed-{s}")
def test_seeded_faults_through_a_grow(seed: int) -> None:
    c = SimCluster(seed, processors=2 + seed % 2, workers=2, partitions=2 + 2 * (seed % 2), step_ms=200,
                   faults=SimFaults.mixed(), standbys=seed % 3 != 0)
    _jobs(c)
    c.run_for(4_000 + 500 * (seed % 7))
    c.grow(c.log.partitions_of(c.topo.job_commands) * 2)
    c.run_for(10_000)
    c.heal(14_000)
    _check(c)


def test_history_and_alerts_are_whole_after_a_grow() -> None:
    """The history projector and the alerter read the grown ledger: history holds every
    committed state (the partitions records are no history), and every alert the ledger
    raises was delivered, the handed-over runs' included."""
    c = SimCluster(5, processors=2, workers=2, partitions=2, step_ms=100, history=True, alerts=True)
    c.set_alerts(late_s=1)
    for i in range(8):
        c.register(f"h{i}", f"*/{1 + i % 3} * * * * *", fail_attempts=9 if i % 4 == 3 else 0, max_attempts=2)
    c.run_for(5_000, faults=False)
    c.grow(4)
    c.run_for(8_000, faults=False)
    c.heal(8_000)
    _check(c)
    assert c.history_gaps() == []
    assert c.alert_gaps() == []


def test_a_grown_partition_reopened_from_its_checkpoint_still_places_by_the_new_count() -> None:
    """Processors stopped cleanly after a grow reopen their stores from checkpoints, whose
    changelog tail no longer holds the partitions record: the count is kept in the store,
    so a command placed by the old count is still forwarded, not refused as unknown."""
    c = SimCluster(4, processors=2, workers=2, partitions=2, step_ms=100, standbys=False)
    _jobs(c)
    c.run_for(3_000, faults=False)
    c.grow(4)
    c.run_for(4_000, faults=False)
    for slot in c.procs:
        c.stop(slot.name, down_ms=1_000)
    c.run_for(5_000, faults=False)
    moved = _moved(2, 4)
    _write_signed(c, J.PauseJob(moved, TENANT, c.clock.now_ms()), partition_for(moved, 2))
    c.run_for(3_000, faults=False)
    assert c.jobs()[moved].status is J.JobStatus.PAUSED
    c.heal(6_000)
    _check(c)


def test_a_handover_that_breaks_half_way_leaves_the_partition_as_it_was(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug in the middle of a handover (after some jobs left the store) is contained:
    the marker is poisoned, the partition keeps every job and its count, nothing runs twice
    or is missed."""
    from gnomon.processor.runtime import Processor
    from gnomon.processor.task import PartitionTask

    original = PartitionTask.set_partitions

    def breaks(self: PartitionTask, count: int) -> tuple[list[tuple[str, bytes]], list[tuple[str, bytes]]]:
        original(self, count)
        raise RuntimeError("a bug half-way through the handover")

    c = SimCluster(6, processors=2, workers=2, partitions=2, step_ms=100)
    _jobs(c)
    c.run_for(3_000, faults=False)
    monkeypatch.setattr(PartitionTask, "set_partitions", breaks)
    # (the changelogs alone grown: producers keep placing by 2, so only the handover is at stake)
    monkeypatch.setattr(Processor, "_ask_partitions", lambda self: {
        t: self.producer.partitions(t, 5.0) for t in (self.topo.jobs, self.topo.runs)})
    for p in range(2):  # markers without new partitions' consumers yet: the handover itself breaks
        c.log.add_partitions([getattr(c.topo, role) for role in ("jobs", "runs")], 4)
        c.log.append(c.topo.job_commands, growth.GROW_KEY.encode(), growth.encode_count(4), p)
    c.run_for(3_000, faults=False)
    reasons = [codec.decode(r.value).reason for r in c.log.records(c.topo.poison) if r.value is not None]
    assert sum("half-way" in r for r in reasons) == 2, reasons
    assert all(not t.grown and t.partitions == 2 for proc in c.live_processors() for t in proc.tasks.values())
    c.heal(8_000)
    _check(c)
    ran = _ran_after(c, c.clock.now_ms() - 8_000)
    assert all(ran.get(f"g{i}", 0) > 0 for i in range(JOBS)), ran


def _pick(n: int, pred: object) -> str:
    return next(f"d{i}" for i in range(10_000) if pred(f"d{i}"))  # type: ignore[operator]


def test_a_dependency_message_placed_by_the_old_count_reaches_the_moved_downstream() -> None:
    """The upstream's partition has not read its marker, the downstream's old partition
    has: the upstream's end is placed by the old count on a partition of this same
    processor that no longer owns the downstream, and must go on to its new one (not be
    refused as another job's)."""
    c = SimCluster(8, processors=1, workers=2, partitions=2, step_ms=100)
    down = _pick(0, lambda j: partition_for(j, 2) == 0 and partition_for(j, 4) == 2)
    up = _pick(0, lambda j: partition_for(j, 2) == 1 and partition_for(j, 4) == 1)
    c.register(up, "*/2 * * * * *")
    c.register(down, "", after=(up,))
    c.run_for(5_000, faults=False)
    c.log.add_partitions(c.topo.co_partitioned(), 4)
    c.log.append(c.topo.job_commands, growth.GROW_KEY.encode(), growth.encode_count(4), 0)  # the downstream's only
    since = c.clock.now_ms()
    c.run_for(8_000, faults=False)
    reasons = [codec.decode(r.value).reason for r in c.log.records(c.topo.poison) if r.value is not None]
    assert reasons == [], reasons
    ran = _ran_after(c, since + 1_000)
    assert ran.get(down, 0) >= 2, ran
    c.log.append(c.topo.job_commands, growth.GROW_KEY.encode(), growth.encode_count(4), 1)
    c.heal(6_000)
    _check(c)


def test_a_forged_origin_header_is_ignored() -> None:
    """Headers are not signed: a command whose ``gnomon-origin`` names a partition its job
    was never placed on is answered at its own position."""
    c = SimCluster(9, processors=2, workers=2, partitions=2, step_ms=100)
    _jobs(c)
    c.run_for(3_000, faults=False)
    c.grow(4)
    c.run_for(3_000, faults=False)
    job = next(f"g{i}" for i in range(JOBS) if partition_for(f"g{i}", 4) >= 2)
    wrong = 1 - partition_for(job, 2)  # not where the old count placed it
    at = _write_signed(c, J.PauseJob(job, TENANT, c.clock.now_ms()), partition_for(job, 4),
                       (growth.origin_header(wrong, 0),))
    c.run_for(3_000, faults=False)
    answers = [codec.decode(r.value) for r in c.log.records(c.topo.command_results) if r.value is not None]
    mine = [a for a in answers if a.command == "PauseJob" and a.job_id == job]
    assert [(a.source_partition, a.source_offset) for a in mine] == [(partition_for(job, 4), at)], mine
