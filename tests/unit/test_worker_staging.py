"""The worker's local timer, driven by a FakeClock with a recording producer (no
Kafka): staged grants start at their slot and never before, Stops drop them, a full
worker hands them back, and a grant whose lease lapsed before its start is dropped."""

from __future__ import annotations

import threading
import time
from typing import Any

from gnomon import codec
from gnomon.core.clock import FakeClock
from gnomon.core.messages import Grant, LeaseAck, Stop, StopReason
from gnomon.core.model import JobSpec, Schedule, Target, TargetType
from gnomon.core.runs import AttemptStarted, CompleteAttempt, Heartbeat, ReturnGrant
from gnomon.core.workers import WorkerAdvert
from gnomon.topology import load_topology
from gnomon.worker import Worker
from gnomon.worker.executors import Dispatcher
from gnomon.worker.pool import AttemptPool


class RecordingProducer:
    """Records what the worker sends. Start reports are taken by Kafka at the next
    ``poll`` (``take_starts``); every other delivery report waits for the test."""

    def __init__(self, take_starts: bool = True) -> None:
        self.sent: list[tuple[str, Any]] = []
        self.reports: list[Any] = []  # delivery callbacks, in order
        self.take_starts = take_starts
        self._starts: list[Any] = []  # start reports' callbacks not yet answered
        self.lock = threading.Lock()

    def produce(self, topic: str, key: bytes | None, value: bytes | None, *, on_delivery: Any = None) -> None:
        with self.lock:
            obj = codec.decode(value or b"")
            self.sent.append((topic, obj))
            if on_delivery is not None:
                self.reports.append(on_delivery)
                if isinstance(obj, AttemptStarted):
                    self._starts.append(on_delivery)

    def poll(self, _timeout: float) -> int:
        if not self.take_starts:
            return 0
        with self.lock:
            starts, self._starts = self._starts, []
        for i, report in enumerate(starts):
            report(None, 0, i)
        return len(starts)

    def of(self, cls: type) -> list[Any]:
        with self.lock:
            return [v for _, v in self.sent if isinstance(v, cls)]


SPEC = JobSpec(name="j", schedule=Schedule(run_at_ms=0), target=Target(TargetType.HANDLER, handler="h"))


def make(concurrency: int = 2) -> tuple[Worker, FakeClock, RecordingProducer, Dispatcher, list[str]]:
    clock = FakeClock()
    w = Worker("default", bootstrap="unused:1", worker_id="w1", concurrency_max=concurrency, clock=clock,
               topology=load_topology(), handback_after_ms=1000, tenants=["t"])
    ran: list[str] = []
    gate = threading.Event()

    @w.handler("h")
    def h(ctx: Any) -> None:
        ran.append(ctx.run_id)
        gate.wait(5)

    w.release = gate  # type: ignore[attr-defined]
    prod = RecordingProducer()
    w._producer = prod  # type: ignore[assignment]
    return w, clock, prod, Dispatcher(w.handlers), ran


def grant(run_id: str, slot: int, token: int = 1, lease_ms: int = 30_000) -> bytes:
    return codec.encode(Grant("w1", run_id, "j", "t", 1, token, slot + lease_ms, slot + 90_000, SPEC, slot,
                              slot - 20_000, slot))


def fire(w: Worker, ex: Any) -> None:
    """Attempts due now report their start; Kafka takes the reports; they start."""
    w._fire_due(ex)
    w._poll_producer()
    w._start_claimed()


def wait_for(pred: Any, timeout_s: float = 5) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_a_staged_grant_starts_at_its_slot_never_before() -> None:
    w, clock, prod, ex, ran = make()
    slot = clock.now_ms() + 20_000
    w._on_inbox(grant("j@1", slot), ex)
    assert w._staged and not w._running
    clock.set(slot - 1)
    fire(w, ex)
    assert not w._running and prod.of(AttemptStarted) == []
    clock.set(slot)
    fire(w, ex)
    assert list(w._running) == ["j@1"]
    wait_for(lambda: ran == ["j@1"])  # the handler itself runs first...
    w._report_started()  # ...and the loop reports the start while it runs
    (started,) = prod.of(AttemptStarted)
    assert started.started_at_ms == slot and started.token == 1
    w.release.set()  # type: ignore[attr-defined]
    wait_for(lambda: not w._done.empty())
    w._finish_done()
    (done,) = prod.of(CompleteAttempt)
    assert done.outcome.value == "succeeded" and done.started_at_ms == slot


