"""Issue 51: a run staged on a worker that is killed -9 starts on another worker within
seconds of the kill, using none of its attempts.

Before: a run staged on the killed worker and due 4 s later never started there; its
worker was found lost 4 s after the kill (after its slot), so its lease decided: it
failed "lease lost" 30 s later, using its only attempt (``retry.max`` 1). Now a worker
is lost after 2 s of silence and every attempt it had not reported started moves at
once (a worker starts one only once Kafka took its start report).

The session stack's processor, projector and API; two workers of this test's own, in a
pool of their own, so no other worker takes the run. CI mode asserts 2x the bar (3 s)
and prints the figure.
"""

from __future__ import annotations

import os
import secrets
import signal
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from harness import Stack, wait_for

from gnomon.client import ApiError
from gnomon.core.clock import ms_to_iso

pytestmark = pytest.mark.integration

POOL = "batch"  # a pool of the topology no other e2e worker serves
BAR_S = 3.0
CI_FACTOR = 2.0


def _run_or_none(stack: Stack, run_id: str) -> dict[str, Any] | None:
    try:
        return stack.client.get_run(run_id)
    except ApiError as exc:
        if exc.status == 404:
            return None
        raise


def _worker(stack: Stack, name: str, policy: Path) -> tuple[Any, str]:
    worker_id = f"{name}-{secrets.token_hex(3)}"
    proc = stack.start(name, "worker", "--worker-id", worker_id, "--pool", POOL, "--tenant", "acme",
                       "--concurrency", "2", "--policy", str(policy))
    return proc, worker_id


def test_a_run_staged_on_a_worker_killed_9_starts_elsewhere_within_seconds_using_no_attempt(
        stack: Stack, tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text('tenants = ["acme"]\n[commands]\nenabled = true\nexecutables = ["sh"]\n')
    first, first_id = _worker(stack, "loss-w1", policy)
    try:
        slot_ms = (int(time.time()) + 12) * 1000
        body = {"name": "loss-" + secrets.token_hex(3), "runAt": ms_to_iso(slot_ms), "pool": POOL,
                "target": {"type": "command", "argv": ["sh", "-c", "echo ran on $GNOMON_RUN_ID"]},
                "timeoutS": 30, "retry": {"max": 1}}
        job_id = stack.client.create_job(body)["id"]
        run_id = f"{job_id}@{ms_to_iso(slot_ms)}"
        staged = wait_for(lambda: (r := _run_or_none(stack, run_id)) and r["staged"] and r["worker"] == first_id
                          and r, 10, "the run staged on worker 1")
        assert staged["attempt"] == 1
        _, second_id = _worker(stack, "loss-w2", policy)
        # worker 2 advertises itself; then worker 1 dies 1 s before the slot: found lost
        # only after the slot has passed (before issue 51 its lease decided then)
        time.sleep(max(0.0, slot_ms / 1000 - 1 - time.time()))
        assert time.time() < slot_ms / 1000, "too late to kill worker 1 before the slot"
        os.killpg(first.pid, signal.SIGKILL)
        killed_s = time.time()
        first.wait(10)
        stack.procs.pop("loss-w1")
        run = wait_for(lambda: (r := _run_or_none(stack, run_id)) and r["status"] == "succeeded" and r, 40,
                       "the run to succeed on worker 2")
        stack.client.delete(job_id)  # a one-time job that ran is done; this only tidies
    finally:
        for name in ("loss-w1", "loss-w2"):
            if name in stack.procs:
                stack.stop(name)
    started_s = datetime.fromisoformat(run["startedAt"]).timestamp()
    after_s = started_s - max(killed_s, slot_ms / 1000)
    print(f"worker 1 killed {slot_ms / 1000 - killed_s:.1f} s before the slot; the run started on worker 2 "
          f"{started_s - killed_s:.2f} s after the kill ({after_s:+.2f} s past max(kill, slot)); bar {BAR_S:g} s")
    assert run["worker"] == second_id and run["attempt"] == 1, run  # no attempt used by the dead worker
    assert after_s <= BAR_S * CI_FACTOR, f"started {started_s - killed_s:.2f} s after the kill"
