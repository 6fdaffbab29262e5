"""The slots of a schedule: cron (wall clock in a zone), interval (absolute durations) or
one time, within the schedule's bounds. Pure; all instants are UTC epoch milliseconds.

* **cron**: ``gnomon.core.cron`` (Debian cron's DST rules).
* **interval** (``every_s``): the slots are ``anchor + k * every`` for k = 0, 1, 2...;
  the anchor is the schedule's ``anchor_ms`` (the API's ``from``), or the Unix epoch.
  Intervals are absolute durations: "every 24h" keeps 24 hours between slots across a
  DST change, so its wall time moves by an hour; a schedule that must keep its wall time
  is a cron expression. The zone does not shape an interval's slots.
* **after its upstreams** (none of them set, the job has ``after``): no slot of its own;
  every function here answers "none", except ``is_slot``, which accepts any instant a
  calendar holds (an upstream's slot: the job's logical times are its upstreams' slots,
  ``gnomon.core.dependencies``).
* **bounds**: no slot before ``start_at_ms`` nor after ``end_at_ms`` (both inclusive
  instants, the API's ``startAt``/``endAt``). ``max_runs`` is not a property of the slot
  sequence but of what the job already ran: ``gnomon.core.jobs`` counts it.

One function per question, used by the scheduler (``core.jobs``), the run processor
(``core.runs``), the history checker, admission and every preview (API, CLI, UI), so
that they all agree on what a slot is.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

from cronsim import CronSim

from gnomon.core.cron import CronSchedule
from gnomon.core.model import Schedule

# the latest instant a slot may be (9999-12-31T23:59:59Z): past it no calendar holds one
SLOT_MAX_MS = 253_402_300_799_000


def next_after(schedule: Schedule, after_ms: int) -> int | None:
    """The first slot strictly after ``after_ms`` within the bounds, or None."""
    if schedule.after_upstreams:
        return None
    lo = after_ms
    if schedule.start_at_ms is not None and schedule.start_at_ms - 1 > lo:
        lo = schedule.start_at_ms - 1
    slot = _unbounded_next_after(schedule, lo)
    if slot is None or (schedule.end_at_ms is not None and slot > schedule.end_at_ms):
        return None
    return slot


def first_at_or_after(schedule: Schedule, at_ms: int) -> int | None:
    return next_after(schedule, at_ms - 1)


def next_n(schedule: Schedule, after_ms: int, count: int) -> list[int]:
    """Up to ``count`` slots strictly after ``after_ms``, ascending."""
    out: list[int] = []
    slot = next_after(schedule, after_ms)
    while slot is not None and len(out) < count:
        out.append(slot)
        slot = next_after(schedule, slot)
    return out


def last_at_or_before(schedule: Schedule, until_ms: int, count: int) -> list[int]:
    """Up to ``count`` latest slots at or before ``until_ms`` within the bounds, newest first."""
    if schedule.after_upstreams:
        return []
    if schedule.end_at_ms is not None:
        until_ms = min(until_ms, schedule.end_at_ms)
    lo = schedule.start_at_ms
    if schedule.run_at_ms is not None:
        hit = schedule.run_at_ms <= until_ms and (lo is None or schedule.run_at_ms >= lo)
        return [schedule.run_at_ms] if hit and count > 0 else []
    if schedule.every_s is not None:
        out = _interval_last(schedule, until_ms, count)
    else:
        out = _cron_last(schedule, until_ms, count)
    return [s for s in out if lo is None or s >= lo]


def is_slot(schedule: Schedule, ms: int) -> bool:
    """Is ``ms`` one of the schedule's slots? False (never an error) for any instant no
    calendar holds: a forged or corrupt slot read from a topic."""
    if not 0 <= ms <= SLOT_MAX_MS:
        return False
    if schedule.after_upstreams:
        return True  # (any upstream's slot is one of its logical times)
    try:
        return next_after(schedule, ms - 1) == ms
    except (ValueError, OverflowError, OSError):
        return False


def shortest_gap_ms(schedule: Schedule, from_ms: int, sample: int) -> int | None:
    """The shortest gap between two of the next ``sample`` slots after ``from_ms``
    (ignoring the bounds: what the schedule *can* do), or None for a one-time schedule
    and for one after its upstreams (its logical times are all its upstreams' slots
    together: with fan-in of upstreams on offset schedules it may fire up to
    ``UPSTREAMS_MAX`` times as often as the most frequent of them, each of which passed
    the tenant's ``interval_min_s``; its runs pass the tenant's run limits like any)."""
    if schedule.run_at_ms is not None or schedule.after_upstreams:
        return None
    if schedule.every_s is not None:
        return schedule.every_s * 1000
    assert schedule.cron is not None
    fires = CronSchedule(schedule.cron, schedule.tz).next_n(from_ms, sample)
    gaps = [b - a for a, b in itertools.pairwise(fires)]
    return min(gaps) if gaps else None


def anchor_of(schedule: Schedule) -> int:
    """An interval's first possible slot (the epoch unless ``anchor_ms`` says otherwise)."""
    return schedule.anchor_ms if schedule.anchor_ms is not None else 0


# ---- per kind --------------------------------------------------------------------------


def _unbounded_next_after(schedule: Schedule, after_ms: int) -> int | None:
    if schedule.run_at_ms is not None:
        return schedule.run_at_ms if schedule.run_at_ms > after_ms else None
    if schedule.every_s is not None:
        return _interval_next_after(anchor_of(schedule), schedule.every_s * 1000, after_ms)
    assert schedule.cron is not None, "a schedule has cron, every_s or run_at_ms"
    return CronSchedule(schedule.cron, schedule.tz).next_after(after_ms)


def _interval_next_after(anchor_ms: int, every_ms: int, after_ms: int) -> int | None:
    assert every_ms > 0
    if after_ms < anchor_ms:
        return anchor_ms
    k = (after_ms - anchor_ms) // every_ms + 1
    slot = anchor_ms + k * every_ms
    return slot if slot <= SLOT_MAX_MS else None


def _interval_last(schedule: Schedule, until_ms: int, count: int) -> list[int]:
    assert schedule.every_s is not None
    anchor, every = anchor_of(schedule), schedule.every_s * 1000
    if until_ms < anchor or count <= 0:
        return []
    last = anchor + (until_ms - anchor) // every * every
    return [last - i * every for i in range(count) if last - i * every >= anchor]


def _cron_last(schedule: Schedule, until_ms: int, count: int) -> list[int]:
    assert schedule.cron is not None
    if count <= 0:
        return []
    zone = ZoneInfo(schedule.tz)
    start = datetime.fromtimestamp(until_ms / 1000 + 1, tz=UTC).astimezone(zone).replace(microsecond=0)
    out: list[int] = []
    for dt in CronSim(schedule.cron, start, reverse=True):
        ms = int(dt.timestamp()) * 1000
        if ms > until_ms:
            continue
        out.append(ms)
        if len(out) >= count:
            break
    return out
