"""Issue 24, finding 5: the output cap counts bytes, but each line is one Kafka record and
one history row kept for days: 8 MiB of newlines made 8.4 million log records from one
successful attempt. An attempt now logs at most ``log_lines_max`` lines (and
``LOG_BYTES_MAX`` bytes); the rest are counted and one marker line says how much was cut.
Driven on a worker with a FakeClock and a recording producer (no Kafka)."""

from __future__ import annotations

import threading
import time
from typing import Any

from gnomon import codec
from gnomon.core.clock import FakeClock
from gnomon.core.messages import Grant, LogLine, LogStream
from gnomon.core.model import JobSpec, Schedule, Target, TargetType
from gnomon.core.runs import CompleteAttempt, Outcome
from gnomon.topology import load_topology
from gnomon.worker import Worker
from gnomon.worker.executors import Dispatcher
from gnomon.worker.log_budget import LOG_LINES_MAX, LogBudget

SPEC = JobSpec(name="j", schedule=Schedule(run_at_ms=0), target=Target(TargetType.HANDLER, handler="flood"))


class Recorder:
    def __init__(self) -> None:
        self.sent: list[Any] = []
        self.reports: list[Any] = []
        self.lock = threading.Lock()

    def produce(self, topic: str, key: bytes | None, value: bytes | None, *, on_delivery: Any = None) -> None:
        with self.lock:
            self.sent.append(codec.decode(value or b""))
            if on_delivery is not None:
                self.reports.append(on_delivery)

    def poll(self, _timeout: float) -> int:
        """Kafka takes every record sent so far (the worker starts an attempt then)."""
        with self.lock:
            reports, self.reports = self.reports, []
        for i, report in enumerate(reports):
            report(None, 0, i)
        return len(reports)

    def of(self, cls: type) -> list[Any]:
        with self.lock:
            return [v for v in self.sent if isinstance(v, cls)]


def run_flood(lines_n: int, line: str = "", **worker_attrs: int) -> tuple[list[LogLine], CompleteAttempt, Worker]:
    clock = FakeClock()
    w = Worker("default", bootstrap="unused:1", worker_id="w1", concurrency_max=1, clock=clock,
               topology=load_topology(), tenants=["t"])
    for name, value in worker_attrs.items():
        setattr(w, name, value)

    @w.handler("flood")
    def flood(ctx: Any) -> None:
        for _ in range(lines_n):
            ctx.log("stdout", line)

    prod = Recorder()
    w._producer = prod  # type: ignore[assignment]
    w.ensure_metrics()
    slot = clock.now_ms() + 1_000
    w._on_inbox(codec.encode(Grant("w1", "j@1", "j", "t", 1, 1, slot + 30_000, slot + 90_000, SPEC, slot,
                                   slot - 20_000, slot)), Dispatcher(w.handlers))
    clock.set(slot)
    w._fire_due(Dispatcher(w.handlers))
    w._poll_producer()  # its start report taken: it starts
    w._start_claimed()
    deadline = time.monotonic() + 60
    while w._done.empty():
        assert time.monotonic() < deadline, "the attempt did not end"
        time.sleep(0.01)
    w._finish_done()
    (done,) = prod.of(CompleteAttempt)
    return prod.of(LogLine), done, w


def test_a_flood_of_empty_lines_is_cut_to_the_budget_with_one_marker() -> None:
    logs, done, w = run_flood(8 * LOG_LINES_MAX)
    assert done.outcome is Outcome.SUCCEEDED
    out = [x for x in logs if x.stream is LogStream.STDOUT]
    assert len(out) == LOG_LINES_MAX, len(out)
    (marker,) = [x for x in logs if x.stream is LogStream.SYSTEM and x.line.startswith("output cut:")]
    assert f"{7 * LOG_LINES_MAX} more line(s)" in marker.line
    assert marker.seq > max(x.seq for x in out), "the marker comes after the last line logged"
    assert len({x.seq for x in logs if x.seq}) == len([x for x in logs if x.seq]), "no sequence number twice"
    assert w.metrics is not None
    cut = w.metrics.registry.get_sample_value("gnomon_worker_output_cut_lines_total", {"pool": "default"})
    assert cut == 7 * LOG_LINES_MAX


def test_the_budget_in_bytes_cuts_long_lines_too() -> None:
    logs, _, _ = run_flood(100, "x" * 1000, log_lines_max=1_000, log_bytes_max=10_000)
    out = [x for x in logs if x.stream is LogStream.STDOUT]
    assert len(out) == 10
    assert any("90 more line(s), 90000 byte(s)" in x.line for x in logs if x.stream is LogStream.SYSTEM)


def test_under_the_budget_nothing_is_cut_and_no_marker() -> None:
    logs, _, _ = run_flood(50, "hello")
    assert len([x for x in logs if x.stream is LogStream.STDOUT]) == 50
    assert not any(x.line.startswith("output cut:") for x in logs)


def test_once_cut_a_later_short_line_is_cut_too() -> None:
    """Lines are never logged out of order around a gap: after the first cut, all are cut."""
    b = LogBudget(lines_max=10, bytes_max=100)
    assert b.take("x" * 60) and not b.take("y" * 60) and not b.take("z")
    assert (b.lines, b.cut_lines, b.cut_bytes) == (1, 2, 61)
    assert b.marker() is not None and "2 more line(s), 61 byte(s)" in (b.marker() or "")
