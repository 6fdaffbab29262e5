"""When a command naming a calendar this processor has not read should make it read the
calendars to their end (``processor.runtime``): unless a read that began after the command
was made has done it (allowing for the clocks of the API and the processor to differ by
``skew_ms``), and at most ``reads_per_s_max`` times a second, so a producer naming unknown
calendars cannot stall the loop."""

from __future__ import annotations

from collections import deque


class CatchUpGate:
    def __init__(self, *, skew_ms: int = 1_000, reads_per_s_max: int = 10) -> None:
        assert skew_ms >= 0 and reads_per_s_max > 0
        self.skew_ms = skew_ms
        self.reads_per_s_max = reads_per_s_max
        self.read_from_ms: int | None = None  # when the last completed read to the end began
        self._starts_s: deque[float] = deque()  # monotonic starts of the reads of the last second

    def should_read(self, made_at_ms: int, now_s: float) -> bool:
        """Read now for a command made at ``made_at_ms``? (True counts as a read begun.)"""
        if self.read_from_ms is not None and self.read_from_ms > made_at_ms + self.skew_ms:
            return False  # a read that began after the command was made has covered it
        while self._starts_s and now_s - self._starts_s[0] > 1.0:
            self._starts_s.popleft()
        if len(self._starts_s) >= self.reads_per_s_max:
            return False
        self._starts_s.append(now_s)
        return True

    def read_done(self, began_ms: int) -> None:
        """A read to the end that began at ``began_ms`` (processor clock) completed."""
        if self.read_from_ms is None or began_ms > self.read_from_ms:
            self.read_from_ms = began_ms
