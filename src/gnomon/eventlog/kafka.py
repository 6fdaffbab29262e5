"""The event-log port on confluent-kafka: the one place the processor, its feeds and the
worker create Kafka clients, and where librdkafka's errors become ``EventLogError``.

Configs come from ``gnomon.adapters.kafka`` (acks=all, idempotence, the murmur2_random
partitioner, read_committed, SASL per role). ``role`` is the Kafka principal of every
client this log makes (``processor``, ``worker``; None: as ``consumer_config`` picks it).
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from confluent_kafka import (
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)
from confluent_kafka import Producer as _KProducer
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._listoffsets import OffsetSpec  # (not re-exported for type checkers)

from gnomon.adapters.kafka import admin_config, consumer_config, producer_config
from gnomon.core.errors import EventLogError
from gnomon.eventlog.port import (
    TP,
    Delivery,
    Headers,
    Partitions,
    ProducerFatalError,
    Record,
    TransactionError,
)

log = logging.getLogger("gnomon.kafka")

RESTORE_GROUP = "gnomon-restore"  # never joined, never committed
# how much longer than its own timeout a transactional call may block before the producer
# is given up as wedged (librdkafka #5456: send_offsets_to_transaction can ignore its timeout).
# (5 s until issue 51: with a host lost, a processor waited 10 s in a send_offsets given 5 s,
# wedged, before it rebuilt its producer; 2 s still leaves room for a starved process.)
TXN_CALL_GRACE_S = 2.0


def _consume(c: Consumer, max_records: int, timeout_s: float) -> list[Any]:
    """Up to ``max_records`` records, returning as soon as there is one (librdkafka's
    ``consume(n, timeout)`` waits the whole timeout unless ``n`` come: every hop of a run
    released at once, by its upstream's end, would wait it): what is fetched already, else
    the first record within ``timeout_s`` and what came with it."""
    msgs = c.consume(max_records, 0)
    if msgs or timeout_s <= 0:
        return msgs
    msgs = c.consume(1, timeout_s)
    if msgs and max_records > 1:
        msgs.extend(c.consume(max_records - 1, 0))
    return msgs


def _records(msgs: list[Message], where: str) -> list[Record]:
    """Messages as Records; errors are logged and left out (partition EOF silently)."""
    out: list[Record] = []
    for m in msgs:
        err = m.error()
        if err is not None:
            if err.code() != KafkaError._PARTITION_EOF:
                log.warning("%s: consume error: %s", where, err)
            continue
        topic, partition, offset = m.topic(), m.partition(), m.offset()
        if topic is None or partition is None or offset is None:
            continue
        out.append(Record(topic, partition, offset, m.key(), m.value(), m.timestamp()[1], _headers(m)))
    return out


def _headers(m: Message) -> Headers:
    raw = m.headers()
    if not raw:
        return ()
    pairs = raw.items() if isinstance(raw, dict) else raw
    return tuple((str(k), v.encode() if isinstance(v, str) else bytes(v or b"")) for k, v in pairs)


def _kheaders(headers: Headers) -> list[tuple[str, str | bytes | None]] | None:
    """Headers as confluent-kafka's ``produce`` takes them (None: none)."""
    return [(k, v) for k, v in headers] if headers else None


def _txn_error(exc: KafkaException, what: str) -> TransactionError:
    err = exc.args[0] if exc.args else None
    if isinstance(err, KafkaError):
        return TransactionError(f"{what}: {err}", fatal=err.fatal(), retriable=err.retriable())
    return TransactionError(f"{what}: {exc}")


def produce_waiting(producer: _KProducer, topic: str, **kwargs: Any) -> None:
    """``producer.produce`` that waits (serving delivery reports) while its queue is full."""
    while True:
        try:
            producer.produce(topic, **kwargs)
            return
        except BufferError:
            producer.poll(0.05)


def _topic_metadata(client: Any, topic: str, timeout_s: float) -> Any:
    """``topic``'s metadata, asked through ``client`` (a consumer or a producer: either
    refreshes its cache from the answer). EventLogError when it cannot be read."""
    try:
        md = client.list_topics(topic, timeout=timeout_s)
    except KafkaException as exc:
        raise EventLogError(f"cannot read the metadata of {topic}: {exc}") from exc
    t = md.topics.get(topic)
    if t is None or t.error is not None:
        raise EventLogError(f"topic {topic}: {t.error if t is not None else 'missing'}; run `gnomon infra up`")
    return t


class KafkaReader:
    def __init__(self, conf: dict[str, Any]) -> None:
        self._c = Consumer(conf)

    def assign(self, positions: Sequence[tuple[str, int, int]]) -> None:
        try:
            self._c.assign([TopicPartition(t, p, o) for t, p, o in positions])
        except KafkaException as exc:
            raise EventLogError(f"cannot assign {len(positions)} partitions: {exc}") from exc

    def consume(self, max_records: int, timeout_s: float) -> list[Record]:
        try:
            return _records(_consume(self._c, max_records, timeout_s), "reader")
        except KafkaException as exc:
            raise EventLogError(f"consume failed: {exc}") from exc

    def position(self, tps: Sequence[TP]) -> dict[TP, int]:
        return _positions(self._c, tps)

    def watermarks(self, tp: TP, timeout_s: float = 10.0, *, cached: bool = False) -> tuple[int, int]:
        try:
            if cached:
                low, high = self._c.get_watermark_offsets(TopicPartition(*tp), cached=True)
            else:
                low, high = self._c.get_watermark_offsets(TopicPartition(*tp), timeout_s)
        except KafkaException as exc:
            raise EventLogError(f"cannot read the watermarks of {tp[0]}[{tp[1]}]: {exc}") from exc
        return int(low), int(high)

    def committed(self, tps: Sequence[TP], timeout_s: float) -> dict[TP, int | None]:
        try:
            got = self._c.committed([TopicPartition(t, p) for t, p in tps], timeout_s)
        except KafkaException as exc:
            raise EventLogError(f"cannot read committed offsets: {exc}") from exc
        return {(tp.topic, tp.partition): tp.offset if tp.offset >= 0 else None for tp in got}

    def partitions(self, topic: str, timeout_s: float = 10.0) -> list[int]:
        return sorted(_topic_metadata(self._c, topic, timeout_s).partitions)

    def offsets_for_time(self, topic: str, partitions: Sequence[int], ts_ms: int,
                         timeout_s: float = 10.0) -> dict[int, int]:
        try:
            got = self._c.offsets_for_times([TopicPartition(topic, p, ts_ms) for p in partitions], timeout_s)
        except KafkaException as exc:
            raise EventLogError(f"cannot look up offsets by time on {topic}: {exc}") from exc
        return {tp.partition: tp.offset if tp.offset >= 0 else -1 for tp in got}

    def pause(self, tps: Sequence[TP]) -> None:
        try:
            self._c.pause([TopicPartition(t, p) for t, p in tps])
        except KafkaException as exc:
            raise EventLogError(f"pause failed: {exc}") from exc

    def resume(self, tps: Sequence[TP]) -> None:
        try:
            self._c.resume([TopicPartition(t, p) for t, p in tps])
        except KafkaException as exc:
            raise EventLogError(f"resume failed: {exc}") from exc

    def close(self) -> None:
        with contextlib.suppress(KafkaException, RuntimeError):
            self._c.close()


class KafkaGroupConsumer:
    def __init__(self, conf: dict[str, Any]) -> None:
        self._c = Consumer(conf)

    def subscribe(self, topics: Sequence[str], *, on_assign: Partitions, on_revoke: Partitions,
                  on_lost: Partitions) -> None:
        def wrap(cb: Partitions) -> Any:
            return lambda _c, tps: cb([(tp.topic, tp.partition) for tp in tps])

        try:
            self._c.subscribe(list(topics), on_assign=wrap(on_assign), on_revoke=wrap(on_revoke),
                              on_lost=wrap(on_lost))
        except (KafkaException, RuntimeError) as exc:  # RuntimeError: the consumer is closed
            raise EventLogError(f"cannot subscribe to {', '.join(topics)}: {exc}") from exc

    def consume(self, max_records: int, timeout_s: float) -> list[Record]:
        try:
            return _records(_consume(self._c, max_records, timeout_s), "group consumer")
        except KafkaException as exc:
            raise EventLogError(f"consume failed: {exc}") from exc

    def assignment(self) -> list[TP]:
        try:
            return [(tp.topic, tp.partition) for tp in self._c.assignment()]
        except (KafkaException, RuntimeError) as exc:  # RuntimeError: the consumer is closed
            raise EventLogError(f"cannot read the assignment: {exc}") from exc

    def position(self, tps: Sequence[TP]) -> dict[TP, int]:
        return _positions(self._c, tps)

    def high_watermark(self, tp: TP) -> int:
        try:
            return int(self._c.get_watermark_offsets(TopicPartition(*tp), cached=True)[1])
        except KafkaException:
            return -1

    def committed(self, tps: Sequence[TP], timeout_s: float) -> dict[TP, int | None]:
        try:
            got = self._c.committed([TopicPartition(t, p) for t, p in tps], timeout_s)
        except KafkaException as exc:
            raise EventLogError(f"cannot read committed offsets: {exc}") from exc
        return {(tp.topic, tp.partition): tp.offset if tp.offset >= 0 else None for tp in got}

    def seek(self, tp: TP, offset: int) -> None:
        try:
            self._c.seek(TopicPartition(tp[0], tp[1], offset))
        except KafkaException as exc:
            raise EventLogError(f"cannot seek {tp[0]}[{tp[1]}] to {offset}: {exc}") from exc

    def commit(self, offsets: Mapping[TP, int], timeout_s: float) -> None:
        tps = [TopicPartition(t, p, off) for (t, p), off in offsets.items()]
        try:  # (librdkafka bounds a synchronous commit by its own request timeouts, not timeout_s)
            self._c.commit(offsets=tps, asynchronous=False)
        except (KafkaException, RuntimeError) as exc:  # RuntimeError: the consumer is closed
            raise EventLogError(f"offset commit failed: {exc}") from exc

    def group_metadata(self) -> Any:
        return self._c.consumer_group_metadata()

    def close(self) -> None:
        with contextlib.suppress(Exception):  # closing is best-effort
            self._c.close()


class _BoundedCaller:
    """Runs blocking librdkafka calls on a daemon thread of its own and waits for each at
    most a given time. librdkafka's ``send_offsets_to_transaction`` can block forever when
    the group coordinator went away during the call (librdkafka #5456; seen here after a
    broker outage: the processor hung in ``rd_kafka_txn_op_req0`` with the broker back).
    A call that overruns is left behind on its thread (it holds its producer), and the
    caller is told so; the thread is a daemon, so it never holds up an exit. An idle
    thread ends after ``idle_s`` (a dropped producer leaves no thread behind)."""

    def __init__(self, name: str, idle_s: float = 30.0) -> None:
        self._name = name
        self._idle_s = idle_s
        self._jobs: queue.SimpleQueue[tuple[Callable[[], None], list[BaseException | None], threading.Event]] = \
            queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        while True:
            try:
                call, box, done = self._jobs.get(timeout=self._idle_s)
            except queue.Empty:
                with self._lock:
                    if self._jobs.empty():
                        self._thread = None
                        return
                continue
            try:
                call()
            except BaseException as exc:  # handed to the waiting caller
                box[0] = exc
            finally:
                done.set()

    def call(self, call: Callable[[], None], wait_s: float) -> bool:
        """Run ``call``; False when it did not return within ``wait_s`` (it may still)."""
        box: list[BaseException | None] = [None]
        done = threading.Event()
        with self._lock:
            self._jobs.put((call, box, done))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
        if not done.wait(wait_s):
            return False
        if box[0] is not None:
            raise box[0]
        return True


class KafkaTransactionalProducer:
    """Every blocking transactional call is bounded (``_BoundedCaller``): one that blocks
    past its timeout plus ``TXN_CALL_GRACE_S`` wedges the producer, reported as a fatal
    ``TransactionError`` (now and on every later call): build a new one, whose
    ``init_transactions`` fences whatever the wedged one still holds."""

    def __init__(self, conf: dict[str, Any]) -> None:
        self._p = _KProducer(conf)
        self._caller = _BoundedCaller(f"txn-{conf.get('client.id', 'producer')}")
        self._wedged: str | None = None

    def _bounded(self, what: str, call: Callable[[], None], timeout_s: float) -> None:
        if self._wedged is not None:
            raise TransactionError(f"{what}: the producer is wedged ({self._wedged})", fatal=True)
        try:
            returned = self._caller.call(call, timeout_s + TXN_CALL_GRACE_S)
        except KafkaException as exc:
            raise _txn_error(exc, what) from exc
        if not returned:
            self._wedged = f"{what} did not return in {timeout_s + TXN_CALL_GRACE_S:.0f} s"
            log.error("transactional producer wedged: %s (librdkafka #5456); it is given up", self._wedged)
            raise TransactionError(f"{what}: {self._wedged}", fatal=True)

    def init_transactions(self, timeout_s: float) -> None:
        self._bounded("cannot initialise Kafka transactions", lambda: self._p.init_transactions(timeout_s), timeout_s)

    def begin(self) -> None:
        if self._wedged is not None:
            raise TransactionError(f"begin_transaction: the producer is wedged ({self._wedged})", fatal=True)
        try:
            self._p.begin_transaction()
        except KafkaException as exc:
            raise _txn_error(exc, "begin_transaction") from exc

    def produce(self, topic: str, key: bytes | None, value: bytes | None, partition: int | None = None,
                headers: Headers = ()) -> None:
        kwargs: dict[str, Any] = {"key": key, "value": value}
        if partition is not None:
            kwargs["partition"] = partition
        if headers:
            kwargs["headers"] = _kheaders(headers)
        try:
            produce_waiting(self._p, topic, **kwargs)
        except KafkaException as exc:
            raise _txn_error(exc, f"produce to {topic}") from exc

    def partitions(self, topic: str, timeout_s: float) -> int:
        # a metadata request of this producer's own: librdkafka updates the topic's cached
        # metadata from its answer, so a produce to a partition added since then works
        return len(_topic_metadata(self._p, topic, timeout_s).partitions)

    def send_offsets(self, offsets: Mapping[TP, int], group_metadata: Any, timeout_s: float) -> None:
        tps = [TopicPartition(t, p, o) for (t, p), o in offsets.items()]
        self._bounded("send_offsets_to_transaction",
                      lambda: self._p.send_offsets_to_transaction(tps, group_metadata, timeout_s), timeout_s)

    def commit(self, timeout_s: float) -> None:
        self._bounded("commit_transaction", lambda: self._p.commit_transaction(timeout_s), timeout_s)

    def abort(self, timeout_s: float) -> None:
        self._bounded("abort_transaction", lambda: self._p.abort_transaction(timeout_s), timeout_s)

    def flush(self, timeout_s: float) -> int:
        if self._wedged is not None:
            return len(self._p)  # another thread is inside librdkafka's transaction API
        try:
            return int(self._p.flush(timeout_s))
        except KafkaException as exc:  # e.g. fenced while records were on their way (an epoch bump)
            raise _txn_error(exc, "flush") from exc


class KafkaProducer:
    """A plain idempotent producer. librdkafka may put it in a fatal state (e.g. an
    out-of-order sequence it cannot recover from by bumping its epoch); it then delivers
    nothing again, so ``produce`` and ``poll`` raise ``ProducerFatalError`` from then on:
    the owner builds a new producer and sends again what was not acknowledged."""

    def __init__(self, conf: dict[str, Any]) -> None:
        self.fatal: str | None = None
        self._p = _KProducer({**conf, "error_cb": self._on_error})

    def _on_error(self, err: KafkaError) -> None:
        if err.fatal() and self.fatal is None:
            self.fatal = str(err)
            log.error("producer fatal error: %s", err)
        elif not err.fatal():
            log.debug("producer error: %s", err)

    def _raise_if_fatal(self) -> None:
        if self.fatal is not None:
            raise ProducerFatalError(f"the producer is in a fatal state: {self.fatal}")

    def produce(self, topic: str, key: bytes | None, value: bytes | None, *, on_delivery: Delivery | None = None,
                headers: Headers = ()) -> None:
        self._raise_if_fatal()
        kwargs: dict[str, Any] = {"key": key, "value": value}
        if headers:
            kwargs["headers"] = _kheaders(headers)
        if on_delivery is not None:
            report = on_delivery

            def delivered(err: KafkaError | None, msg: Message) -> None:
                if err is not None:
                    if err.code() == KafkaError._FATAL and self.fatal is None:
                        self.fatal = str(err)
                    report(str(err), -1, -1)
                    return
                partition, offset = msg.partition(), msg.offset()
                report(None, -1 if partition is None else partition, -1 if offset is None else offset)

            kwargs["on_delivery"] = delivered
        try:
            produce_waiting(self._p, topic, **kwargs)
        except KafkaException as exc:  # e.g. a record over message.max.bytes
            err = exc.args[0] if exc.args else None
            if isinstance(err, KafkaError) and err.fatal():
                self.fatal = self.fatal or str(err)
                raise ProducerFatalError(f"cannot produce to {topic}: {exc}") from exc
            raise EventLogError(f"cannot produce to {topic}: {exc}") from exc

    def poll(self, timeout_s: float) -> int:
        served = int(self._p.poll(timeout_s))
        self._raise_if_fatal()
        return served

    def flush(self, timeout_s: float) -> int:
        return int(self._p.flush(timeout_s))


# librdkafka debug contexts for the group consumers (e.g. ``cgrp,broker``): how a
# process finds its group coordinator and joins, in its stderr; unset in operation
GROUP_DEBUG_ENV = "GNOMON_KAFKA_GROUP_DEBUG"


class KafkaEventLog:
    def __init__(self, bootstrap: str, *, role: str | None = None) -> None:
        self.bootstrap = bootstrap
        self.role = role

    def reader(self, group_id: str, *, client_id: str | None = None,
               config: Mapping[str, Any] | None = None) -> KafkaReader:
        extra = {**({"client.id": client_id} if client_id else {}), **(config or {})}
        return KafkaReader(consumer_config(self.bootstrap, group_id, role=self.role, **extra))

    def group_consumer(self, group_id: str, *, client_id: str, session_timeout_ms: int,
                       config: Mapping[str, Any] | None = None) -> KafkaGroupConsumer:
        debug = os.environ.get(GROUP_DEBUG_ENV, "")  # librdkafka's own log, to stderr
        return KafkaGroupConsumer(consumer_config(self.bootstrap, group_id, role=self.role, **{
            "client.id": client_id, "session.timeout.ms": session_timeout_ms, **(config or {}),
            **({"debug": debug} if debug else {})}))

    def transactional_producer(self, transactional_id: str, *, client_id: str, transaction_timeout_ms: int,
                               config: Mapping[str, Any] | None = None) -> KafkaTransactionalProducer:
        return KafkaTransactionalProducer(producer_config(self.bootstrap, role=self.role, **{
            "transactional.id": transactional_id, "transaction.timeout.ms": transaction_timeout_ms,
            "message.timeout.ms": transaction_timeout_ms, "client.id": client_id, **(config or {})}))

    def producer(self, *, client_id: str, config: Mapping[str, Any] | None = None) -> KafkaProducer:
        return KafkaProducer(producer_config(self.bootstrap, role=self.role, **{"client.id": client_id,
                                                                                 **(config or {})}))

    def end_offset(self, topic: str, partition: int) -> int:
        return read_end_offset(self.bootstrap, topic, partition, role=self.role)

    def read_to_end(self, topic: str, partition: int, timeout_s: float, start: int | None = None) -> Iterator[Record]:
        return read_partition_to_end(self.bootstrap, topic, partition, timeout_s, start, role=self.role)


class KafkaProbe:
    """Does a broker of the cluster answer? (A metadata request on a client of its own.)
    For liveness: a process that makes no progress while its broker answers is stuck."""

    def __init__(self, bootstrap: str, *, role: str | None = None) -> None:
        self._c = Consumer(consumer_config(bootstrap, RESTORE_GROUP, role=role, **{"client.id": "gnomon-probe"}))

    def reachable(self, timeout_s: float = 3.0) -> bool:
        try:
            md = self._c.list_topics(timeout=timeout_s)
        except KafkaException:
            return False
        return bool(md.brokers)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._c.close()


def read_end_offset(bootstrap: str, topic: str, partition: int, *, role: str | None = None) -> int:
    c = Consumer(consumer_config(bootstrap, RESTORE_GROUP, role=role))
    try:
        return int(c.get_watermark_offsets(TopicPartition(topic, partition), 10)[1])
    except KafkaException as exc:
        raise EventLogError(f"cannot read the end offset of {topic}[{partition}]: {exc}") from exc
    finally:
        c.close()


STABLE_POLL_S = 0.1  # how often a restore asks whether a transaction is still open
# The longest a restore waits for one: a previous owner's transaction ends within its
# timeout (5 s) once its coordinator answers, which a failover delays ~10-25 s (the host
# cut-off test saw 22 s). Below the processor's stall limit (60 s), so a partition that
# stays blocked is retried by the recovery, not taken for a stuck process.
STABLE_WAIT_MAX_S = 45.0


def _latest(admin: AdminClient, tp: TopicPartition, level: IsolationLevel, timeout_s: float) -> int:
    futures = admin.list_offsets({tp: OffsetSpec.latest()}, isolation_level=level,  # type: ignore[no-untyped-call]
                                 request_timeout=max(1.0, timeout_s))
    return int(futures[tp].result(timeout=max(1.0, timeout_s) + 1).offset)


def wait_stable(bootstrap: str, topic: str, partition: int, timeout_s: float, *, role: str | None = None) -> int:
    """Wait until no transaction is open on one partition (its last stable offset reached
    its high watermark) and return that end offset.

    A new owner restores a changelog partition only then. A read_committed read stops at
    the last stable offset; a transaction the previous owner asked to commit (its
    coordinator wrote PrepareCommit) but whose markers are not written yet (the
    coordinator was cut off, or is moving to another broker) is invisible there and
    becomes visible later. Restoring before it ends would decide again what it decided:
    a run created twice, a grant token given twice (found by the host cut-off chaos
    test). Only owners write a changelog partition, and the new owner has written
    nothing yet, so whatever is open is a previous owner's: it commits, or its
    coordinator aborts it within the transaction timeout. EventLogError when that takes
    longer than ``timeout_s`` (the caller's recovery tries again)."""
    tp = TopicPartition(topic, partition)
    timeout_s = min(timeout_s, STABLE_WAIT_MAX_S)
    deadline = time.monotonic() + timeout_s
    try:
        admin = AdminClient(admin_config(bootstrap, role=role))
    except KafkaException as exc:
        raise EventLogError(f"cannot read the end offsets of {topic}[{partition}]: {exc}") from exc
    stable = end = -1
    while True:
        left = deadline - time.monotonic()
        try:
            stable = _latest(admin, tp, IsolationLevel.READ_COMMITTED, left)
            end = _latest(admin, tp, IsolationLevel.READ_UNCOMMITTED, left)
        except (KafkaException, TimeoutError) as exc:
            err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
            retriable = isinstance(err, KafkaError) and err.retriable()
            if not retriable or time.monotonic() + STABLE_POLL_S >= deadline:  # (a leader moving: again)
                raise EventLogError(f"cannot read the end offsets of {topic}[{partition}]: {exc}") from exc
            time.sleep(STABLE_POLL_S)
            continue
        if stable >= end:
            return end
        if time.monotonic() + STABLE_POLL_S >= deadline:
            raise EventLogError(
                f"{topic}[{partition}]: a transaction is still open from offset {stable} (end {end}) after "
                f"{timeout_s:.0f} s; a previous owner's commit or abort has not completed (if it never does, "
                "kafka-transactions.sh find-hanging / abort)")
        time.sleep(STABLE_POLL_S)


def read_partition_to_end(bootstrap: str, topic: str, partition: int, timeout_s: float,
                          start: int | None = None, *, role: str | None = None) -> Iterator[Record]:
    """Every committed record of one partition, from ``start`` (default: the beginning)
    to the current end, once no transaction is open on it (:func:`wait_stable`)."""
    began = time.monotonic()
    end = wait_stable(bootstrap, topic, partition, timeout_s, role=role)
    if start is not None and start >= end:  # (a warm standby's or a checkpoint's usual case)
        return  # nothing to read: no consumer (a client of its own costs a TLS and SASL handshake)
    timeout_s = max(1.0, timeout_s - (time.monotonic() - began))
    c = Consumer(consumer_config(bootstrap, RESTORE_GROUP, role=role,
                                 **{"enable.partition.eof": True, "fetch.wait.max.ms": 10}))
    try:
        try:
            low, high = c.get_watermark_offsets(TopicPartition(topic, partition), 10)
        except KafkaException as exc:
            raise EventLogError(f"cannot read the end offset of {topic}[{partition}]: {exc}") from exc
        low = max(low, start) if start is not None else low
        if high <= low:
            return
        c.assign([TopicPartition(topic, partition, low)])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                batch = c.consume(5000, 0.05)
            except KafkaException as exc:
                raise EventLogError(f"restoring {topic}[{partition}]: {exc}") from exc
            if not batch:
                pos = c.position([TopicPartition(topic, partition)])[0].offset
                if pos is not None and pos >= high:
                    return
                continue
            for msg in batch:
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        return
                    raise EventLogError(f"restoring {topic}[{partition}]: {err}")
                offset = msg.offset()
                assert offset is not None
                yield Record(topic, partition, offset, msg.key(), msg.value(), msg.timestamp()[1], _headers(msg))
                if offset + 1 >= high:
                    return
        raise EventLogError(f"restoring {topic}[{partition}] did not reach offset {high} in {timeout_s}s")
    finally:
        c.close()


def _positions(c: Consumer, tps: Sequence[TP]) -> dict[TP, int]:
    """The consumer's next offset per partition; -1 where it has none yet."""
    try:
        got = c.position([TopicPartition(t, p) for t, p in tps])
    except KafkaException as exc:
        raise EventLogError(f"cannot read positions: {exc}") from exc
    return {(tp.topic, tp.partition): tp.offset if tp.offset is not None and tp.offset >= 0 else -1 for tp in got}


class SyncProducer:
    """A producer whose ``send`` returns only after Kafka acknowledged (acks=all)."""

    def __init__(self, bootstrap: str, *, role: str | None = None, **extra: Any) -> None:
        self._p = _KProducer(producer_config(bootstrap, role=role, **{"linger.ms": 0, **extra}))

    def send(self, topic: str, key: str, value: bytes, timeout_s: float = 15.0, headers: Headers = (),
             ) -> tuple[int, int]:
        """Where Kafka put the record: (partition, offset)."""
        errors: list[KafkaError] = []
        written: list[tuple[int, int]] = []

        def on_delivery(err: KafkaError | None, msg: Any) -> None:
            if err is not None:
                errors.append(err)
            else:
                written.append((int(msg.partition()), int(msg.offset())))

        try:
            self._p.produce(topic, key=key.encode(), value=value, on_delivery=on_delivery,
                            headers=_kheaders(headers))
            remaining = self._p.flush(timeout_s)
        except (KafkaException, BufferError) as exc:
            raise EventLogError(f"could not write to {topic}: {exc}") from exc
        if remaining:
            raise EventLogError(f"Kafka did not acknowledge the write to {topic} within {timeout_s}s")
        if errors:
            raise EventLogError(f"Kafka refused the write to {topic}: {errors[0].str()}")
        if not written:
            raise EventLogError(f"Kafka did not report where it wrote to {topic}")
        return written[0]

    def send_many(self, topic: str, items: Sequence[tuple[str, bytes]], timeout_s: float = 15.0,
                  positions: list[tuple[int, int] | None] | None = None,
                  headers: Sequence[Headers] | None = None) -> list[str | None]:
        """Produce every ``(key, value)``, then wait once for Kafka's acknowledgements
        (acks=all). One entry per item: None, or why it is not known to be written.
        ``positions``: filled with where each written item went (partition, offset).
        ``headers``: each item's headers (the same length as ``items``)."""
        assert headers is None or len(headers) == len(items)
        errors: list[str | None] = ["not acknowledged"] * len(items)
        if positions is not None:
            positions[:] = [None] * len(items)

        def on_delivery_of(i: int) -> Callable[[KafkaError | None, Any], None]:
            def on_delivery(err: KafkaError | None, msg: Any) -> None:
                errors[i] = None if err is None else f"Kafka refused the write to {topic}: {err.str()}"
                if err is None and positions is not None:
                    positions[i] = (int(msg.partition()), int(msg.offset()))
            return on_delivery

        deadline = time.monotonic() + timeout_s
        for i, (key, value) in enumerate(items):
            while True:
                try:
                    own = _kheaders(headers[i]) if headers is not None else None
                    self._p.produce(topic, key=key.encode(), value=value, on_delivery=on_delivery_of(i), headers=own)
                    break
                except BufferError:  # the local queue is full: let deliveries drain it
                    if time.monotonic() > deadline:
                        errors[i] = f"could not queue the write to {topic} within {timeout_s}s"
                        break
                    self._p.poll(0.05)
                except KafkaException as exc:
                    errors[i] = f"could not write to {topic}: {exc}"
                    break
        why = f"Kafka did not acknowledge the write to {topic} within {timeout_s}s"
        try:
            self._p.flush(max(0.0, deadline - time.monotonic()))
        except KafkaException as exc:
            why = f"could not write to {topic}: {exc}"
        return [why if e == "not acknowledged" else e for e in errors]

    def close(self) -> None:
        self._p.flush(5)
