"""Intervals and bounds on the real stack (docs/schedules.md): API -> Kafka (JobSpec v7)
-> processor -> worker -> Cassandra -> API. A job every 2 s from an anchor, with
``maxRuns: 3``, runs exactly three slots on the anchor's grid, then shows ``done`` with the
reason, and its fire-time preview is empty."""

from __future__ import annotations

import secrets
import time
from typing import Any

import pytest
from harness import Stack, job_runs, wait_for

from gnomon.core.clock import iso_to_ms, ms_to_iso

pytestmark = pytest.mark.integration



def runs(stack: Stack, job_id: str) -> list[dict[str, Any]]:
    return job_runs(stack, job_id, limit=50)


def test_an_interval_with_max_runs_runs_that_many_slots_then_is_done(stack: Stack) -> None:
    anchor = (int(time.time()) + 3) * 1000 + 1000  # whole seconds, a little ahead
    body = {"name": f"e2e-interval-{secrets.token_hex(3)}", "every": "2s", "from": ms_to_iso(anchor),
            "maxRuns": 3, "target": {"type": "command", "argv": ["true"]}, "timeoutS": 30, "retry": {"max": 1}}
    job = stack.client.create_job(body)
    job_id = str(job["id"])
    assert (job["every"], job["from"], job["maxRuns"]) == ("2s", ms_to_iso(anchor), 3)
    # (from before the anchor: on a slow machine the create's answer may come after the
    # first slot, or after the lookahead triggered all three and ended the job)
    ahead = stack.client.job_fires(job_id, count=10, after=ms_to_iso(anchor - 1000))
    assert [f["slot"] for f in ahead["fires"]] == [ms_to_iso(anchor + i * 2000) for i in range(3)]
    assert ahead["ends"] == f"maxRuns: the last run is {ms_to_iso(anchor + 4000)}"

    def done() -> bool:
        return stack.client.get_job(job_id)["status"] == "done" and \
            len([r for r in runs(stack, job_id) if r["status"] == "succeeded"]) == 3

    wait_for(done, 60, "three runs, then the job done")
    time.sleep(3)  # a fourth slot would be due by now
    items = runs(stack, job_id)
    assert sorted(iso_to_ms(r["slot"]) for r in items) == [anchor, anchor + 2000, anchor + 4000], items
    assert all(r["status"] == "succeeded" for r in items)
    final = stack.client.get_job(job_id)
    assert final["scheduledRuns"] == 3 and final["nextRunAt"] is None
    assert final["endedBecause"] == "maxRuns reached (3 of 3 runs)"
    after = stack.client.job_fires(job_id)
    assert after["fires"] == [] and after["endedBecause"] == final["endedBecause"]
