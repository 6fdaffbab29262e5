"""The next fire times of a job, in its own zone, with the scheduler's own cron code
(``gnomon.core.cron``, as ``gnomon cron next``), and the jittered start of each (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

from gnomon.core.clock import iso_to_ms, ms_to_iso
from gnomon.core.cron import CronSchedule
from gnomon.core.errors import ValidationError
from gnomon.core.model import jitter_offset_ms

FIRES_SHOWN = 10


@dataclass(frozen=True)
class Fire:
    slot_utc: str  # ISO-8601, Z
    local: str  # wall time in the job's zone, with its abbreviation
    start_utc: str  # slot + the job's jitter (the slot itself without jitter)


def next_fires(job: Mapping[str, Any], now_ms: int, count: int = FIRES_SHOWN) -> list[Fire]:
    """The next ``count`` slots after ``now_ms`` of ``job`` (a job view, as
    ``GET /v1/jobs/{id}`` returns it); a one-time job's single instant if still ahead."""
    zone_name = str(job.get("timezone") or "UTC")
    zone = ZoneInfo(zone_name)
    jitter_s = int(job.get("jitterS") or 0)
    if job.get("schedule"):
        try:
            slots = CronSchedule.parse(str(job["schedule"]), zone_name).next_n(now_ms, count)
        except ValidationError:
            return []
    elif job.get("runAt"):
        at_ms = iso_to_ms(str(job["runAt"]))
        slots = [at_ms] if at_ms > now_ms else []
    else:
        return []
    out = []
    for slot in slots:
        local = datetime.fromtimestamp(slot / 1000, tz=UTC).astimezone(zone)
        start = slot + jitter_offset_ms(str(job["id"]), slot, jitter_s) if job.get("schedule") else slot
        out.append(Fire(ms_to_iso(slot), f"{local.strftime('%Y-%m-%d %H:%M:%S')} {local.tzname()}", ms_to_iso(start)))
    return out
