"""confluent-kafka configuration and helpers, in one place.

Every producer uses acks=all, idempotence and the ``murmur2_random`` partitioner so
that keys land on the same partitions as Java and aiokafka clients would put them.
"""

from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from gnomon.core.errors import EventLogError


def producer_config(bootstrap: str, **extra: Any) -> dict[str, Any]:
    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "enable.idempotence": True,
        "partitioner": "murmur2_random",
        "linger.ms": 5,
        "compression.type": "lz4",
        "message.timeout.ms": 30_000,
    }
    conf.update(extra)
    return conf


def consumer_config(bootstrap: str, group_id: str, **extra: Any) -> dict[str, Any]:
    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": group_id,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
        "session.timeout.ms": 10_000,
        "heartbeat.interval.ms": 1_000,
        "max.poll.interval.ms": 300_000,
    }
    conf.update(extra)
    return conf


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (as in the Java client's Utils.murmur2)."""
    length = len(data)
    seed = 0x9747B28C
    m = 0x5BD1E995
    r = 24
    h = (seed ^ length) & 0xFFFFFFFF
    length4 = length // 4
    for i in range(length4):
        i4 = i * 4
        k = (data[i4] & 0xFF) + ((data[i4 + 1] & 0xFF) << 8) + ((data[i4 + 2] & 0xFF) << 16) + ((data[i4 + 3] & 0xFF) << 24)
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = (h * m) & 0xFFFFFFFF
        h ^= k
    extra = length % 4
    idx = length & ~3
    if extra == 3:
        h ^= (data[idx + 2] & 0xFF) << 16
    if extra >= 2:
        h ^= (data[idx + 1] & 0xFF) << 8
    if extra >= 1:
        h ^= data[idx] & 0xFF
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h


def partition_for(key: str, partitions: int) -> int:
    """The partition Java's default partitioner (and murmur2_random) picks for a key."""
    return (murmur2(key.encode()) & 0x7FFFFFFF) % partitions


class SyncProducer:
    """A producer whose ``send`` returns only after Kafka acknowledged (acks=all)."""

    def __init__(self, bootstrap: str, **extra: Any) -> None:
        self._p = Producer(producer_config(bootstrap, **{"linger.ms": 0, **extra}))

    def send(self, topic: str, key: str, value: bytes, timeout_s: float = 15.0) -> None:
        errors: list[KafkaError] = []

        def on_delivery(err: KafkaError | None, _msg: Any) -> None:
            if err is not None:
                errors.append(err)

        try:
            self._p.produce(topic, key=key.encode(), value=value, on_delivery=on_delivery)
            remaining = self._p.flush(timeout_s)
        except (KafkaException, BufferError) as exc:
            raise EventLogError(f"could not write to {topic}: {exc}") from exc
        if remaining:
            raise EventLogError(f"Kafka did not acknowledge the write to {topic} within {timeout_s}s")
        if errors:
            raise EventLogError(f"Kafka refused the write to {topic}: {errors[0].str()}")

    def close(self) -> None:
        self._p.flush(5)
