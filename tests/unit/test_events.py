"""gnomon.events: job commands produced straight to Kafka by a team's service. Validated
locally with the API's rules (nothing is sent on a bad field), encoded as the processor
reads them, keyed by job id, delivery errors surfaced on flush."""

from __future__ import annotations

from typing import Any

import pytest

from gnomon import codec
from gnomon.core import jobs as J
from gnomon.core.clock import FakeClock
from gnomon.core.errors import EventLogError, ValidationError
from gnomon.core.model import idempotent_job_id
from gnomon.events import JobEvents
from gnomon.topology import load_topology

JOB = {"name": "nightly close", "schedule": "0 2 * * *", "timezone": "Europe/Paris",
       "target": {"type": "handler", "name": "close"}}


class FakeProducer:
    """Records what is produced; ``fail`` makes the broker refuse deliveries; ``full``
    makes the local queue refuse that many produce calls first."""

    def __init__(self, fail: bool = False, full: int = 0) -> None:
        self.records: list[tuple[str, bytes, bytes]] = []
        self.pending: list[Any] = []
        self.fail, self.full, self.polls = fail, full, 0

    def produce(self, topic: str, *, key: bytes, value: bytes, on_delivery: Any) -> None:
        if self.full:
            self.full -= 1
            raise BufferError("queue full")
        self.records.append((topic, key, value))
        self.pending.append(on_delivery)

    def poll(self, timeout: float) -> int:
        self.polls += 1
        return 0

    def flush(self, timeout: float) -> int:
        for cb in self.pending:
            cb("Broker: not authorized" if self.fail else None, None)
        self.pending.clear()
        return 0


def events(producer: FakeProducer | None = None) -> tuple[JobEvents, FakeProducer]:
    p = producer or FakeProducer()
    return JobEvents("acme", producer=p, clock=FakeClock(1_764_547_200_000)), p


def test_commands_are_encoded_as_the_processor_reads_them_and_keyed_by_job() -> None:
    ev, p = events()
    topo = load_topology()
    job_id = ev.register(JOB, idempotency_key="billing-close")
    ev.patch(job_id, {"priority": "high"}, expected_version=1)
    ev.pause(job_id)
    ev.resume(job_id)
    run_id = ev.trigger(job_id, "deploy-42")
    ev.delete(job_id)
    done = ev.flush()
    assert done.sent == done.acknowledged == 6 and done.failed == 0
    assert job_id == idempotent_job_id("acme", "billing-close")  # as POST /v1/jobs with Idempotency-Key
    assert run_id == f"{job_id}@manual:deploy-42"
    assert {t for t, _, _ in p.records} == {topo.job_commands}
    assert {k for _, k, _ in p.records} == {job_id.encode()}  # one partition per job: ordered
    cmds = [codec.decode(v, topo.job_commands) for _, _, v in p.records]
    assert [type(c) for c in cmds] == [J.RegisterJob, J.PatchJob, J.PauseJob, J.ResumeJob, J.TriggerJob,
                                       J.DeleteJob]
    assert all(c.tenant == "acme" for c in cmds)
    reg = cmds[0]
    assert isinstance(reg, J.RegisterJob) and reg.spec.schedule.cron == "0 2 * * *"
    assert reg.spec.schedule.tz == "Europe/Paris"
    patch = cmds[1]
    assert isinstance(patch, J.PatchJob) and patch.expected_version == 1


@pytest.mark.parametrize(("call", "field"), [
    (lambda ev: ev.register({**JOB, "schedule": "61 * * * *"}), "schedule"),
    (lambda ev: ev.register({**JOB, "priority": "urgent"}), "priority"),
    (lambda ev: ev.register({**JOB, "colour": "red"}), "colour"),
    (lambda ev: ev.register(JOB, job_id="a@b"), "job_id"),
    (lambda ev: ev.register(JOB, job_id="j", idempotency_key="k"), "job_id"),
    (lambda ev: ev.patch("j", {}), "patch"),
    (lambda ev: ev.patch("j", {"timeoutS": -1}), "timeoutS"),
    (lambda ev: ev.patch("j", {"priority": "high"}, expected_version=0), "expected_version"),
    (lambda ev: ev.trigger("j", ""), "idempotencyKey"),
    (lambda ev: ev.pause(""), "job_id"),
])
def test_bad_input_names_the_field_and_sends_nothing(call: Any, field: str) -> None:
    ev, p = events()
    with pytest.raises(ValidationError) as exc:
        call(ev)
    assert exc.value.field == field
    assert p.records == []


def test_a_tenant_is_required() -> None:
    with pytest.raises(ValidationError) as exc:
        JobEvents(" ", producer=FakeProducer())
    assert exc.value.field == "tenant"


def test_refused_deliveries_fail_the_flush_with_the_reason() -> None:
    ev, _ = events(FakeProducer(fail=True))
    ev.register(JOB)
    ev.register(JOB)
    with pytest.raises(EventLogError, match=r"2 of 2 job commands not written: .*not authorized"):
        ev.flush()
    assert ev.deliveries.sent == 0  # counted afresh after a flush


def test_a_full_local_queue_waits_instead_of_dropping() -> None:
    ev, p = events(FakeProducer(full=3))
    ev.register(JOB)
    assert len(p.records) == 1 and p.polls >= 3
    assert ev.flush().acknowledged == 1


def test_the_context_manager_flushes() -> None:
    p = FakeProducer()
    with JobEvents("acme", producer=p) as ev:
        ev.register(JOB)
        assert p.pending
    assert not p.pending
