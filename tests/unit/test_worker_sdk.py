"""The worker SDK: sync and ``async def`` handlers, their return value recorded as the
run's output (JSON, capped), the typed context, and a command's last lines as its
summary. Pure: the executors are called directly, the run state machine in-process."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import pytest
from test_runs_core import RID, T0, ready, step

from gnomon.api.views import run_view
from gnomon.codec import decode, encode
from gnomon.core import runs as R
from gnomon.core.model import Target, TargetType
from gnomon.worker import Context
from gnomon.worker.attempt import AttemptResult, encode_output, tail_output
from gnomon.worker.executors import HandlerExecutor

TARGET = Target(TargetType.HANDLER, handler="h")


def ctx(timeout_s: float = 5.0) -> tuple[Context, list[tuple[str, str]]]:
    lines: list[tuple[str, str]] = []
    c = Context("j@1", "j", "acme", 2, {"n": 3}, timeout_s, lambda k, line: lines.append((str(k), line)),
                slot_ms=T0, deadline_ms=T0 + 60_000)
    return c, lines


def run(fn: Any, timeout_s: float = 5.0) -> tuple[AttemptResult, Context, list[tuple[str, str]]]:
    ex = HandlerExecutor({"h": fn})
    c, lines = ctx(timeout_s)
    try:
        return ex.execute(TARGET, c), c, lines
    finally:
        ex.close()


def test_sync_handler_return_value_is_the_output() -> None:
    res, _, _ = run(lambda c: {"rows": c.payload["n"] * 2, "run": c.run_id})
    assert res.outcome is R.Outcome.SUCCEEDED and json.loads(res.output or "") == {"rows": 6, "run": "j@1"}


def test_async_handler_runs_on_the_event_loop_and_its_value_is_recorded() -> None:
    seen: dict[str, Any] = {}

    async def h(c: Context) -> list[int]:
        seen["loop"] = asyncio.get_running_loop()
        await asyncio.sleep(0.01)
        return [c.attempt, c.payload["n"]]

    res, _, _ = run(h)
    assert res.outcome is R.Outcome.SUCCEEDED and res.output == "[2,3]"
    assert isinstance(seen["loop"], asyncio.AbstractEventLoop)


def test_async_handlers_share_one_loop_and_run_concurrently() -> None:
    ex = HandlerExecutor({})
    started = threading.Barrier(3, timeout=5)

    async def h(c: Context) -> str:
        await asyncio.get_running_loop().run_in_executor(None, started.wait)
        return c.run_id

    ex.handlers["h"] = h
    results: list[AttemptResult] = []
    threads = [threading.Thread(target=lambda: results.append(ex.execute(TARGET, ctx()[0]))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    ex.close()
    assert [r.outcome for r in results] == [R.Outcome.SUCCEEDED] * 3  # all three were waiting together


def test_async_handler_past_its_timeout_is_cancelled() -> None:
    cancelled = threading.Event()

    async def h(c: Context) -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    t0 = time.monotonic()
    res, c, _ = run(h, timeout_s=0.3)
    assert res.outcome is R.Outcome.TIMED_OUT and c.stop.is_set() and c.stop_reason == "timeout"
    assert cancelled.wait(5) and time.monotonic() - t0 < 5


def test_async_handler_is_cancelled_when_the_attempt_is_stopped() -> None:
    ex = HandlerExecutor({})
    c, _ = ctx(timeout_s=30)
    entered = threading.Event()

    async def h(_c: Context) -> None:
        entered.set()
        await asyncio.sleep(30)

    ex.handlers["h"] = h
    threading.Thread(target=lambda: (entered.wait(5), c.request_stop("cancelled by the user"))).start()
    res = ex.execute(TARGET, c)
    ex.close()
    assert res.outcome is R.Outcome.FAILED and res.error == "stopped: cancelled by the user"


def test_raising_handlers_fail_with_their_error() -> None:
    async def boom(_c: Context) -> None:
        raise RuntimeError("no rows")

    for fn in (boom, lambda _c: 1 / 0):
        res, _, lines = run(fn)
        assert res.outcome is R.Outcome.FAILED and res.output is None
        assert res.error in ("RuntimeError: no rows", "ZeroDivisionError: division by zero")
        assert lines and lines[-1][0] == "stderr"


def test_an_output_that_cannot_be_recorded_is_logged_and_the_attempt_still_succeeds() -> None:
    res, _, lines = run(lambda _c: {"when": object()})
    assert res.outcome is R.Outcome.SUCCEEDED and res.output is None
    assert "not JSON" in lines[-1][1] and lines[-1][0] == "system"
    res, _, lines = run(lambda _c: "x" * (R.OUTPUT_MAX_BYTES + 1))
    assert res.output is None and "over the" in lines[-1][1]


def test_encode_output_bounds() -> None:
    assert encode_output(None) == (None, None)
    assert encode_output({"a": "é"}) == ('{"a":"é"}', None)
    exact = "x" * (R.OUTPUT_MAX_BYTES - 2)  # its JSON (two quotes) is exactly the cap
    assert encode_output(exact)[0] is not None
    assert encode_output(exact + "x")[0] is None
    assert encode_output(float("nan"))[0] is None  # not JSON


def test_tail_output_keeps_the_last_lines_within_the_cap() -> None:
    assert tail_output([]) is None
    assert json.loads(tail_output([f"line {i}" for i in range(100)]) or "") == "\n".join(
        f"line {i}" for i in range(80, 100))
    huge = tail_output(["y" * (R.OUTPUT_MAX_BYTES * 2)])
    assert huge is not None and len(huge.encode()) <= R.OUTPUT_MAX_BYTES


def test_context_is_typed() -> None:
    c, _ = ctx()
    assert c.slot.isoformat() == "2026-11-29T08:00:00+00:00"
    assert c.deadline is not None and (c.deadline - c.slot).total_seconds() == 60
    assert (c.run_id, c.job_id, c.tenant, c.attempt, c.payload) == ("j@1", "j", "acme", 2, {"n": 3})


def test_the_run_records_the_output_of_its_latest_attempt() -> None:
    s = ready()
    s, _ = step(s, R.ClaimRun(RID, "w1", T0 + 5))
    assert s is not None
    s, _ = step(s, R.CompleteAttempt(RID, "w1", 1, R.Outcome.SUCCEEDED, T0 + 9, 0, None, T0 + 6, '{"rows":6}'))
    assert s is not None and s.status is R.RunStatus.SUCCEEDED and s.output == '{"rows":6}'
    assert run_view(s)["output"] == {"rows": 6}


def test_an_oversized_output_from_a_worker_is_dropped_not_the_run() -> None:
    s = ready()
    s, _ = step(s, R.ClaimRun(RID, "w1", T0 + 5))
    big = json.dumps("z" * R.OUTPUT_MAX_BYTES)
    s, _ = step(s, R.CompleteAttempt(RID, "w1", 1, R.Outcome.SUCCEEDED, T0 + 9, 0, None, T0 + 6, big))
    assert s is not None and s.status is R.RunStatus.SUCCEEDED and s.output is None


def test_a_view_shows_non_json_output_as_text() -> None:
    s = ready()
    s, _ = step(s, R.ClaimRun(RID, "w1", T0 + 5))
    s, _ = step(s, R.CompleteAttempt(RID, "w1", 1, R.Outcome.SUCCEEDED, T0 + 9, 0, None, T0 + 6, "not json"))
    assert s is not None and run_view(s)["output"] == "not json"


@pytest.mark.parametrize("output", [None, '{"a":1}'])
def test_output_survives_the_codec(output: str | None) -> None:
    s = ready()
    s, _ = step(s, R.ClaimRun(RID, "w1", T0 + 5))
    cmd = R.CompleteAttempt(RID, "w1", 1, R.Outcome.SUCCEEDED, T0 + 9, 0, None, T0 + 6, output)
    assert decode(encode(cmd)) == cmd
    s, _ = step(s, cmd)
    assert s is not None and s.output == output and decode(encode(s)) == s


def test_an_async_handler_raising_timeout_error_fails_at_once() -> None:
    """Review finding: concurrent.futures.TimeoutError is TimeoutError (3.11+), so a
    handler's own TimeoutError looked like the poll timing out: the attempt spun until
    its timeout and was reported timed out instead of failed."""
    async def slow_upstream(ctx: Context) -> None:
        await asyncio.wait_for(asyncio.sleep(10), timeout=0.01)

    started = time.monotonic()
    result, _, _ = run(slow_upstream, timeout_s=30)
    assert result.outcome is R.Outcome.FAILED and "TimeoutError" in (result.error or ""), result
    assert time.monotonic() - started < 5
