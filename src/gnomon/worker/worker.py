"""``gnomon worker``: one worker of a pool.

The processor stages runs on workers (docs/adr/0003-staging.md); the worker:

* advertises itself on gnomon.workers every ``advert_interval_ms``: pool, slots,
  running and staged counts, and ``stage_max``. The processor stages on it at most
  ``slots`` runs due in the same second (minus what it runs now) and at most
  ``stage_max`` in all. That record is its liveness signal too: one per worker,
  not one heartbeat per staged attempt;
* reads Grants on its inbox partition. A grant carries ``not_before_ms`` (the slot):
  it waits in a local timer (a heap, no thread) and starts at that instant by this
  worker's clock, never before it. Staged attempts are counted apart from running ones;
* at the slot, if a slot is free, reports AttemptStarted (fenced by the grant's token)
  and starts the attempt on a pooled thread once Kafka has taken that report, never
  before: a worker that dies before its report is known never ran the attempt, so the
  processor grants it again at once when it finds the worker lost, without using one of
  the run's attempts (a start that reaches the processor after that is refused, and its
  Stop ends the attempt). If the worker is full, the attempt waits for a free slot up to
  ``handback_after_ms`` and is then returned (ReturnGrant) so the processor stages it on
  a worker with room;
* heartbeats running attempts every lease/3 with the fencing token, and reports the outcome;
* drops a staged attempt, or stops a running one, when a Stop arrives (revoked,
  cancelled, stale token).

The Kafka loop never blocks on an attempt, so max.poll.interval.ms is never exceeded.

Injection (the simulation, ``gnomon.sim``): ``log`` is the event log (default Kafka as
principal ``worker``), ``executor`` runs a target (default the pool's ``Dispatcher``),
and ``runner`` starts attempts (default: a pooled thread each). The loop itself is
``start()``, then ``step()`` until stopped, then ``shutdown()``; ``run()`` does all three.
"""

from __future__ import annotations

import heapq
import json
import logging
import os
import platform
import queue
import secrets
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

from gnomon import codec, region
from gnomon.adapters.kafka import partition_for
from gnomon.config import load
from gnomon.core.clock import Clock, SystemClock
from gnomon.core.errors import EventLogError, GnomonError
from gnomon.core.messages import Grant, LeaseAck, LogLine, LogStream, Stop, StopReason
from gnomon.core.model import Target, TargetType
from gnomon.core.runs import AttemptStarted, CompleteAttempt, Heartbeat, Outcome, ReturnGrant
from gnomon.core.workers import ADVERT_INTERVAL_MS, DEAD_AFTER_MS, LONG_RUNNING_MS, WorkerAdvert
from gnomon.eventlog.port import Delivery, EventLog, Producer, ProducerFatalError, Reader
from gnomon.gate import RegionGate
from gnomon.metrics.worker import WorkerMetrics
from gnomon.outbound.http import redact_url
from gnomon.outbound.secrets import SecretStore
from gnomon.retrying import Retry
from gnomon.topology import Topology, load_topology
from gnomon.worker.attempt import KILL_GRACE_S
from gnomon.worker.executors import AttemptContext, AttemptResult, Dispatcher, Executor, Handler
from gnomon.worker.log_budget import LOG_BYTES_MAX, LOG_LINES_MAX, LogBudget
from gnomon.worker.policy import PolicyError, PoolPolicy
from gnomon.worker.pool import AttemptPool
from gnomon.worker.sandbox import Cgroups

if TYPE_CHECKING:
    from gnomon.metrics.serve import Health

log = logging.getLogger("gnomon.worker")

INBOX_GROUP = "gnomon-worker-inbox"
# finding the inbox's end at start: 0.5, 1, 2, 4, 8, 10, 10 s between 8 attempts (~36 s),
# then the start fails with the broker's error
INBOX_OPEN_RETRY = Retry(attempts_max=8, base_s=0.5, cap_s=10.0,
                         retriable=lambda exc: isinstance(exc, EventLogError))
FENCE_MS = 10_000  # with a region gate: no start after this long without an acknowledged write (``fence_ms``)
RESULT_SENDS_MAX = 10  # a result refused this often is given up (its lease then lapses); timeouts do not count
PRODUCER_REBUILD_EVERY_MS = 1000  # a producer in a fatal state is replaced at most this often
# The processors find a worker lost after DEAD_AFTER_MS without an advert, and grant what
# it had not reported started elsewhere. So an attempt starts at once only when its start
# report was taken within START_CONFIRM_AFTER_MS and this worker's adverts were taken
# without a silence (an advert taken that late, or none for an advert interval more) in
# the last DOUBT_AFTER_SILENCE_MS; otherwise only once the processor answers a heartbeat for it
# (LeaseAck: the start was accepted; Stop: it was refused), asked every
# START_CONFIRM_EVERY_MS: a refused start never runs beside the attempt granted again.
START_CONFIRM_AFTER_MS = DEAD_AFTER_MS // 2
START_CONFIRM_EVERY_MS = 1_000
DOUBT_AFTER_SILENCE_MS = 10_000


class AttemptRunner(Protocol):
    """Starts an attempt: ``begin()`` when it starts, then ``end(work())`` when it is done
    (the default runs both on a pooled thread)."""

    def start(self, ctx: AttemptContext, begin: Callable[[], None], work: Callable[[], AttemptResult],
              end: Callable[[AttemptResult], None]) -> None: ...


@dataclass
class _Attempt:
    grant: Grant
    ctx: AttemptContext
    last_heartbeat_ms: int
    heartbeat_every_ms: int
    started_ms: int  # set again by the attempt's thread when the handler starts
    finished: bool = False
    begin: Callable[[], None] | None = None  # the attempt's parts (see AttemptRunner)
    work: Callable[[], AttemptResult] | None = None
    end: Callable[[AttemptResult], None] | None = None
    seq: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    budget: LogBudget = field(default_factory=LogBudget)  # the attempt's output lines (log_budget.py)
    given_up: bool = False  # its handler outlived deadline + grace: reported timed out by the loop
    confirm_asked_ms: int | None = None  # its start report came late: the processor's answer is awaited


