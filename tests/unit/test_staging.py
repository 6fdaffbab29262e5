"""Pre-staging: runs are granted to a worker before their slot and started there at the
slot; every change to a staged run still reaches it (pause, delete, edit, cancel,
worker lost); the processor stages only on live workers with a free slot."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from gnomon.core import jobs as J
from gnomon.core import runs as R
from gnomon.core.clock import iso_to_ms
from gnomon.core.messages import Grant, Stop, StopReason
from gnomon.core.model import JobSpec, RetryPolicy, Schedule, Target, TargetType
from gnomon.core.workers import WorkerAdvert, WorkerDirectory
from gnomon.testing import InMemoryCluster

CMD = Target(TargetType.COMMAND, argv=("true",))


def spec(cron: str = "*/10 * * * * *", argv: tuple[str, ...] = ("true",)) -> JobSpec:
    return JobSpec(name="j", schedule=Schedule(cron=cron), target=Target(TargetType.COMMAND, argv=argv),
                   retry=RetryPolicy(max_attempts=3, backoff_base_s=1, backoff_cap_s=5))


def grants(c: InMemoryCluster, run_id: str) -> list[Grant]:
    return [rec for _, rec in c.log if isinstance(rec, Grant) and rec.run_id == run_id]


def stops(c: InMemoryCluster, run_id: str) -> list[Stop]:
    return [rec for _, rec in c.log if isinstance(rec, Stop) and rec.run_id == run_id]


def started(c: InMemoryCluster, run_id: str) -> list[tuple[str, int, str]]:
    return [s for s in c.started if s[0] == run_id]


def checked(c: InMemoryCluster, job_ids: list[str]) -> None:
    rep = c.history_report(job_ids)
    assert rep.ok, (rep.summary(), rep.problems[:5])


def setup(seed: int = 1, **kw: object) -> tuple[InMemoryCluster, int]:
    c = InMemoryCluster(seed=seed, **kw)  # type: ignore[arg-type]
    c.run_for(1_000)  # workers advertise
    return c, c.clock.now_ms()


def test_runs_are_granted_ahead_and_start_at_their_slot() -> None:
    c, t0 = setup()
    c.submit(J.RegisterJob("job1", "t", spec(), t0))
    c.run_for(70_000)
    runs = [r for r in c.runs_of("job1") if r.slot_ms <= t0 + 60_000]
    assert len(runs) >= 6
    for r in runs:
        assert r.status is R.RunStatus.SUCCEEDED, r
        (g,) = grants(c, r.run_id)
        assert g.not_before_ms == r.slot_ms and g.at_ms < r.slot_ms  # granted before the slot
        assert g.lease_until_ms == r.slot_ms + c.run_cfg.lease_ms  # the lease counts from the slot
        ((_, start, _),) = started(c, r.run_id)
        assert start == r.slot_ms  # the fake worker's timer fires at the slot, never before
        assert r.started_at_ms == r.slot_ms and r.granted_at_ms == g.at_ms
    checked(c, ["job1"])


def test_pause_reaches_a_staged_run_it_never_starts() -> None:
    c, t0 = setup()
    c.submit(J.RegisterJob("job1", "t", spec("0 * * * * *"), t0))  # every minute
    c.run_for(35_000)  # the 00:01:00 slot is in the lookahead
    (run,) = [r for r in c.runs_of("job1") if r.status is R.RunStatus.RUNNING]
    rid = run.run_id
    assert run.staged and run.worker_id is not None and run.slot_ms > c.clock.now_ms()
    c.submit(J.PauseJob("job1", "t", c.clock.now_ms()))
    c.run_for(40_000)
    run = c.run_state(rid)
    assert run is not None and run.status is R.RunStatus.SKIPPED and run.reason == "paused" and run.attempt == 0
    (stop,) = stops(c, rid)
    assert stop.kind is StopReason.REVOKED and stop.worker_id == grants(c, rid)[0].worker_id
    assert started(c, rid) == []


def test_cancel_of_a_staged_run_and_delete_of_its_job() -> None:
    c, t0 = setup()
    c.submit(J.RegisterJob("a", "t", replace(spec(), schedule=Schedule(run_at_ms=t0 + 20_000)), t0))
    c.submit(J.RegisterJob("b", "t", replace(spec(), schedule=Schedule(run_at_ms=t0 + 20_000)), t0))
    c.run_for(1_000)
    ra, rb = f"a@{_iso(t0 + 20_000)}", f"b@{_iso(t0 + 20_000)}"
    assert c.run_state(ra).staged and c.run_state(rb).staged  # type: ignore[union-attr]
    c.submit(R.CancelRun(ra, "t", c.clock.now_ms()))
    c.submit(J.DeleteJob("b", "t", c.clock.now_ms()))
    c.run_for(30_000)
    a, b = c.run_state(ra), c.run_state(rb)
    assert a is not None and a.status is R.RunStatus.CANCELLED and a.attempt == 0
    assert b is not None and b.status is R.RunStatus.SKIPPED and b.reason == "job deleted before the slot"
    assert [s.kind for s in stops(c, ra)] == [StopReason.CANCELLED]
    assert [s.kind for s in stops(c, rb)] == [StopReason.REVOKED]
    assert started(c, ra) == started(c, rb) == []


def test_an_edit_that_keeps_the_slot_regrants_with_the_new_definition() -> None:
    c, t0 = setup()
    c.submit(J.RegisterJob("job1", "t", spec("0 * * * * *"), t0))  # every minute
    c.run_for(35_000)  # the 00:01:00 slot is in the lookahead
    staged = [r for r in c.runs_of("job1") if r.status is R.RunStatus.RUNNING]
    assert len(staged) == 1 and staged[0].staged
    rid = staged[0].run_id
    new = spec("0 * * * * *", argv=("echo", "v2"))
    c.submit(J.UpdateJob("job1", "t", new, c.clock.now_ms()))
    c.run_for(60_000)
    g1, g2 = grants(c, rid)
    assert g2.token == g1.token + 1 and g2.spec == new and g1.spec != new
    assert [s.kind for s in stops(c, rid)] == [StopReason.REVOKED]
    assert len(started(c, rid)) == 1 and started(c, rid)[0][2] == g2.worker_id
    final = c.run_state(rid)
    assert final is not None and final.status is R.RunStatus.SUCCEEDED and final.attempt == 1 and final.spec == new
    checked(c, ["job1"])


def test_an_edit_that_removes_the_slot_withdraws_the_staged_run() -> None:
    c, t0 = setup()
    c.submit(J.RegisterJob("job1", "t", spec("0 * * * * *"), t0))
    c.run_for(35_000)
    (rid,) = [r.run_id for r in c.runs_of("job1") if r.staged]
    c.submit(J.UpdateJob("job1", "t", spec("30 0 0 1 1 *"), c.clock.now_ms()))
    c.run_for(60_000)
    run = c.run_state(rid)
    assert run is not None and run.status is R.RunStatus.SKIPPED and run.reason == "schedule changed before the slot"
    assert started(c, rid) == []


def test_a_worker_lost_before_the_slot_hands_its_runs_to_another_on_time() -> None:
    c, t0 = setup(workers=2)
    slot = t0 + 25_000
    for i in range(20):
        c.submit(J.RegisterJob(f"j{i}", "t", replace(spec(), schedule=Schedule(run_at_ms=slot)), t0))
    c.run_for(1_000)
    held = {c.run_state(f"j{i}@{_iso(slot)}").worker_id for i in range(20)}  # type: ignore[union-attr]
    assert held == {"w0", "w1"}  # spread over both
    c.kill_worker("w0")
    c.run_for(40_000)
    for i in range(20):
        rid = f"j{i}@{_iso(slot)}"
        run = c.run_state(rid)
        assert run is not None and run.status is R.RunStatus.SUCCEEDED
        ((_, start, worker),) = started(c, rid)
        assert start == slot and worker == "w1"  # moved before the slot, started on time
    checked(c, [f"j{i}" for i in range(20)])


def test_runs_wait_ready_while_no_worker_has_room_then_stage() -> None:
    c, t0 = setup(workers=1, worker_slots=2)
    slot = t0 + 5_000
    for i in range(5):
        c.submit(J.RegisterJob(f"j{i}", "t", replace(spec(), schedule=Schedule(run_at_ms=slot)), t0))
    c.run_for(1_000)
    states = [c.run_state(f"j{i}@{_iso(slot)}") for i in range(5)]
    assert sum(1 for s in states if s is not None and s.staged) == 2  # only the free slots
    ledger_before = sum(1 for _, rec in c.log if isinstance(rec, tuple))
    c.run_for(3_000)  # still before the slot, no room: retries write no ledger records
    assert sum(1 for _, rec in c.log if isinstance(rec, tuple)) == ledger_before
    c.run_for(30_000)
    assert all(c.run_state(f"j{i}@{_iso(slot)}").status is R.RunStatus.SUCCEEDED for i in range(5))  # type: ignore[union-attr]
    checked(c, [f"j{i}" for i in range(5)])


def test_a_returned_grant_is_staged_again() -> None:
    c, t0 = setup(workers=2)
    slot = t0 + 10_000
    c.submit(J.RegisterJob("j", "t", replace(spec(), schedule=Schedule(run_at_ms=slot)), t0))
    c.run_for(500)
    rid = f"j@{_iso(slot)}"
    run = c.run_state(rid)
    assert run is not None and run.worker_id is not None
    first = run.worker_id
    c.attempts.pop((first, rid))  # the worker returns it instead of starting it
    c.submit(R.ReturnGrant(rid, first, run.token, "no free slot at the slot", c.clock.now_ms()))
    c.drain()
    again = c.run_state(rid)
    assert again is not None and again.staged and again.token == run.token + 1 and again.attempt == 1
    c.run_for(20_000)
    assert c.run_state(rid).status is R.RunStatus.SUCCEEDED  # type: ignore[union-attr]


def test_directory_counts_slots_per_start_second_and_judges_liveness_by_receipt_time() -> None:
    d = WorkerDirectory()
    d.observe(WorkerAdvert("a", "p", 2, 0, 0, 1000, at_ms=0), now_ms=10_000)
    d.observe(WorkerAdvert("b", "p", 1, 1, 0, 1000, at_ms=99_999_999), now_ms=10_000)  # clock skew: ignored
    d.observe(WorkerAdvert("c", "q", 5, 0, 0, 1000, at_ms=0), now_ms=10_000)
    # runs due at 11 s: a has 2 slots then, b runs one attempt in its one slot
    assert [d.pick("p", 10_001, 11_000) for _ in range(3)] == ["a", "a", None]
    assert d.pick("p", 10_001, 12_000) == "a"  # the next second has its own slots
    d.release("b", staged_start_ms=None)  # b's running attempt ended
    assert d.pick("p", 10_002, 11_000) == "b"
    d.release("a", staged_start_ms=11_000)  # one of a's staged runs was taken back
    assert d.pick("p", 10_003, 11_500) == "a" and d.pick("p", 10_003, 11_500) is None
    # far ahead only long-running attempts hold slots: b's short one will have ended
    assert d.pick("p", 10_003, 30_000) in ("a", "b")
    assert d.pick("nobody", 10_002) is None
    assert d.lost(10_000 + 1_999) == []
    assert d.lost(10_000 + 2_001) == ["a", "b", "c"]  # silent for 2 intervals (issue 51: was 4)
    d.observe(WorkerAdvert("a", "p", 2, 0, 0, 1000, at_ms=0, leaving=True), now_ms=20_000)
    assert d.pick("p", 20_000) is None and d.lost(20_000) == ["a"]


def test_a_gap_in_the_processors_own_reading_is_not_the_workers_silence() -> None:
    d = WorkerDirectory()  # advert every 1 s: lost after 2 s of silence
    d.listening(10_000)
    d.observe(WorkerAdvert("a", "p", 2, 0, 0, 1000, at_ms=0), now_ms=10_000)
    d.listening(11_000)
    # the processor is stopped 12 s (SIGSTOP, a long restore): it reads nothing, and
    # wakes up with no advert yet: a is not lost, its runs are not moved
    d.listening(23_000)
    assert d.lost(23_000) == [] and d.pick("p", 23_000) == "a"
    # silence while it listens counts: 4.5 s of it (1 s before the gap, 3.5 s after)
    for t in range(23_500, 26_501, 500):
        d.listening(t)
    assert d.lost(26_500) == ["a"]
    # a fresh advert after a deaf gap is judged from its own receipt
    d.observe(WorkerAdvert("b", "p", 2, 0, 0, 1000, at_ms=0), now_ms=26_000)
    d.listening(40_000)
    assert d.alive("b", 40_000)
    d.listening(40_500)
    assert not d.alive("b", 44_600)


def test_a_worker_busy_with_long_runs_takes_nothing() -> None:
    d = WorkerDirectory()
    d.observe(WorkerAdvert("busy", "p", 8, 8, 0, 1000, at_ms=0, long_running=8), now_ms=0)
    d.observe(WorkerAdvert("idle", "p", 8, 0, 0, 1000, at_ms=0), now_ms=0)
    assert {d.pick("p", 0, 20_000) for _ in range(8)} == {"idle"}


def test_directory_caps_what_a_worker_holds_staged() -> None:
    d = WorkerDirectory()
    d.observe(WorkerAdvert("a", "p", 100, 0, 3, 1000, at_ms=0, stage_max=5), now_ms=0)
    assert [d.pick("p", 0, 1000 * i) for i in range(1, 4)] == ["a", "a", None]  # 3 + 2 = stage_max


def test_worker_lost_moves_runs_not_reported_started_and_refuses_their_late_start() -> None:
    base = R.RunState("j@s", "j", "t", spec(), 100_000, 100_000, False, R.RunStatus.RUNNING, 0, 0, attempt=1,
                      token=1, worker_id="w", lease_until_ms=130_000, deadline_ms=200_000)
    for now in (50_000, 101_000):  # its slot ahead, or passed (issue 51): not reported started, it never ran
        (ev,) = R.decide(base, R.WorkerLost("j@s", "w", now))
        assert isinstance(ev, R.GrantRevoked)
        moved = R.evolve(base, ev)
        assert moved.status is R.RunStatus.READY and moved.attempt == 0  # no attempt used
    # the dead worker's start report, read after the move (or after the next grant): refused
    (late,) = R.decide(moved, R.AttemptStarted("j@s", "w", 1, 100_500, 101_100))
    assert isinstance(late, R.StaleRejected)
    regranted = replace(moved, status=R.RunStatus.RUNNING, attempt=1, token=2, worker_id="w2")
    (late,) = R.decide(regranted, R.AttemptStarted("j@s", "w", 1, 100_500, 101_100))
    assert isinstance(late, R.StaleRejected) and late.token == 1
    started_run = replace(base, attempt_started_at_ms=100_000)
    assert R.decide(started_run, R.WorkerLost("j@s", "w", 101_000)) == []  # started: its lease decides
    assert R.decide(base, R.WorkerLost("j@s", "other", 50_000)) == []


STAGED_COMMANDS = st.one_of(
    st.builds(lambda w, dt: ("claim", w, dt), st.sampled_from(["w1", "w2"]), st.integers(0, 3000)),
    st.builds(lambda w, tok, dt: ("start", w, tok, dt), st.sampled_from(["w1", "w2"]), st.integers(0, 4),
              st.integers(0, 3000)),
    st.builds(lambda w, tok, dt: ("return", w, tok, dt), st.sampled_from(["w1", "w2"]), st.integers(0, 4),
              st.integers(0, 3000)),
    st.builds(lambda w, dt: ("lost", w, dt), st.sampled_from(["w1", "w2"]), st.integers(0, 3000)),
    st.builds(lambda how, dt: ("job", how, dt), st.sampled_from(["edit", "pause", "delete", "same"]),
              st.integers(0, 3000)),
    st.builds(lambda w, tok, ok, dt: ("done", w, tok, ok, dt), st.sampled_from(["w1", "w2"]), st.integers(0, 4),
              st.booleans(), st.integers(0, 3000)),
    st.builds(lambda dt: ("cancel", dt), st.integers(0, 3000)),
    st.builds(lambda dt: ("time", dt), st.integers(0, 40_000)),
)

SLOT = iso_to_ms("2026-11-29T08:01:00Z")
SSPEC = spec("0 * * * * *")


@settings(max_examples=300, deadline=None)
@given(st.lists(STAGED_COMMANDS, max_size=40))
def test_staged_run_invariants_under_any_interleaving(script: list[tuple]) -> None:  # type: ignore[type-arg]
    """Whatever happens to a staged run: a started attempt is never revoked or withdrawn,
    tokens only grow (by one per grant), attempts never go negative, and a start is only
    recorded from the current grant's holder."""
    rid = f"j@{_iso(SLOT)}"
    s: R.RunState | None = None
    s = _apply(s, R.decide(s, J.RunTriggered(rid, "j", "t", SSPEC, SLOT, SLOT, False, SLOT - 40_000)))
    now = SLOT - 30_000
    assert s is not None
    s = _apply(s, R.decide_timer(s, now, job=J.JobState("j", "t", SSPEC, J.JobStatus.ACTIVE, SLOT, 1, 0, 0)))
    assert s.status is R.RunStatus.READY
    job = J.JobState("j", "t", SSPEC, J.JobStatus.ACTIVE, SLOT + 60_000, 1, 0, 0)
    for item in script:
        now += item[-1]
        before = s
        kind = item[0]
        cmd: R.RunCommand | None = None
        if kind == "claim":
            cmd = R.ClaimRun(rid, item[1], now)
        elif kind == "start":
            cmd = R.AttemptStarted(rid, item[1], item[2], now, now)
        elif kind == "return":
            cmd = R.ReturnGrant(rid, item[1], item[2], "full", now)
        elif kind == "lost":
            cmd = R.WorkerLost(rid, item[1], now)
        elif kind == "job":
            changed = {"edit": replace(job, spec=spec("0 * * * * *", argv=("echo",))),
                       "pause": replace(job, status=J.JobStatus.PAUSED), "delete": None, "same": job}[item[1]]
            cmd = R.JobChanged(rid, changed, now)
        elif kind == "done":
            cmd = R.CompleteAttempt(rid, item[1], item[2], R.Outcome.SUCCEEDED if item[3] else R.Outcome.FAILED, now)
        elif kind == "cancel":
            cmd = R.CancelRun(rid, "t", now)
        evs = R.decide(s, cmd) if cmd is not None else R.decide_timer(s, now)
        s = _apply(s, evs)
        assert s.token in (before.token, before.token + 1)
        assert 0 <= s.attempt <= s.token
        if before.status.terminal and not (before.status is R.RunStatus.FAILED and s.replays > before.replays):
            assert s == before
        if before.status is R.RunStatus.RUNNING and not before.staged:
            assert s.status not in (R.RunStatus.READY, R.RunStatus.SKIPPED)  # a started attempt only ends
        if s.attempt_started_at_ms is not None and before.attempt_started_at_ms is None and s.token == before.token:
            assert kind == "start" and item[1] == before.worker_id and item[2] == before.token
        if s.status is R.RunStatus.RUNNING:
            assert s.worker_id is not None and s.lease_until_ms is not None and s.lease_until_ms >= SLOT


