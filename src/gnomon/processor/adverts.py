"""Feed worker adverts (gnomon.workers) into a processor's ``WorkerDirectory``.

Not part of the processor's consumer group and not transactional: every processor
instance reads every advert, starting ``lookback_ms`` back so a restarted processor
knows the live workers at once. The directory is soft state; grants it leads to are
fenced like any other.

A reader that reads nothing for ``STUCK_CHECK_MS`` while its partitions hold adverts past
its position is replaced by a new one (from ``lookback_ms`` back). Seen in CI: after the
single broker's 37 s outage a processor's advert reader read nothing more for 85 s
while the worker's adverts were in the topic from its first second back on, so the
processor found the worker lost and granted it nothing: no run after the return.
"""

from __future__ import annotations

import contextlib
import logging

from gnomon import codec
from gnomon.core.clock import Clock
from gnomon.core.errors import EventLogError, GnomonError
from gnomon.core.workers import WorkerAdvert, WorkerDirectory
from gnomon.eventlog.port import OFFSET_END, EventLog, Reader

log = logging.getLogger("gnomon.processor")

STUCK_CHECK_MS = 5_000  # nothing read this long: compare the reader's position with the ends
WATERMARK_TIMEOUT_S = 0.5  # (the check blocks the processor's loop this long at most per partition)


class AdvertFeed:
    def __init__(self, log: EventLog, topic: str, directory: WorkerDirectory, clock: Clock,
                 lookback_ms: int = 10_000, batch_max: int = 5_000) -> None:
        self.topic = topic
        self.directory = directory
        self.clock = clock
        self.batch_max = batch_max
        self.lookback_ms = lookback_ms
        self._log = log
        self.reopened = 0  # readers replaced because they were stuck
        self._parts: list[int] = []  # the topic's partitions, as the reader was assigned them
        self.consumer = self._open()
        self._read_ms = self._checked_ms = clock.now_ms()

    def _open(self) -> Reader:
        consumer = self._log.reader("gnomon-adverts", config={"enable.auto.commit": False, "fetch.wait.max.ms": 10})
        try:
            parts = consumer.partitions(self.topic)
            starts = consumer.offsets_for_time(self.topic, parts, self.clock.now_ms() - self.lookback_ms)
            # offset -1 (nothing that recent): start at the end
            consumer.assign([(self.topic, p, off if off >= 0 else OFFSET_END) for p, off in sorted(starts.items())])
        except EventLogError as exc:
            with contextlib.suppress(Exception):
                consumer.close()
            raise EventLogError(f"cannot read worker adverts from {self.topic}: {exc}") from exc
        self._parts = sorted(starts)
        return consumer

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
        if n:
            self._read_ms = now
        elif now - self._read_ms >= STUCK_CHECK_MS and now - self._checked_ms >= STUCK_CHECK_MS:
            self._checked_ms = now
            self._reopen_if_stuck(now)
        return n

    def _reopen_if_stuck(self, now: int) -> None:
        """Nothing read for ``STUCK_CHECK_MS``: if a partition holds adverts past the
        reader's position, the reader is replaced (its broker unreachable: left as it is)."""
        tps = [(self.topic, p) for p in self._parts]
        try:
            positions = self.consumer.position(tps)
            # (a position not known yet, e.g. assigned at the end and nothing fetched: not stuck)
            behind = [tp for tp in tps if positions.get(tp, -1) >= 0
                      and self.consumer.watermarks(tp, WATERMARK_TIMEOUT_S)[1] > positions[tp]]
        except EventLogError:
            return  # the broker does not answer: the reader may be right to read nothing
        if not behind:
            return
        log.warning("the worker adverts' reader has read nothing for %d s with adverts past its position in %s: "
                    "reading them with a new reader", (now - self._read_ms) // 1000,
                    ", ".join(f"{t}[{p}]" for t, p in behind))
        try:
            fresh = self._open()
        except EventLogError as exc:
            log.warning("the worker adverts' new reader did not open (%s); trying again later", exc)
            return
        with contextlib.suppress(Exception):
            self.consumer.close()
        self.consumer = fresh
        self.reopened += 1

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.consumer.close()
