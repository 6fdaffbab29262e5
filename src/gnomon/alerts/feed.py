"""Feed the tenants' alert configs (``gnomon.alert-configs``) into an ``AlertBook``.

The topic is compacted and small: the alerter and every API instance read it whole,
from offset 0, outside any consumer group and without committing (as
``streams/tenant_feed.py`` reads tenant limits): ``load`` once at start, then ``poll``.
A record that does not decode or names another tenant than its key is logged and
skipped; a tombstone turns the tenant's alerts off.
"""

from __future__ import annotations

import contextlib
import logging
import time

from gnomon import codec
from gnomon.core.alerts import AlertBook, AlertConfig
from gnomon.core.errors import EventLogError, GnomonError
from gnomon.eventlog.port import OFFSET_BEGINNING, TP, EventLog, Record
from gnomon.topology import Topology

log = logging.getLogger("gnomon.alerts")

GROUP_ID = "gnomon-alert-configs"  # never joined, never committed (ACL: gnomon.infra.acls)
METADATA_TIMEOUT_S = 10.0


class AlertFeed:
    def __init__(self, bootstrap: str, topology: Topology, book: AlertBook, *, role: str | None = None,
                 batch_max: int = 5_000, log: EventLog | None = None) -> None:
        if log is None:
            from gnomon.eventlog.kafka import KafkaEventLog

            log = KafkaEventLog(bootstrap, role=role)
        self.book = book
        self.topic = topology.alert_configs
        self.batch_max = batch_max
        self.consumer = log.reader(GROUP_ID, config={"enable.auto.commit": False, "fetch.wait.max.ms": 10})
        try:
            self._partitions: list[TP] = [(self.topic, p) for p in self.consumer.partitions(self.topic,
                                                                                           METADATA_TIMEOUT_S)]
        except EventLogError as exc:
            raise EventLogError(f"cannot read alert configs from {self.topic}: {exc}") from exc
        self.consumer.assign([(t, p, OFFSET_BEGINNING) for t, p in self._partitions])

    def load(self, timeout_s: float = 30.0) -> int:
        """Read every record up to the end offsets as of now; how many."""
        deadline = time.monotonic() + timeout_s
        ends = {tp: self.consumer.watermarks(tp, timeout_s)[1] for tp in self._partitions}
        pending = {tp for tp, end in ends.items() if end > 0}
        n = 0
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise EventLogError(f"could not read {self.topic} to the end within {timeout_s:g} s")
            for msg in self.consumer.consume(self.batch_max, min(left, 0.5)):
                n += self._apply(msg)
                tp = (msg.topic, msg.partition)
                if tp in pending and msg.offset + 1 >= ends[tp]:
                    pending.discard(tp)
            with contextlib.suppress(EventLogError):  # compaction can remove the last records
                for tp, offset in self.consumer.position(sorted(pending)).items():
                    if offset >= ends[tp]:
                        pending.discard(tp)
        return n

    def poll(self) -> int:
        """Apply the records that arrived (non-blocking); how many."""
        return sum(self._apply(msg) for msg in self.consumer.consume(self.batch_max, 0))

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
        self.consumer.close()
