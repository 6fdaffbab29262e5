"""The Kafka event log adapter translates confluent-kafka's errors into gnomon's
``EventLogError`` (one documented exception tree), subscribe included. No broker: the
consumer is built against an address nothing listens on and never connects."""

from __future__ import annotations

import pytest

from gnomon.core.errors import EventLogError
from gnomon.eventlog.kafka import KafkaGroupConsumer


def test_subscribe_on_a_closed_consumer_is_an_event_log_error() -> None:
    c = KafkaGroupConsumer({"bootstrap.servers": "127.0.0.1:1", "group.id": "gnomon-test-subscribe"})
    c.close()
    with pytest.raises(EventLogError, match=r"cannot subscribe to gnomon\.runs"):
        c.subscribe(["gnomon.runs"], on_assign=lambda _: None, on_revoke=lambda _: None, on_lost=lambda _: None)


def test_subscribe_to_an_invalid_topic_name_is_an_event_log_error() -> None:
    c = KafkaGroupConsumer({"bootstrap.servers": "127.0.0.1:1", "group.id": "gnomon-test-subscribe"})
    try:
        with pytest.raises(EventLogError, match="cannot subscribe"):
            c.subscribe([""], on_assign=lambda _: None, on_revoke=lambda _: None, on_lost=lambda _: None)
    finally:
        c.close()
