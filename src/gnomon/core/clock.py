"""Clocks. Code never reads the wall clock directly; a ``Clock`` is passed in."""

from __future__ import annotations

import functools
import threading
import time
from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int: ...


class SystemClock:
    """The real wall clock (UTC epoch milliseconds)."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000


class FakeClock:
    """A settable clock for tests: time moves only when told to."""

    def __init__(self, start_ms: int = 1_767_225_600_000) -> None:  # 2026-01-01T00:00:00Z
        self._now_ms = start_ms
        self._lock = threading.Lock()

    def now_ms(self) -> int:
        with self._lock:
            return self._now_ms

    def advance(self, delta_ms: int) -> int:
        if delta_ms < 0:
            raise ValueError("FakeClock cannot go backwards")
        with self._lock:
            self._now_ms += delta_ms
            return self._now_ms

    def set(self, now_ms: int) -> None:
        with self._lock:
            self._now_ms = now_ms


@functools.lru_cache(maxsize=4096)  # (a slot's run id: the jobs due at one instant share it)
def ms_to_iso(ms: int) -> str:
    """UTC ISO-8601 with a Z; milliseconds only when non-zero."""
    dt = datetime.fromtimestamp(ms / 1000, tz=UTC)
    if ms % 1000:
        return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"
    return dt.strftime("%Y-%m-%dT%H:%M:%SZ")


def iso_to_ms(text: str) -> int:
    """Parse ISO-8601 with an explicit offset (``Z`` or ``+hh:mm``). Naive times are refused."""
    raw = text.strip()
    if raw.endswith(("Z", "z")):
        raw = raw[:-1] + "+00:00"
    dt = datetime.fromisoformat(raw)
    if dt.tzinfo is None:
        raise ValueError("timestamp needs a time zone offset, e.g. 2026-01-01T09:00:00Z")
    return int(dt.timestamp() * 1000)
