"""Exclusion calendars: a tenant's named lists of dates (or date ranges) in a zone
(docs/schedules.md, "Calendars"; docs/adr/0011). A job names the calendars it excludes
(``JobSpec.exclude_calendars``); a slot whose local date, in a calendar's zone, is on one
of them is recorded skipped with reason ``calendar <name>`` instead of running.

``Calendar`` is the value of the compacted topic ``gnomon.calendars`` (key
``<tenant>/<name>``; a tombstone deletes it), written by the API (``PUT
/v1/calendars/{name}``) and read whole by every processor and API instance into a
``CalendarBook``. Pure: parsing with the API's rules, the date check, the book.
"""

from __future__ import annotations

import bisect
import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any
from zoneinfo import ZoneInfo

from gnomon.core.cron import load_zone
from gnomon.core.errors import ValidationError

CALENDARS_PER_TENANT_MAX = 100
DATES_MAX = 1000  # dates or ranges in one calendar
RANGE_DAYS_MAX = 366
NAME_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")
_FIELDS = frozenset({"timezone", "dates"})


@dataclass(frozen=True)
class DateRange:
    """Every date from ``first`` to ``last`` inclusive (ISO dates, ``first <= last``)."""

    first: str
    last: str


@dataclass(frozen=True)
class Calendar:
    tenant: str
    name: str
    tz: str
    ranges: tuple[DateRange, ...]
    updated_at_ms: int

    @property
    def key(self) -> str:
        return calendar_key(self.tenant, self.name)

    def excludes(self, slot_ms: int) -> bool:
        """Is the slot's local date (in this calendar's zone) one of the calendar's?"""
        starts, ends = _spans(self.ranges)
        day = _local_ordinal(slot_ms, self.tz)
        i = bisect.bisect_right(starts, day) - 1
        return i >= 0 and day <= ends[i]

    def days(self) -> int:
        return sum(date.fromisoformat(r.last).toordinal() - date.fromisoformat(r.first).toordinal() + 1
                   for r in self.ranges)


def calendar_key(tenant: str, name: str) -> str:
    return f"{tenant}/{name}"


def check_name(name: object, field: str = "name") -> str:
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise ValidationError(field, "must be a calendar name: 1-63 of a-z 0-9 . _ - (a letter or digit first)")
    return name


def _date(value: object, field: str) -> date:
    if not isinstance(value, str) or len(value) != 10:
        raise ValidationError(field, f"must be an ISO date such as 2026-12-25, got {value!r}")
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise ValidationError(field, f"must be an ISO date such as 2026-12-25, got {value!r}") from None


def parse_calendar(tenant: str, name: str, data: Any, now_ms: int) -> Calendar:
    """A calendar from the API's JSON: ``{"timezone": "Europe/London", "dates":
    ["2026-12-25", {"from": "2026-12-24", "to": "2026-12-26"}]}``, or ValidationError
    naming the field. Ranges are sorted and overlapping ones merged."""
    check_name(name)
    if not isinstance(data, Mapping):
        raise ValidationError("body", "must be a JSON object with timezone and dates")
    for key in data:
        if key not in _FIELDS:
            raise ValidationError(str(key), f"unknown field; allowed: {', '.join(sorted(_FIELDS))}")
    tz = data.get("timezone", "UTC")
    if not isinstance(tz, str):
        raise ValidationError("timezone", "must be an IANA zone name such as Europe/London")
    load_zone(tz, "timezone")
    dates = data.get("dates")
    if not isinstance(dates, list):
        raise ValidationError("dates", 'must be a list of dates ("2026-12-25") or ranges ({"from", "to"})')
    if len(dates) > DATES_MAX:
        raise ValidationError("dates", f"has {len(dates)} entries; at most {DATES_MAX}")
    spans: list[tuple[date, date]] = []
    for i, item in enumerate(dates):
        field = f"dates[{i}]"
        if isinstance(item, Mapping):
            unknown = set(item) - {"from", "to"}
            if unknown:
                raise ValidationError(f"{field}.{sorted(unknown)[0]}", "unknown field; allowed: from, to")
            first, last = _date(item.get("from"), f"{field}.from"), _date(item.get("to"), f"{field}.to")
            if last < first:
                raise ValidationError(f"{field}.to", f"{last} is before from ({first})")
            if (last - first).days + 1 > RANGE_DAYS_MAX:
                raise ValidationError(f"{field}.to", f"a range is at most {RANGE_DAYS_MAX} days")
        else:
            first = last = _date(item, field)
        spans.append((first, last))
    merged: list[tuple[date, date]] = []
    for first, last in sorted(spans):
        if merged and first.toordinal() <= merged[-1][1].toordinal() + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], last))
        else:
            merged.append((first, last))
    ranges = tuple(DateRange(a.isoformat(), b.isoformat()) for a, b in merged)
    return Calendar(tenant, name, tz, ranges, now_ms)


