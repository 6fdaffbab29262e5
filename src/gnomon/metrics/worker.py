"""The worker's metrics. Start lag is measured here, where the handler starts: the
attempt's start (this worker's clock) minus the run's start instant (its slot, plus
the job's fixed jitter offset if it has one), for first attempts only (a retry starts
after its backoff, by design). Observed by the worker's loop, not the attempt threads.

``gnomon_start_lag_seconds`` is the cumulative histogram Prometheus reads;
``gnomon_start_lag_window_seconds`` the same buckets over the last minute only (a gauge
histogram), which ``gnomon status`` reads without a Prometheus server.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.core import GaugeHistogramMetricFamily
from prometheus_client.registry import Collector

from gnomon.metrics import START_LAG_BUCKETS_S, WINDOW_S
from gnomon.metrics.window import WindowedHistogram

ATTEMPT_BUCKETS_S = (0.01, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
WORKER_OUTCOMES = ("succeeded", "failed", "timed_out")


class _WindowCollector(Collector):
    """``gnomon_start_lag_window_seconds{pool, priority}``: the last ``window_s`` seconds."""

    def __init__(self, now_s: Callable[[], int], window_s: int) -> None:
        self._now_s = now_s
        self.window_s = window_s
        self._hists: dict[tuple[str, str], WindowedHistogram] = {}
        self._lock = threading.Lock()

    def observe(self, pool: str, priority: str, lag_s: float) -> None:
        with self._lock:
            hist = self._hists.get((pool, priority))
            if hist is None:
                hist = self._hists[(pool, priority)] = WindowedHistogram(START_LAG_BUCKETS_S, self.window_s)
            hist.observe(lag_s, self._now_s())

    def collect(self) -> Iterator[GaugeHistogramMetricFamily]:
        fam = GaugeHistogramMetricFamily("gnomon_start_lag_window_seconds",
                                         f"Start lag of the attempts started in the last {self.window_s} s",
                                         labels=["pool", "priority"])
        now = self._now_s()
        with self._lock:
            for (pool, prio), hist in sorted(self._hists.items()):
                buckets, _, total = hist.buckets(now)
                fam.add_metric([pool, prio], [(_le(b), c) for b, c in buckets], total)
        yield fam


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(float(bound))


class WorkerMetrics:
    def __init__(self, pool: str, worker_id: str, *, now_s: Callable[[], int],
                 registry: CollectorRegistry | None = None, window_s: int = WINDOW_S) -> None:
        self.pool = pool
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.info = Info("gnomon_worker", "This worker", registry=r)
        self.info.info({"worker_id": worker_id, "pool": pool})
        self.start_lag = Histogram("gnomon_start_lag_seconds", "Start of a run's first attempt minus its slot (plus "
                                   "the job's fixed jitter offset), measured by the worker when the handler starts", ["pool", "priority"],
                                   buckets=START_LAG_BUCKETS_S, registry=r)
        self.window = _WindowCollector(now_s, window_s)
        r.register(self.window)
        self.started = Counter("gnomon_worker_attempts_started", "Attempts this worker started", ["pool"],
                               registry=r)
        self.finished = Counter("gnomon_worker_attempts_finished", "Attempts this worker finished, by outcome",
                                ["pool", "outcome"], registry=r)
        self.duration = Histogram("gnomon_worker_attempt_duration_seconds", "Attempt durations, by outcome",
                                  ["pool", "outcome"], buckets=ATTEMPT_BUCKETS_S, registry=r)
        self.handbacks = Counter("gnomon_worker_handbacks", "Staged attempts handed back (no free slot at the slot, "
                                 "or shutting down)", ["pool"], registry=r)
        self.resends = Counter("gnomon_worker_result_resends", "Checked records sent again after a failed delivery",
                               ["pool"], registry=r)
        self.producer_rebuilds = Counter("gnomon_worker_producer_rebuilds", "Producers replaced after a fatal "
                                         "error (their unacknowledged results sent again)", ["pool"], registry=r)
        self.attempts = Gauge("gnomon_worker_attempts", "Attempts held by this worker, by state", ["pool", "state"],
                              registry=r)
        self.slots = Gauge("gnomon_worker_slots", "Attempts this worker runs at once (--concurrency)", ["pool"],
                           registry=r)
        self.consumer_lag = Gauge("gnomon_consumer_lag_records", "Records not yet consumed by the group, on the "
                                  "partitions this process consumes", ["group", "topic"], registry=r)
        self.output_cut_lines = Counter("gnomon_worker_output_cut_lines", "Output lines of attempts not logged: past "
                                        "the per-attempt log budget", ["pool"], registry=r)
        self.output_cut_bytes = Counter("gnomon_worker_output_cut_bytes", "Bytes of those lines", ["pool"], registry=r)
        self.output_cut_lines.labels(pool)
        self.output_cut_bytes.labels(pool)
        for outcome in WORKER_OUTCOMES:
            self.finished.labels(pool, outcome)
        self.started.labels(pool)
        self.handbacks.labels(pool)

    def attempt_started(self, priority: str, attempt: int, started_ms: int, slot_ms: int) -> None:
        self.started.labels(self.pool).inc()
        if attempt <= 1:
            lag_s = max(0.0, (started_ms - slot_ms) / 1000)
            self.start_lag.labels(self.pool, priority).observe(lag_s)
            self.window.observe(self.pool, priority, lag_s)

    def attempt_finished(self, outcome: str, duration_s: float) -> None:
        self.finished.labels(self.pool, outcome).inc()
        self.duration.labels(self.pool, outcome).observe(max(0.0, duration_s))

    def output_cut(self, lines: int, n_bytes: int) -> None:
        self.output_cut_lines.labels(self.pool).inc(lines)
        self.output_cut_bytes.labels(self.pool).inc(n_bytes)

    def producer_rebuilt(self, pool: str) -> None:
        self.producer_rebuilds.labels(pool).inc()

    def held(self, running: int, staged: int, due: int, slots: int) -> None:
        self.attempts.labels(self.pool, "running").set(running)
        self.attempts.labels(self.pool, "staged").set(staged)
        self.attempts.labels(self.pool, "waiting_for_slot").set(due)
        self.slots.labels(self.pool).set(slots)

    def lag(self, group: str, topic: str, records: int) -> None:
        self.consumer_lag.labels(group, topic).set(max(0, records))
