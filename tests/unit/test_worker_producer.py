"""A worker whose idempotent producer turns fatal (an out-of-order sequence after a broker
outage, say) builds a new one and sends again, in order and with their fencing tokens,
the results the old one never acknowledged; late reports of the old producer are ignored,
and a delivery that timed out (broker away) never counts towards giving a result up."""

from __future__ import annotations

from typing import Any

from gnomon import codec
from gnomon.core.clock import FakeClock
from gnomon.core.runs import CompleteAttempt, Outcome
from gnomon.eventlog.port import Delivery, ProducerFatalError
from gnomon.topology import load_topology
from gnomon.worker import Worker
from gnomon.worker.worker import RESULT_SENDS_MAX


class FlakyProducer:
    """Keeps what it was given with its delivery reports; ``fatal`` makes it refuse."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, Any, Delivery | None]] = []
        self.fatal = False

    def produce(self, topic: str, key: bytes | None, value: bytes | None, *, on_delivery: Delivery | None = None,
                ) -> None:
        if self.fatal:
            raise ProducerFatalError("fatal: out of order sequence")
        self.sent.append((topic, codec.decode(value or b""), on_delivery))

    def poll(self, _timeout_s: float) -> int:
        if self.fatal:
            raise ProducerFatalError("fatal: out of order sequence")
        return 0

    def flush(self, _timeout_s: float) -> int:
        return 0


class Log:
    def __init__(self) -> None:
        self.producers: list[FlakyProducer] = []

    def producer(self, *, client_id: str, config: Any = None) -> FlakyProducer:
        self.producers.append(FlakyProducer())
        return self.producers[-1]


def make() -> tuple[Worker, FakeClock, Log]:
    clock = FakeClock()
    log = Log()
    w = Worker("default", worker_id="w1", clock=clock, topology=load_topology(), tenants=["t"],
               log=log)  # type: ignore[arg-type]
    w._producer = w._new_producer()
    return w, clock, log


def result(run: str, token: int) -> CompleteAttempt:
    return CompleteAttempt(f"j@{run}", "w1", token, Outcome.SUCCEEDED, 1000, 0, None, 900, None)


def test_unacknowledged_results_are_sent_again_on_a_new_producer_with_their_tokens() -> None:
    w, _, log = make()
    topic = w.topo.run_events
    for run, token in (("1", 3), ("2", 5), ("3", 7)):
        w._send(topic, "j", result(run, token), checked=True)
    first = log.producers[0]
    assert first.sent[0][2] is not None
    first.sent[0][2](None, 0, 0)  # the first one was acknowledged
    first.fatal = True
    w._poll_producer()
    assert w._producer_fatal is not None
    w._send(topic, "j", result("4", 9), checked=True)  # while fatal: kept for the next producer
    w._rebuild_producer()
    assert len(log.producers) == 2 and w.producer_rebuilds == 1 and w._producer_fatal is None
    again = [(m.run_id, m.token) for _, m, _ in log.producers[1].sent]
    assert again == [("j@2", 5), ("j@3", 7), ("j@4", 9)]  # in their order, with their tokens
    # a late report of the old producer changes nothing
    first.sent[1][2](None, 0, 1)  # type: ignore[misc]
    assert len(w._unacked) == 3 and not w._undelivered
    for _, _, report in log.producers[1].sent:
        assert report is not None
        report(None, 0, 0)
    assert not w._unacked


def test_a_producer_is_rebuilt_at_most_once_a_second() -> None:
    w, clock, log = make()
    log.producers[0].fatal = True
    w._send(w.topo.run_events, "j", result("1", 1), checked=True)
    w._rebuild_producer()
    log.producers[1].fatal = True
    w._poll_producer()
    w._rebuild_producer()
    assert len(log.producers) == 2  # too soon
    clock.advance(1000)
    w._rebuild_producer()
    assert len(log.producers) == 3
    assert [(m.run_id, m.token) for _, m, _ in log.producers[2].sent] == [("j@1", 1)]


def test_a_timed_out_delivery_never_counts_towards_giving_the_result_up() -> None:
    w, _, log = make()
    w._send(w.topo.run_events, "j", result("1", 1), checked=True)
    for _ in range(RESULT_SENDS_MAX + 5):  # a long outage: every send times out
        report = log.producers[0].sent[-1][2]
        assert report is not None
        report('KafkaError{code=_MSG_TIMED_OUT,val=-192,str="Local: Message timed out"}', -1, -1)
        w._resend_undelivered()
    assert len(log.producers[0].sent) == RESULT_SENDS_MAX + 6  # never given up
    report = log.producers[0].sent[-1][2]
    assert report is not None
    report(None, 0, 0)
    assert not w._unacked and not w._undelivered


def test_a_refused_result_is_given_up_after_the_limit() -> None:
    w, _, log = make()
    w._send(w.topo.run_events, "j", result("1", 1), checked=True)
    for _ in range(RESULT_SENDS_MAX + 5):
        report = log.producers[0].sent[-1][2]
        assert report is not None
        report("KafkaError{code=TOPIC_AUTHORIZATION_FAILED}", -1, -1)
        w._resend_undelivered()
    assert len(log.producers[0].sent) == RESULT_SENDS_MAX + 1  # the first send and the resends
    assert not w._unacked