STAGE_MAX_MIN = 10_000


def default_stage_max(concurrency_max: int) -> int:
    """Attempts a worker accepts staged ahead of their slots when not told: 10,000, or
    twice its slots if more (a worker with 15,000 slots takes 15,000 runs due in one
    second; holding fewer staged would leave a spike's last third to be granted after
    its slot, measured: 30,000 due at once on two such workers, p99 10.5 s)."""
    return max(STAGE_MAX_MIN, 2 * concurrency_max)


class Worker:
    def __init__(
        self,
        pool: str = "default",
        *,
        bootstrap: str | None = None,
        worker_id: str | None = None,
        concurrency_max: int = 8,
        drain_timeout_s: float = 30.0,
        advert_interval_ms: int = ADVERT_INTERVAL_MS,
        handback_after_ms: int = 1000,
        stage_max: int | None = None,
        clock: Clock | None = None,
        topology: Topology | None = None,
        tenants: Iterable[str] = (),
        policy: PoolPolicy | None = None,
        log: EventLog | None = None,
        executor: Executor | None = None,
        runner: AttemptRunner | None = None,
    ) -> None:
        if concurrency_max < 1:
            raise ValueError("concurrency_max must be >= 1")
        self.log_lines_max = LOG_LINES_MAX  # per attempt (log_budget.py); `gnomon worker --log-lines-max`
        self.log_bytes_max = LOG_BYTES_MAX
        if stage_max is None:
            stage_max = default_stage_max(concurrency_max)
        if advert_interval_ms < 100 or handback_after_ms < 0 or stage_max < 1:
            raise ValueError("advert_interval_ms must be >= 100, handback_after_ms >= 0, stage_max >= 1")
        self.pool = pool
        self.bootstrap = bootstrap or ("" if log is not None else load().kafka_bootstrap)
        self._log = log
        self._executor_given = executor
        self._runner = runner
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(2)}"
        self.concurrency_max = concurrency_max
        self.drain_timeout_s = drain_timeout_s
        self.advert_interval_ms = advert_interval_ms
        self.handback_after_ms = handback_after_ms
        self.stage_max = stage_max
        self.clock = clock or SystemClock()
        self.topo = topology or load_topology()
        self.handlers: dict[str, Handler] = {}
        # handler name -> the tenants whose jobs may call it (None: the pool's tenants)
        self.handler_tenants: dict[str, frozenset[str] | None] = {}
        self.tenants = frozenset(tenants)
        self._policy = policy
        self.secrets = SecretStore(None)  # per-tenant secrets on this host (the CLI sets the directory)
        self._stop = threading.Event()
        # run_id -> its attempt, prepared when the grant came, waiting for its slot (or a free slot)
        self._staged: dict[str, _Attempt] = {}
        self._timer: list[tuple[int, str, int]] = []  # heap of (not_before_ms, run_id, token)
        # slot reached, waiting for a free slot: (when it became due here, run_id, token)
        self._due: deque[tuple[int, str, int]] = deque()
        self._running: dict[str, _Attempt] = {}
        # run_id -> its attempt whose start is reported and not yet taken by Kafka: it runs
        # once the report is acknowledged (``_start_claimed``); (run_id, token) of the
        # reports Kafka took, and of those it did not (sent again while the lease lasts)
        self._claimed: dict[str, _Attempt] = {}
        self._confirming: set[str] = set()  # claimed run ids whose start waits for the processor's answer
        self.starts_confirmed = 0  # attempts started late, once the processor accepted their start
        self.starts_refused = 0  # ... and those it refused: never started here
        self._claims_taken: deque[tuple[str, int]] = deque()
        self._claims_failed: deque[tuple[str, int]] = deque()
        self._done: queue.Queue[tuple[_Attempt, AttemptResult]] = queue.Queue()
        self._started: queue.SimpleQueue[_Attempt] = queue.SimpleQueue()
        self.completed = 0
        self.returned = 0
        self._last_advert_ms = 0
        self._producer: Producer | None = None
        self._inbox: Reader | None = None
        self._executor: Executor | None = None
        # checked records whose delivery failed: (topic, key, value, sends so far, error)
        self._undelivered: deque[tuple[str, bytes, bytes, int, str]] = deque()
        # checked records sent and not yet acknowledged, by send order: re-sent on a new
        # producer when the one they went through can deliver nothing again
        self._unacked: dict[int, tuple[str, bytes, bytes, int]] = {}
        self._sends = 0
        self._producer_gen = 0  # delivery reports of an earlier producer are ignored
        self._producer_fatal: str | None = None  # the producer can deliver nothing again
        self._rebuilt_at_ms = -PRODUCER_REBUILD_EVERY_MS
        self.producer_rebuilds = 0
        self.progress_at_s = time.monotonic()  # last step with every checked record acknowledged
        self.undelivered_total = 0
        self._pool = AttemptPool(concurrency_max)
        self.kill_grace_ms = int(KILL_GRACE_S * 1000)  # a watched handler past its deadline: given up this much later
        self._inbox_tp: tuple[str, int] | None = None
        # counts at the edges (attempt start and end, the loop); made at start() unless set
        # before (the CLI sets it to serve it)
        self.metrics: WorkerMetrics | None = None
        # regions (gnomon.gate): serve the namespace only while this region runs it; None: one region
        self.gate: RegionGate | None = None
        self.fenced = False  # another region runs the namespace now: stop
        # with a gate, a staged attempt starts only while the cluster took one of this worker's
        # writes within this long (acks=all: its majority is reachable), so a region cut off
        # starts nothing once it has been cut that long, before a standby may take over
        # (``gnomon processor --takeover-s``, 20 s). Longer than the stall of the surviving
        # region's writes when the other is cut (about 5 s: its followers leave the ISR, its
        # leaders move), which would otherwise hold that region's own starts
        self.fence_ms = FENCE_MS
        self._acked_at_ms: int | None = None  # the cluster's last answer to a write of this worker
        self._doubt_until_ms = 0  # after a silence in its adverts: starts wait for the processor's answer
        self._fence_said = False

    # ---- SDK ---------------------------------------------------------------------------

    def handler(self, name: str, tenants: Iterable[str] | None = None) -> Callable[[Handler], Handler]:
        """Register a Python function for jobs whose target is {"type": "handler", "name": name}.

        A handler is the pool owner's code: it runs only for jobs of ``tenants`` (default:
        the tenants this worker serves) and never on a pool shared by several tenants.
        ``ctx.tenant`` tells it whose job it runs."""

        def register(fn: Handler) -> Handler:
            if name in self.handlers:
                raise ValueError(f"handler {name!r} registered twice")
            self.handlers[name] = fn
            self.handler_tenants[name] = None if tenants is None else frozenset(tenants)
            return fn

        return register

    @property
    def policy(self) -> PoolPolicy:
        """The pool's policy: the one given, widened by ``tenants``; or, with no policy,
        the default one for ``tenants`` (handlers and public HTTP only)."""
        if self._policy is None:
            if not self.tenants:
                raise PolicyError("name the tenants this worker serves: gnomon worker --tenant T "
                                  "(or Worker(tenants=[...]))")
            self._policy = PoolPolicy(self.tenants)
        elif not self.tenants <= self._policy.tenants:
            self._policy = self._policy.with_tenants(self._policy.tenants | self.tenants)
        return self._policy

    def refusal(self, grant: Grant) -> str | None:
        """Why this worker will not run the grant's target (for the run's log), or None."""
        target = grant.spec.target
        if target.type is TargetType.CONTAINER:
            program = target.image or ""
        else:
            program = target.argv[0] if target.argv else (target.handler or "")
        why = self.policy.refusal(target.type, program, grant.tenant)
        if why is None and target.type is TargetType.HANDLER:
            allowed = self.handler_tenants.get(target.handler or "")
            if allowed is not None and grant.tenant not in allowed:
                why = f"handler {target.handler!r} is not registered for tenant {grant.tenant!r}"
        return why

    def stop(self) -> None:
        self._stop.set()

    def ensure_metrics(self) -> WorkerMetrics:
        """This worker's metrics, made on first use (by ``serve_metrics``, the CLI's
        liveness gauges, or ``start``)."""
        if self.metrics is None:
            self.metrics = WorkerMetrics(self.pool, self.worker_id, now_s=lambda: self.clock.now_ms() // 1000)
        return self.metrics

    def serve_metrics(self, port: int | None = None, host: str = "127.0.0.1", *,
                      health: Health | None = None) -> str | None:
        """Serve this worker's /metrics on ``port`` (None: the first free one from 9490;
        0: off), before ``run()``; the URL, or None (logged) if not served. ``health``:
        also /healthz (``gnomon.metrics.liveness``)."""
        from gnomon.metrics.serve import serve

        endpoint = serve(self.ensure_metrics().registry, "worker", port=port, host=host, health=health)
        return None if endpoint is None else endpoint.url

    # ---- loop --------------------------------------------------------------------------

    def start(self) -> None:
        """Connect, open the inbox and advertise (no step yet)."""
        if self._log is None:
            from gnomon.eventlog.kafka import KafkaEventLog

            self._log = KafkaEventLog(self.bootstrap, role="worker")
        self._producer = self._new_producer()
        policy = self.policy  # fails here, before joining, when no tenant is named
        if policy.commands.enabled:
            if Cgroups.usable():
                swept = Cgroups.sweep_stale()
                if swept:
                    log.info("removed %d attempt cgroups left by workers that are gone", swept)
            else:
                log.warning("no writable cgroup v1 pids/memory/cpu hierarchies (run the worker as root on a "
                            "cgroup v1 or hybrid host): sandboxes get rlimits only, with no per-attempt "
                            "process or memory cgroup")
            if os.geteuid() != 0:
                from gnomon.worker import host_ids

                ids, why_not = host_ids.shared()
                if ids is not None:
                    log.info("commands run as a host uid of their own per attempt: %d..%d (subordinate ids), "
                             "never this worker's uid %d", ids.host_uid(1), ids.host_uid(ids.count), os.geteuid())
                    if ids.count < self.concurrency_max:
                        log.warning("only %d subordinate ids for %d attempts at once: attempts beyond them fail "
                                    "(give the user a larger range)", ids.count, self.concurrency_max)
                else:
                    log.warning("commands run as this worker's own uid %d on the host (the sandbox's namespaces "
                                "map nobody onto it): the worker's Kafka credential and the tenants' secrets are "
                                "that uid's too, because %s. Give the worker's user subordinate ids for a host "
                                "uid per attempt, or run it as root (docs/security.md)", os.geteuid(), why_not)
            from gnomon.worker.command import SECCOMP_PROGRAM

            if SECCOMP_PROGRAM is None:
                log.warning("no seccomp syscall table for %s: commands run without the sandbox's seccomp "
                            "filter (gnomon.worker.seccomp)", platform.machine())
        if policy.containers.enabled:
            from gnomon.worker.container import PodmanRunner

            # a predecessor's containers would run beside the attempts granted again
            runner = PodmanRunner()
            orphans = runner.sweep_orphans() if runner.podman else []
            if orphans:
                log.warning("removed %d container(s) of workers that are gone: %s", len(orphans), ", ".join(orphans))
        self._executor = self._executor_given or Dispatcher(self.handlers, policy, self.secrets, inline_handlers=True)
        self._pool = AttemptPool(self.concurrency_max)  # concurrency may have been set after __init__
        self._inbox = self._open_inbox()
        self.ensure_metrics()
        log.info("worker %s serving pool %s for %s (concurrency %d; commands %s, containers %s)", self.worker_id,
                 self.pool, ", ".join(sorted(policy.tenants)), self.concurrency_max,
                 "on" if policy.commands.enabled else "off", "on" if policy.containers.enabled else "off")
        log.info("HTTP targets: %s (the policy's [http] table)", policy.http.describe())
        self._advertise(force=True)

    def step(self, wait_s: float | None = None) -> None:
        """One turn of the loop: inbox, due slots, finished attempts, heartbeats, adverts,
        delivery reports. ``wait_s``: how long the inbox may block (default: until the
        next staged slot, at most 50 ms)."""
        assert self._inbox is not None and self._executor is not None and self._producer is not None
        for msg in self._inbox.consume(500, self._wait_s() if wait_s is None else wait_s):
            self._on_inbox(msg.value, self._executor)
        if self._runner is None:  # threads for what is staged, started before its slot
            self._pool.prestart(len(self._running) + len(self._staged))
            if self._pool.threads_max < self.concurrency_max:  # the OS refused threads (pool.py)
                self.concurrency_max = self._pool.threads_max  # advertised: the processor stages less
        self._fire_due(self._executor)
        self._poll_producer()  # the start reports just sent: acknowledged ones start now
        self._start_claimed()
        self._watch_deadlines()
        self._finish_done()
        self._heartbeat()
        self._advertise()
        self._poll_producer()
        self._start_claimed()
        self._resend_undelivered()
        if self._producer_fatal is not None:
            self._rebuild_producer()
        if not self._unacked and self._producer_fatal is None:
            self.progress_at_s = time.monotonic()

    def shutdown(self) -> None:
        """Hand back what is staged, say it leaves, wait for running attempts (up to
        ``drain_timeout_s``), flush."""
        assert self._inbox is not None and self._executor is not None and self._producer is not None
        try:
            self._return_staged("worker shutting down")
            self._advertise(force=True, leaving=True)
            self._drain(self._inbox, self._executor)
        finally:
            self._close()

    def _close(self) -> None:
        assert self._inbox is not None and self._producer is not None
        if self.gate is not None:
            self.gate.close()
        self._inbox.close()
        left = self._producer.flush(10)
        self._poll_producer()
        if left or self._undelivered:
            log.error("worker %s exits with %d records not delivered; their runs are retried when "
                      "their leases lapse", self.worker_id, left + len(self._undelivered))

    def run(self) -> None:
        if self.gate is not None:
            while not self.gate.wait_until_mine(self._stop, max_wait_s=5.0):
                self.progress_at_s = time.monotonic()  # a standby is waiting, not stuck
                if self._stop.is_set():
                    self.gate.close()
                    return
            self.gate.start_background()  # (its reads never hold up the loop)
        self.start()
        try:
            while not self._stop.is_set():
                if self.gate is not None and not self.gate.still_mine():
                    self.fenced = True
                    self._staged.clear()  # the region that runs the namespace now grants them again
                    self._claimed.clear()
                    self._confirming.clear()
                    self._timer.clear()
                    self._due.clear()
                    break
                self.step()
        except BaseException:
            self._close()
            raise
        self.shutdown()

    def _wait_s(self) -> float:
        """How long the loop may block on the inbox: until the next staged slot, at most 50 ms
        (10 ms while attempts run: their completions wait for the loop, and a downstream
        job's run waits for them)."""
        if len(self._claimed) > len(self._confirming):
            return 0.001  # a start report's acknowledgement starts its attempt
        if self._due:
            return 0.005
        if self._running:
            return 0.01
        if not self._timer:
            return 0.05
        return max(0.0, min(0.05, (self._timer[0][0] - self.clock.now_ms()) / 1000))

    def _advertise(self, *, force: bool = False, leaving: bool = False) -> None:
        now = self.clock.now_ms()
        if not force and now - self._last_advert_ms < self.advert_interval_ms:
            return
        self._last_advert_ms = now
        self._observe_held()
        long_running = sum(1 for a in self._running.values() if now - a.started_ms >= LONG_RUNNING_MS)
        advert = WorkerAdvert(
            self.worker_id, self.pool, self.concurrency_max, len(self._running) + len(self._claimed), len(self._staged),
            self.advert_interval_ms, now, leaving, self.stage_max, long_running, tuple(sorted(self.policy.tenants)))
        self._produce(self.topo.workers, self.worker_id.encode(), codec.encode(advert), False, 0,
                      on_ack=self._advert_acked(now))  # (its answer is the fence's: ``_fenced_off``)

    def _observe_held(self) -> None:
        """Gauges of what this worker holds and how far its inbox is behind (local
        position and cached high watermark: no broker round trip)."""
        if self.metrics is None:
            return
        self.metrics.held(len(self._running), len(self._staged), len(self._due), self.concurrency_max)
        if self._inbox is not None and self._inbox_tp is not None:
            try:
                pos = self._inbox.position([self._inbox_tp]).get(self._inbox_tp, -1)
                _, high = self._inbox.watermarks(self._inbox_tp, cached=True)
            except EventLogError:
                return
            if pos >= 0 and high >= 0:
                self.metrics.lag(region.group_id(INBOX_GROUP, self.topo.region), self._inbox_tp[0], high - pos)

    def _open_inbox(self) -> Reader:
        """The worker's inbox partition, read from its end. The end offset is read again
        while the broker cannot answer (a broker still starting, credentials not yet on every
        broker, a leader moving), at most ``INBOX_OPEN_RETRY.attempts_max`` times."""
        assert self._log is not None
        c = self._log.reader(region.group_id(INBOX_GROUP, self.topo.region), client_id=f"worker-{self.worker_id}")

        def locate() -> tuple[int, int]:
            p = partition_for(self.worker_id, len(c.partitions(self.topo.worker_inbox)))
            return p, c.watermarks((self.topo.worker_inbox, p), 10)[1]

        def on_retry(attempt: int, exc: BaseException, delay_s: float) -> None:
            log.warning("cannot find the end of the inbox yet (attempt %d): %s; again in %.1f s", attempt, exc, delay_s)

        retry = replace(INBOX_OPEN_RETRY, sleep=self._stop.wait)
        p, high = retry.call(locate, on_retry)
        self._inbox_tp = (self.topo.worker_inbox, p)
        c.assign([(self.topo.worker_inbox, p, high)])
        return c

    def _send(self, topic: str, key: str, obj: Any, *, checked: bool = False) -> None:
        """Produce a record. ``checked`` records (an attempt's start, outcome, hand-back)
        get a delivery report: one that librdkafka gave up on (after its own retries, up
        to message.timeout.ms) is produced again by the loop, so no result is lost
        while the worker runs."""
        self._produce(topic, key.encode(), codec.encode(obj), checked, 0)

    def _new_producer(self) -> Producer:
        assert self._log is not None
        return self._log.producer(client_id=f"worker-{self.worker_id}", config={"linger.ms": 2})

    def _produce(self, topic: str, key: bytes, value: bytes, checked: bool, tries: int, *,
                 on_ack: Delivery | None = None) -> None:
        assert self._producer is not None
        on_delivery = on_ack  # (an unchecked record's delivery report, if asked for)
        if checked:
            self._sends += 1
            seq, gen = self._sends, self._producer_gen
            self._unacked[seq] = (topic, key, value, tries)

            def on_delivery(err: str | None, _partition: int, _offset: int) -> None:
                if gen != self._producer_gen:
                    return  # sent through a producer given up since: re-sent on its successor
                if self._unacked.pop(seq, None) is None:
                    return
                if err is None:
                    self.progress_at_s = time.monotonic()
                else:  # a timeout (broker away) does not count against the record
                    self._undelivered.append((topic, key, value, tries + (0 if "TIMED_OUT" in err else 1), err))
        if self._producer_fatal is not None:
            return  # kept in _unacked when checked: sent on the next producer
        try:  # (waits while the producer's queue is full)
            self._producer.produce(topic, key, value, on_delivery=on_delivery)
        except ProducerFatalError as exc:
            self._producer_fatal = str(exc)
        except EventLogError as exc:  # e.g. a record over message.max.bytes: never end the loop
            log.error("cannot produce to %s for %s: %s", topic, key.decode(), exc)
            if checked:
                self._unacked.pop(self._sends, None)

    def _poll_producer(self) -> None:
        """Serve delivery reports; notice a producer that can deliver nothing again."""
        assert self._producer is not None
        try:
            self._producer.poll(0)
        except ProducerFatalError as exc:
            self._producer_fatal = str(exc)

    def _rebuild_producer(self) -> None:
        """Replace a producer in a fatal state (an idempotent producer that lost its
        sequence, e.g. after a broker outage) and send again, in their order, the checked
        records it did not acknowledge: starts, outcomes and hand-backs keep their fencing
        tokens, so the processor still refuses a stale one. At most once per
        ``PRODUCER_REBUILD_EVERY_MS``."""
        now = self.clock.now_ms()
        if now - self._rebuilt_at_ms < PRODUCER_REBUILD_EVERY_MS:
            return
        self._rebuilt_at_ms = now
        why, self._producer_fatal = self._producer_fatal, None
        self._producer_gen += 1
        self.producer_rebuilds += 1
        self._producer = self._new_producer()
        pending = [rec for _, rec in sorted(self._unacked.items())]
        self._unacked.clear()
        log.warning("producer unusable (%s); built a new one (%d) and sending %d unacknowledged results again",
                    why, self.producer_rebuilds, len(pending))
        if self.metrics is not None:
            self.metrics.producer_rebuilt(self.pool)
        for topic, key, value, tries in pending:
            self._produce(topic, key, value, True, tries)
        for att in list(self._claimed.values()):  # start reports the old producer did not answer
            if att.grant.run_id in self._confirming:
                self._ask_confirm(att, self.clock.now_ms())
            else:
                self._send_claim(att)

    def _resend_undelivered(self) -> None:
        """Produce again the checked records whose delivery failed (see ``_send``): one
        log line per record refused, one per batch for records that timed out (a broker
        outage times out every record in flight)."""
        timed_out: list[str] = []
        while self._undelivered:
            topic, key, value, tries, err = self._undelivered.popleft()
            self.undelivered_total += 1
            if self.metrics is not None:
                self.metrics.resends.labels(self.pool).inc()
            if tries > RESULT_SENDS_MAX:
                log.error("gave up on a result for %s after %d refused sends: %s", key.decode(), tries, err)
                continue
            if "TIMED_OUT" in err:
                timed_out.append(key.decode())
            else:
                log.warning("result for %s not delivered (%s); sending it again (refused %d times)", key.decode(),
                            err, tries)
            self._produce(topic, key, value, True, tries)
        if timed_out:
            log.warning("%d results not delivered in time (broker away?), e.g. for %s; sending them again",
                        len(timed_out), ", ".join(sorted(set(timed_out))[:3]))

    # ---- inbox and the local timer ----------------------------------------------------------

    def _on_inbox(self, raw: bytes | None, executor: Executor) -> None:
        try:
            msg = codec.decode(raw or b"")
        except GnomonError as exc:
            log.warning("undecodable inbox message skipped: %s", exc)
            return
        if getattr(msg, "worker_id", None) != self.worker_id:
            return  # another worker's message on the same partition
        if isinstance(msg, Grant):
            held = [a for a in (self._running.get(msg.run_id), self._staged.get(msg.run_id),
                                self._claimed.get(msg.run_id)) if a is not None]
            if any(a.grant.token >= msg.token for a in held):
                return  # a repeat, or older than what this worker holds
            # a newer token while an older attempt still runs (its lease lapsed): stage it;
            # the old attempt is told to stop when it next reports. Work ahead of the slot
            # here too: everything but the thread handoff is ready.
            self._staged[msg.run_id] = self._prepare(msg, executor)
            heapq.heappush(self._timer, (msg.not_before_ms, msg.run_id, msg.token))
            self._fire_due(executor)
        elif isinstance(msg, Stop):
            staged = self._staged.get(msg.run_id)
            if staged is not None and msg.token >= staged.grant.token and msg.kind is not StopReason.REJECTED:
                del self._staged[msg.run_id]  # dropped before its start: nothing ran
                log.info("dropped staged %s: %s (%s)", msg.run_id, msg.kind.value, msg.reason)
                return
            claimed = self._claimed.get(msg.run_id)
            if claimed is not None and msg.token >= claimed.grant.token and msg.kind is not StopReason.REJECTED:
                confirming = msg.run_id in self._confirming
                self._unclaim(msg.run_id)  # its start report not taken yet, or refused: nothing ran
                if confirming:
                    self.starts_refused += 1
                    log.warning("%s not started: its late start report was refused (%s: %s)", msg.run_id,
                                msg.kind.value, msg.reason)
                else:
                    log.info("dropped %s before its start: %s (%s)", msg.run_id, msg.kind.value, msg.reason)
                return
            att = self._running.get(msg.run_id)
            if att is not None and msg.kind is not StopReason.REJECTED and msg.token >= att.grant.token:
                log.warning("stopping %s: %s (%s)", msg.run_id, msg.kind.value, msg.reason)
                att.ctx.request_stop(f"{msg.kind.value}: {msg.reason}")
        elif isinstance(msg, LeaseAck):
            att = self._claimed.get(msg.run_id)
            if att is not None and msg.run_id in self._confirming and msg.token == att.grant.token:
                self._unclaim(msg.run_id)
                self.starts_confirmed += 1
                log.info("%s starts: the processor accepted its late start report", msg.run_id)
                self._launch(att)

    def _fire_due(self, executor: Executor) -> None:
        """Start staged attempts whose slot has come, while slots are free; return those
        that waited too long for a slot."""
        now = self.clock.now_ms()
        while self._timer and self._timer[0][0] <= now:
            # due here from now: a grant that came after its slot (the processor's first
            # transactions after many registrations) waits handback_after_ms for a free
            # slot like any other, instead of being handed back at once and started only
            # when the processor granted it again, 10 s later (the region test's first runs)
            _, run_id, token = heapq.heappop(self._timer)
            self._due.append((now, run_id, token))
        while self._due:
            _, run_id, token = self._due[0]
            att = self._staged.get(run_id)
            if att is None or att.grant.token != token:
                self._due.popleft()  # dropped or superseded
                continue
            if now >= att.grant.lease_until_ms:
                # its lease (counted from the slot) lapsed before it could start, e.g. this
                # process was stopped: the processor has moved it on, so never start it
                self._due.popleft()
                del self._staged[run_id]
                log.warning("dropped staged %s: its lease lapsed before the start", run_id)
                continue
            if self._fenced_off(now):
                break  # held: started when the cluster answers again, or dropped when its lease lapses
            if len(self._running) + len(self._claimed) < self.concurrency_max:
                self._due.popleft()
                del self._staged[run_id]
                self._claim(att, now)
                continue
            break
        if self._fence_said:
            # held by the fence, not for want of a slot: a hand-back now would be one more
            # write the cluster does not take, and would send the run to the processor for
            # a new grant seconds after the cluster answers (the region test: 45 of b's
            # runs due in the cut's 10th second started 9 s late, on their second grant)
            return
        # full: attempts that waited past handback_after_ms go back to the processor
        while self._due and now - self._due[0][0] > self.handback_after_ms:
            _, run_id, token = self._due.popleft()
            att = self._staged.get(run_id)
            if att is not None and att.grant.token == token:
                del self._staged[run_id]
                self._hand_back(att.grant, "no free slot at the slot", now)

    def _fenced_off(self, now: int) -> bool:
        """With a gate: has the cluster taken none of this worker's writes for ``fence_ms``?"""
        if self.gate is None:
            return False
        off = self._acked_at_ms is None or now - self._acked_at_ms > self.fence_ms
        if off != self._fence_said:
            self._fence_said = off
            if off:
                log.warning("no write of this worker taken for %d ms: starting nothing until the cluster answers "
                            "(another region may run these runs now)", self.fence_ms)
            else:
                log.info("the cluster answers again: starting staged attempts")
        return off

    def _advert_acked(self, sent_ms: int) -> Delivery:
        """An advert's delivery report: a silence in what the processors saw of this worker
        (``START_CONFIRM_AFTER_MS``) makes its starts wait for their answer a while."""
        def on_delivery(err: str | None, _partition: int, _offset: int) -> None:
            if err is not None:
                return
            now = self.clock.now_ms()
            if now - sent_ms > START_CONFIRM_AFTER_MS or self._adverts_silent(now):
                self._doubt_until_ms = now + DOUBT_AFTER_SILENCE_MS
            self._acked_at_ms = now
        return on_delivery

    def _adverts_silent(self, now: int) -> bool:
        """No advert of this worker taken for an advert interval and ``START_CONFIRM_AFTER_MS`` more."""
        return self._acked_at_ms is not None and now - self._acked_at_ms > self.advert_interval_ms + START_CONFIRM_AFTER_MS

    def _may_be_lost(self, now: int) -> bool:
        """Might the processors have found this worker lost lately (``START_CONFIRM_AFTER_MS``)?"""
        return now < self._doubt_until_ms or self._adverts_silent(now)

    def _hand_back(self, grant: Grant, reason: str, now: int) -> None:
        self.returned += 1
        if self.metrics is not None:
            self.metrics.handbacks.labels(self.pool).inc()
        self._send(self.topo.run_events, grant.job_id, ReturnGrant(grant.run_id, self.worker_id, grant.token, reason, now),
                   checked=True)

    def _return_staged(self, reason: str) -> None:
        now = self.clock.now_ms()
        for att in self._staged.values():
            self._hand_back(att.grant, reason, now)
        self._staged.clear()
        self._timer.clear()
        self._due.clear()

    def _prepare(self, grant: Grant, executor: Executor) -> _Attempt:
        """Build an attempt (context, log function, thread body) when its grant arrives,
        so that at the slot only the thread handoff is left."""
        payload = json.loads(grant.spec.payload_json)
        holder: list[_Attempt] = []

        def emit(stream: LogStream | str, line: str) -> None:
            stream = LogStream(stream)  # handlers may pass "stdout" / "stderr"
            att = holder[0]
            with att.lock:
                if stream is not LogStream.SYSTEM and not att.budget.take(line):
                    return  # counted; one marker line says so when the attempt ends
                att.seq += 1
                seq = att.seq
            self._send(self.topo.run_logs, grant.run_id, LogLine(grant.run_id, grant.job_id, grant.tenant,
                                                                grant.attempt, seq, stream, line, self.clock.now_ms()))

        ctx = AttemptContext(grant.run_id, grant.job_id, grant.tenant, grant.attempt, payload, float(grant.spec.timeout_s),
                             emit, secrets=grant.spec.secrets, slot_ms=grant.slot_ms,
                             lease_s=max(1.0, (grant.lease_until_ms - max(grant.at_ms, grant.not_before_ms)) / 1000))

        # The handler starts first; reporting is the loop's job (_report_started), so
        # thousands of attempts due in the same second are not serialised behind their
        # own start reports.
        def begin() -> None:
            att = holder[0]
            att.started_ms = self.clock.now_ms()
            self._started.put(att)

        def work() -> AttemptResult:
            try:
                why = self.refusal(grant)
                if why is not None:
                    ctx.log(LogStream.SYSTEM, f"refused by pool {self.pool!r}: {why}")
                    return AttemptResult(Outcome.FAILED, None, f"refused by pool {self.pool!r}: {why}")
                return executor.execute(grant.spec.target, ctx)
            except Exception as exc:  # an executor bug must still end the attempt
                log.exception("executor crashed")
                return AttemptResult(Outcome.FAILED, error=f"executor error: {exc}")

        def end(result: AttemptResult) -> None:
            att = holder[0]
            with att.lock:
                if att.finished:  # given up by the loop already (_watch_deadlines)
                    return
                att.finished = True
            self._done.put((att, result))

        lease_ms = grant.lease_until_ms - max(grant.at_ms, grant.not_before_ms)
        att = _Attempt(grant, ctx, 0, max(1000, lease_ms // 3), 0, begin=begin, work=work, end=end,
                       budget=LogBudget(self.log_lines_max, self.log_bytes_max))
        holder.append(att)
        return att

    def _claim(self, att: _Attempt, now: int) -> None:
        """Report the attempt started (fenced by its token); it starts when Kafka took
        the report (``_start_claimed``), so no process runs that the log does not know of."""
        att.started_ms = now
        self._claimed[att.grant.run_id] = att
        self._send_claim(att)

    def _send_claim(self, att: _Attempt) -> None:
        g = att.grant
        claim = (g.run_id, g.token)

        def on_delivery(err: str | None, _partition: int, _offset: int) -> None:
            (self._claims_taken if err is None else self._claims_failed).append(claim)

        self._produce(self.topo.run_events, g.job_id.encode(),
                      codec.encode(AttemptStarted(g.run_id, self.worker_id, g.token, att.started_ms,
                                                  self.clock.now_ms())), False, 0, on_ack=on_delivery)

    def _start_claimed(self) -> None:
        """Start the attempts whose start report Kafka took in time (the others once the
        processor accepts them: ``START_CONFIRM_AFTER_MS``); send again the reports it did
        not take, while their lease lasts (after it, the processor has moved the run on)."""
        now = self.clock.now_ms()
        if self._confirming:
            self._confirm_pending(now)
        while self._claims_failed:
            run_id, token = self._claims_failed.popleft()
            att = self._claimed.get(run_id)
            if att is None or att.grant.token != token:
                continue
            if run_id in self._confirming:
                continue  # taken already (a report sent again): the processor's answer is awaited
            if now >= att.grant.lease_until_ms:
                del self._claimed[run_id]
                log.warning("dropped %s: its start report was not taken before its lease lapsed", run_id)
                continue
            self._send_claim(att)
        while self._claims_taken:
            run_id, token = self._claims_taken.popleft()
            att = self._claimed.get(run_id)
            if att is None or att.grant.token != token:
                continue  # dropped meanwhile (a Stop), or superseded
            if run_id in self._confirming:
                continue  # a repeated report: the processor's answer is awaited already
            late, doubt = now - att.started_ms > START_CONFIRM_AFTER_MS, self._may_be_lost(now)
            if late or doubt:
                self._confirming.add(run_id)
                log.log(logging.WARNING if late else logging.INFO,
                        "%s: its start report took %d ms to be taken%s; it starts once the processor accepts it",
                        run_id, now - att.started_ms, ", after a silence of this worker" if doubt else "")
                self._ask_confirm(att, now)
                continue
            del self._claimed[run_id]
            self._launch(att)

    def _unclaim(self, run_id: str) -> None:
        self._claimed.pop(run_id, None)
        self._confirming.discard(run_id)

    def _ask_confirm(self, att: _Attempt, now: int) -> None:
        """A heartbeat for an attempt whose start report came late: after that report in its
        partition, so the processor answers LeaseAck if it accepted the start, else Stop."""
        att.confirm_asked_ms = now
        self._send_heartbeat(att.grant, now)

    def _send_heartbeat(self, g: Grant, now: int, on_ack: Delivery | None = None) -> None:
        self._produce(self.topo.run_events, g.job_id.encode(),
                      codec.encode(Heartbeat(g.run_id, self.worker_id, g.token, now)), False, 0, on_ack=on_ack)

    def _confirm_pending(self, now: int) -> None:
        """Ask again for the answers not come; give up those whose lease lapsed unanswered
        (the processor has moved the run on; an accepted start then fails 'lease lost')."""
        for run_id in list(self._confirming):
            att = self._claimed.get(run_id)
            if att is None:
                self._confirming.discard(run_id)
            elif now >= att.grant.lease_until_ms:
                self._unclaim(run_id)
                log.warning("%s not started: no answer to its late start report before its lease lapsed", run_id)
            elif now - (att.confirm_asked_ms or 0) >= START_CONFIRM_EVERY_MS:
                self._ask_confirm(att, now)

    def _launch(self, att: _Attempt) -> None:
        """Start a prepared attempt now, on a pooled thread."""
        now = self.clock.now_ms()
        g = att.grant
        att.ctx.timeout_s = float(max(1.0, min(g.spec.timeout_s, (g.deadline_ms - now) / 1000)))
        att.ctx.deadline_ms = now + int(att.ctx.timeout_s * 1000)
        att.last_heartbeat_ms = att.started_ms = now
        self._running[g.run_id] = att
        begin, work, end = att.begin, att.work, att.end
        assert begin is not None and work is not None and end is not None
        if self._runner is not None:
            self._runner.start(att.ctx, begin, work, end)
            return

        def body() -> bool:  # on a pooled thread; True: given up while it ran, the thread leaves
            begin()
            end(work())
            return att.given_up

        self._pool.submit(body)

    def _report_started(self) -> None:
        """The log line and the metric of each attempt whose handler started (its
        AttemptStarted went before it: ``_claim``)."""
        while True:
            try:
                att = self._started.get_nowait()
            except queue.Empty:
                return
            g = att.grant
            if self.metrics is not None:  # the handler's start minus the run's start instant
                self.metrics.attempt_started(g.spec.priority.value, g.attempt, att.started_ms,
                                             max(g.slot_ms, g.not_before_ms))
            self._send(self.topo.run_logs, g.run_id, LogLine(
                g.run_id, g.job_id, g.tenant, g.attempt, 0, LogStream.SYSTEM,
                f"attempt {g.attempt} started on {self.worker_id} ({_describe(g.spec.target)})", att.started_ms))

    def _finish_done(self) -> None:
        self._report_started()  # a start report always goes before its completion
        while True:
            try:
                att, result = self._done.get_nowait()
            except queue.Empty:
                return
            g = att.grant
            result = result.capped()  # an error text of any size must not stop the loop
            if self._running.get(g.run_id) is att:  # not a newer attempt of the same run
                del self._running[g.run_id]
            self.completed += 1
            if self.metrics is not None:
                self.metrics.attempt_finished(result.outcome.value, (self.clock.now_ms() - att.started_ms) / 1000)
            self._log_cut(att)
            self._send(self.topo.run_events, g.job_id, CompleteAttempt(
                g.run_id, self.worker_id, g.token, result.outcome, self.clock.now_ms(), result.exit_code, result.error,
                att.started_ms, result.output), checked=True)

    def _log_cut(self, att: _Attempt) -> None:
        """One SYSTEM line after the attempt's last, if its output went past its budget."""
        with att.lock:
            marker, cut_lines, cut_bytes = att.budget.marker(), att.budget.cut_lines, att.budget.cut_bytes
            if marker is None:
                return
            att.seq += 1
            seq = att.seq
        g = att.grant
        if self.metrics is not None:
            self.metrics.output_cut(cut_lines, cut_bytes)
        self._send(self.topo.run_logs, g.run_id, LogLine(g.run_id, g.job_id, g.tenant, g.attempt, seq,
                                                         LogStream.SYSTEM, marker, self.clock.now_ms()))

    def _watch_deadlines(self) -> None:
        """Attempts whose handler runs on the attempt's own thread (``ctx.watched``): stop
        at the deadline; ``kill_grace_ms`` later, one still running is reported timed out
        and its thread given up (the pool starts another in its place)."""
        now = self.clock.now_ms()
        for att in list(self._running.values()):
            ctx = att.ctx
            if not ctx.watched or ctx.deadline_ms is None or now < ctx.deadline_ms or att.finished:
                continue
            ctx.request_stop("timeout")
            if now < ctx.deadline_ms + self.kill_grace_ms:
                continue
            with att.lock:
                if att.finished:
                    continue
                att.finished = att.given_up = True
            log.warning("attempt %s of %s: handler still running %d ms after its deadline; reported timed out and "
                        "its thread given up", att.grant.attempt, att.grant.run_id, now - ctx.deadline_ms)
            self._pool.abandon()
            self._done.put((att, AttemptResult(Outcome.TIMED_OUT, None,
                                               f"handler still running after {ctx.timeout_s:g}s")))

    def _heartbeat(self) -> None:
        now = self.clock.now_ms()
        for att in list(self._running.values()):
            g = att.grant
            if now - att.last_heartbeat_ms >= att.heartbeat_every_ms:
                att.last_heartbeat_ms = now
                # once Kafka has the heartbeat, the lease is renewed: tell the attempt's
                # listeners then (a container's guard: gnomon.worker.container_guard), so a
                # worker cut off from Kafka does not keep a container its lease no longer covers
                self._send_heartbeat(g, now, _renewal_of(att.ctx))

    def _drain(self, inbox: Reader, executor: Executor) -> None:
        deadline = time.monotonic() + self.drain_timeout_s
        while (self._running or self._claimed) and time.monotonic() < deadline:
            for msg in inbox.consume(100, 0.01 if self._claimed else 0.1):
                self._on_inbox(msg.value, executor)
            self._poll_producer()
            self._start_claimed()  # reported started: they run, as any attempt running at the drain
            self._watch_deadlines()
            self._finish_done()
            self._heartbeat()
        self._finish_done()


def _renewal_of(ctx: AttemptContext) -> Delivery:
    """A heartbeat's delivery report: the attempt's lease renewed when Kafka took it."""
    def on_delivery(err: str | None, _partition: int, _offset: int) -> None:
        if err is None:
            ctx.renewed()
    return on_delivery


def _describe(target: Target) -> str:
    """The target for the run's log: an HTTP URL without its credentials."""
    if target.type is TargetType.HTTP:
        return "http:" + redact_url(target.url or "")
    return target.describe()
