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


def test_a_restore_with_nothing_past_its_start_makes_no_consumer(monkeypatch: pytest.MonkeyPatch) -> None:
    # a warm standby (or a checkpoint) already at the changelog's stable end reads nothing:
    # no restore consumer of its own (each costs a TLS and SASL handshake: 0.5-1 s per
    # partition restored after a rebalance on the three-host TLS cluster)
    import gnomon.eventlog.kafka as mod

    made: list[object] = []
    monkeypatch.setattr(mod, "wait_stable", lambda *_a, **_k: 7)
    monkeypatch.setattr(mod, "Consumer", lambda *a, **_k: made.append(a) or pytest.fail("a consumer was made"))
    assert list(mod.read_partition_to_end("127.0.0.1:1", "gnomon.runs", 0, 5.0, start=7)) == []
    assert list(mod.read_partition_to_end("127.0.0.1:1", "gnomon.runs", 0, 5.0, start=9)) == []
    assert made == []
    with pytest.raises(pytest.fail.Exception):  # records past the start (or a full rebuild): it reads
        list(mod.read_partition_to_end("127.0.0.1:1", "gnomon.runs", 0, 5.0, start=3))
