"""Overlap policies on the real stack: a job every 4 s whose runs take 10 s.

``forbid`` never has two runs going at once and records the slots it skipped
("overlap: ..."); ``replace`` cancels the running one ("replaced by ...") when the next
slot starts. API -> Kafka -> processor -> worker (sandboxed sleep) -> Cassandra -> API.
"""

from __future__ import annotations

import itertools
import secrets
import time
from typing import Any

import pytest
from harness import Stack, wait_for

from gnomon.client import ApiError
from gnomon.core.clock import iso_to_ms

pytestmark = pytest.mark.integration


def overlap_job(stack: Stack, overlap: str) -> str:
    body = {"name": f"e2e-overlap-{overlap}-{secrets.token_hex(3)}", "schedule": "*/4 * * * * *",
            "target": {"type": "command", "argv": ["sleep", "10"]}, "timeoutS": 60, "retry": {"max": 1},
            "overlap": overlap}
    return str(stack.client.create_job(body)["id"])


def runs(stack: Stack, job_id: str) -> list[dict[str, Any]]:
    try:
        return list(stack.client.list_runs(job_id, limit=100)["items"])
    except ApiError as exc:
        if exc.status == 404:  # history has not seen the job yet
            return []
        raise


def test_forbid_skips_slots_while_a_run_is_active(stack: Stack) -> None:
    job_id = overlap_job(stack, "forbid")
    wait_for(lambda: len([r for r in runs(stack, job_id) if r["status"] == "skipped"]) >= 3, 60,
             "three slots skipped for overlap")
    stack.client.pause(job_id)  # (a deleted job has no listing)
    time.sleep(1)
    items = runs(stack, job_id)
    skipped = [r for r in items if r["status"] == "skipped"]
    assert all((r["reason"] or "").startswith("overlap:") for r in skipped), [r["reason"] for r in skipped]
    spans = sorted((iso_to_ms(r["startedAt"]), iso_to_ms(r["finishedAt"]) if r["finishedAt"] else 10**15)
                   for r in items if r["startedAt"])
    assert spans, "some slot ran"
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert start >= end, f"two runs overlapped: {spans}"


def test_replace_cancels_the_running_one(stack: Stack) -> None:
    job_id = overlap_job(stack, "replace")
    wait_for(lambda: len([r for r in runs(stack, job_id) if r["status"] == "cancelled"]) >= 2, 60,
             "two runs replaced")
    stack.client.pause(job_id)  # (a deleted job has no listing)
    cancelled = [r for r in runs(stack, job_id) if r["status"] == "cancelled"]
    assert all("overlap: replace" in (r["reason"] or "") for r in cancelled), cancelled
    assert not [r for r in runs(stack, job_id) if (r["reason"] or "").startswith("overlap:")]
