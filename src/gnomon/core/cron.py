"""Cron schedules: parsing, validation and next-fire computation.

Semantics follow Debian cron (via cronsim), including daylight saving time:

* a fixed-time job (seconds, minutes and hours fields all literal) whose wall time
  falls in the hour skipped by spring-forward runs right after the jump;
* in the hour repeated by fall-back it runs once (the first occurrence);
* jobs with a wildcard or step in seconds/minutes/hours follow the wall clock, so
  they fire through both occurrences of a repeated hour.

Expressions have 5 fields (minute precision) or 6 fields with *seconds first*
(``*/5 * * * * *`` = every 5 s), or a macro (``@hourly``...). All instants in and
out are UTC epoch milliseconds; the zone only shapes the wall clock.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from gnomon.core.errors import ValidationError

MACROS: dict[str, str] = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

EXPR_MAX_CHARS = 200


def load_zone(name: str, field: str = "timezone") -> ZoneInfo:
    if not name or len(name) > 64 or name.startswith(("/", ".")) or ".." in name:
        raise ValidationError(field, f"unknown time zone {name!r}; use an IANA name such as Europe/London")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ValidationError(
            field, f"unknown time zone {name!r}; use an IANA name such as Europe/London"
        ) from None


VALIDATED_MAX = 4096  # distinct (expression, zone) pairs whose check is remembered


@functools.lru_cache(maxsize=VALIDATED_MAX)
def _check_fires(text: str, tz: str, expr: str, field: str) -> None:
    """Raise ValidationError unless ``text`` is a cron expression that fires in zone
    ``tz``. Pure, so remembered: a bulk registration of many jobs with the same few
    expressions checks each once (the check walks the calendar: about 0.5 ms)."""
    zone = load_zone(tz, "timezone")
    try:
        it = CronSim(text, datetime(2026, 1, 1, tzinfo=zone))
        next(it)
    except CronSimError as exc:
        raise ValidationError(field, f"invalid cron expression {expr!r}: {exc}") from None
    except StopIteration:
        raise ValidationError(field, f"cron expression {expr!r} never fires") from None


@dataclass(frozen=True)
class CronSchedule:
    """A validated cron expression in a zone. ``expr`` is normalised (macros expanded)."""

    expr: str
    tz: str

    @staticmethod
    def parse(expr: str, tz: str = "UTC", field: str = "schedule") -> CronSchedule:
        if not isinstance(expr, str) or not expr.strip():
            raise ValidationError(field, "cron expression is empty")
        if len(expr) > EXPR_MAX_CHARS:
            raise ValidationError(field, f"cron expression longer than {EXPR_MAX_CHARS} characters")
        text = " ".join(expr.split())
        if text.startswith("@"):
            if text.lower() not in MACROS:
                raise ValidationError(
                    field, f"unknown macro {text!r}; known: {', '.join(sorted(MACROS))}"
                )
            text = MACROS[text.lower()]
        n = len(text.split())
        if n not in (5, 6):
            raise ValidationError(
                field,
                f"cron expression needs 5 fields (min hour dom month dow) or 6 with seconds first, got {n}",
            )
        _check_fires(text, tz, expr, field)
        return CronSchedule(expr=text, tz=tz)

    def iter_after(self, after_ms: int) -> Iterator[int]:
        """Fire instants strictly after ``after_ms``, in UTC epoch ms, ascending."""
        zone = ZoneInfo(self.tz)
        start = datetime.fromtimestamp(after_ms / 1000, tz=UTC).astimezone(zone)
        # cronsim works in whole seconds and yields instants strictly after `start`
        # once microseconds are dropped; drop them ourselves to keep that exact.
        start = start.replace(microsecond=0)
        last = -1
        for dt in CronSim(self.expr, start):
            ms = int(dt.timestamp()) * 1000
            if ms <= after_ms or ms <= last:
                # defensive: never go backwards or repeat an instant
                continue
            last = ms
            yield ms

    def next_after(self, after_ms: int) -> int | None:
        return _next_after(self.expr, self.tz, after_ms)

    def next_n(self, after_ms: int, count: int) -> list[int]:
        out: list[int] = []
        for ms in self.iter_after(after_ms):
            out.append(ms)
            if len(out) >= count:
                break
        return out


# Many jobs share a schedule ("0 * * * *", "*/5 * * * *", per-second ones in a bench), and
# the processor asks each for its next slot after the same instant: one computation serves
# them all (cronsim's parse and walk cost ~20 us a call). Bounded; a pure function.
NEXT_AFTER_CACHE_MAX = 65_536


@functools.lru_cache(maxsize=NEXT_AFTER_CACHE_MAX)
def _next_after(expr: str, tz: str, after_ms: int) -> int | None:
    for ms in CronSchedule(expr, tz).iter_after(after_ms):
        return ms
    return None