def _apply(s: R.RunState | None, evs: list[R.RunEvent]) -> R.RunState:
    for e in evs:
        s = R.evolve(s, e)
    assert s is not None
    return s


def _iso(ms: int) -> str:
    from gnomon.core.model import slot_run_id

    return slot_run_id("x", ms).split("@", 1)[1]


def test_a_small_worker_holds_many_runs_due_at_different_seconds() -> None:
    """Slots count per start second: 4 slots hold 4 runs for each second of the
    lookahead, not 4 in all (a staged run occupies no slot before its second)."""
    c, t0 = setup(workers=1, worker_slots=4)
    for i in range(4):
        c.submit(J.RegisterJob(f"j{i}", "t", spec("* * * * * *"), t0))
    c.run_for(2_000)
    runs = [r for i in range(4) for r in c.runs_of(f"j{i}")]
    ahead = [r for r in runs if r.slot_ms > c.clock.now_ms() + 5_000]
    assert len(ahead) >= 4 * 20 and all(r.staged for r in ahead)  # ~25 s of every-second runs, all staged
    c.run_for(30_000)
    checked(c, [f"j{i}" for i in range(4)])
    late = [s for s in c.started if s[1] != _slot_of(s[0]) and _slot_of(s[0]) > t0 + 2_000]
    assert late == []  # every start at its slot (but the ones due as the jobs were registered)


