"""Liveness: a process that is alive but makes no progress while its broker answers
says so (a gauge, /healthz), then exits non-zero so that its supervisor restarts it.

* ``ProgressWatch`` decides, pure (its clock is passed in): the time without progress
  counts only while the broker answers, so an outage, however long, is waited out and
  the limit starts again when the broker is back;
* ``Watchdog`` runs it on a daemon thread of its own (the loop it watches may be stuck
  inside a client library): every ``every_s`` it probes the broker, updates the gauges,
  and calls ``on_stuck`` once when the limit is reached.

A process's loop reports progress by keeping a monotonic ``progress_at_s`` (the
processor: a step that committed, or had nothing to do; the worker: a step with every
result acknowledged).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Gauge

log = logging.getLogger("gnomon.liveness")

EXIT_STALLED = 75  # EX_TEMPFAIL: stuck with the broker answering; a restart may help
DEFAULT_STALL_LIMIT_S = 60.0


@dataclass(frozen=True)
class Verdict:
    stalled_s: float  # without progress while the broker answered
    limit_s: float
    broker_reachable: bool

    @property
    def stuck(self) -> bool:
        return self.stalled_s >= self.limit_s

    def as_dict(self) -> dict[str, object]:
        return {"status": "stalled" if self.stuck else "ok", "stalled_s": round(self.stalled_s, 1),
                "limit_s": self.limit_s, "broker_reachable": self.broker_reachable}


class ProgressWatch:
    """``progress_at``: when the process last made progress; ``now_s``: the same clock
    (monotonic seconds). ``observe`` takes whether the broker answered just now."""

    def __init__(self, limit_s: float, progress_at: Callable[[], float], now_s: Callable[[], float]) -> None:
        if limit_s <= 0:
            raise ValueError("limit_s must be > 0")
        self.limit_s = limit_s
        self._progress_at = progress_at
        self._now_s = now_s
        self._away_at = now_s()  # the last time the broker did not answer (or the start)

    def observe(self, broker_reachable: bool) -> Verdict:
        now = self._now_s()
        if not broker_reachable:
            self._away_at = now
        since = max(self._progress_at(), self._away_at)
        return Verdict(max(0.0, now - since), self.limit_s, broker_reachable)


class LivenessGauges:
    def __init__(self, registry: CollectorRegistry, kind: str) -> None:
        self.kind = kind
        self.stalled_s = Gauge("gnomon_stalled_seconds", "Seconds without progress while the broker answered "
                               "(the process exits at the limit)", ["kind"], registry=registry)
        self.stalled = Gauge("gnomon_stalled", "1 when the process made no progress for its stall limit while "
                             "the broker answered", ["kind"], registry=registry)
        self.broker_reachable = Gauge("gnomon_broker_reachable", "1 when the last probe of the broker was "
                                      "answered", ["kind"], registry=registry)

    def show(self, v: Verdict) -> None:
        self.stalled_s.labels(self.kind).set(v.stalled_s)
        self.stalled.labels(self.kind).set(1 if v.stuck else 0)
        self.broker_reachable.labels(self.kind).set(1 if v.broker_reachable else 0)


class Watchdog:
    """Checks a ``ProgressWatch`` every ``every_s`` on a daemon thread; ``probe`` says
    whether the broker answers (bounded by its own timeout)."""

    def __init__(self, watch: ProgressWatch, probe: Callable[[], bool], on_stuck: Callable[[Verdict], None], *,
                 gauges: LivenessGauges | None = None, every_s: float = 2.0,
                 on_stop: Callable[[], None] | None = None) -> None:
        self.watch = watch
        self._probe = probe
        self._on_stop = on_stop  # (run by the thread once stopped: e.g. the probe's client closed)
        self._on_stuck = on_stuck
        self._gauges = gauges
        self._every_s = every_s
        self._stop = threading.Event()
        self.last = Verdict(0.0, watch.limit_s, True)
        self.tripped = False
        self._thread = threading.Thread(target=self._run, name="gnomon-watchdog", daemon=True)

    def start(self) -> Watchdog:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def check(self) -> Verdict:
        """One check (the thread's body; callable directly in tests)."""
        v = self.watch.observe(self._probe())
        self.last = v
        if self._gauges is not None:
            self._gauges.show(v)
        if v.stuck and not self.tripped:
            self.tripped = True
            log.error("no progress for %.0f s while the broker answers (limit %.0f s): exiting so that a "
                      "supervisor restarts this process", v.stalled_s, v.limit_s)
            self._on_stuck(v)
        return v

    def health(self) -> tuple[bool, dict[str, object]]:
        """For /healthz: healthy unless stuck."""
        return not (self.last.stuck or self.tripped), self.last.as_dict()

    def _run(self) -> None:
        while not self._stop.wait(self._every_s):
            try:
                self.check()
            except Exception:  # the watchdog must outlive a failing probe
                log.exception("liveness check failed")
        if self._on_stop is not None:
            self._on_stop()
