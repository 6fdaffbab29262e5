"""Nothing a record holds stops the processor (issue 21): the real Processor on the
in-memory log. A job command the API would refuse is answered ``invalid`` naming the
field; one that reaches a bug is answered, poisoned, and its writes undone while the rest
of its batch is applied; a record that kills processes is poisoned unapplied after
``record_attempts_max`` of them, counted across restarts."""

from __future__ import annotations

import pytest

from gnomon import codec
from gnomon.core import jobs as J
from gnomon.core.messages import PoisonRecord
from gnomon.core.model import JobSpec, Schedule, Target, TargetType
from gnomon.core.replies import CommandResult, ResultCode
from gnomon.processor.task import PartitionTask
from gnomon.sim import HANDLER, TENANT, SimCluster
from gnomon.testing import partition_for

GOOD = JobSpec(name="good", schedule=Schedule(cron="*/5 * * * * *"), target=Target(TargetType.HANDLER, handler=HANDLER))


def _spec(**kw: object) -> JobSpec:
    from dataclasses import replace

    return replace(GOOD, **kw)  # type: ignore[arg-type]


def _answers(sim: SimCluster) -> dict[str, list[CommandResult]]:
    out: dict[str, list[CommandResult]] = {}
    for r in sim.log.records(sim.topo.command_results):
        res = codec.decode(r.value or b"", topic=sim.topo.command_results)
        out.setdefault(res.job_id, []).append(res)
    return out


def _poison(sim: SimCluster) -> list[PoisonRecord]:
    return [codec.decode(r.value or b"", topic=sim.topo.poison) for r in sim.log.records(sim.topo.poison)]


def _sim() -> SimCluster:
    return SimCluster(seed=21, processors=1, workers=1, partitions=2)


def test_a_batch_mixing_good_and_hostile_commands_gets_one_answer_each_and_the_good_jobs_run() -> None:
    sim = _sim()
    now = sim.clock.now_ms()
    bad = {
        "bad-cron": (J.RegisterJob("bad-cron", TENANT, _spec(schedule=Schedule(cron="61 * * * *")), now), "schedule"),
        "bad-zone": (J.RegisterJob("bad-zone", TENANT, _spec(schedule=Schedule(cron="* * * * *", tz="Mars/Olympus")),
                                   now), "timezone"),
        "bad-pool": (J.RegisterJob("bad-pool", TENANT, _spec(pool="nowhere"), now), "pool"),
        "bad-name": (J.RegisterJob("bad-name", TENANT, _spec(name=""), now), "name"),
        "bad-timeout": (J.RegisterJob("bad-timeout", TENANT, _spec(timeout_s=-5), now), "timeoutS"),
        "bad-payload": (J.RegisterJob("bad-payload", TENANT, _spec(payload_json="{nope"), now), "payload"),
        "bad-both": (J.RegisterJob("bad-both", TENANT, _spec(schedule=Schedule(cron="* * * * *", run_at_ms=now)), now),
                     "schedule"),
        "bad-past": (J.RegisterJob("bad-past", TENANT, _spec(schedule=Schedule(run_at_ms=now - 86_400_000)), now),
                     "runAt"),
        "bad-future-at": (J.RegisterJob("bad-future-at", TENANT, GOOD, now + 86_400_000), "at_ms"),
        "bad-tenant": (J.RegisterJob("bad-tenant", "*", GOOD, now), "tenant"),
        "bad@id": (J.RegisterJob("bad@id", TENANT, GOOD, now), "job_id"),
        "good-a": (J.TriggerJob("good-a", TENANT, "bad key with spaces", now), "idempotencyKey"),
    }
    sim.submit(J.RegisterJob("good-a", TENANT, GOOD, now))
    for cmd, _ in bad.values():
        sim.submit(cmd)
    sim.submit(J.RegisterJob("good-b", TENANT, GOOD, now))
    sim.run_for(20_000, faults=False)

    answers = _answers(sim)
    assert [a.code for a in answers["good-b"]] == [ResultCode.ACCEPTED]
    assert [a.code for a in answers["good-a"]] == [ResultCode.ACCEPTED, ResultCode.INVALID]
    assert answers["good-a"][1].field == "idempotencyKey"
    for job_id, (_, field) in bad.items():
        if job_id == "good-a":
            continue
        (ans,) = answers[job_id]
        assert (ans.code, ans.field) == (ResultCode.INVALID, field), ans
        assert ans.reason
    jobs = sim.jobs()
    assert set(jobs) == {"good-a", "good-b"}
    ran = {s.job_id for s in sim.ledger() if s.status.value == "succeeded"}
    assert ran == {"good-a", "good-b"}
    report = sim.history_report(never_due=[job_id for job_id in bad if job_id != "good-a"])  # (refused)
    assert report.ok and report.jobs["good-a"].runs and report.jobs["good-b"].runs, report.verdict()


