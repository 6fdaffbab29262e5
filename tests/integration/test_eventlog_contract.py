"""The event-log port's contract (tests/eventlog_contract.py) on Kafka: the same suite the
in-memory log passes in the unit suite, on fresh topics of the local stack."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest

from eventlog_contract import EventLogContract
from gnomon.config import Settings
from gnomon.eventlog.kafka import KafkaEventLog
from gnomon.infra import kafka

pytestmark = pytest.mark.integration


class TestKafkaEventLog(EventLogContract):
    @pytest.fixture
    def log(self, infra: Settings) -> KafkaEventLog:
        return KafkaEventLog(infra.kafka_bootstrap, role="admin")

    @pytest.fixture
    def new_topic(self, infra: Settings) -> Iterator[Callable[[int], str]]:
        from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

        admin = kafka.admin(infra.kafka_bootstrap)
        made: list[str] = []

        def make(partitions: int) -> str:
            name = f"contracttest.{uuid.uuid4().hex[:10]}"
            admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])[name].result(
                timeout=20)
            made.append(name)
            return name

        yield make
        if made:
            for f in admin.delete_topics(made).values():
                f.result(timeout=20)
