"""Issue 50, finding 4 (its wording half): over Kafka a refusal said "belongs to another
tenant" for another tenant's job and "does not exist" for an unknown one, so a team's
producer could probe which ids exist. Every command about another tenant's job or run is
now answered in the words an unknown one gets (REST already answered both with the same
404). The processor's real deciders answer (``DecidingProducer``), as they answer a
producer on the job-commands topic."""

from __future__ import annotations

from typing import Any

from gnomon import codec
from gnomon.core import jobs as J
from gnomon.core import runs as R
from gnomon.core.model import JobSpec, Schedule, Target, TargetType
from gnomon.core.replies import CommandResult
from gnomon.testing import DecidingProducer
from gnomon.topology import load_topology

SPEC = JobSpec(name="n", schedule=Schedule(cron="0 * * * *"), target=Target(TargetType.HANDLER, handler="h"))
TOPO = load_topology()


def _send(producer: DecidingProducer, cmd: Any) -> CommandResult:
    at = producer.send(TOPO.job_commands, cmd.job_id if hasattr(cmd, "job_id") else cmd.run_id.partition("@")[0],
                       codec.encode(cmd, TOPO.job_commands))
    assert at is not None
    return producer.results[at]


def _commands(job_id: str, run_id: str, tenant: str, now: int) -> list[Any]:
    return [J.PauseJob(job_id, tenant, now), J.ResumeJob(job_id, tenant, now), J.DeleteJob(job_id, tenant, now),
            J.TriggerJob(job_id, tenant, "k", now), J.PatchJob(job_id, tenant, '{"name": "x"}', None, now),
            J.UpdateJob(job_id, tenant, SPEC, now), J.BackfillJob(job_id, tenant, (now - 3_600_000,), now),
            R.CancelRun(run_id, tenant, now), R.ReplayRun(run_id, tenant, now)]


def test_another_tenants_job_and_an_unknown_one_get_the_same_answer() -> None:
    producer = DecidingProducer()
    now = producer.clock.now_ms()
    theirs = "team-nightly"
    assert _send(producer, J.RegisterJob(theirs, "acme", SPEC, now)).accepted
    run = f"{theirs}@manual:a"
    assert _send(producer, J.TriggerJob(theirs, "acme", "a", now)).accepted
    missing = "no-such-job"
    for mine, none in zip(_commands(theirs, run, "other", now), _commands(missing, f"{missing}@manual:a", "other", now),
                          strict=True):
        a, b = _send(producer, mine), _send(producer, none)
        said = (a.code, a.field, (a.reason or "").replace(theirs, "<id>"))
        assert said == (b.code, b.field, (b.reason or "").replace(missing, "<id>")), (type(mine).__name__, a, b)
        assert not a.accepted and "acme" not in (a.reason or "") and "tenant" not in (a.reason or ""), a
    job = producer.job(theirs)
    assert job is not None and job.status is J.JobStatus.ACTIVE and job.spec == SPEC  # nothing of acme's moved
