"""The fire-time preview of a job (pure): its next slots within the schedule's bounds and
the runs its ``maxRuns`` leaves, each with its jittered start. What
``GET /v1/jobs/{id}/fires``, the job page and ``gnomon schedule next`` show, computed with
the scheduler's own slot code (``gnomon.core.schedule``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

from gnomon.core import schedule as slots
from gnomon.core.calendars import Calendar, excluded_by
from gnomon.core.clock import ms_to_iso
from gnomon.core.model import Schedule, jitter_offset_ms

FIRES_MAX = 1000


@dataclass(frozen=True)
class Fire:
    slot_ms: int
    start_ms: int  # the slot plus the job's jitter
    excluded_by: str | None = None  # a calendar that holds the slot's date: recorded skipped, not run

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
            runs_left: int | None = None, counted_before_ms: int | None = None,
            calendars: Sequence[Calendar] = ()) -> Preview:
    """The first ``count`` (at most ``FIRES_MAX``) slots strictly after ``after_ms``. A
    one-time schedule shows its instant if it is still ahead. ``runs_left``: the runs the
    schedule's ``max_runs`` still allows (None: all of ``max_runs``), for the slots at or
    after ``counted_before_ms`` (the job's next_run_at: the slots before it were
    triggered already, the lookahead's included, and are counted). A slot one of
    ``calendars`` holds is shown with the calendar's name: it will be recorded skipped,
    and is no run for ``max_runs``."""
    assert 0 < count <= FIRES_MAX, count
    left = schedule.max_runs if runs_left is None else runs_left

    def counted(slot: int) -> bool:
        return left is not None and (counted_before_ms is None or slot >= counted_before_ms)

    shown: list[int] = []
    excluded: dict[int, str] = {}
    slot = slots.next_after(schedule, after_ms)
    while slot is not None and len(shown) < count:
        name = excluded_by(calendars, slot) if calendars else None
        if name is not None:
            excluded[slot] = name
        elif counted(slot):
            assert left is not None
            if left == 0:
                break
            left -= 1
        shown.append(slot)
        slot = slots.next_after(schedule, slot)
    fires = tuple(Fire(s, s + (jitter_offset_ms(job_id, s, jitter_s) if schedule.run_at_ms is None else 0),
                       excluded.get(s)) for s in shown)
    ends: str | None = None
    if slot is not None and left == 0 and counted(slot) and not (calendars and excluded_by(calendars, slot)):
        ends = f"maxRuns: the last run is {ms_to_iso(shown[-1])}" if shown else "maxRuns reached"
    elif slot is None:
        if not shown:
            ends = "no slot left"
        elif schedule.run_at_ms is not None:
            ends = "one time"
        else:
            ends = f"the last slot is {ms_to_iso(shown[-1])}" + (
                f" (endAt {ms_to_iso(schedule.end_at_ms)})" if schedule.end_at_ms is not None else "")
    return Preview(fires, ends)
