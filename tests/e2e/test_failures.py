"""Failures on the real stack that need a real process: a timeout that kills the
attempt, a cancel that stops a running one.

API -> Kafka -> processor -> worker (e2e-w1) -> projector -> Cassandra -> API.
Retries with backoff, dead letters and their replay, and cancelling a run staged ahead
of its slot run in the whole-system simulation under seeded faults
(tests/unit/test_sim_failures.py).
"""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path
from typing import Any

import pytest
from harness import Stack, wait_for

from gnomon.client import ApiError, Client
from gnomon.core.clock import ms_to_iso

pytestmark = pytest.mark.integration

POLL_S = 0.05  # fast enough to see a retry_wait of a few hundred ms in the history


def one_time_job(c: Client, ahead_s: float, argv: list[str], **over: Any) -> tuple[str, str]:
    """A one-time job ``ahead_s`` from now (whole second); returns (job id, its run id)."""
    at_ms = int(time.time() + ahead_s) * 1000
    body: dict[str, Any] = {"name": "e2e-fail-" + secrets.token_hex(3), "runAt": ms_to_iso(at_ms),
                            "target": {"type": "command", "argv": argv}, "timeoutS": 30, "retry": {"max": 1}}
    body.update(over)
    job_id = c.create_job(body)["id"]
    return job_id, f"{job_id}@{ms_to_iso(at_ms)}"


def get_run(c: Client, run_id: str) -> dict[str, Any] | None:
    try:
        return c.get_run(run_id)
    except ApiError as exc:
        if exc.status == 404:
            return None
        raise


def log_lines(c: Client, run_id: str) -> list[dict[str, Any]]:
    return c.get_logs(run_id)["items"]  # type: ignore[no-any-return]


def watch(c: Client, run_id: str, until: Any, timeout_s: float, what: str) -> list[dict[str, Any]]:
    """Poll the run quickly; every distinct view seen, until ``until(view)`` holds."""
    seen: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        view = get_run(c, run_id)
        if view is not None and (not seen or view != seen[-1]):
            seen.append(view)
        if view is not None and until(view):
            return seen
        time.sleep(POLL_S)
    states = [(v["status"], v["attempt"]) for v in seen]
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}; seen {states}")


def api_error(fn: Any, *args: Any) -> ApiError:
    with pytest.raises(ApiError) as info:
        fn(*args)
    return info.value


def processes_with(marker: str) -> list[int]:
    """Pids whose command line contains ``marker`` (other than this test process)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            cmdline = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline:
            out.append(int(d.name))
    return out


def test_timeout_kills_the_attempt_and_fails_the_run(stack: Stack) -> None:
    c = stack.client
    _, run_id = one_time_job(c, 3, ["sleep", "30"], timeoutS=2, retry={"max": 1})
    running = watch(c, run_id, lambda v: v["status"] in ("running", "failed"), 30, "the attempt to start")[-1]
    started = time.monotonic()
    final = watch(c, run_id, lambda v: v["status"] == "failed", 15, "the timed-out run to fail")[-1]
    assert time.monotonic() - started <= 10, "timeoutS 2 ended the run within ~10 s"
    assert running["status"] == "running" or final["attempt"] == 1
    assert final["attempt"] == 1 and "timed out" in (final["error"] or ""), final
    lines = wait_for(lambda: [x for x in log_lines(c, run_id) if "timed out" in x["line"]], 10, "the timeout log line")
    assert lines[0]["stream"] == "system" and "killed" in lines[0]["line"], lines


def test_cancel_a_running_attempt_stops_it(stack: Stack) -> None:
    c = stack.client
    marker = "e2e-cancel-" + secrets.token_hex(4)
    _, run_id = one_time_job(c, 3, ["sh", "-c", f"echo {marker}; sleep 60; echo never-{marker}"],
                             timeoutS=120, retry={"max": 1})
    watch(c, run_id, lambda v: v["status"] == "running", 30, "the attempt to run")
    wait_for(lambda: any(marker in x["line"] for x in log_lines(c, run_id)), 10, "the command's first line")
    assert processes_with(marker), "the command runs on this host"
    asked = time.monotonic()
    assert c.cancel(run_id) == {"runId": run_id, "accepted": "cancel"}
    final = watch(c, run_id, lambda v: v["status"] == "cancelled", 10, "cancelled")[-1]
    assert time.monotonic() - asked <= 10
    assert final["attempt"] == 1 and final["finishedAt"] is not None
    # the worker got the Stop: it killed the process group and logged it
    wait_for(lambda: not processes_with(marker), 10, "the command's processes to be killed")
    stop = wait_for(lambda: [x for x in log_lines(c, run_id) if x["stream"] == "system" and "stopped" in x["line"]],
                    10, "the worker's stop line")
    assert "cancel" in stop[0]["line"], stop
    # the attempt's late completion does not change the outcome
    time.sleep(2)
    after = get_run(c, run_id)
    assert after is not None and after["status"] == "cancelled" and after["finishedAt"] == final["finishedAt"], after
    assert not any(x["stream"] == "stdout" and f"never-{marker}" in x["line"] for x in log_lines(c, run_id))
    assert api_error(c.cancel, run_id).status == 409
