"""The registry's store on Kafka: the compacted topic ``Topology.schemas`` (one partition).

``read_all`` reads it from the beginning to the end offset as of the call (outside any
consumer group, committing nothing); ``KafkaStore.append`` writes records and returns
once Kafka acknowledged them (acks=all, idempotent producer). The Kafka principal is
the role ``registry`` (ACLs: ``gnomon.infra.acls``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

from gnomon.adapters.kafka import SyncProducer, consumer_config
from gnomon.core.errors import EventLogError
from gnomon.registry.state import Record, parse_record

ROLE = "registry"
GROUP_ID = "gnomon-registry"  # never joined, never committed
PARTITION = 0


def read_all(bootstrap: str, topic: str, *, role: str = ROLE, timeout_s: float = 30.0) -> list[Record]:
    """Every record of ``topic`` up to its end as of now, in order. Raises EventLogError
    if the end is not reached within ``timeout_s``, or for a record that is not one of
    the registry's (the store must be exact: ids are at stake)."""
    consumer = Consumer(consumer_config(bootstrap, GROUP_ID, role=role, **{"enable.partition.eof": False}))
    try:
        tp = TopicPartition(topic, PARTITION)
        try:
            low, high = consumer.get_watermark_offsets(tp, timeout=timeout_s)
        except KafkaException as exc:
            raise EventLogError(f"cannot read the end offset of {topic}: {exc}") from exc
        records: list[Record] = []
        if high <= low:
            return records
        consumer.assign([TopicPartition(topic, PARTITION, OFFSET_BEGINNING)])
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise EventLogError(f"could not read {topic} to its end ({high}) within {timeout_s:g} s")
            for msg in consumer.consume(500, min(left, 0.5)):
                err = msg.error()
                if err is not None:
                    raise EventLogError(f"cannot read {topic}: {err.str()}")
                try:
                    records.append(parse_record(msg.key() or b"", msg.value()))
                except ValueError as exc:
                    raise EventLogError(f"{topic}@{msg.offset()}: {exc}") from exc
                if (msg.offset() or 0) + 1 >= high:
                    return records
            # compaction may have removed the last records: a position at the end is done
            positions = consumer.position([TopicPartition(topic, PARTITION)])
            if positions and positions[0].offset >= high:
                return records
    finally:
        consumer.close()


class KafkaStore:
    def __init__(self, bootstrap: str, topic: str, *, role: str = ROLE) -> None:
        self.topic = topic
        self._producer = SyncProducer(bootstrap, role=role)

    def append(self, records: Sequence[Record]) -> None:
        for r in records:
            self._producer.send(self.topic, r.key().decode(), r.value())

    def close(self) -> None:
        self._producer.close()
