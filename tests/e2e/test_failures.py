"""Failures on the real stack: retries with backoff, dead letters and their replay,
timeouts, cancelling a queued run and a running attempt.

API -> Kafka -> processor -> worker (e2e-w1) -> projector -> Cassandra -> API.
"""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path
from typing import Any

import pytest
from harness import OTHER_TOKEN, Stack, wait_for

from gnomon.client import ApiError, Client
from gnomon.core.clock import iso_to_ms, ms_to_iso

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


def ledger_states(run_id: str) -> list[Any]:
    """Every state the run ledger (gnomon.runs) recorded for ``run_id``, in order."""
    from confluent_kafka import Consumer, TopicPartition

    from gnomon import codec
    from gnomon.adapters.kafka import consumer_config, partition_for
    from gnomon.config import load
    from gnomon.topology import load_topology

    topo = load_topology()
    tp = TopicPartition(topo.runs, partition_for(run_id.split("@", 1)[0], topo.partitions))
    c = Consumer(consumer_config(load().kafka_bootstrap, "e2e-ledger-reader"))
    try:
        low, high = c.get_watermark_offsets(tp, 10)
        c.assign([TopicPartition(tp.topic, tp.partition, low)])
        out, pos, deadline = [], low, time.monotonic() + 30
        while pos < high and time.monotonic() < deadline:
            for msg in c.consume(1000, 0.5):
                if msg.error():
                    continue
                pos = msg.offset() + 1
                if msg.key() == run_id.encode() and msg.value():
                    out.append(codec.decode(msg.value()))
        return out
    finally:
        c.close()


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


def test_retries_with_backoff_then_dead_letter_then_replay(stack: Stack) -> None:
    c = stack.client
    job_id, run_id = one_time_job(c, 3, ["sh", "-c", "echo attempt $GNOMON_ATTEMPT; exit 7"],
                                  retry={"max": 3, "backoffS": 1})
    seen = watch(c, run_id, lambda v: v["status"] == "failed", 45, "the run to exhaust its 3 attempts")
    final = seen[-1]
    assert (final["attempt"], final["maxAttempts"], final["exitCode"], final["replays"]) == (3, 3, 7, 0), final
    assert final["finishedAt"] is not None and final["nextAttemptAt"] is None

    # The history may skip a short retry_wait (attempts now start the moment the backoff
    # ends), so the retry waits are read from the run ledger itself, every state of it.
    waits = [r for r in ledger_states(run_id) if r.status.value == "retry_wait"]
    assert [r.attempt for r in waits] == [1, 2], [(r.status.value, r.attempt) for r in ledger_states(run_id)]
    for r in waits:
        assert r.exit_code == 7 and r.next_attempt_at_ms is not None, r
        # full jitter: the next attempt is released within backoffS * 2**(attempt-1) of the failure
        assert 0 <= r.next_attempt_at_ms - r.updated_at_ms <= 1000 * 2 ** (r.attempt - 1), r
    attempts_logged = {x["attempt"] for x in log_lines(c, run_id)}
    assert attempts_logged == {1, 2, 3}

    # a dead letter of this tenant, not of another one
    dead = wait_for(lambda: next((r for r in c.dead_letters(limit=500)["items"] if r["id"] == run_id), None),
                    15, "the run in GET /v1/dead-letters")
    assert dead["status"] == "failed" and dead["jobId"] == job_id
    other = Client(stack.api_url, OTHER_TOKEN)
    assert run_id not in {r["id"] for r in other.dead_letters(limit=500)["items"]}
    assert api_error(other.replay, run_id).status == 404
    assert api_error(c.cancel, run_id).status == 409  # already finished

    assert c.replay(run_id) == {"runId": run_id, "accepted": "replay"}
    replayed = watch(c, run_id, lambda v: v["attempt"] >= 4, 30, "attempt 4 after the replay")[-1]
    assert replayed["replays"] == 1 and replayed["maxAttempts"] == 6, replayed
    wait_for(lambda: 4 in {x["attempt"] for x in log_lines(c, run_id)}, 15, "logs of attempt 4")
    # no longer a dead letter while it runs again
    wait_for(lambda: run_id not in {r["id"] for r in c.dead_letters(limit=500)["items"]}
             or get_run(c, run_id)["status"] == "failed",  # type: ignore[index]
             10, "the replayed run to leave the dead letters")
    # the fresh budget can take a while (backoff grows with the attempt number); stop it
    view = get_run(c, run_id)
    assert view is not None
    if view["status"] != "failed":
        c.cancel(run_id)
        watch(c, run_id, lambda v: v["status"] in ("cancelled", "failed"), 15, "the replayed run to stop")


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


def test_cancel_a_queued_run_it_never_runs(stack: Stack) -> None:
    c = stack.client
    job_id, run_id = one_time_job(c, 20, ["sh", "-c", "echo must-not-run"])
    slot_ms = iso_to_ms(run_id.split("@", 1)[1])
    # pre-staging: within the lookahead the run is granted to a worker ahead of its slot
    queued = watch(c, run_id, lambda v: v["staged"], 15, "the run staged on a worker")[-1]
    assert queued["status"] == "running" and queued["startedAt"] is None and queued["grantedAt"], queued
    assert time.time() * 1000 < slot_ms - 5000, "the run exists well before its slot (lookahead)"
    assert c.cancel(run_id) == {"runId": run_id, "accepted": "cancel"}
    final = watch(c, run_id, lambda v: v["status"] == "cancelled", 10, "cancelled")[-1]
    assert final["attempt"] == 0 and final["startedAt"] is None
    assert api_error(c.replay, run_id).status == 409  # not a dead letter
    assert api_error(Client(stack.api_url, OTHER_TOKEN).cancel, run_id).status == 404
    # past its slot: still cancelled, no attempt, no log line
    time.sleep(max(0.0, slot_ms / 1000 - time.time()) + 3)
    after = get_run(c, run_id)
    assert after is not None and after["status"] == "cancelled" and after["attempt"] == 0, after
    assert log_lines(c, run_id) == []
    assert [r["id"] for r in c.list_runs(job_id)["items"]] == [run_id]


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
