"""Backfill on the real stack: API -> Kafka -> processor -> worker -> Cassandra -> API.

A job every 3 s whose runs take 5 s, with ``overlap: forbid``: every other slot is
recorded skipped ("overlap: ..."). Then the overlap is allowed and the range of slots so
far is backfilled: every slot of the range ends with exactly one run, the slots that ran
are left alone (same attempt count, nothing new), the skipped ones are reopened (the
run's note says why it had been skipped) and run. A second backfill sends nothing.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

import pytest
from harness import Stack, job_runs, wait_for

from gnomon.core.clock import iso_to_ms, ms_to_iso
from gnomon.core.jobs import slots_between
from gnomon.core.model import JobSpec, Schedule, Target, TargetType, slot_run_id

pytestmark = pytest.mark.integration

CRON = "*/3 * * * * *"



def runs(stack: Stack, job_id: str) -> list[dict[str, Any]]:
    return job_runs(stack, job_id, limit=200)


def test_backfill_reopens_skipped_slots_and_never_doubles_a_run(stack: Stack) -> None:
    body = {"name": f"e2e-backfill-{secrets.token_hex(3)}", "schedule": CRON,
            "target": {"type": "command", "argv": ["sleep", "5"]}, "timeoutS": 60, "retry": {"max": 1},
            "overlap": "forbid"}
    job_id = str(stack.client.create_job(body)["id"])

    def enough() -> bool:
        items = runs(stack, job_id)
        return (len([r for r in items if r["status"] == "skipped"]) >= 3
                and len([r for r in items if r["status"] == "succeeded"]) >= 2)

    wait_for(enough, 90, "three slots skipped for overlap and two run")
    stack.client.update_job(job_id, {"overlap": "allow"})  # the reopened slots run at once, side by side
    before = {r["id"]: r for r in runs(stack, job_id)}
    first = min(iso_to_ms(r["slot"]) for r in before.values())
    last = max(iso_to_ms(r["slot"]) for r in before.values() if r["status"] == "succeeded")
    skipped = {rid for rid, r in before.items() if r["status"] == "skipped" and first <= iso_to_ms(r["slot"]) <= last}
    ran = {rid: r for rid, r in before.items() if r["status"] == "succeeded"}
    assert skipped and ran
    assert all((before[rid]["reason"] or "").startswith("overlap:") for rid in skipped)

    out = stack.client.backfill(job_id, ms_to_iso(first), ms_to_iso(last))
    spec = JobSpec("x", Schedule(cron=CRON), Target(TargetType.COMMAND, argv=("true",)))
    slots = slots_between(spec, first, last, 1000)
    expected = {slot_run_id(job_id, s) for s in slots}
    assert out["slots"] == len(slots)
    assert set(out["alreadyRun"]) >= {rid for rid in ran if rid in expected}, "runs that ran are left alone"
    assert set(out["runIds"]) >= skipped, "every skipped slot is sent (reopened)"
    assert not set(out["runIds"]) & set(ran)

    def all_ran() -> bool:
        by_id = {r["id"]: r for r in runs(stack, job_id)}
        return all(by_id.get(rid, {}).get("status") == "succeeded" for rid in expected)

    wait_for(all_ran, 90, "every slot of the range ran")
    again = stack.client.backfill(job_id, ms_to_iso(first), ms_to_iso(last))
    assert again["sent"] == 0 and again["runIds"] == [], "a second backfill of a range that ran sends nothing"
    stack.client.pause(job_id)  # (a deleted job has no listing)
    time.sleep(1)
    items = runs(stack, job_id)
    in_range = [r for r in items if first <= iso_to_ms(r["slot"]) <= last and not r["manual"]]
    assert sorted(r["id"] for r in in_range) == sorted(expected), "exactly one run per slot of the range"
    by_id = {r["id"]: r for r in items}
    for rid, old in ran.items():  # not doubled, not touched
        assert by_id[rid]["attempt"] == old["attempt"] == 1, (rid, by_id[rid])
        assert by_id[rid]["startedAt"] == old["startedAt"] and by_id[rid]["reopens"] == 0
    for rid in skipped:
        r = by_id[rid]
        assert r["status"] == "succeeded" and r["reopens"] == 1 and r["backfill"], r
        assert (r["note"] or "").startswith("reopened by backfill (was skipped: overlap:"), r["note"]
