"""A plain handler runs on the attempt's pooled thread (no thread of its own per start),
so the worker's loop keeps its deadline: ``ctx.stop`` at the deadline, a timed-out
result then, and a handler that ignores the stop is given up ``kill_grace_ms`` later
while its thread leaves the pool and another takes its place. FakeClock and a
recording producer, no Kafka."""

from __future__ import annotations

import threading
import time
from typing import Any

from tests.unit.test_worker_staging import RecordingProducer, fire, wait_for

from gnomon import codec
from gnomon.core.clock import FakeClock
from gnomon.core.messages import Grant
from gnomon.core.model import JobSpec, Schedule, Target, TargetType
from gnomon.core.runs import CompleteAttempt
from gnomon.topology import load_topology
from gnomon.worker import Worker
from gnomon.worker.executors import Dispatcher, HandlerExecutor
from gnomon.worker.pool import AttemptPool

SPEC = JobSpec(name="j", schedule=Schedule(run_at_ms=0), target=Target(TargetType.HANDLER, handler="h"), timeout_s=10)


def grant(run_id: str, slot: int) -> bytes:
    return codec.encode(Grant("w1", run_id, "j", "t", 1, 1, slot + 600_000, slot + 600_000, SPEC, slot,
                              slot - 1_000, slot))


def make(handler: Any, concurrency: int = 1) -> tuple[Worker, FakeClock, RecordingProducer, Dispatcher]:
    clock = FakeClock()
    w = Worker("default", bootstrap="unused:1", worker_id="w1", concurrency_max=concurrency, clock=clock,
               topology=load_topology(), tenants=["t"])
    w.handler("h")(handler)
    prod = RecordingProducer()
    w._producer = prod  # type: ignore[assignment]
    w.kill_grace_ms = 2_000
    return w, clock, prod, Dispatcher(w.handlers, inline_handlers=True)


def step(w: Worker) -> None:
    w._watch_deadlines()
    w._finish_done()


def test_the_handler_runs_on_the_attempt_thread_not_one_of_its_own() -> None:
    seen: list[str] = []
    w, clock, prod, ex = make(lambda ctx: seen.append(threading.current_thread().name))
    slot = clock.now_ms() + 1_000
    w._on_inbox(grant("j@1", slot), ex)
    clock.set(slot)
    fire(w, ex)
    wait_for(lambda: not w._done.empty())
    step(w)
    assert seen == ["attempt-1"]  # the pool's thread (before: "handler-j@1")
    (done,) = prod.of(CompleteAttempt)
    assert done.outcome.value == "succeeded"


def test_a_handler_that_heeds_the_stop_at_its_deadline_times_out() -> None:
    def h(ctx: Any) -> str:
        ctx.stop.wait(10)
        return "stopped" if ctx.stop.is_set() else "not stopped"

    w, clock, prod, ex = make(h)
    slot = clock.now_ms() + 1_000
    w._on_inbox(grant("j@1", slot), ex)
    clock.set(slot)
    fire(w, ex)
    att = w._running["j@1"]
    wait_for(lambda: att.ctx.watched)  # the handler runs
    assert att.ctx.deadline_ms == slot + 10_000
    clock.set(slot + 9_999)
    step(w)
    assert not att.ctx.stop.is_set() and prod.of(CompleteAttempt) == []
    clock.set(slot + 10_000)
    step(w)
    assert att.ctx.stop_reason == "timeout"
    wait_for(lambda: not w._done.empty())
    step(w)
    (done,) = prod.of(CompleteAttempt)
    assert done.outcome.value == "timed_out" and done.error == "handler still running after 10s"


