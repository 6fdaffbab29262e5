"""The history projector's metrics: records and batches written, store write time and
failures, poison, and its consumer group's lag (committed by it after each batch; read
from the consumer's positions and cached high watermarks, at most every
``lag_interval_s``: no broker round trip)."""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gnomon.core.errors import EventLogError
from gnomon.eventlog.port import GroupConsumer

WRITE_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class ProjectorMetrics:
    def __init__(self, group_id: str, *, registry: CollectorRegistry | None = None, lag_interval_s: float = 5.0,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.group_id = group_id
        self.registry = registry if registry is not None else CollectorRegistry()
        self.lag_interval_s = lag_interval_s
        self._monotonic = monotonic
        self._lag_at = -1e18
        r = self.registry
        self.records = Counter("gnomon_projector_records", "Records consumed, by topic", ["topic"], registry=r)
        self.batches = Counter("gnomon_projector_batches", "Batches written and committed", registry=r)
        self.write_seconds = Histogram("gnomon_projector_write_seconds", "Time to write one batch to history",
                                       buckets=WRITE_BUCKETS_S, registry=r)
        self.write_failures = Counter("gnomon_projector_write_failures", "Batches given up after their write "
                                      "attempts (then replayed)", registry=r)
        self.commit_failures = Counter("gnomon_projector_commit_failures", "Offset commits that failed", registry=r)
        self.poison = Counter("gnomon_projector_poison_records", "Records skipped as undecodable", ["topic"],
                              registry=r)
        self.consumer_lag = Gauge("gnomon_consumer_lag_records", "Records not yet consumed by the group, on the "
                                  "partitions this process consumes", ["group", "topic"], registry=r)

    def lag(self, consumer: GroupConsumer, topics: list[str], *, force: bool = False) -> None:
        """Refresh the lag of ``consumer`` on its assignment (cached high watermarks: no
        broker round trip)."""
        now = self._monotonic()
        if not force and now - self._lag_at < self.lag_interval_s:
            return
        self._lag_at = now
        try:
            assignment = consumer.assignment()
            positions = consumer.position(assignment) if assignment else {}
            lag = dict.fromkeys(topics, 0)
            for tp, pos in positions.items():
                high = consumer.high_watermark(tp)
                if pos >= 0 and high >= 0 and tp[0] in lag:
                    lag[tp[0]] += max(0, high - pos)
        except EventLogError:  # a closing consumer: keep the last values
            return
        for topic, n in lag.items():
            self.consumer_lag.labels(self.group_id, topic).set(n)
