"""Read-your-writes for the API's own accepted job writes.

History (Cassandra, written by the projector) lags the processor by its projection
delay, typically well under a second but more when the projector is behind. A client
that was just told 201 must find its job on the next GET: the API keeps the state it
answered with for every job write the processor accepted, for ``kept_s`` (default 60 s,
at most ``kept_max`` jobs), and a read of a job answers the newer (by version) of that
and history. Per API process: with ``gnomon api --workers N`` a GET that lands on
another process reads history alone (docs/api.md, "Answers").
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from gnomon.core.jobs import JobState

KEPT_S_DEFAULT = 60.0
KEPT_MAX_DEFAULT = 10_000


class RecentJobs:
    def __init__(self, kept_s: float = KEPT_S_DEFAULT, kept_max: int = KEPT_MAX_DEFAULT,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        assert kept_s >= 0 and kept_max >= 1
        self.kept_s = kept_s
        self.kept_max = kept_max
        self._monotonic = monotonic
        self._jobs: OrderedDict[str, tuple[float, JobState]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._jobs)

    def put(self, state: JobState) -> None:
        if self.kept_s <= 0:
            return
        now = self._monotonic()
        with self._lock:
            self._jobs.pop(state.job_id, None)
            self._jobs[state.job_id] = (now, state)
            while self._jobs:
                at, _ = next(iter(self._jobs.values()))
                if len(self._jobs) <= self.kept_max and now - at < self.kept_s:
                    break
                self._jobs.popitem(last=False)

    def get(self, job_id: str) -> JobState | None:
        with self._lock:
            kept = self._jobs.get(job_id)
        if kept is None or self._monotonic() - kept[0] >= self.kept_s:
            return None
        return kept[1]

    def newest(self, job_id: str, history: JobState | None) -> JobState | None:
        """The newer of history's state and the one kept here. History wins a tie: what
        the processor changes without a new version (the schedule's position, a
        one-time job done) reaches the API only through history."""
        kept = self.get(job_id)
        if kept is None:
            return history
        if history is None or kept.version > history.version:
            return kept
        return history
