"""Issue 50, finding 8: a CancelRun's reason was only length-checked, and the worker logged
it raw, so a team's producer could write a forged line into a worker's log ("...\\n<time>
CRITICAL gnomon.worker: ..."). The decider now refuses a reason with control or bidi
characters, and every gnomon process logs through a formatter that escapes them in any
message (text a tenant wrote reaches logs by other paths too, and older records remain)."""

from __future__ import annotations

import io
import logging
from typing import Any

from gnomon import codec
from gnomon.core.clock import FakeClock
from gnomon.core.messages import Grant, Stop, StopReason
from gnomon.core.model import JobSpec, Schedule, Target, TargetType
from gnomon.core.replies import ResultCode
from gnomon.core.runs import CancelRun, RunState, RunStatus
from gnomon.logs import OneLineFormatter
from gnomon.testing import DecidingProducer
from gnomon.topology import load_topology
from gnomon.worker import Worker
from gnomon.worker.executors import Dispatcher

FORGED = "bye\n2026-12-01 00:00:00,000 CRITICAL gnomon.worker: credentials leaked, rotate now"
SPEC = JobSpec(name="j", schedule=Schedule(cron="0 * * * *"), target=Target(TargetType.HANDLER, handler="h"))


def test_a_cancel_reason_with_control_characters_is_refused_by_the_decider() -> None:
    """A team's producer on the job-commands topic: refused, field ``reason``; the run goes on."""
    producer = DecidingProducer()
    now = producer.clock.now_ms()
    run_id = "j@2026-12-01T00:00:00Z"
    producer.adopt_run(RunState(run_id, "j", "acme", SPEC, now - 1_000, now - 1_000, False, RunStatus.READY,
                                now - 2_000, now - 1_000))
    topo = load_topology()
    at = producer.send(topo.job_commands, "j", codec.encode(CancelRun(run_id, "acme", now, FORGED), topo.job_commands))
    assert at is not None
    answer = producer.results[at]
    assert (answer.code, answer.field) == (ResultCode.INVALID, "reason"), answer
    still = producer.run(run_id)
    assert still is not None and still.status is RunStatus.READY
    ok = producer.send(topo.job_commands, "j", codec.encode(CancelRun(run_id, "acme", now, "not needed"),
                                                            topo.job_commands))
    assert ok is not None and producer.results[ok].code is ResultCode.ACCEPTED


def _worker_log(messages: list[Any]) -> list[str]:
    """What a worker writes to its log, through the processes' formatter, for ``messages``
    read from its inbox."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(OneLineFormatter("%(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger("gnomon.worker")
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    try:
        clock = FakeClock()
        w = Worker("default", bootstrap="unused:1", worker_id="w1", concurrency_max=1, clock=clock,
                   topology=load_topology(), tenants=["t"])
        w.ensure_metrics()
        for msg in messages:
            w._on_inbox(codec.encode(msg(clock.now_ms())), Dispatcher(w.handlers))
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    return out.getvalue().splitlines()


def test_a_stop_reason_from_an_older_record_is_logged_on_one_line() -> None:
    """A Stop written before the decider refused such reasons (or by any other path): the
    worker's log line says it escaped, and no line of the log is the forged one."""
    def grant(now: int) -> Grant:
        slot = now + 60_000
        return Grant("w1", "j@1", "j", "t", 1, 1, slot + 30_000, slot + 90_000, SPEC, slot, now, slot)

    def stop(now: int) -> Stop:
        return Stop("w1", "j@1", 1, StopReason.CANCELLED, FORGED, now)

    lines = _worker_log([grant, stop])
    dropped = [ln for ln in lines if "dropped staged j@1" in ln]
    assert len(dropped) == 1 and "bye\\n2026-12-01" in dropped[0], lines
    assert not any(ln.startswith("2026-12-01") or "CRITICAL" in ln.split(":", 1)[0] for ln in lines), lines


def test_the_formatter_escapes_bidi_and_terminal_controls_but_keeps_a_traceback() -> None:
    fmt = OneLineFormatter("%(message)s")
    rec = logging.LogRecord("x", logging.INFO, __file__, 1, "name %s", ("a\u202eb\x1b[2Jc\r\td",), None)
    assert fmt.format(rec) == "name a\\u202eb\\u001b[2Jc\\r\\td"
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        failed = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    text = fmt.format(failed)
    assert text.startswith("failed\nTraceback") and "ValueError: boom" in text
