"""Read a small compacted topic whole, then follow it: the one reader for compacted feeds.

Outside any consumer group and without committing: every partition is assigned from
offset 0; ``load`` reads to the end offsets as of its call (compaction may have removed
the last records: a position at or past the end counts as done), then ``poll`` applies
what arrived since, without blocking. ``apply`` turns one record into the caller's state
and returns how many it applied (0 when it logged and skipped a bad one): a bad record
never stops the reader.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence

from gnomon.core.errors import EventLogError
from gnomon.eventlog.port import OFFSET_BEGINNING, TP, EventLog, Record

METADATA_TIMEOUT_S = 10.0
POLL_WAIT_MAX_MS = 10


class CompactedFeed:
    def __init__(self, log: EventLog, group_id: str, topics: Sequence[str], apply: Callable[[Record], int], *,
                 batch_max: int = 5_000, now_ms: Callable[[], int] | None = None) -> None:
        """``group_id``: the id the reader is known by (ACLs), never joined; ``now_ms``:
        the clock ``last_poll_ms`` reads (default: none kept)."""
        assert batch_max > 0, batch_max
        self.topics = list(topics)
        self.batch_max = batch_max
        self._apply = apply
        self._now_ms = now_ms
        self.last_poll_ms: int | None = None  # when load/poll last reached the log
        self.consumer = log.reader(group_id, config={"enable.auto.commit": False,
                                                     "fetch.wait.max.ms": POLL_WAIT_MAX_MS})
        self.partitions: list[TP] = []
        try:
            for topic in self.topics:
                self.partitions += [(topic, p) for p in self.consumer.partitions(topic, METADATA_TIMEOUT_S)]
        except EventLogError as exc:
            raise EventLogError(f"cannot read {', '.join(self.topics)}: {exc}") from exc
        self.consumer.assign([(t, p, OFFSET_BEGINNING) for t, p in self.partitions])

    def load(self, timeout_s: float = 30.0) -> int:
        """Read every record up to the end offsets as of now; how many were applied.
        Raises ``EventLogError`` if the end is not reached within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        try:
            marks = {tp: self.consumer.watermarks(tp, timeout_s) for tp in self.partitions}
        except EventLogError as exc:
            raise EventLogError(f"cannot read the end offsets of {', '.join(self.topics)}: {exc}") from exc
        ends = {tp: high for tp, (_low, high) in marks.items()}
        pending = {tp for tp, (low, high) in marks.items() if high > low}  # empty partitions: nothing to wait for
        n = 0
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise EventLogError(f"could not read {', '.join(self.topics)} to the end within {timeout_s:g} s "
                                    f"({len(pending)} partitions behind)")
            for msg in self.consumer.consume(self.batch_max, min(left, 0.5)):
                n += self._apply(msg)
                tp = (msg.topic, msg.partition)
                if tp in pending and msg.offset + 1 >= ends[tp]:
                    pending.discard(tp)
            with contextlib.suppress(EventLogError):
                for tp, offset in self.consumer.position(sorted(pending)).items():
                    if offset >= ends[tp]:
                        pending.discard(tp)
        self._mark()
        return n

    def poll(self) -> int:
        """Apply the records that arrived (non-blocking); how many."""
        n = sum(self._apply(msg) for msg in self.consumer.consume(self.batch_max, 0))
        self._mark()
        return n

    def _mark(self) -> None:
        if self._now_ms is not None:
            self.last_poll_ms = self._now_ms()

    def close(self) -> None:
        self.consumer.close()
