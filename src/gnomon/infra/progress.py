"""Progress lines on stderr, so long waits are visible and stdout stays machine-readable."""

from __future__ import annotations

import sys
import time


def say(message: str) -> None:
    print(f"gnomon: {message}", file=sys.stderr, flush=True)


class Ticker:
    """Prints ``<what>… <elapsed>s`` at most every ``every_s`` seconds while waiting."""

    def __init__(self, what: str, every_s: float = 5.0) -> None:
        self.what = what
        self.every_s = every_s
        self.started = time.monotonic()
        self._last = self.started

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    def tick(self) -> None:
        now = time.monotonic()
        if now - self._last >= self.every_s:
            self._last = now
            say(f"{self.what}… {self.elapsed_s:.0f}s")