def _slot_of(run_id: str) -> int:
    from gnomon.core.clock import iso_to_ms

    return iso_to_ms(run_id.split("@", 1)[1])


def test_a_completion_that_carries_the_start_records_both() -> None:
    s = R.RunState("j@s", "j", "t", spec(), 100_000, 100_000, False, R.RunStatus.RUNNING, 0, 0, attempt=1,
                   token=1, worker_id="w", lease_until_ms=130_000, deadline_ms=200_000)
    evs = R.decide(s, R.CompleteAttempt("j@s", "w", 1, R.Outcome.SUCCEEDED, 100_050, started_at_ms=100_001))
    assert [type(e) for e in evs] == [R.AttemptStartReported, R.AttemptEnded]
    for e in evs:
        s = R.evolve(s, e)
    assert s.status is R.RunStatus.SUCCEEDED and s.started_at_ms == 100_001


def test_an_edit_after_the_slot_leaves_a_staged_run_alone() -> None:
    """The worker may have started it already (its report still in flight): never revoke it."""
    s = R.RunState("j@s", "j", "t", spec("0 * * * * *"), 120_000, 120_000, False, R.RunStatus.RUNNING, 0, 0,
                   attempt=1, token=1, worker_id="w", lease_until_ms=150_000, deadline_ms=200_000)
    edited = J.JobState("j", "t", spec("0 * * * * *", argv=("echo",)), J.JobStatus.ACTIVE, 180_000, 2, 0, 0)
    paused = replace(edited, spec=s.spec, status=J.JobStatus.PAUSED)
    assert R.decide(s, R.JobChanged("j@s", edited, 120_001)) == []
    assert R.decide(s, R.JobChanged("j@s", paused, 120_001)) == []
    assert R.decide(s, R.JobChanged("j@s", None, 120_001)) == []
    assert [type(e) for e in R.decide(s, R.JobChanged("j@s", edited, 119_999))] == [R.GrantRevoked]


