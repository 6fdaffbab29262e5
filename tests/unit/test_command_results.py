"""Every job command read from the job-commands topic is answered on the command-results
topic, on the command's own partition number, naming it by its offset: accepted with
the job's version, or refused with the code, field and reason (nothing else written)."""

from __future__ import annotations

from gnomon.core import jobs as J
from gnomon.core.model import JobSpec, Schedule, Target, TargetType, slot_run_id
from gnomon.core.replies import CommandResult, ResultCode
from gnomon.core.tenants import TenantBook, TenantLimits
from gnomon.processor.output import Output
from gnomon.processor.task import PartitionTask
from gnomon.testing import InMemoryCluster, partition_for

SPEC = JobSpec(name="x", schedule=Schedule(cron="0 * * * *"), target=Target(TargetType.COMMAND, argv=("true",)))


def _task(c: InMemoryCluster, job_id: str) -> tuple[PartitionTask, int]:
    p = partition_for(job_id, c.partitions)
    return c.tasks[p], p


def _results(out: list[Output], c: InMemoryCluster) -> list[tuple[CommandResult, int | None]]:
    return [(o.value, o.partition) for o in out if o.topic == c.topo.command_results]


def test_an_accepted_command_is_answered_with_the_version_on_its_partition() -> None:
    c = InMemoryCluster(partitions=4)
    task, p = _task(c, "j")
    now = c.clock.now_ms()
    out = task.handle_command(J.RegisterJob("j", "acme", SPEC, now), now, p, 41)
    (res, part), = _results(out, c)
    assert part == p and res.code is ResultCode.ACCEPTED and res.job_version == 1
    assert (res.job_id, res.tenant, res.command, res.source_partition, res.source_offset) == (
        "j", "acme", "RegisterJob", p, 41)
    assert any(o.topic == c.topo.jobs for o in out)  # the command itself was applied
    out = task.handle_command(J.PatchJob("j", "acme", J.canonical_patch({"priority": "high"}), 1, now), now, p, 42)
    (res, _), = _results(out, c)
    assert res.accepted and res.job_version == 2


def test_refusals_are_answered_and_change_nothing() -> None:
    book = TenantBook()
    book.apply("acme", TenantLimits("acme", interval_min_s=3600))
    c = InMemoryCluster(partitions=4, tenants=book)
    task, p = _task(c, "j")
    k = next(f"k{i}" for i in range(1000) if partition_for(f"k{i}", 4) == p)  # a job of the same partition
    now = c.clock.now_ms()
    task.handle_command(J.RegisterJob("j", "acme", SPEC, now), now, p, 1)
    before = task.job("j")
    cases = [
        (J.PatchJob("j", "acme", J.canonical_patch({"priority": "low"}), 7, now), ResultCode.CONFLICT, None),
        (J.PauseJob("j", "other", now), ResultCode.REFUSED, None),
        (J.PauseJob("missing", "acme", now), ResultCode.REFUSED, None),
        (J.RegisterJob(k, "acme", JobSpec(name="y", schedule=Schedule(cron="* * * * *"), target=SPEC.target), now),
         ResultCode.LIMIT, "interval_min_s"),
    ]
    for offset, (cmd, code, limit) in enumerate(cases, start=2):
        out = task.handle_command(cmd, now, p, offset)
        (res, part), = _results(out, c)
        assert out == [o for o in out if o.topic == c.topo.command_results], f"{cmd} wrote more than its answer"
        assert (res.code, res.limit, res.source_offset, part) == (code, limit, offset, p), res
        assert res.reason
    assert task.job("j") == before and task.job(k) is None
    assert task.stats.commands_refused == 4


def test_a_backfill_refused_part_way_writes_nothing() -> None:
    """Review finding: a backfill whose later slot is refused (the skipped run of a
    deleted job, the id registered again: by its own tenant, since an id is its tenant's
    for ever) wrote the runs of its earlier slots to the store, with no changelog record,
    before the refusal."""
    from gnomon.core.runs import RunStatus

    c = InMemoryCluster(partitions=4)
    minute = Schedule(cron="* * * * *")
    every_minute = JobSpec(name="m", schedule=minute, target=SPEC.target)
    c.submit(J.RegisterJob("j", "acme", every_minute, c.clock.now_ms()))
    c.drain()
    c.submit(J.PauseJob("j", "acme", c.clock.now_ms()))
    c.drain()
    c.run_for(5 * 60_000, step_ms=1_000)
    c.submit(J.ResumeJob("j", "acme", c.clock.now_ms()))
    c.drain()
    skipped = [r for r in c.runs_of("j") if r.status is RunStatus.SKIPPED]
    assert skipped, "the paused minutes were recorded skipped"
    last = max(skipped, key=lambda r: r.slot_ms)
    assert last.skipped_from_ms is not None and last.skipped_from_ms < last.slot_ms  # a range record
    c.submit(J.DeleteJob("j", "acme", c.clock.now_ms()))
    c.drain()
    c.submit(J.RegisterJob("j", "other", every_minute, c.clock.now_ms()))  # refused: acme's id
    c.submit(J.RegisterJob("j", "acme", every_minute, c.clock.now_ms()))
    c.drain()
    assert [j.tenant for j in (c.job_state("j"),) if j is not None] == ["acme"]
    task, p = _task(c, "j")
    earlier = last.skipped_from_ms  # a slot of the range with no record of its own
    before = {r.run_id for r in c.runs_of("j")}
    now = c.clock.now_ms()
    out = task.handle_command(J.BackfillJob("j", "acme", (earlier, last.slot_ms), now), now, p, 99)
    (res, _), = _results(out, c)
    # refused before any slot is decided: the earlier slots are before the new job existed
    # (issue 24: a backfill is bounded by the job's creation)
    assert res.code is ResultCode.INVALID and "before the job existed" in (res.reason or ""), res
    assert {r.run_id for r in c.runs_of("j")} == before
    assert task.run(slot_run_id("j", earlier)) is None  # nothing written for the earlier slot


def test_run_commands_on_the_job_commands_topic_are_refused() -> None:
    """Review finding: services now produce to job-commands (gnomon.events); a manual
    RunTriggered there would create a run without admission."""
    c = InMemoryCluster(partitions=4)
    task, p = _task(c, "j")
    now = c.clock.now_ms()
    task.handle_command(J.RegisterJob("j", "acme", SPEC, now), now, p, 1)
    forged = J.RunTriggered("j@manual:x", "j", "acme", SPEC, now, now, True, now)
    out = task.handle_command(forged, now, p, 2)
    (res, _), = _results(out, c)
    assert res.code is ResultCode.REFUSED and "job commands" in (res.reason or "")
    assert task.run("j@manual:x") is None


def test_a_failing_state_store_is_not_answered_as_a_refusal() -> None:
    """RocksDB failing is not the command's fault: no "refused" answer (the producer would
    give up on a valid command), no poison record; the error stops the processor, whose
    restart applies the command from the last commit."""
    import pytest

    from gnomon.core.errors import StateStoreError

    c = InMemoryCluster(partitions=4)
    task, p = _task(c, "j")

    class Broken:
        def __getattr__(self, name: str) -> object:
            def fail(*_a: object, **_k: object) -> None:
                raise StateStoreError("RocksDB get failed: IO error")
            return fail

    task.kv = Broken()  # type: ignore[assignment]
    now = c.clock.now_ms()
    with pytest.raises(StateStoreError):
        task.handle_command(J.RegisterJob("j", "acme", SPEC, now), now, p, 1)
