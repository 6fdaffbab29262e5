"""Run exports (issue 11, point 6): the flat record of a finished run, its schema, and the
history projector publishing it after the store write and before the commit (pure: the
in-memory event log and a fake producer)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from test_history_memory import TOPICS, Feed, projector

from gnomon.codec import decode, encode, schema_id_for_topic
from gnomon.core.exports import RunExport, export_of
from gnomon.core.model import Priority
from gnomon.core.runs import RunStatus
from gnomon.history.export import ExportPublishError, RunExportPublisher
from gnomon.history.memory import InMemoryHistoryStore
from gnomon.topology import load_topology
from history_contract import T0, failed, run

EXPORTS = load_topology().run_exports


@dataclass
class FakeProducer:
    """Records produce() calls; flush() delivers them (or fails the next ``failures``)."""

    sent: list[tuple[str, bytes, bytes]] = field(default_factory=list)
    pending: list[Any] = field(default_factory=list)
    failures: int = 0

    def produce(self, topic: str, key: bytes | None, value: bytes | None, *, on_delivery: Any = None) -> None:
        self.pending.append((topic, key, value, on_delivery))

    def poll(self, timeout_s: float) -> int:
        return 0

    def flush(self, timeout_s: float) -> int:
        for topic, key, value, cb in self.pending:
            if self.failures > 0:
                self.failures -= 1
                cb("KafkaError{code=_MSG_TIMED_OUT}", -1, -1)
            else:
                self.sent.append((topic, key, value))
                cb(None, 0, len(self.sent) - 1)
        self.pending.clear()
        return 0


def test_export_of_a_finished_run_has_slot_status_attempts_and_start_lag() -> None:
    r = run("job_a", T0, RunStatus.SUCCEEDED, attempt=2, started_at_ms=T0 + 1_250, finished_at_ms=T0 + 9_000,
            exit_code=0, not_before_ms=T0 + 1_000, reason="exit code 0")
    e = export_of(r)
    assert e == RunExport(
        run_id=r.run_id, job_id="job_a", tenant="acme", pool="batch", priority=Priority.HIGH, slot_ms=T0,
        slot="2026-11-29T08:00:00Z", status=RunStatus.SUCCEEDED, attempts=2, manual=False,
        updated_at_ms=r.updated_at_ms, start_lag_ms=250, started_at_ms=T0 + 1_250, finished_at_ms=T0 + 9_000,
        exit_code=0, reason="exit code 0")


def test_live_runs_have_no_export_and_unstarted_ones_no_lag() -> None:
    for status in (RunStatus.SCHEDULED, RunStatus.READY, RunStatus.RUNNING, RunStatus.RETRY_WAIT):
        assert export_of(run("job_a", T0, status)) is None
    skipped = export_of(run("job_a", T0, RunStatus.SKIPPED, reason="paused"))
    assert skipped is not None and skipped.start_lag_ms is None and skipped.attempts == 0
    assert skipped.reason == "paused"


def test_the_export_schema_is_its_own_id_and_round_trips() -> None:
    e = export_of(failed("job_a", T0))
    assert e is not None
    data = encode(e, EXPORTS)
    assert data[0] == 0 and int.from_bytes(data[1:5], "big") == schema_id_for_topic(EXPORTS) == 80
    assert decode(data, EXPORTS) == e


def test_publisher_sends_final_runs_only_keyed_by_run_id() -> None:
    prod = FakeProducer()
    pub = RunExportPublisher(prod, EXPORTS)
    done, live = failed("job_a", T0), run("job_b", T0, RunStatus.RUNNING)
    assert pub.publish([live, done]) == 1
    [(topic, key, value)] = prod.sent
    assert topic == EXPORTS and key == done.run_id.encode()
    assert decode(value, EXPORTS) == export_of(done)
    assert pub.publish([live]) == 0


def test_publisher_raises_when_kafka_does_not_take_them() -> None:
    pub = RunExportPublisher(FakeProducer(failures=1), EXPORTS)
    with pytest.raises(ExportPublishError, match="1 failed"):
        pub.publish([failed("job_a", T0)])
    assert pub.published == 0


def test_projector_exports_after_the_store_write_and_before_the_commit() -> None:
    store, c, prod = InMemoryHistoryStore(), Feed(), FakeProducer()
    running = run("job_a", T0, RunStatus.RUNNING, attempt=1, token=1, worker_id="w")
    done = replace(running, status=RunStatus.SUCCEEDED, started_at_ms=T0 + 40, finished_at_ms=T0 + 500)
    other = run("job_b", T0, RunStatus.RUNNING)
    for s in (running, done, other):
        c.add(TOPICS["runs"], s.run_id, encode(s))
    p = projector(store, c, exporter=RunExportPublisher(prod, EXPORTS))
    assert p.run_once(100) == 3
    assert [decode(v, EXPORTS) for _, _, v in prod.sent] == [export_of(done)]  # coalesced: the final state
    assert store.get_run(done.run_id) == done
    assert c.committed() == {(TOPICS["runs"], 0): 3} and p.stats.exported == 1


def test_a_failed_publish_replays_the_batch_at_least_once() -> None:
    store, c, prod = InMemoryHistoryStore(), Feed(), FakeProducer(failures=3)
    r1, r2 = failed("job_a", T0), failed("job_b", T0)
    for s in (r1, r2):
        c.add(TOPICS["runs"], s.run_id, encode(s))
    p = projector(store, c, exporter=RunExportPublisher(prod, EXPORTS), write_attempts=2)
    with pytest.raises(ExportPublishError):  # both attempts lose a record: not committed, rewound
        p.run_once(100)
    assert c.committed() == {} and p.consumer.position([(TOPICS["runs"], 0)]) == {(TOPICS["runs"], 0): 0}
    sent_before = [k for _, k, _ in prod.sent]
    assert p.run_once(100) == 2
    assert c.committed() == {(TOPICS["runs"], 0): 2}
    # every run reached Kafka at least once; the ones that got through earlier come twice
    assert sorted(k for _, k, _ in prod.sent) == sorted([*sent_before, r1.run_id.encode(), r2.run_id.encode()])