def test_an_attempt_starts_only_once_kafka_took_its_start_report() -> None:
    """Issue 51: the start is on record before the handler runs, so a worker that dies
    before its report was taken never ran the attempt (the processor grants it again at
    once, using no attempt). A report Kafka refused is sent again; a Stop meanwhile drops
    the attempt before anything ran."""
    w, clock, prod, ex, ran = make()
    prod.take_starts = False
    w.release.set()  # type: ignore[attr-defined]  # the handler returns at once
    slot = clock.now_ms() + 1_000
    w._on_inbox(grant("j@1", slot), ex)
    w._on_inbox(grant("j@2", slot), ex)
    clock.set(slot)
    fire(w, ex)
    assert [s.run_id for s in prod.of(AttemptStarted)] == ["j@1", "j@2"] and not w._running and ran == []
    assert w._wait_s() <= 0.001  # the loop comes back for the acknowledgement at once
    first, second = prod.reports[-2:]
    first("Local: Message timed out", -1, -1)  # not taken: sent again, still not started
    w._start_claimed()
    assert [s.run_id for s in prod.of(AttemptStarted)] == ["j@1", "j@2", "j@1"] and not w._running
    w._on_inbox(codec.encode(Stop("w1", "j@2", 1, StopReason.REVOKED, "worker lost", 0)), ex)
    second(None, 0, 1)  # taken, but the Stop came first: it never starts
    prod.reports[-1](None, 0, 2)  # j@1's second report taken
    w._start_claimed()
    wait_for(lambda: not w._done.empty())
    w._finish_done()
    assert ran == ["j@1"] and not w._claimed
    (done,) = prod.of(CompleteAttempt)
    assert done.run_id == "j@1" and done.started_at_ms >= slot


def test_a_start_report_not_taken_before_the_lease_lapsed_drops_the_attempt() -> None:
    w, clock, prod, ex, ran = make()
    prod.take_starts = False
    slot = clock.now_ms() + 1_000
    w._on_inbox(grant("j@1", slot, lease_ms=5_000), ex)
    clock.set(slot)
    fire(w, ex)
    clock.set(slot + 5_000)
    prod.reports[-1]("Local: Message timed out", -1, -1)
    w._start_claimed()
    assert not w._claimed and not w._running and ran == [] and len(prod.of(AttemptStarted)) == 1


def test_a_stop_drops_a_staged_grant_and_a_newer_grant_replaces_it() -> None:
    w, clock, _prod, ex, _ran = make()
    slot = clock.now_ms() + 20_000
    w._on_inbox(grant("j@1", slot, token=1), ex)
    w._on_inbox(codec.encode(Stop("w1", "j@1", 1, StopReason.REVOKED, "paused", 0)), ex)
    w._on_inbox(grant("j@2", slot, token=1), ex)
    w._on_inbox(grant("j@2", slot, token=2), ex)  # re-granted (edited): the newer token wins
    clock.set(slot)
    fire(w, ex)
    assert list(w._running) == ["j@2"] and w._running["j@2"].grant.token == 2
    w.release.set()  # type: ignore[attr-defined]


def test_a_full_worker_hands_back_what_it_cannot_start() -> None:
    w, clock, prod, ex, _ran = make(concurrency=1)
    slot = clock.now_ms() + 5_000
    w._on_inbox(grant("j@1", slot), ex)
    w._on_inbox(grant("j@2", slot), ex)
    clock.set(slot)
    fire(w, ex)
    assert list(w._running) == ["j@1"] and "j@2" in w._staged
    clock.set(slot + 1000)
    fire(w, ex)
    assert prod.of(ReturnGrant) == []  # waits up to handback_after_ms
    clock.set(slot + 1001)
    fire(w, ex)
    (back,) = prod.of(ReturnGrant)
    assert back.run_id == "j@2" and back.token == 1 and not w._staged and w.returned == 1
    w.release.set()  # type: ignore[attr-defined]


