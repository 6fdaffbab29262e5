"""Feed tenant limits (gnomon.tenants), usage (gnomon.tenant-usage) and exclusion
calendars (gnomon.calendars) into books.

Both topics are compacted and small; every processor and API instance reads them whole,
from offset 0, outside any consumer group and without committing: ``load`` once at
start (to the end offsets as of then), then ``poll`` from the loop (the reader is
``feeds.compacted``). A processor passes ``usage=None`` and reads limits only; the API
reads both (what ``GET /v1/tenant`` and the admin endpoints show). With a
``CalendarBook`` the tenants' calendars are read too (processors: the slots they
exclude; the API: previews and checks), loaded before the processor's first tick.

A record that does not decode, or that its book refuses (a key naming another tenant
than its value), is logged and skipped: limits are soft state, and a bad record must
not stop a processor. A tombstone (value None) is applied as such.
"""

from __future__ import annotations

import logging

from gnomon import codec
from gnomon.core.calendars import Calendar, CalendarBook
from gnomon.core.clock import Clock
from gnomon.core.errors import GnomonError
from gnomon.core.tenants import TenantBook, TenantLimits
from gnomon.core.usage import TenantUsage, UsageBook
from gnomon.eventlog.port import EventLog, Record
from gnomon.feeds.compacted import CompactedFeed
from gnomon.topology import Topology

log = logging.getLogger("gnomon.tenants")

GROUP_ID = "gnomon-tenants"  # never joined, never committed (ACL: gnomon.infra.acls)


class TenantFeed:
    def __init__(self, bootstrap: str, topology: Topology, book: TenantBook, usage: UsageBook | None,
                 clock: Clock, *, role: str | None = None, batch_max: int = 5_000, log: EventLog | None = None,
                 calendars: CalendarBook | None = None) -> None:
        """``role``: the Kafka principal (default: as ``consumer_config`` picks it); ``log``:
        the event log to read (default: Kafka at ``bootstrap`` as ``role``)."""
        if log is None:
            from gnomon.eventlog.kafka import KafkaEventLog

            log = KafkaEventLog(bootstrap, role=role)
        self.book = book
        self.usage = usage
        self.tenants_topic = topology.tenants
        self.calendars = calendars
        self.calendars_topic = topology.calendars
        topics = ([topology.tenants] + ([topology.tenant_usage] if usage is not None else [])
                  + ([topology.calendars] if calendars is not None else []))
        self.feed = CompactedFeed(log, GROUP_ID, topics, self._apply, batch_max=batch_max, now_ms=clock.now_ms)

    @property
    def last_poll_ms(self) -> int | None:
        """When ``load`` or ``poll`` last reached the log (None before the first)."""
        return self.feed.last_poll_ms

    def load(self, timeout_s: float = 30.0) -> int:
        """Read every record up to the end offsets as of now; how many. Raises
        ``EventLogError`` if the end is not reached within ``timeout_s``."""
        return self.feed.load(timeout_s)

    def poll(self) -> int:
        """Apply the records that arrived (non-blocking); how many."""
        return self.feed.poll()

    def _apply(self, msg: Record) -> int:
        raw_key = msg.key
        try:
            key = raw_key.decode() if raw_key is not None else ""
        except UnicodeDecodeError:
            log.warning("record with a non-UTF-8 key skipped on %s", msg.topic)
            return 0
        if msg.topic == self.calendars_topic and self.calendars is not None:
            return apply_calendar(self.calendars, key, msg.value, topic=msg.topic)
        return apply_record(self.book, self.usage, msg.topic, key, msg.value, tenants_topic=self.tenants_topic)

    def close(self) -> None:
        self.feed.close()


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


def apply_calendar(book: CalendarBook, key: str, value: bytes | None, *, topic: str) -> int:
    """One record of the calendars topic into ``book`` (1), or logged and skipped (0)."""
    try:
        obj = None if value is None else codec.decode(value, topic=topic)
        if obj is not None and not isinstance(obj, Calendar):
            raise TypeError(f"{type(obj).__name__} is not a Calendar")
        book.apply(key, obj)
    except (GnomonError, TypeError) as exc:
        log.warning("record %r on %s skipped: %s", key, topic, exc)
        return 0
    return 1
