"""A tick reads the due index, not every job: its work counts what is due."""

from __future__ import annotations

from gnomon.adapters.kv import MemoryKV
from gnomon.core import jobs as J
from gnomon.core.model import JobSpec, Schedule, Target, TargetType
from gnomon.processor.task import PartitionTask
from gnomon.topology import load_topology

T0 = 1_803_859_200_000  # 2027-03-01T00:00:00Z
CMD = Target(TargetType.COMMAND, argv=("true",))


def test_tick_examines_only_due_jobs_among_many_idle() -> None:
    task = PartitionTask(0, MemoryKV(), load_topology(), J.SchedulerConfig(lookahead_ms=0))
    idle = JobSpec(name="idle", schedule=Schedule(cron="0 0 1 1 *"), target=CMD)
    due = JobSpec(name="due", schedule=Schedule(cron="*/10 * * * * *"), target=CMD)
    for i in range(10_000):
        task.handle(J.RegisterJob(f"idle-{i}", "t", idle, T0))
    for i in range(3):
        task.handle(J.RegisterJob(f"due-{i}", "t", due, T0))
    out = task.tick(T0 + 10_000)  # slots T0 and T0+10s of the 3 due jobs
    assert task.stats.tick_jobs_examined == 3
    assert task.stats.triggers == 6
    # triggers are applied to the co-partitioned run state directly: runs on the ledger,
    # nothing round-trips through gnomon.run-events
    assert {o.value.job_id for o in out if o.topic == "gnomon.runs"} == {"due-0", "due-1", "due-2"}
    assert not [o for o in out if o.topic == "gnomon.run-events"]
    task.tick(T0 + 15_000)  # nothing due: nothing examined
    assert task.stats.tick_jobs_examined == 3