def test_a_command_that_breaks_the_processor_is_answered_poisoned_and_undone(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pause is written to the store, then a bug raises: the write is taken back, the
    producer is told, the operators get the record on the poison topic, the next command
    in the same batch is applied, and the job keeps its schedule."""
    original = PartitionTask._job_changed

    def broken(self: PartitionTask, job_id: str, job: J.JobState | None, now_ms: int) -> list:  # type: ignore[type-arg]
        if job_id == "boom" and job is not None and job.status is J.JobStatus.PAUSED:
            raise KeyError("a bug a value reached")
        return original(self, job_id, job, now_ms)

    monkeypatch.setattr(PartitionTask, "_job_changed", broken)
    sim = _sim()
    sim.submit(J.RegisterJob("boom", TENANT, GOOD, sim.clock.now_ms()))
    sim.run_for(2_000, faults=False)
    task_of = lambda: sim.processor("p0").tasks[partition_for("boom", 2)]  # noqa: E731
    before = task_of().job("boom")
    assert before is not None and before.status is J.JobStatus.ACTIVE
    now = sim.clock.now_ms()
    sim.submit(J.PauseJob("boom", TENANT, now))
    sim.submit(J.RegisterJob("after", TENANT, GOOD, now))
    sim.run_for(15_000, faults=False)

    answers = _answers(sim)
    assert [a.code for a in answers["boom"]] == [ResultCode.ACCEPTED, ResultCode.REFUSED]
    assert "could not apply PauseJob" in (answers["boom"][1].reason or "")
    assert [a.code for a in answers["after"]] == [ResultCode.ACCEPTED]
    (poison,) = _poison(sim)
    assert poison.source_topic == sim.topo.job_commands and "KeyError" in poison.reason
    assert codec.decode(poison.value or b"") == J.PauseJob("boom", TENANT, now)  # kept whole, to replay
    task = task_of()
    assert task.job("boom") == sim.jobs()["boom"]
    assert sim.jobs()["boom"].status is J.JobStatus.ACTIVE and task.stats.rolled_back == 1
    slots = sorted(s.slot_ms for s in sim.ledger() if s.job_id == "boom" and s.status.value == "succeeded")
    assert slots and slots[-1] > now, "the job kept running after the broken pause"
    assert sim.history_report().ok, sim.history_report()


class Death(BaseException):
    """What containment cannot catch: the process dies in the record."""


def test_a_record_that_kills_processes_is_poisoned_after_its_attempts(monkeypatch: pytest.MonkeyPatch) -> None:
    original = PartitionTask.apply_record
    deaths = []

    def deadly(self: PartitionTask, cmd: object, now_ms: int, topic: str, offset: int,  # type: ignore[no-untyped-def]
               signed=None, origin=None) -> list:  # type: ignore[type-arg]
        if getattr(cmd, "job_id", None) == "killer":
            deaths.append(offset)
            raise Death()
        return original(self, cmd, now_ms, topic, offset, signed, origin)

    monkeypatch.setattr(PartitionTask, "apply_record", deadly)
    sim = _sim()
    sim.submit(J.RegisterJob("good", TENANT, GOOD, sim.clock.now_ms()))
    sim.run_for(1_000, faults=False)
    sim.submit(J.RegisterJob("killer", TENANT, GOOD, sim.clock.now_ms()))
    for _ in range(3):  # each process dies in it; the next one (same disk) reads it again
        with pytest.raises(Death):
            sim.run_for(8_000, faults=False)  # (the dead member's session lapses first)
        sim.kill("p0", drop_state=False, down_ms=0)
    sim.run_for(10_000, faults=False)

    assert len(deaths) == 3 and len(set(deaths)) == 1
    (poison,) = _poison(sim)
    assert "stopped 3 times while applying it" in poison.reason and poison.offset == deaths[0]
    assert "killer" not in sim.jobs() and "good" in sim.jobs()
    sim.submit(J.RegisterJob("later", TENANT, GOOD, sim.clock.now_ms()))
    sim.run_for(5_000, faults=False)
    assert [a.code for a in _answers(sim)["later"]] == [ResultCode.ACCEPTED]
    report = sim.history_report(never_due=["killer"])  # (poisoned: never applied)
    assert report.ok and report.jobs["good"].runs, report.verdict()


def test_a_clean_restart_and_an_abort_do_not_count_as_deaths() -> None:
    sim = _sim()
    sim.submit(J.RegisterJob("good", TENANT, GOOD, sim.clock.now_ms()))
    for _ in range(5):
        sim.run_for(500, faults=False)
        sim.fail_next_commit("p0")
        sim.run_for(500, faults=False)
        sim.stop("p0", down_ms=0)
    sim.run_for(5_000, faults=False)
    assert _poison(sim) == [] and "good" in sim.jobs()


def test_a_job_whose_tick_breaks_is_poisoned_once_and_the_others_keep_running(
        monkeypatch: pytest.MonkeyPatch) -> None:
    original = J.decide_tick

    def broken(state: J.JobState, now_ms: int, cfg: J.SchedulerConfig | None = None,
               present_since_ms: int | None = None, *, triggers: bool = True,
               calendars: tuple[object, ...] = ()) -> list[J.JobEvent]:
        if state.job_id == "sick":
            raise ZeroDivisionError("a schedule no code expected")
        return original(state, now_ms, cfg, present_since_ms, triggers=triggers, calendars=calendars)

    monkeypatch.setattr(J, "decide_tick", broken)
    sim = _sim()
    now = sim.clock.now_ms()
    sim.submit(J.RegisterJob("sick", TENANT, GOOD, now))
    sim.submit(J.RegisterJob("well", TENANT, GOOD, now))
    sim.run_for(20_000, faults=False)
    (poison,) = _poison(sim)
    assert poison.key == b"sick" and "ZeroDivisionError" in poison.reason and poison.source_topic == sim.topo.jobs
    assert any(s.job_id == "well" and s.status.value == "succeeded" for s in sim.ledger())
    task = sim.processor("p0").tasks[partition_for("sick", 2)]
    assert task.stats.tick_failures > 10  # tried every tick, poisoned once


def test_deaths_after_a_record_was_applied_are_not_counted_against_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Review finding: the marker named the last record begun until the next one, so
    processes killed in their commit (or a tick) three times blamed a healthy record."""
    from gnomon.processor.runtime import Processor

    original = Processor._commit
    kills = []

    def dying(self: Processor, outputs: object, offsets: dict) -> None:  # type: ignore[type-arg]
        if len(kills) < 3 and any(t == self.topo.job_commands for t, _ in offsets):
            kills.append(dict(offsets))
            raise Death()
        original(self, outputs, offsets)  # type: ignore[arg-type]

    monkeypatch.setattr(Processor, "_commit", dying)
    sim = _sim()
    sim.submit(J.RegisterJob("healthy", TENANT, GOOD, sim.clock.now_ms()))
    for _ in range(3):
        with pytest.raises(Death):
            sim.run_for(8_000, faults=False)
        sim.kill("p0", drop_state=False, down_ms=0)
    sim.run_for(10_000, faults=False)
    assert len(kills) == 3 and _poison(sim) == []
    assert [a.code for a in _answers(sim)["healthy"]] == [ResultCode.ACCEPTED] and "healthy" in sim.jobs()