def test_a_skipped_range_at_the_dst_fall_back_is_not_inverted() -> None:
    ny = JobSpec(name="n", schedule=Schedule(cron="30 1 * * *", tz="America/New_York"), target=CMD)
    first = iso_to_ms("2026-11-01T05:30:00Z")  # 01:30 EDT, the first of the two 01:30s
    state = J.JobState("n", "t", ny, J.JobStatus.ACTIVE, first, 1, 0, 0)
    for until in (iso_to_ms("2026-11-01T06:00:00Z"), iso_to_ms("2026-11-01T06:29:59Z")):
        (rng,) = J._skip_range(state, first, until, "paused", until, J.SchedulerConfig())
        assert isinstance(rng, J.RunSkipped)
        assert rng.slot_ms >= (rng.from_ms or rng.slot_ms) and rng.slot_ms == first and rng.count == 1


def test_a_run_is_staged_only_on_a_worker_that_serves_its_tenant() -> None:
    """Workers advertise their tenants; a worker of another tenant is never picked (it
    would refuse the run and burn an attempt). Older adverts (no tenants) serve any."""
    d = WorkerDirectory()
    d.observe(WorkerAdvert("acme-w", "p", 5, 0, 0, 1000, at_ms=0, tenants=("acme",)), now_ms=10_000)
    d.observe(WorkerAdvert("shared-w", "p", 5, 0, 0, 1000, at_ms=0, tenants=("globex", "initech")), now_ms=10_000)
    for _ in range(4):
        assert d.pick("p", 10_000, tenant="acme") == "acme-w"
        assert d.pick("p", 10_000, tenant="globex") == "shared-w"
    assert d.pick("p", 10_000, tenant="umbrella") is None
    d.observe(WorkerAdvert("old-w", "p", 5, 0, 0, 1000, at_ms=0), now_ms=10_000)
    assert d.pick("p", 10_000, tenant="umbrella") == "old-w"