def test_a_grant_that_comes_after_its_slot_to_a_full_worker_waits_before_it_goes_back() -> None:
    # hundreds of grants for slots already past came at once (the first transactions after
    # many registrations): those beyond the free slots were handed back at once, and the
    # processor granted them again seconds later, after the worker had room
    w, clock, prod, ex, ran = make(concurrency=1)
    slot = clock.now_ms()
    clock.set(slot + 6_000)  # the grants come 6 s after their slot
    w._on_inbox(grant("j@1", slot), ex)
    w._on_inbox(grant("j@2", slot), ex)
    w._poll_producer()  # Kafka takes j@1's start report: it starts
    w._start_claimed()
    assert list(w._running) == ["j@1"] and "j@2" in w._staged
    clock.set(slot + 6_500)
    fire(w, ex)
    assert prod.of(ReturnGrant) == []  # it waits up to handback_after_ms from its coming
    w.release.set()  # type: ignore[attr-defined]  # j@1 ends: a slot is free
    wait_for(lambda: not w._done.empty())
    w._finish_done()
    fire(w, ex)
    assert "j@2" in w._running and prod.of(ReturnGrant) == []
    wait_for(lambda: ran == ["j@1", "j@2"])


class _Gate:
    """A region gate that only says the namespace is still this region's."""

    def still_mine(self) -> bool:
        return True


def test_runs_held_by_the_write_fence_are_not_handed_back_and_start_when_writes_are_taken() -> None:
    # region b's worker, while a's cut made its writes wait 10 s for a's replica to leave
    # the ISR: its runs due then were held (right), then handed back after 1 s as if it
    # had no free slot (wrong): the processor granted them again and they started 9 s late
    w, clock, prod, ex, ran = make(concurrency=4)
    w.gate = _Gate()  # type: ignore[assignment]
    w.fence_ms = 10_000
    w._advert_acked(clock.now_ms())(None, 0, 0)  # the last write the cluster took
    slot = clock.now_ms() + 10_500
    w._on_inbox(grant("j@1", slot), ex)
    clock.set(slot)
    fire(w, ex)
    assert not w._running and "j@1" in w._staged  # no write taken for 10.5 s: held
    clock.set(slot + 3_000)
    fire(w, ex)
    assert prod.of(ReturnGrant) == [] and "j@1" in w._staged  # held, not handed back
    w._advert_acked(clock.now_ms())(None, 0, 0)  # the cluster answers again
    fire(w, ex)
    # silent 13.5 s, the worker may have been found lost: the start waits for the processor
    assert "j@1" not in w._running and prod.of(ReturnGrant) == [] and prod.of(Heartbeat)
    w._on_inbox(codec.encode(LeaseAck("w1", "j@1", 1, slot + 40_000, slot)), ex)  # accepted
    assert "j@1" in w._running
    w.release.set()  # type: ignore[attr-defined]
    wait_for(lambda: ran == ["j@1"])


def test_a_grant_whose_lease_lapsed_before_its_start_is_dropped() -> None:
    w, clock, prod, ex, _ran = make()
    slot = clock.now_ms() + 1_000
    w._on_inbox(grant("j@1", slot, lease_ms=8_000), ex)
    clock.set(slot + 8_000)  # e.g. the process was SIGSTOPped past the lease
    fire(w, ex)
    assert not w._running and not w._staged and prod.of(AttemptStarted) == []


def test_adverts_count_staged_and_running_apart() -> None:
    w, clock, prod, ex, _ran = make(concurrency=4)
    slot = clock.now_ms() + 5_000
    for i in range(3):
        w._on_inbox(grant(f"j@{i}", slot + i * 10_000), ex)
    clock.set(slot)
    fire(w, ex)
    w._advertise(force=True)
    (ad,) = prod.of(WorkerAdvert)
    assert (ad.slots, ad.running, ad.staged, ad.pool, ad.leaving) == (4, 1, 2, "default", False)
    w.release.set()  # type: ignore[attr-defined]


def test_attempt_pool_reuses_at_most_threads_max_threads() -> None:
    pool = AttemptPool(3)
    done = threading.Semaphore(0)
    names: set[str] = set()
    lock = threading.Lock()

    def job() -> None:
        with lock:
            names.add(threading.current_thread().name)
        time.sleep(0.01)
        done.release()

    for _ in range(30):
        pool.submit(job)
    for _ in range(30):
        assert done.acquire(timeout=5)
    assert pool.threads <= 3 and len(names) <= 3


