"""Feed the tenants' alert configs (``gnomon.alert-configs``) into an ``AlertBook``.

The topic is compacted and small: the alerter and every API instance read it whole,
from offset 0, outside any consumer group and without committing (as
``gnomon.feeds.tenants`` reads tenant limits, on the same reader,
``gnomon.feeds.compacted``): ``load`` once at start, then ``poll``.
A record that does not decode or names another tenant than its key is logged and
skipped; a tombstone turns the tenant's alerts off.
"""

from __future__ import annotations

import logging

from gnomon import codec
from gnomon.core.alerts import AlertBook, AlertConfig
from gnomon.core.errors import GnomonError
from gnomon.eventlog.port import EventLog, Record
from gnomon.feeds.compacted import CompactedFeed
from gnomon.topology import Topology

log = logging.getLogger("gnomon.alerts")

GROUP_ID = "gnomon-alert-configs"  # never joined, never committed (ACL: gnomon.infra.acls)


class AlertFeed:
    def __init__(self, bootstrap: str, topology: Topology, book: AlertBook, *, role: str | None = None,
                 batch_max: int = 5_000, log: EventLog | None = None) -> None:
        if log is None:
            from gnomon.eventlog.kafka import KafkaEventLog

            log = KafkaEventLog(bootstrap, role=role)
        self.book = book
        self.topic = topology.alert_configs
        self.feed = CompactedFeed(log, GROUP_ID, [self.topic], self._apply, batch_max=batch_max)

    def load(self, timeout_s: float = 30.0) -> int:
        """Read every record up to the end offsets as of now; how many."""
        return self.feed.load(timeout_s)

    def poll(self) -> int:
        """Apply the records that arrived (non-blocking); how many."""
        return self.feed.poll()

    def _apply(self, msg: Record) -> int:
        try:
            key = (msg.key or b"").decode()
            obj = None if msg.value is None else codec.decode(msg.value, topic=self.topic)
            if obj is not None and not isinstance(obj, AlertConfig):
                raise TypeError(f"{type(obj).__name__} is not AlertConfig")
            self.book.apply(key, obj)
        except (GnomonError, TypeError, UnicodeDecodeError) as exc:
            log.warning("alert config record at %s[%d]@%d skipped: %s", msg.topic, msg.partition, msg.offset, exc)
            return 0
        return 1

    def close(self) -> None:
        self.feed.close()
