"""Feed tenant limits (gnomon.tenants) and usage (gnomon.tenant-usage) into books.

Both topics are compacted and small; every processor and API instance reads them whole,
from offset 0, outside any consumer group and without committing: ``load`` once at
start (to the end offsets as of then), then ``poll`` from the loop. A processor passes
``usage=None`` and reads limits only; the API reads both (admission pre-checks, the
admin endpoints).

A record that does not decode, or that its book refuses (a key naming another tenant
than its value), is logged and skipped: limits are soft state, and a bad record must
not stop a processor. A tombstone (value None) is applied as such.
"""

from __future__ import annotations

import contextlib
import logging
import time

from gnomon import codec
from gnomon.core.clock import Clock
from gnomon.core.errors import EventLogError, GnomonError
from gnomon.core.tenants import TenantBook, TenantLimits
from gnomon.core.usage import TenantUsage, UsageBook
from gnomon.eventlog.port import OFFSET_BEGINNING, TP, EventLog, Record
from gnomon.topology import Topology

log = logging.getLogger("gnomon.tenants")

GROUP_ID = "gnomon-tenants"  # never joined, never committed (ACL: gnomon.infra.acls)
METADATA_TIMEOUT_S = 10.0


class TenantFeed:
    def __init__(self, bootstrap: str, topology: Topology, book: TenantBook, usage: UsageBook | None,
                 clock: Clock, *, role: str | None = None, batch_max: int = 5_000, log: EventLog | None = None,
                 ) -> None:
        """``role``: the Kafka principal (default: as ``consumer_config`` picks it); ``log``:
        the event log to read (default: Kafka at ``bootstrap`` as ``role``)."""
        if log is None:
            from gnomon.eventlog.kafka import KafkaEventLog

            log = KafkaEventLog(bootstrap, role=role)
        self.book = book
        self.usage = usage
        self.clock = clock
        self.batch_max = batch_max
        self.topics = [topology.tenants] + ([topology.tenant_usage] if usage is not None else [])
        self.last_poll_ms: int | None = None  # when poll/load last reached Kafka
        self.consumer = log.reader(GROUP_ID, config={"enable.auto.commit": False, "fetch.wait.max.ms": 10})
        self._partitions: list[TP] = []
        try:
            for topic in self.topics:
                self._partitions += [(topic, p) for p in self.consumer.partitions(topic, METADATA_TIMEOUT_S)]
        except EventLogError as exc:
            raise EventLogError(f"cannot read tenants from {', '.join(self.topics)}: {exc}") from exc
        self.consumer.assign([(t, p, OFFSET_BEGINNING) for t, p in self._partitions])

    def load(self, timeout_s: float = 30.0) -> int:
        """Read every record up to the end offsets as of now; how many. Raises
        ``EventLogError`` if the end is not reached within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        try:
            ends = {tp: self.consumer.watermarks(tp, timeout_s)[1] for tp in self._partitions}
        except EventLogError as exc:
            raise EventLogError(f"cannot read the end offsets of {', '.join(self.topics)}: {exc}") from exc
        pending = {k for k, end in ends.items() if end > 0}
        n = 0
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise EventLogError(f"could not read {', '.join(self.topics)} to the end within {timeout_s:g} s "
                                    f"({len(pending)} partitions behind)")
            for msg in self.consumer.consume(self.batch_max, min(left, 0.5)):
                n += self._apply(msg)
                key = (msg.topic, msg.partition)
                if key in pending and msg.offset + 1 >= ends[key]:
                    pending.discard(key)
            # compaction can remove the last records: a position at or past the end is done
            with contextlib.suppress(EventLogError):
                for tp, offset in self.consumer.position(sorted(pending)).items():
                    if offset >= ends[tp]:
                        pending.discard(tp)
        self.last_poll_ms = self.clock.now_ms()
        return n

    def poll(self) -> int:
        """Apply the records that arrived (non-blocking); how many."""
        n = 0
        for msg in self.consumer.consume(self.batch_max, 0):
            n += self._apply(msg)
        self.last_poll_ms = self.clock.now_ms()
        return n

    def _apply(self, msg: Record) -> int:
        raw_key = msg.key
        try:
            key = raw_key.decode() if raw_key is not None else ""
        except UnicodeDecodeError:
            log.warning("record with a non-UTF-8 key skipped on %s", msg.topic)
            return 0
        return apply_record(self.book, self.usage, msg.topic, key, msg.value,
                            tenants_topic=self.topics[0])

    def close(self) -> None:
        self.consumer.close()


def apply_record(book: TenantBook, usage: UsageBook | None, topic: str, key: str, value: bytes | None, *,
                 tenants_topic: str) -> int:
    """One record of either topic into its book (1), or logged and skipped (0)."""
    try:
        obj = None if value is None else codec.decode(value, topic=topic)
        if topic == tenants_topic:
            if obj is not None and not isinstance(obj, TenantLimits):
                raise TypeError(f"{type(obj).__name__} is not TenantLimits")
            book.apply(key, obj)
        elif usage is not None:
            if obj is not None and not isinstance(obj, TenantUsage):
                raise TypeError(f"{type(obj).__name__} is not TenantUsage")
            usage.apply(key, obj)
        else:
            return 0
    except (GnomonError, TypeError) as exc:
        log.warning("record %r on %s skipped: %s", key, topic, exc)
        return 0
    return 1
