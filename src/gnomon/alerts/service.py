"""``Alerter``: the run ledger (``gnomon.runs``) -> the tenants' alert webhooks.

Consumes the ledger in consumer group ``gnomon-alerter`` (read_committed: only states
of committed processor transactions; manual commits), keeps the tenants' alert configs
from ``gnomon.alert-configs`` (``AlertFeed``, polled every loop), and asks
``core.alerts.AlertMemory.observe`` (``decide`` plus a bounded memory of what it saw of
each run) which alerts each state raises. The scheduler's hot path is not involved: the
processor writes the ledger anyway.

Delivery is at-least-once and never holds the consumer for one webhook: each alert is
handed to a pool of at most ``DeliveryPolicy.in_flight_max`` deliveries (the consumer
waits for a free place, nothing longer), of which one tenant holds at most
``tenant_in_flight_max``; a tenant's further alerts wait in its own bounded backlog
(``tenant_backlog_max``; full: the alert is given up and counted, ``stats.backlog_full``),
so one tenant's hanging webhook never delays another's. A delivery calls the webhook up to
``attempts_max`` times with capped exponential backoff (``gnomon.retrying.Retry``), then
gives up: the alert is logged at ERROR with its key and counted (``stats.given_up``).
A record's offset is committed only once every alert it raised is delivered or given
up (``OffsetTracker``), so a crash or a stop re-reads, and re-sends, at most what was
not settled. Receivers drop repeats by the ``Idempotency-Key``.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from gnomon import region
from gnomon.alerts.sender import AlertDeliveryError, AlertSender
from gnomon.core.alerts import Alert, AlertBook, AlertMemory, DeliveryPolicy
from gnomon.core.clock import Clock, SystemClock
from gnomon.core.errors import EventLogError
from gnomon.core.runs import RunState
from gnomon.eventlog.port import TP, EventLog, GroupConsumer, Record
from gnomon.retrying import Retry
from gnomon.topology import load_topology

__all__ = ["GROUP_ID", "Alerter", "AlerterStats", "OffsetTracker"]

log = logging.getLogger("gnomon.alerts")

GROUP_ID = "gnomon-alerter"
ROLE = "alerter"  # Kafka principal User:alerter (gnomon.infra.acls)
SESSION_TIMEOUT_MS = 10_000
COMMIT_TIMEOUT_S = 10.0


class OffsetTracker:
    """Per partition, the offsets read in order and how many alerts each still has in
    flight. What may be committed is the offset after the longest settled prefix."""

    def __init__(self) -> None:
        self._pending: dict[TP, OrderedDict[int, int]] = {}
        self._next: dict[TP, int] = {}
        self._committed: dict[TP, int] = {}

    def add(self, tp: TP, offset: int, alerts: int) -> None:
        self._pending.setdefault(tp, OrderedDict())[offset] = alerts
        self._advance(tp)

    def settle(self, tp: TP, offset: int) -> None:
        """One alert of the record at ``offset`` is delivered or given up."""
        queue = self._pending.get(tp)
        if queue is None or offset not in queue:
            return  # its partition was revoked meanwhile
        queue[offset] -= 1
        self._advance(tp)

    def _advance(self, tp: TP) -> None:
        queue = self._pending[tp]
        while queue:
            offset, left = next(iter(queue.items()))
            if left > 0:
                break
            queue.popitem(last=False)
            self._next[tp] = offset + 1

    def to_commit(self) -> dict[TP, int]:
        """Partitions whose committable offset moved since the last ``committed``."""
        return {tp: off for tp, off in self._next.items() if self._committed.get(tp) != off}

    def committed(self, offsets: Mapping[TP, int]) -> None:
        self._committed.update(offsets)

    def in_flight(self) -> int:
        return sum(sum(q.values()) for q in self._pending.values())

    def drop(self, tps: Sequence[TP]) -> None:
        for tp in tps:
            self._pending.pop(tp, None)
            self._next.pop(tp, None)
            self._committed.pop(tp, None)


@dataclass
class AlerterStats:
    records: int = 0
    runs: int = 0
    tombstones: int = 0
    poison: int = 0
    alerts: int = 0  # decided
    no_config: int = 0  # states of tenants without an alert config
    calls: int = 0
    delivered: int = 0
    retries: int = 0
    given_up: int = 0
    backlog_full: int = 0  # of given_up: the tenant's backlog was full
    commit_failures: int = 0


class Alerter:
    def __init__(
        self,
        book: AlertBook,
        sender: AlertSender,
        policy: DeliveryPolicy | None = None,
        *,
        log: EventLog | None = None,
        bootstrap: str = "",
        feed: Any = None,
        memory: AlertMemory | None = None,
        clock: Clock | None = None,
        group_id: str = GROUP_ID,
        batch_max: int = 500,
        poll_timeout_s: float = 0.5,
        kafka_role: str | None = ROLE,
        on_given_up: Callable[[Alert, str], None] | None = None,
        executor: Executor | None = None,
        retry_sleep: Callable[[float], object] | None = None,
    ) -> None:
        """``log``: the event log it reads (default: Kafka at ``bootstrap`` as principal
        ``kafka_role``; the in-memory log in tests); ``feed``: anything with ``poll()``
        that fills ``book`` (an ``AlertFeed``). ``executor`` runs the deliveries (default:
        a pool of ``in_flight_max`` threads) and ``retry_sleep`` is the wait between a
        delivery's calls (default: until the stop); the simulation passes its own, so
        deliveries run when it steps them and nothing sleeps. ``group_id``: the group as
        named in the default namespace (``gnomon-alerter`` or ``gnomon-alerter-<name>``),
        joined as ``$GNOMON_REGION``'s id of it (gnomon.region.group_id)."""
        self.book = book
        self.sender = sender
        self.policy = policy or DeliveryPolicy()
        self.feed = feed
        self.memory = memory or AlertMemory()
        self.clock = clock or SystemClock()
        topo = load_topology()
        self.group_id = group_id = region.group_id(group_id, topo.region)  # the namespace's id of it
        self.batch_max = batch_max
        self.poll_timeout_s = poll_timeout_s
        self.on_given_up = on_given_up
        self.topic = topo.runs
        self.topology_partitions = topo.partitions  # at creation: more are born in a grow
        self.stats = AlerterStats()
        self.tracker = OffsetTracker()
        self._lock = threading.Lock()  # tracker + stats, shared with the delivery threads
        self._slots = threading.BoundedSemaphore(self.policy.in_flight_max)
        # per tenant, under _lock: places held, and alerts waiting for one of its places
        self._tenant_in_flight: dict[str, int] = {}
        self._backlog: dict[str, deque[tuple[Alert, str, TP, int]]] = {}
        self._stop = threading.Event()
        self._pool: Executor = executor or ThreadPoolExecutor(self.policy.in_flight_max,
                                                              thread_name_prefix="gnomon-alert")
        self._retry_sleep = retry_sleep
        if log is None:
            from gnomon.eventlog.kafka import KafkaEventLog

            if not bootstrap:
                raise ValueError("bootstrap is required unless a log is given")
            log = KafkaEventLog(bootstrap, role=kafka_role)
        self.log = log
        self.consumer: GroupConsumer = log.group_consumer(group_id, client_id="gnomon-alerter",
                                                          session_timeout_ms=SESSION_TIMEOUT_MS)
        self.consumer.subscribe([self.topic], on_assign=self._on_assign, on_revoke=self._on_revoke,
                                on_lost=self._on_revoke)

    # ---- loop ----------------------------------------------------------------------------

    def run(self, stop_event: threading.Event) -> None:
        """Alert until ``stop_event`` is set; then let deliveries end (a retry's wait ends
        at once, and its alert stays uncommitted, to be sent again after a restart),
        commit what is settled and close."""
        self._stop = stop_event
        log.info("alerter: group %s, topic %s, %s", self.group_id, self.topic, self.policy)
        try:
            while not stop_event.is_set():
                self.run_once()
        finally:
            self.close()

    def run_once(self, timeout_s: float | None = None) -> int:
        """Poll the configs; consume up to ``batch_max`` ledger records (waiting up to
        ``timeout_s`` for the first); hand out their alerts; commit what is settled."""
        if self.feed is not None:
            self.feed.poll()
        msgs = self.consumer.consume(self.batch_max, self.poll_timeout_s if timeout_s is None else timeout_s)
        for msg in msgs:
            self._handle(msg)
        self.commit()
        return len(msgs)

    def _handle(self, msg: Record) -> None:
        from gnomon.codec import DecodeError, decode

        tp = (msg.topic, msg.partition)
        self.stats.records += 1
        value = msg.value
        if value is None:  # a purged run left the ledger
            self.stats.tombstones += 1
            self.memory.forget((msg.key or b"").decode(errors="replace"))
            self._track(tp, msg.offset, 0)
            return
        try:
            state = decode(value, self.topic)
            if not isinstance(state, RunState):
                raise DecodeError(f"a {type(state).__name__} on the run ledger")
        except DecodeError as exc:
            self.stats.poison += 1
            log.warning("ledger record %s[%d]@%d skipped: %s", tp[0], tp[1], msg.offset, exc.message)
            self._track(tp, msg.offset, 0)
            return
        self.stats.runs += 1
        config = self.book.get(state.tenant)
        if config is None:
            self.stats.no_config += 1
        alerts = self.memory.observe(state, config, self.clock.now_ms())
        self._track(tp, msg.offset, len(alerts))
        for alert in alerts:
            assert config is not None
            self.stats.alerts += 1
            self._submit(alert, config.url, tp, msg.offset)

    def _track(self, tp: TP, offset: int, alerts: int) -> None:
        with self._lock:
            self.tracker.add(tp, offset, alerts)

    def _submit(self, alert: Alert, url: str, tp: TP, offset: int) -> None:
        p = self.policy
        with self._lock:
            if self._tenant_in_flight.get(alert.tenant, 0) >= p.tenant_in_flight_max:
                backlog = self._backlog.setdefault(alert.tenant, deque())
                if len(backlog) < p.tenant_backlog_max:
                    backlog.append((alert, url, tp, offset))  # started when one of its places frees
                    return
                self.stats.given_up += 1
                self.stats.backlog_full += 1
                self.tracker.settle(tp, offset)
                full = True
            else:
                self._tenant_in_flight[alert.tenant] = self._tenant_in_flight.get(alert.tenant, 0) + 1
                full = False
        if full:
            why = (f"tenant {alert.tenant}: {p.tenant_in_flight_max} alerts in delivery and "
                   f"{p.tenant_backlog_max} waiting")
            log.error("alert %s given up: %s", alert.key, why)
            if self.on_given_up is not None:
                self.on_given_up(alert, why)
            return
        while not self._slots.acquire(timeout=0.5):  # in_flight_max reached: wait for a place
            if self._stop.is_set():
                self._release_tenant(alert.tenant)
                return  # left unsettled: re-read after a restart
        self._pool.submit(self._deliver, alert, url, tp, offset)

    def _release_tenant(self, tenant: str) -> None:
        with self._lock:
            left = self._tenant_in_flight.get(tenant, 0) - 1
            if left > 0:
                self._tenant_in_flight[tenant] = left
            else:
                self._tenant_in_flight.pop(tenant, None)

    def _next_of(self, tenant: str) -> tuple[Alert, str, TP, int] | None:
        """The tenant's next waiting alert, which takes over the place (and the pool slot)
        of the delivery that just ended; None: that place is given back."""
        with self._lock:
            backlog = self._backlog.get(tenant)
            if backlog and not self._stop.is_set():
                return backlog.popleft()
            if backlog is not None and not backlog:
                del self._backlog[tenant]
        self._release_tenant(tenant)
        return None

    # ---- delivery (pool threads) ---------------------------------------------------------

    def _deliver(self, alert: Alert, url: str, tp: TP, offset: int) -> None:
        p = self.policy
        retry = Retry(p.attempts_max, p.backoff_base_s, p.backoff_cap_s,
                      retriable=lambda exc: isinstance(exc, AlertDeliveryError) and not self._stop.is_set(),
                      sleep=self._retry_sleep or self._stop.wait)

        def call() -> int:
            with self._lock:
                self.stats.calls += 1
            return self.sender.send(alert, url, p.timeout_s)

        def retrying(attempt: int, exc: BaseException, delay_s: float) -> None:
            with self._lock:
                self.stats.retries += 1
            log.warning("alert %s: call %d/%d failed (%s); again in %.1f s", alert.key, attempt, p.attempts_max,
                        exc, delay_s)

        try:
            retry.call(call, on_retry=retrying)
            with self._lock:
                self.stats.delivered += 1
                self.tracker.settle(tp, offset)
            log.info("alert %s delivered", alert.key)
        except Exception as exc:
            if self._stop.is_set():
                log.info("alert %s not delivered before the stop; it is sent again after a restart", alert.key)
                return
            with self._lock:
                self.stats.given_up += 1
                self.tracker.settle(tp, offset)
            log.error("alert %s given up after %d calls: %s", alert.key, p.attempts_max, exc)
            if self.on_given_up is not None:
                self.on_given_up(alert, str(exc))
        finally:
            following = self._next_of(alert.tenant)
            if following is None:
                self._slots.release()
            else:
                try:
                    self._pool.submit(self._deliver, *following)
                except RuntimeError:  # the pool is shutting down: left unsettled, re-read after a restart
                    self._release_tenant(alert.tenant)
                    self._slots.release()

    # ---- offsets -------------------------------------------------------------------------

    def commit(self) -> None:
        with self._lock:
            offsets = self.tracker.to_commit()
        if not offsets:
            return
        try:
            self.consumer.commit(offsets, COMMIT_TIMEOUT_S)
        except EventLogError as exc:  # a rebalance: the records are read again (alerts keep their keys)
            self.stats.commit_failures += 1
            log.warning("offset commit failed (records will be read again): %s", exc)
            return
        with self._lock:
            self.tracker.committed(offsets)

    def _on_assign(self, partitions: list[TP]) -> None:
        """A partition this group never committed starts at the ledger's end (a new
        alerter alerts what happens from now on, not the dead letters of the past week):
        that end is committed at once, before the consumer reads its start position from
        the group's commits, so a restart resumes from it, missing nothing. Except a
        partition born in a grow (docs/adr/0012): it starts at its beginning, its first
        records being the runs handed to it, so nothing written to it before this
        alerter learnt of it is missed."""
        fresh: dict[TP, int] = {}
        born = self.topology_partitions
        try:
            committed = self.consumer.committed(partitions, COMMIT_TIMEOUT_S)
            fresh = {tp: (0 if tp[1] >= born else self.log.end_offset(*tp))
                     for tp, off in committed.items() if off is None}
            if fresh:
                self.consumer.commit(fresh, COMMIT_TIMEOUT_S)
        except EventLogError as exc:  # the group's reset policy applies
            log.warning("alerter: cannot read or set the start offsets (%s); using the reset policy", exc)
        log.info("alerter: assigned %d partition(s) of %s (%d new, from the end)", len(partitions), self.topic,
                 len(fresh))

    def _on_revoke(self, partitions: list[TP]) -> None:
        self.commit()
        revoked = set(partitions)
        with self._lock:
            self.tracker.drop(list(revoked))
            for backlog in self._backlog.values():  # their records are read again by the new owner
                kept = [entry for entry in backlog if entry[2] not in revoked]
                backlog.clear()
                backlog.extend(kept)
        # The records after the commit are read again by whoever gets the partitions, this
        # process too: it must raise their alerts again (the receiver drops a repeat by its
        # Idempotency-Key), not remember them as raised while their delivery is no longer
        # tracked (a later commit would pass them, and a crash would lose them).
        self.memory = AlertMemory(self.memory.runs_max)

    def wait_idle(self, timeout_s: float) -> bool:
        """Until no alert is in flight (tests); whether that happened."""
        import time

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if self.tracker.in_flight() == 0:
                    return True
            time.sleep(0.05)
        return False

    def close(self) -> None:
        self._stop.set()
        self._pool.shutdown(wait=True)
        self.commit()
        log.info("alerter stopping: %s", self.stats)
        try:
            self.consumer.close()
        except Exception as exc:  # closing twice, or a broker gone: nothing left to do
            log.debug("consumer close: %s", exc)
        if self.feed is not None:
            self.feed.close()