def test_a_newer_grant_is_staged_while_an_older_attempt_still_runs() -> None:
    w, clock, _prod, ex, _ = make()
    slot = clock.now_ms() + 1_000
    w._on_inbox(grant("j@1", slot, token=1), ex)
    clock.set(slot)
    fire(w, ex)  # token 1 runs (and hangs on the gate)
    w._on_inbox(grant("j@1", slot + 40_000, token=2), ex)  # its lease lapsed: granted again
    assert w._staged["j@1"].grant.token == 2
    w._on_inbox(grant("j@1", slot, token=1), ex)  # a repeat of the old one changes nothing
    assert w._staged["j@1"].grant.token == 2
    w.release.set()  # type: ignore[attr-defined]


def test_a_result_whose_delivery_failed_is_sent_again() -> None:
    w, clock, prod, ex, _ran = make()
    slot = clock.now_ms() + 1_000
    w._on_inbox(grant("j@9", slot), ex)
    clock.set(slot)
    fire(w, ex)
    w.release.set()  # type: ignore[attr-defined]
    wait_for(lambda: not w._done.empty())
    w._finish_done()
    completes = prod.of(CompleteAttempt)
    assert len(completes) == 1
    prod.reports[-1]("KafkaError{code=_MSG_TIMED_OUT}", -1, -1)  # librdkafka gave up on it
    w._resend_undelivered()
    assert prod.of(CompleteAttempt) == completes * 2, "the outcome is produced again"
    assert w.undelivered_total == 1
    prod.reports[-1](None, 0, 1)  # delivered this time
    w._resend_undelivered()
    assert len(prod.of(CompleteAttempt)) == 2


def test_an_oversized_error_is_capped_before_it_is_reported() -> None:
    from gnomon.core.runs import Outcome
    from gnomon.worker.attempt import ERROR_MAX_CHARS, AttemptResult

    result = AttemptResult(Outcome.FAILED, 1, "x" * 10_000_000).capped()
    assert result.error is not None and len(result.error) <= ERROR_MAX_CHARS
    assert result.error.endswith("(truncated)")


def test_staging_room_defaults_to_twice_the_slots_when_that_is_more_than_10000() -> None:
    """A worker takes up to ``concurrency`` runs due in one second: its staging room must
    hold them (30,000 due at once on two 15,000-slot workers waited for room: p99 10.5 s)."""
    assert make(8)[0].stage_max == 10_000
    assert make(15_000)[0].stage_max == 30_000
    w = Worker("default", bootstrap="unused:1", concurrency_max=4, stage_max=50, topology=load_topology())
    assert w.stage_max == 50


