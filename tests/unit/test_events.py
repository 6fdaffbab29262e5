"""gnomon.events: job commands produced straight to Kafka by a team's service. Validated
locally with the API's rules (nothing is sent on a bad field), encoded as the processor
reads them, keyed by job id, delivery errors surfaced on flush."""

from __future__ import annotations

import random
from typing import Any

import pytest

from gnomon import codec
from gnomon.core import jobs as J
from gnomon.core.clock import FakeClock
from gnomon.core.command_auth import CommandKey, MemoryKeyring, verify
from gnomon.core.errors import EventLogError, LimitExceeded, ValidationError
from gnomon.core.model import idempotent_job_id
from gnomon.core.replies import ResultCode, result_for
from gnomon.credentials import CredentialError
from gnomon.eventlog.memory import MemoryEventLog, PlainFaults
from gnomon.eventlog.port import Record
from gnomon.events import JobEvents
from gnomon.topology import load_topology

JOB = {"name": "nightly close", "schedule": "0 2 * * *", "timezone": "Europe/Paris",
       "target": {"type": "handler", "name": "close"}}


ACME_KEY = CommandKey("acme.test", "acme", b"k" * 32)


class Broker:
    """The in-memory event log (``gnomon.eventlog.memory``) as JobEvents sees Kafka, and a
    stand-in for the processor: ``answer(i)`` writes the answer to the i-th command sent
    on the command-results topic, matched by the command's partition and offset."""

    def __init__(self) -> None:
        self.topo = load_topology()
        self.log = MemoryEventLog(FakeClock(1_000), partitions=self.topo.partitions)
        self.records: list[Record] = []  # the commands written, in the order sent
        append = self.log.append

        def recorded(topic: str, key: bytes | None, value: bytes | None, partition: int | None = None,
                     txn: Any = None, headers: Any = ()) -> int:
            offset = append(topic, key, value, partition, txn, headers=headers)
            if topic == self.topo.job_commands:
                assert partition is not None  # (the log's producers place every record)
                self.records.append(Record(topic, partition, offset, key, value, 0, headers))
            return offset

        self.log.append = recorded  # type: ignore[method-assign]

    def refuse(self, why: str | None) -> None:
        if why is None:
            self.log.refuse_writes.pop(self.topo.job_commands, None)
        else:
            self.log.refuse_writes[self.topo.job_commands] = why

    def answer(self, index: int, error: Exception | None = None) -> None:
        rec = self.records[index]
        cmd = codec.decode(rec.value or b"", self.topo.job_commands)
        res = result_for(cmd, rec.partition, rec.offset, 5, error=error, job_version=None if error else 1)
        self.log.append(self.topo.command_results, rec.key, codec.encode(res))


def events(broker: Broker | None = None, **kw: Any) -> tuple[JobEvents, Broker]:
    b = broker or Broker()
    return JobEvents("acme", log=b.log, clock=FakeClock(1_764_547_200_000), command_key=ACME_KEY, **kw), b


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
    assert {r.key for r in p.records} == {job_id.encode()}  # one partition per job: ordered
    cmds = [codec.decode(r.value or b"", topo.job_commands) for r in p.records]
    assert [type(c) for c in cmds] == [J.RegisterJob, J.PatchJob, J.PauseJob, J.ResumeJob, J.TriggerJob,
                                       J.DeleteJob]
    assert all(c.tenant == "acme" for c in cmds)
    reg = cmds[0]
    assert isinstance(reg, J.RegisterJob) and reg.spec.schedule.cron == "0 2 * * *"
    assert reg.spec.schedule.tz == "Europe/Paris"
    patch = cmds[1]
    assert isinstance(patch, J.PatchJob) and patch.expected_version == 1
    keyring = MemoryKeyring.of([ACME_KEY])  # every command is signed with the tenant's key (ADR 0006)
    assert all(verify(keyring, r.topic, r.key, r.value, r.headers) == ACME_KEY for r in p.records)


