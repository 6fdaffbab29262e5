"""core.overload: the tick budget and the AIMD governor that sets it on the real stack;
core.jobs.decide_tick's give-up of slots past a job's lateness bound; the per-priority
due indexes (and the move of an old store's single one)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gnomon.adapters.floors import FloorKV
from gnomon.adapters.kv import MemoryKV
from gnomon.core import jobs as J
from gnomon.core.model import JobSpec, Priority, Schedule, Target, TargetType
from gnomon.core.overload import OverloadGovernor, TickBudget
from gnomon.processor.task import PartitionTask
from gnomon.topology import load_topology

T0 = 1_767_225_600_000
SPEC = JobSpec(name="n", schedule=Schedule(cron="* * * * * *"), target=Target(TargetType.HANDLER, handler="h"))


def _state(spec: JobSpec = SPEC, next_ms: int = T0) -> J.JobState:
    return J.JobState("j", "t", spec, J.JobStatus.ACTIVE, next_ms, 1, T0 - 60_000, T0 - 60_000)


def test_a_budget_counts_down_and_none_is_unlimited() -> None:
    b = TickBudget(left=3)
    b.spend(2)
    assert not b.exhausted and b.used == 2
    b.spend(1)
    assert b.exhausted
    free = TickBudget()
    free.spend(10**6)
    assert not free.exhausted and free.used == 10**6


def test_the_window_grows_while_runs_start_on_time_and_is_cut_when_they_do_not() -> None:
    g = OverloadGovernor(target_lag_ms=800, period_ms=1_000, window_start_runs=1_000)
    now, in_flight = T0, 0
    assert g.budget(0).left == 1_000
    for _ in range(7):  # on time and binding: slow start doubles it every period
        b = g.budget(in_flight)
        in_flight += b.left or 0
        b.spend(b.left or 0)
        g.observe_start(0, 100)
        g.after_tick(b, in_flight, now)
        now += 500
    assert g.window_runs == 8_000 and g.slow_start
    # high runs start 2 s late: cut to 0.7x what was in flight, and slow start ends
    for _ in range(2):
        b = g.budget(in_flight)
        g.observe_start(0, 2_000)
        g.observe_start(1, 50)  # (normal runs on time do not hide late high ones)
        g.after_tick(b, in_flight, now)
        now += 500
    assert g.window_runs == 0.7 * in_flight and not g.slow_start
    cut = g.window_runs
    # on time again, with due jobs deferred (it binds): it grows by 10 % a period
    for _ in range(4):
        b = g.budget(in_flight)
        b.deferred = 5
        g.observe_start(0, 100)
        g.after_tick(b, in_flight, now)
        now += 500
    assert cut < g.window_runs <= cut * 1.1 ** 2 + 1
    assert g.overloaded


def test_a_window_that_does_not_bind_does_not_grow() -> None:
    g = OverloadGovernor(period_ms=1_000, window_start_runs=1_000)
    for i in range(10):
        g.after_tick(g.budget(10), 10, T0 + i * 500)
    assert g.window_runs == 1_000 and not g.overloaded


@given(st.lists(st.tuples(st.integers(0, 20_000), st.integers(0, 5_000), st.integers(0, 3)), max_size=80))
def test_the_window_stays_between_its_floor_and_its_ceiling(ticks: list[tuple[int, int, int]]) -> None:
    g = OverloadGovernor(period_ms=500)
    now = T0
    for in_flight, lag, step in ticks:
        b = g.budget(in_flight)
        assert b.left is not None and b.left >= 0
        b.deferred = step
        g.observe_start(step % 3, lag)
        g.after_tick(b, in_flight, now)
        assert g.window_min_runs <= g.window_runs <= g.window_max_runs
        now += 100 * (step + 1)


def test_a_present_processor_gives_late_slots_up_as_overload_in_one_range() -> None:
    state = _state(next_ms=T0)
    now = T0 + 90_000  # 90 slots late, the job accepts 60 s (the misfire grace)
    events = J.decide_tick(state, now, J.SchedulerConfig(lookahead_ms=0), present_since_ms=T0 - 1)
    given_up = events[0]
    assert isinstance(given_up, J.RunSkipped) and given_up.reason == J.OVERLOAD_REASON
    assert (given_up.from_ms, given_up.slot_ms, given_up.count) == (T0, T0 + 30_000, 31)
    assert given_up.advances and given_up.advance_to_ms == T0 + 31_000
    ran = [e for e in events if isinstance(e, J.RunTriggered)]
    assert ran[0].slot_ms == T0 + 31_000 and ran[-1].slot_ms == now  # the rest run late


def test_lateness_is_the_jobs_own_setting_and_an_absent_processor_uses_catch_up() -> None:
    spec = JobSpec(name="n", schedule=Schedule(cron="* * * * * *"), target=SPEC.target, late_max_s=5)
    events = J.decide_tick(_state(spec), T0 + 20_000, J.SchedulerConfig(lookahead_ms=0), present_since_ms=T0)
    assert isinstance(events[0], J.RunSkipped) and events[0].slot_ms == T0 + 15_000
    only = J.decide_tick(_state(spec), T0 + 20_000, J.SchedulerConfig(lookahead_ms=0), present_since_ms=T0,
                         triggers=False)
    assert len(only) == 1 and isinstance(only[0], J.RunSkipped)
    # the processor was not there at the slot: the catch-up policy, as after an outage
    away = J.decide_tick(_state(spec), T0 + 90_000, J.SchedulerConfig(lookahead_ms=0), present_since_ms=T0 + 1)
    assert isinstance(away[0], J.RunSkipped) and away[0].reason == "catch-up policy once"
    # with the budget spent the catch-up waits for it, but no longer than the job's lateness
    # bound past the processor's return
    assert J.decide_tick(_state(spec), T0 + 5_000, J.SchedulerConfig(lookahead_ms=0), present_since_ms=T0 + 1,
                         triggers=False) == []


def test_an_outage_backlog_the_budget_never_reaches_records_what_its_catch_up_skips() -> None:
    """Found by the stricter history checker (issue 49): after a processor's restart, low
    jobs whose slots were missed before it came back waited for their catch-up, which
    waits for budget; under overload that never came, and the jobs stood still with their
    slots neither run nor recorded (50 s in ``test_sim_overload``'s faults scenario). With
    the budget spent, the slots the policy skips are recorded at once (they cost no
    trigger); the runs it keeps wait for budget as before."""
    back = T0 + 90_000
    cfg = J.SchedulerConfig(lookahead_ms=0, misfire_grace_ms=20_000)
    once = JobSpec(name="n", schedule=Schedule(cron="* * * * * *"), target=SPEC.target)  # catch-up: once
    events = J.decide_tick(_state(once), back, cfg, present_since_ms=back, triggers=False)
    assert len(events) == 1 and isinstance(events[0], J.RunSkipped), events
    skipped = events[0]
    assert skipped.reason == "catch-up policy once"
    assert (skipped.from_ms, skipped.slot_ms, skipped.count) == (T0, back - 1_000, 90)
    assert skipped.advances and skipped.advance_to_ms == back  # the kept slot waits for budget
    after = J.evolve(_state(once), skipped)
    assert after is not None and after.next_run_at_ms == back
    assert J.decide_tick(after, back + 1_000, cfg, present_since_ms=back, triggers=False) == []  # (in the grace)
    # with budget, the kept slot runs as the catch-up would have run it
    ran = J.decide_tick(after, back + 500, cfg, present_since_ms=back)
    assert isinstance(ran[0], J.RunTriggered) and ran[0].slot_ms == back
    # skip: the whole backlog, the job moved past now
    skip = JobSpec(name="n", schedule=Schedule(cron="* * * * * *"), target=SPEC.target, catch_up=J.CatchUp.SKIP)
    (all_skipped,) = J.decide_tick(_state(skip), back, cfg, present_since_ms=back, triggers=False)
    assert isinstance(all_skipped, J.RunSkipped) and all_skipped.reason == "catch-up policy skip"
    assert (all_skipped.slot_ms, all_skipped.advance_to_ms) == (back, back + 1_000)
    # within the grace nothing is missed yet: nothing is decided without budget
    assert J.decide_tick(_state(once, next_ms=back - 5_000), back, cfg, present_since_ms=back, triggers=False) == []


def _task() -> PartitionTask:
    return PartitionTask(0, FloorKV(MemoryKV()), load_topology())


def test_due_jobs_are_indexed_by_priority_and_an_old_store_is_moved() -> None:
    task = _task()
    out: list = []
    for i, prio in enumerate(Priority):
        spec = JobSpec(name="n", schedule=SPEC.schedule, target=SPEC.target, priority=prio)
        job = J.JobState(f"j{i}", "t", spec, J.JobStatus.ACTIVE, T0 + i, 1, T0, T0)
        task._store_job(job.job_id, None, job, out)
    keys = [k for k, _ in task.kv.scan(b"j0/", b"j3", 10)]
    assert keys == [b"j0/%013d/j0" % T0, b"j1/%013d/j1" % (T0 + 1), b"j2/%013d/j2" % (T0 + 2)]
    # a store written before the per-priority indexes: one jd/ index, moved when opened
    for k in keys:
        task.kv.delete(k)
    for i in range(3):
        task.kv.put(b"jd/%013d/j%d" % (T0 + i, i), b"")
    task.kv.put(b"jd/%013d/gone" % T0, b"")  # an entry whose job is gone is dropped
    assert task.migrate_due_index(chunk_max=2) == 4
    assert [k for k, _ in task.kv.scan(b"j0/", b"j3", 10)] == keys
    assert list(task.kv.scan(b"jd/", b"je", 10)) == []
    assert task.migrate_due_index() == 0


def test_status_says_a_processor_is_overloaded_and_by_how_much() -> None:
    from gnomon.metrics.status import ProcessorView, Status, render

    calm = ProcessorView("http://p0", "p0", [0, 1], 0)
    busy = ProcessorView("http://p1", "p1", [2, 3], 0, overload_window=1200, overload_in_flight=1190,
                         overload_deferred=40, overload_lag_s=0.9)
    lines = render(Status(processors=[calm, busy], partitions_total=4))
    flagged = [line for line in lines if "OVERLOADED" in line]
    assert len(flagged) == 1 and "room 1200" in flagged[0] and "40 due normal/low jobs deferred" in flagged[0]


def test_the_ui_banner_names_an_overload_and_is_silent_otherwise() -> None:
    import asyncio

    import httpx

    from gnomon.metrics.status import Scrape, parse
    from gnomon.ui.overload import OverloadProbe, banner_text

    calm = ('gnomon_processor_info{instance_id="p0"} 1\n'
            'gnomon_overload_deferred_jobs 0\n')
    busy = ('gnomon_processor_info{instance_id="p1"} 1\n'
            'gnomon_overload_deferred_jobs 37\ngnomon_overload_signal_lag_seconds 1.5\n')
    assert banner_text([Scrape("a", parse(calm))]) is None
    text = banner_text([Scrape("a", parse(calm)), Scrape("b", parse(busy))])
    assert text is not None and "37 due normal/low jobs" in text and "overload" in text

    pages = {"http://p0/metrics": calm, "http://p1/metrics": busy}

    def answer(request: httpx.Request) -> httpx.Response:
        body = pages.get(str(request.url))
        return httpx.Response(200, text=body) if body is not None else httpx.Response(503)

    probe = OverloadProbe(["http://p0/metrics", "http://p1/metrics", "http://gone/metrics"],
                          transport=httpx.MockTransport(answer))
    asyncio.run(probe.refresh())
    assert probe.current() is not None and "37" in (probe.current() or "")


def test_deleting_a_job_behind_records_its_untriggered_slots() -> None:
    state = _state(next_ms=T0)  # deferred: 10 slots due and not triggered
    events = J.decide(state, J.DeleteJob("j", "t", T0 + 9_500))
    skipped, deleted = events
    assert isinstance(skipped, J.RunSkipped) and skipped.reason == "job deleted"
    assert (skipped.from_ms, skipped.slot_ms, skipped.count) == (T0, T0 + 9_000, 10)
    assert isinstance(deleted, J.JobDeleted)
    # a job on time has nothing behind it
    assert [type(e) for e in J.decide(_state(next_ms=T0 + 1_000), J.DeleteJob("j", "t", T0))] == [J.JobDeleted]


def test_pausing_a_job_behind_records_its_untriggered_slots_and_moves_past_them() -> None:
    """Found by the stricter history checker (issue 49): a job behind (overload) paused and
    never resumed left its due slots neither run nor recorded; a resume recorded them later
    as if they had fallen while paused."""
    state = _state(next_ms=T0)  # deferred: 10 slots due and not triggered
    skipped, paused = J.decide(state, J.PauseJob("j", "t", T0 + 9_500))
    assert isinstance(skipped, J.RunSkipped) and skipped.reason == "paused"
    assert (skipped.from_ms, skipped.slot_ms, skipped.count) == (T0, T0 + 9_000, 10)
    assert skipped.advances and skipped.advance_to_ms == T0 + 10_000
    assert isinstance(paused, J.JobPaused)
    after = J.evolve(J.evolve(state, skipped), paused)
    assert after is not None and (after.status, after.next_run_at_ms) == (J.JobStatus.PAUSED, T0 + 10_000)
    # the resume records the slots of the pause alone, from where the pause left the job
    gap, resumed = J.decide(after, J.ResumeJob("j", "t", T0 + 20_500))
    assert isinstance(gap, J.RunSkipped) and (gap.from_ms, gap.slot_ms) == (T0 + 10_000, T0 + 20_000)
    assert isinstance(resumed, J.JobResumed)
    # a job on time has nothing behind it
    assert [type(e) for e in J.decide(_state(next_ms=T0 + 1_000), J.PauseJob("j", "t", T0))] == [J.JobPaused]


class _Overloaded:
    """An OverloadProbe stand-in that says what it is told."""

    def __init__(self, text: str | None) -> None:
        self.text = text

    def current(self) -> str | None:
        return self.text


def test_the_api_relays_the_overloaded_processors_429_for_new_one_off_work() -> None:
    from fastapi.testclient import TestClient

    from gnomon.api.app import CommandSink, create_app
    from gnomon.core.clock import FakeClock
    from gnomon.history.memory import InMemoryHistoryStore
    from gnomon.testing import DecidingProducer
    from gnomon.web.auth import Authenticator

    clock = FakeClock(T0)
    producer, history = DecidingProducer(InMemoryHistoryStore(), clock=clock), InMemoryHistoryStore()
    for task in producer.tasks.values():
        task.overloaded = True
    topo = load_topology()
    app = create_app(history=history, commands=CommandSink(producer, topo.job_commands),
                     auth=Authenticator({"tok": "acme"}), topology=topo, clock=clock, answers=producer.answers)
    client, auth = TestClient(app), {"Authorization": "Bearer tok"}
    target = {"type": "command", "argv": ["true"]}
    once = client.post("/v1/jobs", json={"name": "n", "runAt": "2026-01-01T01:00:00Z", "target": target},
                       headers=auth)
    assert once.status_code == 429 and once.headers["Retry-After"] == "30", once.text
    assert once.json()["limit"] == "overload" and once.headers["content-type"].startswith("application/problem+json")
    cron = client.post("/v1/jobs", json={"name": "n", "schedule": "0 * * * *", "target": target}, headers=auth)
    assert cron.status_code == 201  # recurring work is still registered: its slots follow the order
    job_id = cron.json()["id"]
    trig = client.post(f"/v1/jobs/{job_id}:trigger", json={"idempotencyKey": "k1"}, headers=auth)
    assert trig.status_code == 429 and trig.json()["limit"] == "overload"
    from gnomon.adapters.kafka import partition_for

    owner = producer.tasks[partition_for(job_id, producer.partitions)]
    assert owner.job(job_id) is not None and owner.run(f"{job_id}@manual:k1") is None  # nothing triggered
    for task in producer.tasks.values():
        task.overloaded = False
    assert client.post(f"/v1/jobs/{job_id}:trigger", json={"idempotencyKey": "k1"}, headers=auth).status_code == 200


def test_the_processor_refuses_new_one_off_work_while_overloaded() -> None:
    from gnomon.core.errors import LimitExceeded

    task = _task()
    task.overloaded = True
    once = JobSpec(name="n", schedule=Schedule(run_at_ms=T0 + 60_000), target=SPEC.target)
    try:
        task.handle(J.RegisterJob("o", "t", once, T0), T0)
        raise AssertionError("a one-time job was accepted while overloaded")
    except LimitExceeded as exc:
        assert exc.limit == "overload" and exc.retry_after_s == 30
    task.handle(J.RegisterJob("c", "t", SPEC, T0), T0)  # recurring: applied
    assert task.job("c") is not None and task.job("o") is None
    try:
        task.handle(J.TriggerJob("c", "t", "k", T0), T0)
        raise AssertionError("a manual trigger was accepted while overloaded")
    except LimitExceeded as exc:
        assert exc.limit == "overload"
    task.overloaded = False
    task.handle(J.TriggerJob("c", "t", "k", T0), T0)
    assert task.run("c@manual:k") is not None


def test_the_probe_names_its_targets_as_gnomon_status_does(monkeypatch: pytest.MonkeyPatch) -> None:
    from gnomon.ui.overload import processor_targets

    monkeypatch.setenv("GNOMON_STATUS_TARGETS", "10.0.0.5:9470, http://p2:9471/metrics")
    assert processor_targets() == ["http://10.0.0.5:9470/metrics", "http://p2:9471/metrics"]
    monkeypatch.delenv("GNOMON_STATUS_TARGETS")
    assert processor_targets()[0] == "http://127.0.0.1:9470/metrics"


def test_runs_triggered_ahead_get_an_allowance_so_a_healthy_load_is_never_held_back() -> None:
    """300 per-second normal jobs with a 30 s lookahead keep ~9,000 runs in flight. The
    window alone (here 1,000, as if cut once at start-up) would defer most of them and
    make them late by itself; the allowance (start rate x lookahead) makes room for them,
    counted from starts even in a quiet period."""
    g = OverloadGovernor(period_ms=2_000, window_start_runs=1_000, lookahead_ms=30_000)
    now, in_flight, quiet_until = T0, 0, T0 + 10_000
    deferred_total = 0
    for tick in range(300):  # 60 s of 200 ms ticks
        b = g.budget(in_flight)
        wanted = 9_000 - in_flight  # what the due index has to trigger
        take = min(wanted, b.left or 0)
        in_flight += take
        b.spend(take)
        b.deferred = 1 if take < wanted else 0
        if tick >= 50:
            deferred_total += b.deferred
        for _ in range(60):  # 300 starts a second, on time (judged only after the quiet period)
            g.observe_start(1, 30, judged=now >= quiet_until)
        in_flight -= 60
        g.after_tick(b, in_flight, now, hold=now < quiet_until)
        now += 200
    assert g.pipeline_runs == 300 * 30
    assert g.room_runs >= 9_000 and deferred_total == 0
    assert not g.overloaded


def test_under_overload_normal_keeps_the_rate_it_achieves_while_the_window_is_at_its_floor() -> None:
    g = OverloadGovernor(period_ms=1_000, window_start_runs=1_000, lookahead_ms=30_000)
    now = T0
    for _ in range(40):  # high late: the window falls to its floor; normal still starts 40/s
        b = g.budget(5_000)
        b.deferred = 100
        g.observe_start(0, 3_000)
        for _ in range(20):
            g.observe_start(1, 20_000)
        g.after_tick(b, 5_000, now)
        now += 500
    assert g.window_runs == g.window_min_runs
    assert g.pipeline_runs == 40 * 30 and g.room_runs == g.window_min_runs + 1_200
    assert g.overloaded
