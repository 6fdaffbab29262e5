"""Every job command read from the job-commands topic is answered on the command-results
topic, on the command's own partition number, naming it by its offset: accepted with
the job's version, or refused with the code, field and reason (nothing else written)."""

from __future__ import annotations

from gnomon.core import jobs as J
from gnomon.core.model import JobSpec, Schedule, Target, TargetType
from gnomon.core.replies import CommandResult, ResultCode
from gnomon.core.tenants import TenantBook, TenantLimits
from gnomon.streams.task import Output, PartitionTask
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
    now = c.clock.now_ms()
    task.handle_command(J.RegisterJob("j", "acme", SPEC, now), now, p, 1)
    before = task.job("j")
    cases = [
        (J.PatchJob("j", "acme", J.canonical_patch({"priority": "low"}), 7, now), ResultCode.CONFLICT, None),
        (J.PauseJob("j", "other", now), ResultCode.REFUSED, None),
        (J.PauseJob("missing", "acme", now), ResultCode.REFUSED, None),
        (J.RegisterJob("k", "acme", JobSpec(name="y", schedule=Schedule(cron="* * * * *"), target=SPEC.target), now),
         ResultCode.LIMIT, "interval_min_s"),
    ]
    for offset, (cmd, code, limit) in enumerate(cases, start=2):
        out = task.handle_command(cmd, now, p, offset)
        (res, part), = _results(out, c)
        assert out == [o for o in out if o.topic == c.topo.command_results], f"{cmd} wrote more than its answer"
        assert (res.code, res.limit, res.source_offset, part) == (code, limit, offset, p), res
        assert res.reason
    assert task.job("j") == before and task.job("k") is None
    assert task.stats.commands_refused == 4