def test_a_producer_may_not_hold_another_tenants_key(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    b = Broker()
    with pytest.raises(ValidationError) as exc:
        JobEvents("acme", log=b.log, command_key=CommandKey("globex.k", "globex", b"g" * 32))
    assert exc.value.field == "command_key"
    monkeypatch.setenv("GNOMON_COMMAND_KEYS_DIR", str(tmp_path))  # no key file: a clear error, nothing made
    monkeypatch.delenv("GNOMON_COMMAND_KEY_FILE", raising=False)
    with pytest.raises(CredentialError, match="gnomon tenants command-key acme"):
        JobEvents("acme", log=b.log)
    assert not any(tmp_path.rglob("*.json"))


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
        JobEvents(" ", log=Broker().log, command_key=ACME_KEY)
    assert exc.value.field == "tenant"


def test_refused_deliveries_fail_the_flush_with_the_reason() -> None:
    b = Broker()
    b.refuse("Broker: Topic authorization failed: not authorized")
    ev, _ = events(b)
    ev.register(JOB)
    ev.register(JOB)
    with pytest.raises(EventLogError, match=r"2 of 2 job commands not written: .*not authorized"):
        ev.flush()
    assert ev.deliveries.sent == 0  # counted afresh after a flush


def test_the_context_manager_flushes() -> None:
    b = Broker()
    # every poll holds the command back (as a producer still lingering): only a flush sends it
    b.log.plain_faults = PlainFaults(random.Random(0), frozenset({b.topo.job_commands}), p_reorder=1.0)
    with JobEvents("acme", log=b.log, command_key=ACME_KEY) as ev:
        ev.register(JOB)
        assert b.records == []  # still in the producer's queue
    assert len(b.records) == 1


def test_results_come_back_in_the_order_sent_matched_by_partition_and_offset() -> None:
    b = Broker()
    for p in range(b.topo.partitions):  # older answers on the topic: not ours, never read
        b.log.append(b.topo.command_results, b"old", b"junk", p)
    ev, _ = events(b, replies=True)
    ids = [ev.register(JOB, job_id=f"j{i}") for i in range(5)]
    ev.flush()  # delivered, so the fake processor can answer (out of order, one refused)
    for i in (3, 0, 4, 1):
        b.answer(i)
    b.answer(2, LimitExceeded("jobs_max", "1 of 1 jobs registered", field=None))
    results = ev.results(timeout_s=5)
    assert [x.job_id for x in results] == ids
    assert [x.code for x in results] == [ResultCode.ACCEPTED] * 2 + [ResultCode.LIMIT] + [ResultCode.ACCEPTED] * 2
    assert results[2].limit == "jobs_max" and not results[2].accepted
    ev.close()


def test_missing_results_time_out_naming_how_many() -> None:
    ev, b = events(replies=True)
    ev.register(JOB)
    ev.register(JOB)
    ev.flush()
    b.answer(0)
    with pytest.raises(EventLogError, match="1 of 2 command results did not arrive"):
        ev.results(timeout_s=0.3)


def test_results_need_replies() -> None:
    ev, _ = events()
    with pytest.raises(ValidationError) as exc:
        ev.results()
    assert exc.value.field == "replies"


def test_after_a_timeout_the_next_call_keeps_waiting_for_the_same_answers() -> None:
    ev, b = events(replies=True)
    ids = [ev.register(JOB, job_id=f"j{i}") for i in range(3)]
    ev.flush()
    b.answer(1)
    with pytest.raises(EventLogError, match="2 of 3 command results"):
        ev.results(timeout_s=0.2)
    b.answer(2)
    b.answer(0)
    assert [x.job_id for x in ev.results(timeout_s=5)] == ids  # the one found before the timeout too
    assert ev.results(timeout_s=0.1) == []  # nothing left to wait for


def test_a_command_kafka_refused_does_not_break_later_results() -> None:
    b = Broker()
    b.refuse("Broker: not authorized")
    ev, _ = events(b, replies=True)
    ev.register(JOB, job_id="lost")
    with pytest.raises(EventLogError, match="not written"):
        ev.results(timeout_s=1)
    b.refuse(None)
    kept = ev.register(JOB, job_id="kept")
    ev.flush()
    b.answer(0)
    assert [x.job_id for x in ev.results(timeout_s=5)] == [kept]


def test_results_from_partitions_a_grow_added_after_reading_began() -> None:
    """The topics grew (ADR 0012) after this JobEvents began reading answers: commands
    it sends now may land on the new partitions, and their answers are read there."""
    b = Broker()
    ev, _ = events(b, replies=True)
    grown = b.topo.partitions * 2
    b.log.add_partitions([b.topo.job_commands, b.topo.command_results], grown)
    ids = [ev.register(JOB, job_id=f"g{i}") for i in range(12)]
    ev.flush()
    assert any(r.partition >= b.topo.partitions for r in b.records), "no command landed on a new partition"
    for i in range(len(ids)):
        b.answer(i)
    assert [x.job_id for x in ev.results(timeout_s=5)] == ids
    ev.close()


# ---- answers through the REST API (a team's service: docs/adr/0006, decision 4) ----------


@pytest.fixture
def api_over(request: pytest.FixtureRequest) -> Any:
    """The real API app (its ``GET /v1/commands/{id}`` and ``CommandAnswers``) reading the
    answers of a ``Broker``'s in-memory log, served by uvicorn; tokens for acme and globex."""
    import threading
    import time

    import uvicorn

    from gnomon.api.answers import CommandAnswers
    from gnomon.api.app import CommandSink, create_app
    from gnomon.history.memory import InMemoryHistoryStore
    from gnomon.web.auth import Authenticator

    servers: list[tuple[Any, threading.Thread]] = []

    def serve(b: Broker) -> str:
        answers = CommandAnswers(b.log.reader("api-answers"), b.topo.command_results, b.topo.partitions).start()
        app = create_app(history=InMemoryHistoryStore(), commands=CommandSink(b.log.producer(client_id="api"), b.topo.job_commands),
                         auth=Authenticator({"tok-acme-0123456789": "acme", "tok-globex-0123456789": "globex"}),
                         topology=b.topo, answers=answers)
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 10
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        servers.append((server, thread))
        request.addfinalizer(answers.close)
        return f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"

    yield serve
    for server, thread in servers:
        server.should_exit = True
        thread.join(10)


def test_a_teams_producer_reads_its_answers_through_the_api(api_over: Any) -> None:
    b = Broker()
    url = api_over(b)
    ev, _ = events(b, replies=True, answers_url=url, api_token="tok-acme-0123456789")
    ids = [ev.register(JOB, job_id=f"j{i}") for i in range(4)]
    ev.flush()
    for i in (2, 0, 3):
        b.answer(i)
    b.answer(1, LimitExceeded("jobs_max", "1 of 1 jobs registered", field=None))
    results = ev.results(timeout_s=10)
    assert [x.job_id for x in results] == ids
    assert [x.code for x in results] == [ResultCode.ACCEPTED, ResultCode.LIMIT, ResultCode.ACCEPTED,
                                         ResultCode.ACCEPTED]
    assert results[1].limit == "jobs_max" and "1 of 1" in (results[1].reason or "") and results[0].job_version == 1
    assert [(x.source_partition, x.source_offset) for x in results] == [(r.partition, r.offset) for r in b.records]
    ev.close()


def test_another_tenants_answers_never_reach_a_producer_through_the_api(api_over: Any) -> None:
    """globex's token asks for acme's answers (it learnt where acme's commands landed): they
    stay pending, and results() times out naming how many, knowing nothing of them."""
    b = Broker()
    url = api_over(b)
    acme, _ = events(b, replies=True, answers_url=url, api_token="tok-acme-0123456789")
    acme.register(JOB, job_id="acme-secret-job")
    acme.flush()
    b.answer(0)
    assert [r.job_id for r in acme.results(timeout_s=10)] == ["acme-secret-job"]
    spy, _ = events(b, replies=True, answers_url=url, api_token="tok-globex-0123456789")
    spy.tenant = "globex"
    spy._waiting = [("?", b.records[0].partition, b.records[0].offset)]  # acme's command's position
    with pytest.raises(EventLogError, match="1 of 1 command results did not arrive"):
        spy.results(timeout_s=0.5)
    with pytest.raises(EventLogError, match="401"):
        _bad_token(b, url)


def _bad_token(b: Broker, url: str) -> None:
    ev, _ = events(b, replies=True, answers_url=url, api_token="not-a-token-0123456789")
    ev.register(JOB, job_id="j-bad")
    ev.flush()
    ev.results(timeout_s=1)


def test_a_teams_producer_must_say_where_its_answers_are() -> None:
    b = Broker()
    with pytest.raises(ValidationError) as exc:
        JobEvents("acme", log=b.log, command_key=ACME_KEY, replies=True, answers_url="http://127.0.0.1:1")
    assert exc.value.field == "api_token"
    # on Kafka, as the producer role, the answers topic is closed to it: refused before any client is made
    with pytest.raises(ValidationError) as exc:
        JobEvents("acme", "127.0.0.1:1", command_key=ACME_KEY, replies=True)
    assert exc.value.field == "answers_url" and "through the API" in exc.value.message
