"""librdkafka's send_offsets_to_transaction can block past its timeout for good
(librdkafka #5456: the processor hung there after a broker outage). Every blocking
transactional call of the Kafka adapter is bounded: one that overruns wedges the
producer, reported as a fatal TransactionError now and on every later call, so the
processor builds a new producer instead of hanging."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from gnomon.eventlog import kafka as K
from gnomon.eventlog.port import TransactionError


class StuckProducer:
    """Stands for librdkafka's producer: send_offsets blocks until released."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.commits = 0

    def send_offsets_to_transaction(self, _tps: Any, _meta: Any, _timeout_s: float) -> None:
        self.release.wait(30)

    def commit_transaction(self, _timeout_s: float) -> None:
        self.commits += 1

    def __len__(self) -> int:
        return 3


def producer(monkeypatch: pytest.MonkeyPatch) -> tuple[K.KafkaTransactionalProducer, StuckProducer]:
    monkeypatch.setattr(K, "TXN_CALL_GRACE_S", 0.2)
    p = K.KafkaTransactionalProducer({"bootstrap.servers": "127.0.0.1:1", "transactional.id": "t",
                                      "client.id": "test"})
    stuck = StuckProducer()
    p._p = stuck  # type: ignore[assignment]
    return p, stuck


def test_a_call_that_overruns_its_timeout_wedges_the_producer(monkeypatch: pytest.MonkeyPatch) -> None:
    p, stuck = producer(monkeypatch)
    began = time.monotonic()
    with pytest.raises(TransactionError) as err:
        p.send_offsets({("t", 0): 1}, None, 0.1)
    assert err.value.fatal and "did not return" in str(err.value)
    assert time.monotonic() - began < 5
    with pytest.raises(TransactionError) as again:  # never used again: another thread is inside it
        p.commit(1)
    assert again.value.fatal and stuck.commits == 0
    with pytest.raises(TransactionError):
        p.begin()
    assert p.flush(10) == 3  # at once, not waiting on the wedged producer
    stuck.release.set()


def test_calls_that_return_in_time_go_through(monkeypatch: pytest.MonkeyPatch) -> None:
    p, stuck = producer(monkeypatch)
    stuck.release.set()
    p.send_offsets({("t", 0): 1}, None, 1)
    p.commit(1)
    assert stuck.commits == 1


def test_the_caller_passes_errors_on_and_its_idle_thread_ends() -> None:
    def broken() -> None:
        raise ZeroDivisionError("from the library")

    c = K._BoundedCaller("test", idle_s=0.1)
    with pytest.raises(ZeroDivisionError):
        c.call(broken, 1)
    assert c.call(lambda: None, 1)
    deadline = time.monotonic() + 5
    while any(t.name == "test" for t in threading.enumerate()):
        assert time.monotonic() < deadline, "the idle thread did not end"
        time.sleep(0.05)
    assert c.call(lambda: None, 1)  # started again when needed


class FencedProducer:
    """Stands for librdkafka's producer fenced while its records were on their way."""

    def flush(self, _timeout_s: float) -> int:
        from confluent_kafka import KafkaError, KafkaException
        raise KafkaException(KafkaError(KafkaError._FENCED, "ProduceRequest failed: old epoch", fatal=True))

    def __len__(self) -> int:
        return 15


def test_a_flush_that_finds_the_producer_fenced_is_a_fatal_transaction_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # the processor flushes a transaction's records before its offsets; a fenced producer
    # raised librdkafka's own exception out of that flush, past the processor's handling
    # (it stopped instead of rebuilding its producer: region test, b's processor mid-cut)
    p, _stuck = producer(monkeypatch)
    p._p = FencedProducer()  # type: ignore[assignment]
    with pytest.raises(TransactionError) as err:
        p.flush(1)
    assert err.value.fatal and "flush" in str(err.value)
