"""The registry's store on Kafka: the compacted topic ``Topology.schemas`` (one partition).

``read_all`` reads it from the beginning to the end offset as of the call (outside any
consumer group, committing nothing); ``KafkaStore.append`` writes records and returns
once Kafka acknowledged them (acks=all, idempotent producer). The Kafka principal is
the role ``registry`` (ACLs: ``gnomon.infra.acls``).
"""

from __future__ import annotations

from collections.abc import Sequence

from gnomon.core.errors import EventLogError
from gnomon.eventlog.kafka import SyncProducer
from gnomon.eventlog.port import EventLog
from gnomon.eventlog.port import Record as LogRecord
from gnomon.feeds.compacted import CompactedFeed
from gnomon.registry.state import Record, parse_record

ROLE = "registry"
GROUP_ID = "gnomon-registry"  # never joined, never committed


def read_all(bootstrap: str, topic: str, *, role: str = ROLE, timeout_s: float = 30.0,
             log: EventLog | None = None) -> list[Record]:
    """Every record of ``topic`` up to its end as of now, in order (the compacted-feed
    reader, ``gnomon.feeds.compacted``, on ``log``: default Kafka at ``bootstrap`` as
    ``role``). Raises EventLogError if the end is not reached within ``timeout_s``, or
    for a record that is not one of the registry's (the store must be exact: ids are at
    stake)."""
    if log is None:
        from gnomon.eventlog.kafka import KafkaEventLog

        log = KafkaEventLog(bootstrap, role=role)
    records: list[Record] = []

    def apply(msg: LogRecord) -> int:
        try:
            records.append(parse_record(msg.key or b"", msg.value))
        except ValueError as exc:
            raise EventLogError(f"{topic}@{msg.offset}: {exc}") from exc
        return 1

    feed = CompactedFeed(log, GROUP_ID, [topic], apply, batch_max=500)
    try:
        feed.load(timeout_s)
    finally:
        feed.close()
    return records


class KafkaStore:
    def __init__(self, bootstrap: str, topic: str, *, role: str = ROLE) -> None:
        self.topic = topic
        self._producer = SyncProducer(bootstrap, role=role)

    def append(self, records: Sequence[Record]) -> None:
        for r in records:
            self._producer.send(self.topic, r.key().decode(), r.value())

    def close(self) -> None:
        self._producer.close()
