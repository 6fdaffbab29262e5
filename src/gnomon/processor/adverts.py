"""Feed worker adverts (gnomon.workers) into a processor's ``WorkerDirectory``.

Not part of the processor's consumer group and not transactional: every processor
instance reads every advert, starting ``lookback_ms`` back so a restarted processor
knows the live workers at once. The directory is soft state; grants it leads to are
fenced like any other.
"""

from __future__ import annotations

import contextlib
import logging

from gnomon import codec
from gnomon.core.clock import Clock
from gnomon.core.errors import EventLogError, GnomonError
from gnomon.core.workers import WorkerAdvert, WorkerDirectory
from gnomon.eventlog.port import OFFSET_END, EventLog

log = logging.getLogger("gnomon.processor")


class AdvertFeed:
    def __init__(self, log: EventLog, topic: str, directory: WorkerDirectory, clock: Clock,
                 lookback_ms: int = 10_000, batch_max: int = 5_000) -> None:
        self.topic = topic
        self.directory = directory
        self.clock = clock
        self.batch_max = batch_max
        self.consumer = log.reader("gnomon-adverts", config={"enable.auto.commit": False, "fetch.wait.max.ms": 10})
        try:
            parts = self.consumer.partitions(topic)
            starts = self.consumer.offsets_for_time(topic, parts, clock.now_ms() - lookback_ms)
        except EventLogError as exc:
            raise EventLogError(f"cannot read worker adverts from {topic}: {exc}") from exc
        # offset -1 (nothing that recent): start at the end
        self.consumer.assign([(topic, p, off if off >= 0 else OFFSET_END) for p, off in sorted(starts.items())])

    def poll(self) -> int:
        """Observe the adverts that arrived (non-blocking); how many."""
        n = 0
        now = self.clock.now_ms()
        self.directory.listening(now)
        for msg in self.consumer.consume(self.batch_max, 0):
            raw = msg.value
            if raw is None:
                continue
            try:
                advert = codec.decode(raw)
            except GnomonError as exc:
                log.warning("undecodable worker advert skipped: %s", exc)
                continue
            if isinstance(advert, WorkerAdvert):
                self.directory.observe(advert, now)
                n += 1
        return n

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.consumer.close()