def calendar_to_json(cal: Calendar) -> dict[str, Any]:
    """The API's shape (a one-day range is written as its date)."""
    dates: list[Any] = [r.first if r.first == r.last else {"from": r.first, "to": r.last} for r in cal.ranges]
    return {"name": cal.name, "timezone": cal.tz, "dates": dates, "days": cal.days(),
            "updatedAt": datetime.fromtimestamp(cal.updated_at_ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}


def check_calendar(cal: Calendar) -> Calendar:
    """A calendar read from the topic, checked as the API would have built it."""
    data = {"timezone": cal.tz, "dates": [{"from": r.first, "to": r.last} for r in cal.ranges]}
    return parse_calendar(cal.tenant, cal.name, data, cal.updated_at_ms)


def excluded_by(calendars: Sequence[Calendar], slot_ms: int) -> str | None:
    """The name of the first of ``calendars`` whose dates hold the slot, or None."""
    for cal in calendars:
        if cal.excludes(slot_ms):
            return cal.name
    return None


CALENDAR_REASON_PREFIX = "calendar "


def calendar_reason(name: str) -> str:
    return CALENDAR_REASON_PREFIX + name


def is_calendar_skip(reason: str | None) -> bool:
    """A slot skipped because the job excludes its date: what the user asked for, so no
    "skipped" alert is sent for it."""
    return reason is not None and reason.startswith(CALENDAR_REASON_PREFIX)


class CalendarBook:
    """Every tenant's calendars, as last read from ``gnomon.calendars``."""

    def __init__(self) -> None:
        self._by_key: dict[str, Calendar] = {}

    def apply(self, key: str, cal: Calendar | None) -> None:
        """One record: ``key`` is ``<tenant>/<name>``; None deletes. A record whose key
        does not name its value, or that does not pass the API's rules, is refused
        (ValidationError): the caller logs and skips it."""
        if cal is None:
            self._by_key.pop(key, None)
            return
        if key != cal.key:
            raise ValidationError("key", f"record key {key!r} does not name calendar {cal.key!r}")
        self._by_key[key] = check_calendar(cal)

    def get(self, tenant: str, name: str) -> Calendar | None:
        return self._by_key.get(calendar_key(tenant, name))

    def of_tenant(self, tenant: str) -> list[Calendar]:
        prefix = tenant + "/"
        return sorted((c for k, c in self._by_key.items() if k.startswith(prefix)), key=lambda c: c.name)

    def for_job(self, tenant: str, names: Iterable[str]) -> tuple[Calendar, ...]:
        """The job's calendars that exist (a name with no calendar excludes nothing)."""
        found = (self.get(tenant, n) for n in names)
        return tuple(c for c in found if c is not None)

    def missing(self, tenant: str, names: Iterable[str]) -> list[str]:
        return [n for n in names if self.get(tenant, n) is None]


@functools.lru_cache(maxsize=1024)
def _spans(ranges: tuple[DateRange, ...]) -> tuple[list[int], list[int]]:
    starts = [date.fromisoformat(r.first).toordinal() for r in ranges]
    ends = [date.fromisoformat(r.last).toordinal() for r in ranges]
    return starts, ends


@functools.lru_cache(maxsize=65_536)
def _local_ordinal(slot_ms: int, tz: str) -> int:
    return datetime.fromtimestamp(slot_ms / 1000, tz=UTC).astimezone(ZoneInfo(tz)).date().toordinal()
