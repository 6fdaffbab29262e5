"""Reading a topic's committed records for the real-stack suites (chaos, e2e, benches): its
end offsets and every record from given offsets up to them. One reader, so the EOF and
open-transaction rules below are written once."""

from __future__ import annotations

import time
from collections.abc import Iterator

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from gnomon.adapters.kafka import consumer_config


def end_offsets(bootstrap: str, topic: str, attempts: int = 10, *, committed: bool = True) -> list[TopicPartition]:
    """End offset of every partition; retried while leadership settles (3-node clusters).
    ``committed``: the last stable offset (read_committed: an open transaction holds it
    back); else the high watermark, past every record written, decided or not."""
    isolation = "read_committed" if committed else "read_uncommitted"
    for attempt in range(attempts):
        c = Consumer(consumer_config(bootstrap, "chaos-offsets", **{"isolation.level": isolation}))
        try:
            md = c.list_topics(topic, timeout=10)
            return [TopicPartition(topic, p, c.get_watermark_offsets(TopicPartition(topic, p), 10)[1])
                    for p in sorted(md.topics[topic].partitions)]
        except KafkaException:
            if attempt == attempts - 1:
                raise
            time.sleep(1)
        finally:
            c.close()
    raise AssertionError("unreachable")


def read_messages(bootstrap: str, start: list[TopicPartition], timeout_s: float = 90,
                  group: str = "chaos-reader") -> Iterator[Message]:
    """Every committed record from ``start`` to the current end, raw (tombstones too), in
    partition order."""
    topic = start[0].topic
    ends = {tp.partition: tp.offset for tp in end_offsets(bootstrap, topic)}
    c = Consumer(consumer_config(bootstrap, group, **{"enable.partition.eof": True}))
    try:
        c.assign(start)
        pending = {tp.partition for tp in start if ends[tp.partition] > tp.offset}
        deadline = time.monotonic() + timeout_s
        while pending and time.monotonic() < deadline:
            msg = c.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                # EOF comes at the last stable offset: a killed processor's open
                # transaction holds it back until the broker aborts it (transaction
                # timeout, then the coordinator's next sweep), and committed records
                # behind it come after. Done only at the end offset read above.
                if msg.error().code() == KafkaError._PARTITION_EOF and msg.offset() >= ends[msg.partition()]:
                    pending.discard(msg.partition())
                continue
            yield msg
            if msg.offset() + 1 >= ends[msg.partition()]:
                pending.discard(msg.partition())
    finally:
        c.close()
