"""Liveness decided with a fake clock: time without progress counts only while the broker
answers; at the limit the watchdog reports it once (gauge, /healthz 503) and asks the
process to stop."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry

from gnomon.metrics.liveness import LivenessGauges, ProgressWatch, Verdict, Watchdog
from gnomon.metrics.serve import serve


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Process:
    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.progress_at_s = clock.t

    def progress(self) -> None:
        self.progress_at_s = self.clock.t


def make(limit_s: float = 60.0) -> tuple[Clock, Process, ProgressWatch]:
    clock = Clock()
    proc = Process(clock)
    return clock, proc, ProgressWatch(limit_s, lambda: proc.progress_at_s, clock)


def test_progress_keeps_it_alive() -> None:
    clock, proc, watch = make()
    for _ in range(100):
        clock.t += 10
        proc.progress()
        assert not watch.observe(True).stuck


def test_no_progress_with_the_broker_answering_is_stuck_at_the_limit() -> None:
    clock, _, watch = make()
    clock.t += 59.9
    assert not watch.observe(True).stuck
    clock.t += 0.1
    v = watch.observe(True)
    assert v.stuck and v.stalled_s == pytest.approx(60.0)


def test_an_outage_however_long_is_waited_out_and_the_limit_starts_again_at_the_return() -> None:
    clock, proc, watch = make()
    for _ in range(600):  # a 10-minute outage, probed every second: never stuck
        clock.t += 1
        v = watch.observe(False)
        assert not v.stuck and v.stalled_s == 0 and not v.broker_reachable
    clock.t += 59  # the broker is back; no progress yet
    assert not watch.observe(True).stuck
    clock.t += 1
    assert watch.observe(True).stuck  # a full limit after the last time the broker was away
    proc.progress()
    assert not watch.observe(True).stuck


def test_the_watchdog_trips_once_shows_it_and_answers_503() -> None:
    clock, _, watch = make(limit_s=5)
    reg = CollectorRegistry()
    stuck: list[Verdict] = []
    dog = Watchdog(watch, lambda: True, stuck.append, gauges=LivenessGauges(reg, "processor"))
    assert dog.check().stalled_s == 0 and dog.health()[0]
    clock.t += 5
    dog.check()
    clock.t += 5
    dog.check()
    assert len(stuck) == 1 and dog.tripped
    assert reg.get_sample_value("gnomon_stalled", {"kind": "processor"}) == 1
    assert reg.get_sample_value("gnomon_stalled_seconds", {"kind": "processor"}) == 10
    ok, body = dog.health()
    assert not ok and body["status"] == "stalled"
    endpoint = serve(reg, "processor", port=_free_port(), health=dog.health, process_metrics=False)
    assert endpoint is not None
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"http://127.0.0.1:{endpoint.port}/healthz", timeout=5)
    assert err.value.code == 503 and json.loads(err.value.read())["status"] == "stalled"
    with urllib.request.urlopen(endpoint.url, timeout=5) as r:  # the metrics stay where they were
        assert b"gnomon_stalled" in r.read()


def test_a_limit_must_be_positive() -> None:
    with pytest.raises(ValueError):
        ProgressWatch(0, lambda: 0.0, lambda: 0.0)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_stopped_watchdog_closes_its_probe_once_its_thread_ends() -> None:
    """The processor and worker commands stop their watchdog when their loop returns, and the
    watchdog then closes the probe's Kafka client: left running, a test that ran the command
    in-process kept a client reconnecting to the broker for the rest of its session."""
    import threading

    closed: list[int] = []
    ended = threading.Event()

    def close() -> None:
        closed.append(1)
        ended.set()

    dog = Watchdog(ProgressWatch(60, lambda: 0.0, lambda: 0.0), lambda: True, lambda _v: None, every_s=0.01,
                   on_stop=close).start()
    assert not ended.wait(0.1)  # running: the probe stays open
    dog.stop()
    assert ended.wait(5) and closed == [1]