def test_a_handler_that_ignores_the_stop_is_given_up_and_its_thread_replaced() -> None:
    release = threading.Event()
    ran: list[str] = []

    def h(ctx: Any) -> None:
        ran.append(ctx.run_id)
        if ctx.run_id == "j@1":
            release.wait(10)  # ignores ctx.stop

    w, clock, prod, ex = make(h, concurrency=1)
    slot = clock.now_ms() + 1_000
    w._on_inbox(grant("j@1", slot), ex)
    clock.set(slot)
    fire(w, ex)
    wait_for(lambda: ran == ["j@1"])
    clock.set(slot + 10_000 + 1_999)
    step(w)
    assert prod.of(CompleteAttempt) == [] and "j@1" in w._running  # within its grace
    clock.set(slot + 10_000 + 2_000)
    step(w)
    (done,) = prod.of(CompleteAttempt)
    assert done.outcome.value == "timed_out" and done.run_id == "j@1" and not w._running
    # the slot is free again and a new thread serves it while the stuck one still hangs
    w._on_inbox(grant("j@2", slot + 20_000), ex)
    clock.set(slot + 20_000)
    fire(w, ex)
    wait_for(lambda: not w._done.empty())
    step(w)
    assert [d.run_id for d in prod.of(CompleteAttempt)] == ["j@1", "j@2"]
    assert [d.outcome.value for d in prod.of(CompleteAttempt)] == ["timed_out", "succeeded"]
    release.set()  # the stuck handler returns late: nothing more is reported
    time.sleep(0.05)
    step(w)
    assert len(prod.of(CompleteAttempt)) == 2


def test_a_given_up_pool_thread_leaves_and_the_pool_makes_another() -> None:
    pool = AttemptPool(1)
    gate, out = threading.Event(), []
    pool.submit(lambda: gate.wait(5) or True)  # (given up: returns True when it ends)
    wait_for(lambda: pool.threads == 1)
    pool.abandon()
    pool.submit(lambda: out.append(threading.current_thread().name) and None)
    wait_for(lambda: len(out) == 1)
    assert pool.threads == 1
    gate.set()
    time.sleep(0.05)
    assert pool.threads == 1  # the stuck one left instead of serving on


def test_the_threaded_executor_still_joins_with_a_timeout() -> None:
    ex = HandlerExecutor({"h": lambda ctx: ctx.stop.wait(5)})
    from gnomon.worker.attempt import AttemptContext

    ctx = AttemptContext("j@1", "j", "t", 1, {}, 0.05, lambda s, line: None)
    res = ex.execute(Target(TargetType.HANDLER, handler="h"), ctx)
    assert res.outcome.value == "timed_out" and not ctx.watched


def test_threads_for_staged_attempts_are_started_before_their_slot() -> None:
    w, clock, _prod, ex = make(lambda ctx: None, concurrency=300)
    slot = clock.now_ms() + 20_000
    for i in range(250):
        w._on_inbox(grant(f"j@{i}", slot), ex)
    assert w._pool.threads == 0
    assert w._pool.prestart(250) == 200  # bounded per call: a loop turn pauses at most so long
    assert w._pool.prestart(250) == 50 and w._pool.prestart(250) == 0
    assert w._pool.prestart(10_000) == 50 and w._pool.threads == 300  # never past threads_max
    clock.set(slot)
    fire(w, ex)
    wait_for(lambda: w._done.qsize() == 250)
    assert w._pool.threads == 300  # the slot created none


def test_each_heartbeat_renews_the_attempts_listeners_with_its_lease() -> None:
    """What feeds a container's guard (gnomon.worker.container_guard): the attempt knows
    its grant's lease, and every heartbeat Kafka acknowledges calls its renewal listeners:
    none between heartbeats, none for a heartbeat Kafka did not take."""
    from gnomon.core.runs import Heartbeat

    release = threading.Event()
    w, clock, prod, ex = make(lambda ctx: release.wait(10))
    slot = clock.now_ms() + 1_000
    w._on_inbox(grant("j@1", slot), ex)
    clock.set(slot)
    fire(w, ex)
    att = w._running["j@1"]
    assert att.ctx.lease_s == 600.0  # lease_until_ms - max(at_ms, not_before_ms)
    renewed: list[int] = []
    att.ctx.renewals.append(lambda: renewed.append(clock.now_ms()))
    clock.set(slot + att.heartbeat_every_ms - 1)
    w._heartbeat()
    assert renewed == [] and prod.of(Heartbeat) == []
    clock.set(slot + att.heartbeat_every_ms)
    w._heartbeat()
    assert len(prod.of(Heartbeat)) == 1 and renewed == []  # sent, not acknowledged yet
    prod.reports[-1]("Local: Message timed out", -1, -1)  # not delivered: no renewal
    assert renewed == []
    clock.set(slot + 2 * att.heartbeat_every_ms)
    w._heartbeat()
    prod.reports[-1](None, 0, 7)  # Kafka took it
    assert renewed == [slot + 2 * att.heartbeat_every_ms] and len(prod.of(Heartbeat)) == 2
    release.set()
    wait_for(lambda: not w._done.empty())
    step(w)
