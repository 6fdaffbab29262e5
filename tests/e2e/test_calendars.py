"""Exclusion calendars on the real stack (docs/schedules.md "Calendars"): the API writes
the calendar to gnomon.calendars, every processor reads it (under its own Kafka principal
and ACLs), and a job excluding today's date has its slots recorded skipped with the
reason, never run; a job naming a calendar its tenant does not have is refused by the
processor (422 naming the field)."""

from __future__ import annotations

import secrets
import time
from typing import Any

import pytest
from harness import Stack, job_runs, wait_for

from gnomon.client import ApiError

pytestmark = pytest.mark.integration



def runs(stack: Stack, job_id: str) -> list[dict[str, Any]]:
    return job_runs(stack, job_id, limit=50)


def test_a_calendar_excluding_today_records_the_slots_skipped_with_the_reason(stack: Stack) -> None:
    name = f"e2e-{secrets.token_hex(3)}"
    today = time.strftime("%Y-%m-%d", time.gmtime())
    # yesterday to tomorrow: a run that crosses midnight still has every slot excluded
    days = [time.strftime("%Y-%m-%d", time.gmtime(time.time() + d * 86_400)) for d in (-1, 0, 1)]
    with pytest.raises(ApiError) as refused:
        stack.client.create_job({"name": "unknown-calendar", "schedule": "*/2 * * * * *", "excludeCalendars": [name],
                                 "target": {"type": "command", "argv": ["true"]}})
    assert refused.value.status == 422 and "excludeCalendars[0]" in str(refused.value)
    view = stack.client.put_calendar(name, {"timezone": "UTC", "dates": days})
    assert view["days"] == 3 and today in days
    job = stack.client.create_job({"name": f"e2e-calendar-{name}", "schedule": "*/2 * * * * *",
                                   "excludeCalendars": [name], "target": {"type": "command", "argv": ["true"]},
                                   "timeoutS": 30})
    job_id = str(job["id"])
    ahead = stack.client.job_fires(job_id, count=3)
    assert all(f["excludedBy"] == name for f in ahead["fires"]), ahead

    def skipped() -> bool:
        return len([r for r in runs(stack, job_id) if r["status"] == "skipped"]) >= 3

    wait_for(skipped, 60, "three slots recorded skipped by the calendar")
    items = runs(stack, job_id)
    assert {r["reason"] for r in items} == {f"calendar {name}"}, items
    assert not [r for r in items if r["startedAt"] is not None], "no slot on an excluded date ran"
    with pytest.raises(ApiError) as in_use:
        stack.client.delete_calendar(name)
    assert in_use.value.status == 409
    stack.client.delete(job_id)
