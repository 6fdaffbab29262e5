"""gnomon.events: job commands produced straight to Kafka by a team's service. Validated
locally with the API's rules (nothing is sent on a bad field), encoded as the processor
reads them, keyed by job id, delivery errors surfaced on flush."""

from __future__ import annotations

from typing import Any

import pytest

from gnomon import codec
from gnomon.core import jobs as J
from gnomon.core.clock import FakeClock
from gnomon.core.errors import EventLogError, LimitExceeded, ValidationError
from gnomon.core.model import idempotent_job_id
from gnomon.core.replies import ResultCode, result_for
from gnomon.events import JobEvents
from gnomon.testing import FakeMessage, partition_for
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
        for i, cb in enumerate(self.pending):
            topic, key, _ = self.records[len(self.records) - len(self.pending) + i]
            offset = sum(1 for _, k, _ in self.records[: len(self.records) - len(self.pending) + i]
                         if partition_for(k.decode(), 8) == partition_for(key.decode(), 8))
            cb("Broker: not authorized" if self.fail else None,
               FakeMessage(topic, partition_for(key.decode(), 8), offset, key, None))
        self.pending.clear()
        return 0


class FakeResults:
    """The command-results topic as a consumer sees it: ``answer`` plays the processor."""

    def __init__(self) -> None:
        self.queue: list[FakeMessage] = []
        self.assigned: list[Any] = []
        self.closed = False

    def get_watermark_offsets(self, partition: Any, timeout: float) -> tuple[int, int]:
        return 0, 100

    def assign(self, partitions: list[Any]) -> None:
        self.assigned = partitions

    def consume(self, num_messages: int, timeout: float) -> list[FakeMessage]:
        out, self.queue = self.queue[:num_messages], self.queue[num_messages:]
        return out

    def close(self) -> None:
        self.closed = True

    def answer(self, producer: FakeProducer, index: int, error: Exception | None = None) -> None:
        topic, key, value = producer.records[index]
        cmd = codec.decode(value, topic)
        p = partition_for(key.decode(), 8)
        offset = sum(1 for _, k, _ in producer.records[:index] if partition_for(k.decode(), 8) == p)
        res = result_for(cmd, p, offset, 5, error=error, job_version=None if error else 1)
        self.queue.append(FakeMessage("results", p, len(self.queue), key, codec.encode(res)))


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


def test_results_come_back_in_the_order_sent_matched_by_partition_and_offset() -> None:
    p, r = FakeProducer(), FakeResults()
    ev = JobEvents("acme", producer=p, replies=True, results_consumer=r, clock=FakeClock(1_000))
    assert {tp.offset for tp in r.assigned} == {100} and len(r.assigned) == load_topology().partitions
    ids = [ev.register(JOB, job_id=f"j{i}") for i in range(5)]
    p.flush(1)  # delivered, so the fake processor can answer (out of order, one refused)
    for i in (3, 0, 4, 1):
        r.answer(p, i)
    r.answer(p, 2, LimitExceeded("jobs_max", "1 of 1 jobs registered", field=None))
    results = ev.results(timeout_s=5)
    assert [x.job_id for x in results] == ids
    assert [x.code for x in results] == [ResultCode.ACCEPTED] * 2 + [ResultCode.LIMIT] + [ResultCode.ACCEPTED] * 2
    assert results[2].limit == "jobs_max" and not results[2].accepted
    ev.close()
    assert r.closed


def test_missing_results_time_out_naming_how_many() -> None:
    p, r = FakeProducer(), FakeResults()
    ev = JobEvents("acme", producer=p, replies=True, results_consumer=r)
    ev.register(JOB)
    ev.register(JOB)
    p.flush(1)
    r.answer(p, 0)
    with pytest.raises(EventLogError, match="1 of 2 command results did not arrive"):
        ev.results(timeout_s=0.3)


def test_results_need_replies() -> None:
    ev, _ = events()
    with pytest.raises(ValidationError) as exc:
        ev.results()
    assert exc.value.field == "replies"


def test_after_a_timeout_the_next_call_keeps_waiting_for_the_same_answers() -> None:
    p, r = FakeProducer(), FakeResults()
    ev = JobEvents("acme", producer=p, replies=True, results_consumer=r)
    ids = [ev.register(JOB, job_id=f"j{i}") for i in range(3)]
    p.flush(1)
    r.answer(p, 1)
    with pytest.raises(EventLogError, match="2 of 3 command results"):
        ev.results(timeout_s=0.2)
    r.answer(p, 2)
    r.answer(p, 0)
    assert [x.job_id for x in ev.results(timeout_s=5)] == ids  # the one found before the timeout too
    assert ev.results(timeout_s=0.1) == []  # nothing left to wait for


def test_a_command_kafka_refused_does_not_break_later_results() -> None:
    p, r = FakeProducer(fail=True), FakeResults()
    ev = JobEvents("acme", producer=p, replies=True, results_consumer=r)
    ev.register(JOB, job_id="lost")
    with pytest.raises(EventLogError, match="not written"):
        ev.results(timeout_s=1)
    p.fail = False
    kept = ev.register(JOB, job_id="kept")
    p.flush(1)
    r.answer(p, 1)
    assert [x.job_id for x in ev.results(timeout_s=5)] == [kept]
