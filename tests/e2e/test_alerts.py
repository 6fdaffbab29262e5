"""Alerts end to end: the tenant sets its webhook through the API, the alerter (its own
process, Kafka role ``alerter``) reads the run ledger, and a receiver on this host gets
a signed call for a dead letter, a late start and a skipped slot; the first call is
answered 500 and that alert arrives again.

API -> gnomon.alert-configs -> alerter; API -> processor -> worker -> gnomon.runs -> alerter
-> the receiver (127.0.0.1, allowed by GNOMON_ALERT_ALLOWED_CIDRS / --allowed-cidr).
"""

from __future__ import annotations

import contextlib
import json
import secrets
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from harness import NEVER_DUE, Stack, wait_for

from gnomon.client import ApiError, Client
from gnomon.core.clock import ms_to_iso
from gnomon.outbound.http import verify_signature

pytestmark = pytest.mark.integration

SIGNING_KEY = "e2e-alert-key-" + secrets.token_hex(8)


class AlertReceiver(BaseHTTPRequestHandler):
    calls: list[dict[str, Any]] = []
    lock = threading.Lock()

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        with AlertReceiver.lock:
            status = 500 if not AlertReceiver.calls else 200  # the very first call fails
            AlertReceiver.calls.append({"headers": dict(self.headers), "body": body, "status": status,
                                        "at": time.time()})
        self.send_response(status)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[str]:
    AlertReceiver.calls = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), AlertReceiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/gnomon-alerts"
    server.shutdown()


def known(c: Client, job_id: str) -> bool:
    try:
        c.get_job(job_id)
    except ApiError as exc:
        if exc.status == 404:
            return False
        raise
    return True


def delivered(job_id: str, kind: str) -> list[dict[str, Any]]:
    """The 2xx calls of ``kind`` about ``job_id``, bodies decoded."""
    with AlertReceiver.lock:
        calls = list(AlertReceiver.calls)
    out = []
    for c in calls:
        doc = json.loads(c["body"])
        if c["status"] == 200 and doc["jobId"] == job_id and doc["kind"] == kind:
            out.append({**c, "doc": doc})
    return out


def test_dead_letter_late_and_skipped_alerts_arrive_signed_and_a_failed_call_is_retried(
        stack: Stack, receiver: str, tmp_path: Path) -> None:
    c = stack.client
    view = c.set_alerts({"url": receiver})  # every kind; late only for jobs with alertLateS
    assert view["configured"] and view["url"] == receiver and view["tenant"] == "acme", view
    assert c.get_alerts() == view

    secrets_dir = tmp_path / "secrets"
    (secrets_dir / "acme").mkdir(parents=True, mode=0o700)
    secrets_dir.chmod(0o700)
    key_file = secrets_dir / "acme" / "http-signing-key"
    key_file.write_text(SIGNING_KEY)
    key_file.chmod(0o600)
    group = "gnomon-alerter-e2e-" + secrets.token_hex(4)  # a new group: starts at the ledger's end
    stack.start("alerter", "alerter", "--secrets-dir", str(secrets_dir), "--allowed-cidr", "127.0.0.1/32",
                "--group-id", group, "--backoff-s", "0.5", "--attempts-max", "5", "--timeout-s", "5")
    log_file = stack.logs / "alerter.log"
    made: list[str] = []  # jobs to delete at the end
    try:
        wait_for(lambda: "assigned" in log_file.read_text(), 60, "the alerter to be assigned the ledger")
        tag = secrets.token_hex(3)
        # a dead letter: one attempt, exits 3
        at_ms = int(time.time() + 3) * 1000
        dead_job = c.create_job({"name": f"e2e-alert-dead-{tag}", "runAt": ms_to_iso(at_ms),
                                 "target": {"type": "command", "argv": ["sh", "-c", "exit 3"]},
                                 "timeoutS": 30, "retry": {"max": 1}})["id"]
        made.append(dead_job)
        # a late start: threshold 0 s; a manual run starts after its request went through Kafka
        created = c.create_job({"name": f"e2e-alert-late-{tag}", "schedule": NEVER_DUE,
                                "target": {"type": "command", "argv": ["true"]}, "alertLateS": 0})
        assert created["alertLateS"] == 0
        late_job = created["id"]
        made.append(late_job)
        wait_for(lambda: known(c, late_job), 30, "the late job in history")  # the API triggers known jobs
        late_run = c.trigger(late_job, "late-" + tag)
        # skipped slots: a run every second that takes 5 s, overlap forbid
        skip_job = c.create_job({"name": f"e2e-alert-skip-{tag}", "schedule": "* * * * * *",
                                 "target": {"type": "command", "argv": ["sleep", "5"]}, "timeoutS": 30,
                                 "retry": {"max": 1}, "overlap": "forbid"})["id"]
        try:
            skipped = wait_for(lambda: delivered(skip_job, "skipped"), 60, "a skipped alert")
        finally:
            c.delete(skip_job)
        late = wait_for(lambda: delivered(late_job, "late"), 60, "a late alert")
        dead = wait_for(lambda: delivered(dead_job, "dead_letter"), 60, "a dead-letter alert")
    finally:
        stack.stop("alerter")
        c.delete_alerts()  # leave acme without a webhook (the receiver is gone after the test)
        for job in made:
            with contextlib.suppress(ApiError):  # a finished one-time job may be gone already
                c.delete(job)

    # what each alert says
    (late_call,) = late
    assert late_call["doc"]["runId"] == late_run and late_call["doc"]["lateThresholdS"] == 0
    assert late_call["doc"]["startLagS"] > 0
    (dead_call,) = dead
    assert dead_call["doc"]["runId"] == f"{dead_job}@{ms_to_iso(at_ms)}"
    assert dead_call["doc"]["status"] == "failed" and dead_call["doc"]["attempts"] == 1, dead_call["doc"]
    assert dead_call["doc"]["idempotencyKey"] == f"{dead_call['doc']['runId']}:dead_letter:0"
    assert skipped[0]["doc"]["reason"].startswith("overlap:"), skipped[0]["doc"]
    # every call is signed with the tenant's key, like an HTTP target, and names its key
    with AlertReceiver.lock:
        calls = list(AlertReceiver.calls)
    for call in calls:
        h, doc = call["headers"], json.loads(call["body"])
        assert verify_signature(SIGNING_KEY.encode(), h["X-Gnomon-Timestamp"], call["body"],
                                h["X-Gnomon-Signature"], call["at"]), h
        assert not verify_signature(b"not-the-key", h["X-Gnomon-Timestamp"], call["body"],
                                    h["X-Gnomon-Signature"], call["at"])
        assert h["Idempotency-Key"] == doc["idempotencyKey"] and h["X-Gnomon-Tenant"] == "acme"
    # the first call was answered 500; the same alert (same key) came again and got through
    first = calls[0]
    assert first["status"] == 500
    key = json.loads(first["body"])["idempotencyKey"]
    again = [x for x in calls[1:] if json.loads(x["body"])["idempotencyKey"] == key]
    assert again and again[0]["status"] == 200 and again[0]["at"] - first["at"] >= 0.4, again
    # no transition alerted twice once delivered (a repeat only after a failed call)
    ok_keys = [json.loads(x["body"])["idempotencyKey"] for x in calls if x["status"] == 200]
    assert len(ok_keys) == len(set(ok_keys)), ok_keys
    text = log_file.read_text()
    assert f"alert {key}: call 1/5 failed" in text, text[-2000:]
