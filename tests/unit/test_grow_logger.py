"""`gnomon infra grow`'s marker producer survives librdkafka's log lines (its logger is a
logging.Logger: a plain function crashed the flush with "'function' object has no
attribute 'log'" the first time librdkafka logged, e.g. a broker connection closed)."""

from __future__ import annotations

import logging

from confluent_kafka import Producer

from gnomon.infra import grow


def test_the_marker_producers_logger_takes_librdkafkas_lines() -> None:
    assert isinstance(grow._quiet, logging.Logger)
    # nothing listens on port 1: librdkafka logs the refused connections (debug=broker)
    producer = Producer({"bootstrap.servers": "127.0.0.1:1", "logger": grow._quiet, "debug": "broker",
                         "message.timeout.ms": 500})
    producer.produce("t", b"x")
    assert producer.flush(2.0) == 0  # (timed out and reported, not raised)
