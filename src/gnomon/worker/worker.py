"""``gnomon worker``: a consumer-group member of one pool.

Loop: read dispatch hints (gnomon.dispatch.<pool>.<priority>) while it has free slots,
send a Claim for each, wait for the run processor's Grant on this worker's inbox
partition, execute the attempt in a thread, heartbeat every lease/3 with the fencing
token, report the outcome. A Stop on the inbox (stale token, cancel) ends the attempt.
The Kafka loop never blocks on an attempt, so max.poll.interval.ms is never exceeded.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from gnomon import codec
from gnomon.adapters.kafka import consumer_config, partition_for, producer_config
from gnomon.config import load
from gnomon.core.clock import Clock, SystemClock
from gnomon.core.errors import GnomonError
from gnomon.core.messages import DispatchRun, Grant, LeaseAck, LogLine, LogStream, Stop, StopReason
from gnomon.core.runs import ClaimRun, CompleteAttempt, Heartbeat, Outcome
from gnomon.topology import Topology, load_topology
from gnomon.worker.executors import AttemptContext, AttemptResult, Dispatcher, Handler

log = logging.getLogger("gnomon.worker")


@dataclass
class _Attempt:
    grant: Grant
    ctx: AttemptContext
    thread: threading.Thread
    last_heartbeat_ms: int
    seq: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


class Worker:
    def __init__(
        self,
        pool: str = "default",
        *,
        bootstrap: str | None = None,
        worker_id: str | None = None,
        concurrency_max: int = 8,
        claim_timeout_s: float = 5.0,
        drain_timeout_s: float = 30.0,
        clock: Clock | None = None,
        topology: Topology | None = None,
    ) -> None:
        if concurrency_max < 1:
            raise ValueError("concurrency_max must be >= 1")
        self.pool = pool
        self.bootstrap = bootstrap or load().kafka_bootstrap
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(2)}"
        self.concurrency_max = concurrency_max
        self.claim_timeout_s = claim_timeout_s
        self.drain_timeout_s = drain_timeout_s
        self.clock = clock or SystemClock()
        self.topo = topology or load_topology()
        self.handlers: dict[str, Handler] = {}
        self._stop = threading.Event()
        self._pending: dict[str, float] = {}  # run_id -> monotonic time the claim was sent
        self._running: dict[str, _Attempt] = {}
        self._done: queue.Queue[tuple[_Attempt, AttemptResult]] = queue.Queue()
        self.completed = 0
        self._producer: Producer | None = None

    # ---- SDK ---------------------------------------------------------------------------

    def handler(self, name: str) -> Callable[[Handler], Handler]:
        """Register a Python function for jobs whose target is {"type": "handler", "name": name}."""

        def register(fn: Handler) -> Handler:
            if name in self.handlers:
                raise ValueError(f"handler {name!r} registered twice")
            self.handlers[name] = fn
            return fn

        return register

    def stop(self) -> None:
        self._stop.set()

    # ---- loop --------------------------------------------------------------------------

    def run(self) -> None:
        self._producer = Producer(producer_config(self.bootstrap, **{"client.id": f"worker-{self.worker_id}"}))
        executor = Dispatcher(self.handlers)
        inbox = self._open_inbox()
        dispatch = Consumer(consumer_config(
            self.bootstrap, f"gnomon-workers-{self.pool}",
            **{"enable.auto.commit": True, "auto.offset.reset": "earliest", "client.id": f"worker-{self.worker_id}"},
        ))
        dispatch.subscribe(self.topo.dispatch_topics(self.pool))
        paused = False
        log.info("worker %s serving pool %s (concurrency %d)", self.worker_id, self.pool, self.concurrency_max)
        try:
            while not self._stop.is_set():
                for msg in inbox.consume(200, 0):
                    if not msg.error():
                        self._on_inbox(msg.value(), executor)
                self._finish_done()
                self._heartbeat()
                self._expire_claims()
                free = self.concurrency_max - len(self._running) - len(self._pending)
                if free <= 0 and not paused:
                    dispatch.pause(dispatch.assignment())
                    paused = True
                elif free > 0 and paused:
                    dispatch.resume(dispatch.assignment())
                    paused = False
                for msg in dispatch.consume(max(free, 1), 0.05):
                    if msg.error():
                        if msg.error().code() != KafkaError._PARTITION_EOF:
                            log.warning("dispatch consume error: %s", msg.error())
                        continue
                    self._on_dispatch(msg.value())
                self._producer.poll(0)
            self._drain(inbox, executor)
        finally:
            dispatch.close()
            inbox.close()
            self._producer.flush(10)

    def _open_inbox(self) -> Consumer:
        c = Consumer(consumer_config(self.bootstrap, "gnomon-worker-inbox",
                                     **{"client.id": f"worker-{self.worker_id}"}))
        p = partition_for(self.worker_id, self._inbox_partitions(c))
        _, high = c.get_watermark_offsets(TopicPartition(self.topo.worker_inbox, p), 10)
        c.assign([TopicPartition(self.topo.worker_inbox, p, high)])
        return c

    def _inbox_partitions(self, c: Consumer) -> int:
        md = c.list_topics(self.topo.worker_inbox, timeout=10)
        return len(md.topics[self.topo.worker_inbox].partitions)

    def _send(self, topic: str, key: str, obj: Any) -> None:
        assert self._producer is not None
        while True:
            try:
                self._producer.produce(topic, key=key.encode(), value=codec.encode(obj))
                return
            except BufferError:
                self._producer.poll(0.05)

    # ---- dispatch and inbox ----------------------------------------------------------------

    def _on_dispatch(self, raw: bytes | None) -> None:
        try:
            hint = codec.decode(raw or b"")
        except GnomonError as exc:
            log.warning("undecodable dispatch message skipped: %s", exc)
            return
        if not isinstance(hint, DispatchRun) or hint.run_id in self._pending or hint.run_id in self._running:
            return
        self._pending[hint.run_id] = time.monotonic()
        self._send(self.topo.run_events, hint.job_id, ClaimRun(hint.run_id, self.worker_id, self.clock.now_ms()))

    def _on_inbox(self, raw: bytes | None, executor: Dispatcher) -> None:
        try:
            msg = codec.decode(raw or b"")
        except GnomonError as exc:
            log.warning("undecodable inbox message skipped: %s", exc)
            return
        if getattr(msg, "worker_id", None) != self.worker_id:
            return  # another worker's message on the same partition
        if isinstance(msg, Grant):
            self._pending.pop(msg.run_id, None)
            if msg.run_id in self._running:
                return
            self._start(msg, executor)
        elif isinstance(msg, Stop):
            self._pending.pop(msg.run_id, None)
            att = self._running.get(msg.run_id)
            if att is not None and msg.kind is not StopReason.REJECTED and msg.token >= att.grant.token:
                log.warning("stopping %s: %s (%s)", msg.run_id, msg.kind.value, msg.reason)
                att.ctx.request_stop(f"{msg.kind.value}: {msg.reason}")
        elif isinstance(msg, LeaseAck):
            pass

    def _start(self, grant: Grant, executor: Dispatcher) -> None:
        payload = json.loads(grant.spec.payload_json)
        remaining_s = max(1.0, min(grant.spec.timeout_s, (grant.deadline_ms - self.clock.now_ms()) / 1000))
        holder: list[_Attempt] = []

        def emit(stream: LogStream | str, line: str) -> None:
            stream = LogStream(stream)  # handlers may pass "stdout" / "stderr"
            att = holder[0]
            with att.lock:
                att.seq += 1
                seq = att.seq
            self._send(self.topo.run_logs, grant.run_id, LogLine(grant.run_id, grant.job_id, grant.tenant,
                                                                grant.attempt, seq, stream, line, self.clock.now_ms()))

        ctx = AttemptContext(grant.run_id, grant.job_id, grant.attempt, payload, float(remaining_s), emit)

        def body() -> None:
            emit(LogStream.SYSTEM, f"attempt {grant.attempt} started on {self.worker_id} ({grant.spec.target.describe()})")
            try:
                result = executor.execute(grant.spec.target, ctx)
            except Exception as exc:  # an executor bug must still end the attempt
                log.exception("executor crashed")
                result = AttemptResult(Outcome.FAILED,
                                       error=f"executor error: {exc}")
            self._done.put((holder[0], result))

        thread = threading.Thread(target=body, daemon=True, name=f"attempt-{grant.run_id}")
        att = _Attempt(grant, ctx, thread, self.clock.now_ms())
        holder.append(att)
        self._running[grant.run_id] = att
        thread.start()

    def _finish_done(self) -> None:
        while True:
            try:
                att, result = self._done.get_nowait()
            except queue.Empty:
                return
            g = att.grant
            self._running.pop(g.run_id, None)
            self.completed += 1
            self._send(self.topo.run_events, g.job_id, CompleteAttempt(
                g.run_id, self.worker_id, g.token, result.outcome, self.clock.now_ms(), result.exit_code, result.error))

    def _heartbeat(self) -> None:
        now = self.clock.now_ms()
        for att in list(self._running.values()):
            g = att.grant
            interval_ms = max(1000, (g.lease_until_ms - g.at_ms) // 3)
            if now - att.last_heartbeat_ms >= interval_ms:
                att.last_heartbeat_ms = now
                self._send(self.topo.run_events, g.job_id, Heartbeat(g.run_id, self.worker_id, g.token, now))

    def _expire_claims(self) -> None:
        cutoff = time.monotonic() - self.claim_timeout_s
        for run_id, sent in list(self._pending.items()):
            if sent < cutoff:
                del self._pending[run_id]

    def _drain(self, inbox: Consumer, executor: Dispatcher) -> None:
        deadline = time.monotonic() + self.drain_timeout_s
        while self._running and time.monotonic() < deadline:
            for msg in inbox.consume(100, 0.1):
                if not msg.error():
                    self._on_inbox(msg.value(), executor)
            self._finish_done()
            self._heartbeat()
        self._finish_done()
