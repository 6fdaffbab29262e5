"""Feed worker adverts (gnomon.workers) into a processor's ``WorkerDirectory``.

Not part of the processor's consumer group and not transactional: every processor
instance reads every advert, starting ``lookback_ms`` back so a restarted processor
knows the live workers at once. The directory is soft state; grants it leads to are
fenced like any other.
"""

from __future__ import annotations

import contextlib
import logging

from confluent_kafka import Consumer, KafkaException, TopicPartition

from gnomon import codec
from gnomon.adapters.kafka import consumer_config
from gnomon.core.clock import Clock
from gnomon.core.errors import EventLogError, GnomonError
from gnomon.core.workers import WorkerAdvert, WorkerDirectory

log = logging.getLogger("gnomon.processor")


class AdvertFeed:
    def __init__(self, bootstrap: str, topic: str, directory: WorkerDirectory, clock: Clock,
                 lookback_ms: int = 10_000, batch_max: int = 5_000) -> None:
        self.topic = topic
        self.directory = directory
        self.clock = clock
        self.batch_max = batch_max
        self.consumer = Consumer(consumer_config(bootstrap, "gnomon-adverts",
                                                 **{"enable.auto.commit": False, "fetch.wait.max.ms": 10}))
        try:
            md = self.consumer.list_topics(topic, timeout=10)
            if md.topics[topic].error is not None:
                raise EventLogError(f"topic {topic}: {md.topics[topic].error}; run `gnomon infra up`")
            since = clock.now_ms() - lookback_ms
            tps = [TopicPartition(topic, p, since) for p in md.topics[topic].partitions]
            starts = self.consumer.offsets_for_times(tps, 10)
        except KafkaException as exc:
            raise EventLogError(f"cannot read worker adverts from {topic}: {exc}") from exc
        # offset -1 (nothing that recent): start at the end
        self.consumer.assign([TopicPartition(topic, tp.partition, tp.offset if tp.offset >= 0 else -1)
                              for tp in starts])

    def poll(self) -> int:
        """Observe the adverts that arrived (non-blocking); how many."""
        n = 0
        now = self.clock.now_ms()
        for msg in self.consumer.consume(self.batch_max, 0):
            raw = msg.value()
            if msg.error() or raw is None:
                continue
            try:
                advert = codec.decode(raw)
            except GnomonError as exc:
                log.warning("undecodable worker advert skipped: %s", exc)
                continue
            if isinstance(advert, WorkerAdvert):
                self.directory.observe(advert, now)
                n += 1
        return n

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.consumer.close()