def test_gnomon_worker_sizes_the_staging_room_from_its_concurrency(monkeypatch: Any, tmp_path: Any) -> None:
    from typer.testing import CliRunner

    from gnomon.cli.main import app

    seen: list[tuple[int, int]] = []
    monkeypatch.setattr(Worker, "run", lambda self: seen.append((self.concurrency_max, self.stage_max)))
    monkeypatch.setenv("GNOMON_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("GNOMON_CODEC_FETCH_UNKNOWN", "0")  # (the command would install a registry lookup process-wide)
    runner = CliRunner()
    for args, want in ((["--concurrency", "15000"], (15_000, 30_000)),
                       (["--concurrency", "100", "--stage-max", "500"], (100, 500))):
        res = runner.invoke(app, ["worker", "--tenant", "t", *args])
        assert res.exit_code == 0, res.output
        assert seen.pop() == want


def test_a_pool_the_os_refuses_threads_stops_growing_instead_of_failing(monkeypatch: Any) -> None:
    """``RuntimeError: can't start new thread`` (five 20,000-slot workers past the kernel's pid_max)
    killed the worker's loop; now the pool keeps the threads it has and the worker
    advertises that many slots."""
    w, _, _, _, ran = make(concurrency=50)
    w.release.set()  # type: ignore[attr-defined]
    real_start = threading.Thread.start
    started = [0]

    def start(self: threading.Thread) -> None:
        if self.name.startswith("attempt-") and started[0] >= 3:
            raise RuntimeError("can't start new thread")
        started[0] += self.name.startswith("attempt-")
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    assert w._pool.prestart(10) == 3
    assert w._pool.threads_max == 3 and w._pool.threads == 3
    ran_before = len(ran)
    for i in range(5):  # more attempts than threads: they queue for the three
        w._pool.submit(lambda i=i: ran.append(f"x{i}") and None)
    wait_for(lambda: len(ran) == ran_before + 5)


# ---- issue 51 item 3: a late start report starts its attempt only once it was accepted ----

def _late_claim(w: Worker, clock: FakeClock, prod: RecordingProducer, ex: Any, *, late_ms: int) -> int:
    """j@1 staged, due now; its start report taken ``late_ms`` after it was sent."""
    w._advert_acked(clock.now_ms())(None, 0, 0)
    slot = clock.now_ms() + 500
    w._on_inbox(grant("j@1", slot), ex)
    clock.set(slot)
    w._advert_acked(clock.now_ms())(None, 0, 0)  # adverts taken all along
    prod.take_starts = False
    fire(w, ex)
    assert "j@1" in w._claimed and prod.of(AttemptStarted)
    clock.advance(late_ms)
    w._advert_acked(clock.now_ms())(None, 0, 0)
    prod.take_starts = True
    fire(w, ex)
    return slot


def test_a_start_report_taken_in_time_starts_at_once() -> None:
    w, clock, prod, ex, ran = make()
    _late_claim(w, clock, prod, ex, late_ms=200)
    assert "j@1" in w._running and not prod.of(Heartbeat)
    w.release.set()  # type: ignore[attr-defined]
    wait_for(lambda: ran == ["j@1"])


def test_a_start_report_taken_late_starts_once_the_processor_accepts_it() -> None:
    w, clock, prod, ex, ran = make()
    slot = _late_claim(w, clock, prod, ex, late_ms=1_500)
    assert "j@1" not in w._running and "j@1" in w._claimed
    beats = prod.of(Heartbeat)
    assert [(b.run_id, b.token) for b in beats] == [("j@1", 1)]  # the question, after the report
    clock.advance(1_000)
    fire(w, ex)
    assert len(prod.of(Heartbeat)) == 2  # asked again while unanswered
    w._on_inbox(codec.encode(LeaseAck("w1", "j@1", 1, slot + 40_000, slot)), ex)
    assert "j@1" in w._running and w.starts_confirmed == 1
    w.release.set()  # type: ignore[attr-defined]
    wait_for(lambda: ran == ["j@1"])


def test_a_late_start_report_refused_never_starts() -> None:
    w, clock, prod, ex, ran = make()
    slot = _late_claim(w, clock, prod, ex, late_ms=3_000)
    w._on_inbox(codec.encode(Stop("w1", "j@1", 1, StopReason.STALE, "stale token 1 (current 2)", slot)), ex)
    assert not w._claimed and not w._running and w.starts_refused == 1
    w._on_inbox(codec.encode(LeaseAck("w1", "j@1", 1, slot + 40_000, slot)), ex)  # (a stray answer)
    fire(w, ex)
    assert not w._running and ran == []


def test_a_late_start_report_left_unanswered_is_given_up_at_its_lease() -> None:
    w, clock, prod, ex, ran = make()
    slot = _late_claim(w, clock, prod, ex, late_ms=2_000)
    clock.set(slot + 30_000)  # the grant's lease
    fire(w, ex)
    assert not w._claimed and not w._running and ran == []


def test_after_a_silence_of_its_adverts_a_start_taken_in_time_waits_for_the_answer() -> None:
    w, clock, prod, ex, _ran = make()
    w._advert_acked(clock.now_ms())(None, 0, 0)
    clock.advance(2_500)  # no advert taken for 2.5 s: the processors may have found it lost
    w._advert_acked(clock.now_ms() - 100)(None, 0, 0)
    slot = clock.now_ms() + 100
    w._on_inbox(grant("j@1", slot), ex)
    clock.set(slot)
    fire(w, ex)
    assert "j@1" not in w._running and prod.of(Heartbeat)
    for _ in range(11):  # 11 s of adverts taken in time: starts go at once again
        clock.advance(1_000)
        w._advert_acked(clock.now_ms())(None, 0, 0)
    w._on_inbox(grant("j@2", clock.now_ms() + 100), ex)
    clock.advance(100)
    fire(w, ex)
    assert "j@2" in w._running
    w.release.set()  # type: ignore[attr-defined]
