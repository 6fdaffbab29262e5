"""A histogram over a sliding window (pure): what ``gnomon status`` shows as "start lag
p50/p99 over the last minute" without a Prometheus server.

Observations go into one-second slots of bucket counts (a ring of ``window_s`` slots);
``buckets(now_s)`` sums the slots of the last ``window_s`` seconds. Memory is
``window_s`` x buckets per label set, whatever the rate. Time is passed in.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class _Slot:
    second: int
    counts: list[int]
    total: float = 0.0


@dataclass
class WindowedHistogram:
    bounds: Sequence[float]  # upper bounds, ascending; +Inf is implied after the last
    window_s: int = 60
    _slots: dict[int, _Slot] = field(default_factory=dict)  # second % window_s -> its slot

    def observe(self, value: float, now_s: int) -> None:
        i = now_s % self.window_s
        slot = self._slots.get(i)
        if slot is None or slot.second != now_s:
            slot = self._slots[i] = _Slot(now_s, [0] * (len(self.bounds) + 1))
        slot.counts[bisect.bisect_left(self.bounds, value)] += 1
        slot.total += value

    def buckets(self, now_s: int) -> tuple[list[tuple[float, int]], int, float]:
        """Cumulative (upper bound, count) pairs ending with +Inf, the count and the sum of
        the observations of the last ``window_s`` seconds (now_s included)."""
        counts = [0] * (len(self.bounds) + 1)
        total = 0.0
        for slot in self._slots.values():
            if now_s - self.window_s < slot.second <= now_s:
                for j, c in enumerate(slot.counts):
                    counts[j] += c
                total += slot.total
        out: list[tuple[float, int]] = []
        running = 0
        for bound, c in zip([*self.bounds, float("inf")], counts, strict=True):
            running += c
            out.append((bound, running))
        return out, running, total


def quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """The ``q`` quantile (0..1) of cumulative histogram buckets (upper bound, count),
    ascending and ending with +Inf, interpolated linearly within a bucket as
    PromQL's ``histogram_quantile`` does. None: no observations. A quantile that falls in
    the +Inf bucket answers the last finite bound."""
    if not buckets or not 0.0 <= q <= 1.0:
        return None
    total = buckets[-1][1]
    if total <= 0:
        return None
    rank = q * total
    prev_bound, prev_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if bound == float("inf"):
                return prev_bound
            if count == prev_count:
                return bound
            return prev_bound + (bound - prev_bound) * (rank - prev_count) / (count - prev_count)
        prev_bound, prev_count = bound, count
    return prev_bound
