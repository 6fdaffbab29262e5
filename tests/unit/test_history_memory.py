"""The HistoryStore contract on InMemoryHistoryStore, paging properties, and the
projector's batching / poison / retry logic on the in-memory event log (all pure)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gnomon.codec import encode
from gnomon.core.clock import FakeClock
from gnomon.core.errors import HistoryStoreError
from gnomon.core.runs import RunStatus
from gnomon.eventlog.memory import MemoryEventLog
from gnomon.history import _paging as P
from gnomon.history.base import HistoryBatch
from gnomon.history.memory import InMemoryHistoryStore
from gnomon.history.projector import GROUP_ID, HistoryProjector
from history_contract import (
    MINUTE,
    T0,
    HistoryStoreContract,
    all_pages,
    failed,
    job,
    line,
    run,
)


class TestInMemoryContract(HistoryStoreContract):
    @pytest.fixture
    def make_store(self) -> Callable[..., InMemoryHistoryStore]:
        shared = InMemoryHistoryStore()

        def make(status_scan_max: int | None = None) -> InMemoryHistoryStore:
            if status_scan_max is None:
                return shared
            other = InMemoryHistoryStore(status_scan_max=status_scan_max)
            other.__dict__.update({k: v for k, v in shared.__dict__.items() if k.startswith("_")})
            return other

        return make


# ---- paging properties -------------------------------------------------------------------

STATUSES = [RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.SKIPPED, RunStatus.RUNNING]


@settings(max_examples=150, deadline=None)
@given(
    slots=st.lists(st.tuples(st.integers(0, 30), st.sampled_from(STATUSES), st.booleans()), max_size=40),
    limit=st.integers(1, 7),
    scan_max=st.integers(1, 12),
    status=st.none() | st.sampled_from(STATUSES),
)
def test_pages_cover_the_listing_exactly_once(
    slots: list[tuple[int, RunStatus, bool]], limit: int, scan_max: int, status: RunStatus | None
) -> None:
    store = InMemoryHistoryStore(status_scan_max=scan_max)
    runs = {}
    for i, (slot, st_, manual) in enumerate(slots):
        r = run("job_p", T0 + slot * MINUTE, st_, manual_key=f"k{i}" if manual else None)
        runs[r.run_id] = r
        store.put_run(r)
    expected = sorted(runs.values(), key=lambda r: (r.slot_ms, r.run_id), reverse=True)
    if status is not None:
        expected = [r for r in expected if r.status is status]
    items, pages = all_pages(lambda n, c: store.list_runs("job_p", status and status.value, n, c), limit)
    assert items == expected
    assert all(len(p.items) <= limit for p in pages)
    if status is None:
        assert all(len(p.items) == limit for p in pages[:-1])
        assert len(pages) == max(1, -(-len(expected) // limit))


@given(st.sampled_from([P.JOBS, P.RUNS, P.LOGS, P.DEAD]), st.data())
def test_cursor_round_trip(kind: str, data: st.DataObject) -> None:
    parts = {str: st.text(max_size=30), int: st.integers(-(2**63), 2**63 - 1)}
    key = tuple(data.draw(parts[t]) for t in P._SHAPES[kind])
    assert P.decode_cursor(kind, P.encode_cursor(kind, key)) == key


def test_dead_letters_follow_the_latest_state_in_memory() -> None:
    store = InMemoryHistoryStore()
    r = failed("job_d", T0, "t1")
    store.put_run(r)
    store.put_run(run("job_d", T0, RunStatus.READY, "t1"))
    assert store.list_dead_letters("t1", 10, None).items == []


# ---- projector on the in-memory event log --------------------------------------------------------

TOPICS = {"jobs": "gnomon.jobs", "runs": "gnomon.runs", "logs": "gnomon.run-logs"}


class Feed:
    """The projector's input topics on the in-memory event log (the one the simulation
    runs), with what its group has committed."""

    def __init__(self) -> None:
        self.log = MemoryEventLog(FakeClock(T0), partitions=2)
        self.projectors: list[HistoryProjector] = []

    def add(self, topic: str, key: str | None, value: bytes | None, partition: int = 0) -> None:
        self.log.append(topic, key.encode() if key is not None else None, value, partition)

    def committed(self) -> dict[tuple[str, int], int]:
        return dict(self.log._group(GROUP_ID).committed)


class FlakyStore(InMemoryHistoryStore):
    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures
        self.attempts = 0

    def write_batch(self, batch: HistoryBatch) -> None:
        self.attempts += 1
        if self.failures > 0:
            self.failures -= 1
            raise HistoryStoreError("cassandra write batch: OperationTimedOut: errors={}")
        super().write_batch(batch)


def projector(store: Any, feed: Feed, **kw: Any) -> HistoryProjector:
    kw.setdefault("retry_backoff_s", 0.0)
    return HistoryProjector(store, feed.log, topics=TOPICS, **kw)


def test_projector_writes_coalesced_batches_then_commits() -> None:
    store, c = InMemoryHistoryStore(), Feed()
    j1, j2 = job("job_a", "t1", 1), job("job_a", "t1", 2)
    c.add("gnomon.jobs", "job_a", encode(j1))
    c.add("gnomon.jobs", "job_a", encode(j2))
    c.add("gnomon.jobs", "job_b", encode(job("job_b", "t1")), partition=1)
    states = [run("job_a", T0, RunStatus.RUNNING, "t1", attempt=1, token=1, worker_id="w", lease_until_ms=T0,
                  deadline_ms=T0), failed("job_a", T0, "t1")]
    for s in states:
        c.add("gnomon.runs", s.run_id, encode(s))
    lines = [line(states[0].run_id, 1, i) for i in range(3)]
    for x in [*lines, lines[0]]:
        c.add("gnomon.run-logs", x.run_id, encode(x))
    p = projector(store, c)
    assert p.run_once(100) == 9
    assert store.get_job("job_a") == j2
    assert [j.job_id for j in store.list_jobs("t1", 10, None).items] == ["job_a", "job_b"]
    assert store.get_run(states[0].run_id) == states[1]
    assert store.list_dead_letters("t1", 10, None).items == [states[1]]
    assert store.get_logs(states[0].run_id, 10, None).items == lines
    assert p.stats.jobs == 2 and p.stats.runs == 1 and p.stats.logs == 3 and p.stats.records == 9
    assert c.committed() == {("gnomon.jobs", 0): 2, ("gnomon.jobs", 1): 1, ("gnomon.runs", 0): 2,
                             ("gnomon.run-logs", 0): 4}
    assert p.run_once(100) == 0


def test_projector_batches_are_bounded() -> None:
    store, c = InMemoryHistoryStore(), Feed()
    for i in range(7):
        x = line("job_a@x", 1, i)
        c.add("gnomon.run-logs", x.run_id, encode(x))
    p = projector(store, c, batch_max=3)
    got = []
    for _ in range(4):
        got.append((p.run_once(100), c.committed().get(("gnomon.run-logs", 0))))
    assert got == [(3, 3), (3, 6), (1, 7), (0, 7)]
    assert len(store.get_logs("job_a@x", 10, None).items) == 7


def test_projector_job_tombstone_deletes_and_run_tombstone_is_ignored() -> None:
    store, c = InMemoryHistoryStore(), Feed()
    store.put_job(job("job_a", "t1"))
    store.put_job(job("job_b", "t1"))
    r = run("job_a", T0)
    store.put_run(r)
    c.add("gnomon.jobs", "job_a", None)
    c.add("gnomon.jobs", "job_b", None)
    c.add("gnomon.jobs", "job_b", encode(job("job_b", "t1", 5)))  # re-created after the tombstone
    c.add("gnomon.runs", r.run_id, None)
    p = projector(store, c)
    p.run_once(100)
    assert store.get_job("job_a") is None
    assert store.get_job("job_b") == job("job_b", "t1", 5)
    assert store.get_run(r.run_id) == r
    assert p.stats.ignored == 1 and p.stats.jobs_deleted == 1


def test_projector_skips_poison_through_the_hook_and_still_commits() -> None:
    store, c = InMemoryHistoryStore(), Feed()
    seen: list[tuple[int, str]] = []
    good = job("job_a", "t1")
    c.add("gnomon.jobs", "job_x", b"\x00\x00\x00\x00\x63garbage")
    c.add("gnomon.jobs", "job_y", b"not avro")
    c.add("gnomon.jobs", "job_a", encode(good))
    c.add("gnomon.runs", "r", encode(good))  # a JobState on the runs topic
    c.add("gnomon.jobs", None, None)  # a tombstone without a key
    p = projector(store, c, poison_sink=lambda rec, why: seen.append((rec.offset, why)))
    assert p.run_once(100) == 5
    assert store.get_job("job_a") == good
    assert p.stats.poison == 4 and len(seen) == 4
    assert all("DecodeError" in why for _, why in seen[:2])
    assert c.committed()[("gnomon.jobs", 0)] == 4 and c.committed()[("gnomon.runs", 0)] == 1


def test_projector_retries_then_rewinds_without_committing() -> None:
    store, c = FlakyStore(failures=3), Feed()
    r = failed("job_a", T0, "t1")
    c.add("gnomon.runs", "other", encode(run("job_z", T0)))
    c.add("gnomon.runs", r.run_id, encode(r))
    p = projector(store, c, write_attempts=2)
    with pytest.raises(HistoryStoreError):
        p.run_once(100)
    assert store.attempts == 2 and c.committed() == {} and p.consumer.position([("gnomon.runs", 0)]) == {
        ("gnomon.runs", 0): 0}  # rewound to the batch's first record
    assert p.stats.write_failures == 1
    assert p.run_once(100) == 2  # replayed: one more failure, then written
    assert store.attempts == 4 and store.get_run(r.run_id) == r
    assert c.committed() == {("gnomon.runs", 0): 2}


def test_projector_run_loop_stops_and_closes() -> None:
    import threading

    store, c = FlakyStore(failures=1), Feed()
    c.add("gnomon.runs", "x", encode(run("job_a", T0)))
    stop = threading.Event()
    p = projector(store, c, write_attempts=1, owns_store=True)

    original = p.run_once

    def once(n: int, timeout_s: float | None = None) -> int:
        got = original(n, 0)
        if got == 0 and store.get_run(run("job_a", T0).run_id) is not None:
            stop.set()
        return got

    p.run_once = once  # type: ignore[method-assign]
    p.run(stop, poll_timeout_s=0)
    assert c.log.groups[GROUP_ID].members == {} and store.closed  # left the group and store.get_run(run("job_a", T0).run_id) is not None


class RecordingStore(InMemoryHistoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.batches: list[HistoryBatch] = []

    def write_batch(self, batch: HistoryBatch) -> None:
        self.batches.append(batch)
        super().write_batch(batch)


def test_projector_passes_each_state_with_its_records_bytes() -> None:
    store, c = RecordingStore(), Feed()
    j1, j2 = job("job_a", "t1", 1), job("job_a", "t1", 2)
    r1 = run("job_a", T0, RunStatus.RUNNING, "t1", attempt=1, token=1, worker_id="w")
    r2 = failed("job_a", T0, "t1")
    for topic, key, value in [("gnomon.jobs", "job_a", encode(j1)), ("gnomon.jobs", "job_a", encode(j2)),
                              ("gnomon.jobs", "job_b", encode(job("job_b", "t1"))), ("gnomon.jobs", "job_b", None),
                              ("gnomon.runs", r1.run_id, encode(r1)), ("gnomon.runs", r2.run_id, encode(r2))]:
        c.add(topic, key, value)
    projector(store, c).run_once(100)
    (batch,) = store.batches
    assert batch.job_blobs == {"job_a": encode(j2)}  # the last record's; none for the deleted job
    assert batch.run_blobs == {r2.run_id: encode(r2)}
    assert list(batch.jobs) == [j2] and list(batch.deleted_jobs) == ["job_b"] and list(batch.runs) == [r2]
