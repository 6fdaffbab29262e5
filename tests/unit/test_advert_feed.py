"""A processor's worker-advert reader that reads nothing while adverts wait past its
position is replaced (seen in CI: after a single broker's outage the reader read nothing
more for 85 s, the worker's adverts in the topic all along: the processor found it lost
and granted it nothing)."""

from __future__ import annotations

from typing import Any

import pytest

from gnomon import codec
from gnomon.core.clock import FakeClock
from gnomon.core.workers import WorkerAdvert, WorkerDirectory
from gnomon.eventlog.memory import MemoryEventLog
from gnomon.processor import adverts as adverts_mod
from gnomon.processor.adverts import AdvertFeed
from gnomon.topology import load_topology

TOPIC = load_topology().workers


def _advertise(log: MemoryEventLog, clock: FakeClock, worker_id: str = "w1") -> None:
    advert = WorkerAdvert(worker_id, "default", 4, 0, 0, 1_000, clock.now_ms())
    log.append(TOPIC, worker_id.encode(), codec.encode(advert), 0)


def _feed() -> tuple[MemoryEventLog, FakeClock, WorkerDirectory, AdvertFeed]:
    clock = FakeClock()
    log = MemoryEventLog(clock, partitions=1)
    directory = WorkerDirectory()
    _advertise(log, clock)
    feed = AdvertFeed(log, TOPIC, directory, clock)
    assert feed.poll() == 1 and directory.alive("w1", clock.now_ms())
    return log, clock, directory, feed


class _Stuck:
    """A reader that reads nothing more, its position where it stopped."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.closed = False

    def consume(self, max_records: int, timeout_s: float) -> list[Any]:
        return []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def close(self) -> None:
        self.closed = True


def test_a_stuck_reader_is_replaced_and_the_worker_is_seen_again() -> None:
    log, clock, directory, feed = _feed()
    stuck = _Stuck(feed.consumer)
    feed.consumer = stuck  # type: ignore[assignment]
    for _ in range(4):  # adverts every second, none read
        clock.advance(1_000)
        _advertise(log, clock)
        assert feed.poll() == 0
    assert not directory.alive("w1", clock.now_ms())  # 4 s of silence: it would be found lost
    clock.advance(1_000)
    _advertise(log, clock)
    feed.poll()  # 5 s without a read, adverts past its position: a new reader
    assert feed.reopened == 1 and stuck.closed and feed.consumer is not stuck
    assert feed.poll() >= 1 and directory.alive("w1", clock.now_ms())


def test_a_quiet_topic_is_not_taken_for_a_stuck_reader() -> None:
    _log, clock, _directory, feed = _feed()
    for _ in range(20):  # the worker gone: nothing to read, and nothing past the position
        clock.advance(1_000)
        feed.poll()
    assert feed.reopened == 0


def test_a_broker_that_does_not_answer_leaves_the_reader_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    log, clock, _directory, feed = _feed()
    feed.consumer = _Stuck(feed.consumer)  # type: ignore[assignment]

    def down(*_a: Any, **_k: Any) -> Any:
        from gnomon.core.errors import EventLogError
        raise EventLogError("broker down")

    monkeypatch.setattr(feed.consumer, "watermarks", down, raising=False)
    for _ in range(12):
        clock.advance(1_000)
        _advertise(log, clock)
        feed.poll()
    assert feed.reopened == 0
    assert adverts_mod.STUCK_CHECK_MS == 5_000
