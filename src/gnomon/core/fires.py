"""The fire-time preview of a job (pure): its next slots within the schedule's bounds and
the runs its ``maxRuns`` leaves, each with its jittered start. What
``GET /v1/jobs/{id}/fires``, the job page and ``gnomon schedule next`` show, computed with
the scheduler's own slot code (``gnomon.core.schedule``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

from gnomon.core import schedule as slots
from gnomon.core.clock import ms_to_iso
from gnomon.core.model import Schedule, jitter_offset_ms

FIRES_MAX = 1000


@dataclass(frozen=True)
class Fire:
    slot_ms: int
    start_ms: int  # the slot plus the job's jitter

    def local(self, tz: str) -> str:
        """The slot's wall time in zone ``tz`` with the zone's abbreviation."""
        dt = datetime.fromtimestamp(self.slot_ms / 1000, tz=UTC).astimezone(ZoneInfo(tz))
        return f"{dt.strftime('%Y-%m-%d %H:%M:%S')} {dt.tzname()}"


@dataclass(frozen=True)
class Preview:
    fires: tuple[Fire, ...]
    # the schedule has no slot after the last one shown (its endAt or maxRuns ends it), or
    # None while it goes on
    ends: str | None


def preview(schedule: Schedule, *, after_ms: int, count: int, job_id: str = "", jitter_s: int = 0,
            runs_left: int | None = None) -> Preview:
    """The first ``count`` (at most ``FIRES_MAX``) slots strictly after ``after_ms``. A
    one-time schedule shows its instant if it is still ahead. ``runs_left``: what the
    schedule's ``max_runs`` still allows (None: its full ``max_runs``)."""
    assert 0 < count <= FIRES_MAX, count
    if runs_left is None:
        runs_left = schedule.max_runs
    cap = count if runs_left is None else min(count, runs_left)
    found = slots.next_n(schedule, after_ms, cap + 1)
    shown = found[:cap]
    fires = tuple(Fire(s, s + (jitter_offset_ms(job_id, s, jitter_s) if schedule.run_at_ms is None else 0))
                  for s in shown)
    ends: str | None = None
    if len(found) <= cap or (runs_left is not None and len(shown) == runs_left):
        if not shown:
            ends = "no slot left"
        elif runs_left is not None and len(shown) == runs_left and len(found) > len(shown):
            ends = f"maxRuns: the last run is {ms_to_iso(shown[-1])}"
        elif schedule.run_at_ms is not None:
            ends = "one time"
        else:
            ends = f"the last slot is {ms_to_iso(shown[-1])}" + (
                f" (endAt {ms_to_iso(schedule.end_at_ms)})" if schedule.end_at_ms is not None else "")
    return Preview(fires, ends)
