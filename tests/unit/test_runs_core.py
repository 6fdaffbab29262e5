"""The run state machine: insert-if-absent, grants and fencing, leases, retries."""

from __future__ import annotations

import dataclasses
import io

import fastavro
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gnomon import codec
from gnomon.core import runs as R
from gnomon.core.clock import iso_to_ms
from gnomon.core.errors import TransitionError
from gnomon.core.jobs import RunTriggered
from gnomon.core.model import JobSpec, RetryPolicy, Schedule, Target, TargetType
from gnomon.core.retry import BackoffStrategy

T0 = iso_to_ms("2026-11-29T08:00:00Z")
SPEC = JobSpec(name="j", schedule=Schedule(cron="* * * * *"), target=Target(TargetType.COMMAND, argv=("true",)),
               timeout_s=60, retry=RetryPolicy(max_attempts=2, backoff_base_s=1, backoff_cap_s=10))
RID = "job1@2026-11-29T08:00:00Z"


def trig(at: int = T0 - 10_000) -> RunTriggered:
    return RunTriggered(RID, "job1", "t", SPEC, T0, T0, False, at, advances=True, advance_to_ms=T0 + 60_000)


def step(state: R.RunState | None, cmd: R.RunCommand) -> tuple[R.RunState | None, list[R.RunEvent]]:
    evs = R.decide(state, cmd)
    for e in evs:
        state = R.evolve(state, e)
    return state, evs


def timer(state: R.RunState, now: int) -> tuple[R.RunState, list[R.RunEvent]]:
    evs = R.decide_timer(state, now)
    for e in evs:
        state = R.evolve(state, e)
    return state, evs


STAGE = T0 - R.RunConfig().stage_ahead_ms  # runs are released (and staged) this long before the slot


def ready() -> R.RunState:
    s, _ = step(None, trig(at=STAGE - 10_000))
    assert s is not None and s.status is R.RunStatus.SCHEDULED and s.timer_ms() == STAGE
    s, evs = timer(s, STAGE - 1)
    assert evs == []
    s, evs = timer(s, STAGE)
    assert [type(e) for e in evs] == [R.RunReleased] and s.status is R.RunStatus.READY
    return s


def test_replayed_trigger_makes_no_second_run() -> None:
    s, _ = step(None, trig())
    s2, evs = step(s, trig(at=T0))
    assert evs == [] and s2 == s


def test_one_grant_at_a_time_with_growing_tokens() -> None:
    s = ready()
    s, evs = step(s, R.ClaimRun(RID, "w1", T0 + 5))
    (g,) = evs
    assert isinstance(g, R.AttemptGranted) and g.token == 1 and s.status is R.RunStatus.RUNNING
    s, evs = step(s, R.ClaimRun(RID, "w2", T0 + 6))
    assert isinstance(evs[0], R.ClaimRejected) and s.token == 1 and s.worker_id == "w1"


def test_stale_token_is_rejected_and_told_to_stop() -> None:
    s = ready()
    s, _ = step(s, R.ClaimRun(RID, "w1", T0 + 5))
    lease = s.lease_until_ms
    assert lease is not None
    s, evs = timer(s, lease)  # w1 went silent: lease lapses, attempt 1 failed, retry
    assert s.status is R.RunStatus.RETRY_WAIT and s.next_attempt_at_ms is not None
    s, _ = timer(s, s.next_attempt_at_ms)
    s, _ = step(s, R.ClaimRun(RID, "w2", lease + 20_000))
    assert s.token == 2 and s.attempt == 2
    s2, evs = step(s, R.CompleteAttempt(RID, "w1", 1, R.Outcome.SUCCEEDED, lease + 21_000))
    assert isinstance(evs[0], R.StaleRejected) and s2 == s
    s, evs = step(s, R.CompleteAttempt(RID, "w2", 2, R.Outcome.SUCCEEDED, lease + 22_000, 0))
    assert s.status is R.RunStatus.SUCCEEDED and s.finished_at_ms == lease + 22_000


def test_exhausted_retries_fail_terminally() -> None:
    s = ready()
    for attempt in (1, 2):
        s, _ = step(s, R.ClaimRun(RID, "w", T0 + attempt * 100_000))
        s, _evs = step(s, R.CompleteAttempt(RID, "w", attempt, R.Outcome.FAILED, T0 + attempt * 100_000 + 1, 3, "exit 3"))
        if attempt == 1:
            assert s.status is R.RunStatus.RETRY_WAIT
            s, _ = timer(s, s.next_attempt_at_ms or 0)
    assert s.status is R.RunStatus.FAILED and s.exit_code == 3 and s.status.terminal


def test_cancel_stops_running_worker() -> None:
    s = ready()
    s, _ = step(s, R.ClaimRun(RID, "w1", T0 + 5))
    s, evs = step(s, R.CancelRun(RID, "t", T0 + 6))
    assert isinstance(evs[0], R.RunCancelled) and evs[0].worker_id == "w1" and s.status is R.RunStatus.CANCELLED
    assert step(s, R.CancelRun(RID, "t", T0 + 7))[1] == []


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=1, max_value=25), st.floats(min_value=0, max_value=100), st.floats(min_value=0, max_value=1000))
def test_backoff_is_bounded_and_deterministic(attempt: int, base: float, cap_extra: float) -> None:
    strat = BackoffStrategy(RetryPolicy(max_attempts=25, backoff_base_s=base, backoff_cap_s=base + cap_extra))
    d = strat.delay_ms("r", attempt)
    assert 0 <= d <= (base + cap_extra) * 1000
    assert d == strat.delay_ms("r", attempt)


COMMANDS = st.one_of(
    st.builds(lambda w, dt: ("claim", w, dt), st.sampled_from(["w1", "w2", "w3"]), st.integers(0, 5000)),
    st.builds(lambda w, tok, dt: ("hb", w, tok, dt), st.sampled_from(["w1", "w2", "w3"]), st.integers(0, 4), st.integers(0, 5000)),
    st.builds(lambda w, tok, ok, dt: ("done", w, tok, ok, dt), st.sampled_from(["w1", "w2", "w3"]), st.integers(0, 4),
              st.booleans(), st.integers(0, 5000)),
    st.builds(lambda dt: ("time", dt), st.integers(0, 60_000)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(COMMANDS, max_size=60))
def test_fencing_invariants_under_any_interleaving(script: list[tuple]) -> None:  # type: ignore[type-arg]
    """Whatever workers send in whatever order: tokens only grow by one per grant, only the
    current token's holder can change the run, and terminal states are final."""
    s = ready()
    now = T0
    for item in script:
        now += item[-1]
        before = s
        if item[0] == "claim":
            s, evs = step(s, R.ClaimRun(RID, item[1], now))
        elif item[0] == "hb":
            s, evs = step(s, R.Heartbeat(RID, item[1], item[2], now))
        elif item[0] == "done":
            out = R.Outcome.SUCCEEDED if item[3] else R.Outcome.FAILED
            s, evs = step(s, R.CompleteAttempt(RID, item[1], item[2], out, now))
        else:
            s, evs = timer(s, now)
        assert s is not None
        assert s.token in (before.token, before.token + 1)
        if before.status.terminal:
            assert s == before
        if item[0] in ("hb", "done") and (item[2] != before.token or item[1] != before.worker_id):
            # a heartbeat/completion from anyone but the current grant's holder changes nothing
            assert s == before
            assert all(isinstance(e, R.StaleRejected) for e in evs)
        assert s.attempt == s.token <= SPEC.retry.max_attempts


def test_replay_gives_a_dead_letter_a_fresh_retry_budget() -> None:
    s = ready()
    assert R.decide(s, R.ReplayRun(RID, "t", T0)) == []  # only failed runs replay; others: no-op
    now = T0
    for attempt in (1, 2):
        now += 100_000
        s, _ = step(s, R.ClaimRun(RID, "w", now))
        s, _ = step(s, R.CompleteAttempt(RID, "w", attempt, R.Outcome.FAILED, now + 1, 1))
        if attempt == 1:
            s, _ = timer(s, s.next_attempt_at_ms or 0)
    assert s.status is R.RunStatus.FAILED
    s, evs = step(s, R.ReplayRun(RID, "t", now + 10))
    assert s.status is R.RunStatus.READY and s.replays == 1 and s.attempts_before_replay == 2
    assert R.decide(s, R.ReplayRun(RID, "t", now + 11)) == [], "a double replay is a no-op"
    assert any(isinstance(e, R.RunReleased) and e.attempt == 3 for e in evs)
    s, _ = step(s, R.ClaimRun(RID, "w", now + 20))
    s, _ = step(s, R.CompleteAttempt(RID, "w", 3, R.Outcome.FAILED, now + 21, 1))
    assert s.status is R.RunStatus.RETRY_WAIT, "the replay brought a full budget of attempts"


def test_lease_is_not_expired_while_the_partition_is_read_behind() -> None:
    s = ready()
    s, _ = step(s, R.ClaimRun(RID, "w1", T0))
    lease = s.lease_until_ms
    assert lease is not None
    # wall clock is past the lease, but the processor has only read input up to lease - 1:
    # the heartbeat may be in the unread backlog, so nothing happens yet
    assert R.decide_timer(s, lease + 60_000, read_up_to_ms=lease - 1) == []
    (ev,) = R.decide_timer(s, lease + 60_000, read_up_to_ms=lease)
    assert isinstance(ev, R.AttemptEnded) and ev.outcome is None


def test_deadline_fails_an_attempt_that_keeps_heartbeating_past_its_timeout() -> None:
    s = ready()
    s, _ = step(s, R.ClaimRun(RID, "w1", T0))
    deadline = s.deadline_ms
    assert deadline == T0 + SPEC.timeout_s * 1000 + R.RunConfig().timeout_grace_ms
    now = T0
    while now + 5_000 < deadline:  # a worker that heartbeats but never finishes
        now += 5_000
        s, _ = step(s, R.Heartbeat(RID, "w1", 1, now))
    assert R.decide_timer(s, deadline - 1) == []
    s, evs = timer(s, deadline)
    (ev,) = evs
    assert isinstance(ev, R.AttemptEnded) and ev.outcome is R.Outcome.TIMED_OUT
    assert s.status is R.RunStatus.RETRY_WAIT and "deadline" in (s.reason or "")


# ---- cancel / replay carry the tenant; the processor checks it ---------------------------


def dead_letter() -> R.RunState:
    s = ready()
    for attempt in (1, 2):
        s, _ = step(s, R.ClaimRun(RID, "w", T0 + attempt * 100_000))
        s, _ = step(s, R.CompleteAttempt(RID, "w", attempt, R.Outcome.FAILED, T0 + attempt * 100_000 + 1, 1))
        if attempt == 1:
            s, _ = timer(s, s.next_attempt_at_ms or 0)
    assert s is not None and s.status is R.RunStatus.FAILED
    return s


def test_cancel_and_replay_of_another_tenants_run_are_refused() -> None:
    running, _ = step(ready(), R.ClaimRun(RID, "w1", T0 + 5))
    assert running is not None
    with pytest.raises(TransitionError, match=r"^no run "):  # (as an unknown run)
        R.decide(running, R.CancelRun(RID, "intruder", T0 + 6))
    with pytest.raises(TransitionError, match=r"^no run "):
        R.decide(dead_letter(), R.ReplayRun(RID, "intruder", T0 + 300_000))


def test_cancel_and_replay_without_a_tenant_are_refused() -> None:
    """Records written before run commands carried a tenant decode with tenant "": they
    act on no run."""
    running, _ = step(ready(), R.ClaimRun(RID, "w1", T0 + 5))
    assert running is not None
    with pytest.raises(TransitionError, match="carries no tenant"):
        R.decide(running, R.CancelRun(RID, "", T0 + 6))
    with pytest.raises(TransitionError, match="carries no tenant"):
        R.decide(dead_letter(), R.ReplayRun(RID, "", T0 + 300_000))


def test_old_cancel_records_decode_without_a_tenant_and_are_refused() -> None:
    v4 = codec.default_codec.registry.lookup("gnomon.run-events-value", 4)
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, v4.schema, {"body": ("gnomon.CancelRun", {"run_id": RID, "at_ms": T0 + 6,
                                                                               "reason": "old"})})
    old = codec.decode(b"\x00" + v4.id.to_bytes(4, "big") + buf.getvalue())
    assert old == R.CancelRun(RID, "", T0 + 6, "old")
    running, _ = step(ready(), R.ClaimRun(RID, "w1", T0 + 5))
    with pytest.raises(TransitionError, match="carries no tenant"):
        R.decide(running, old)


def test_reports_about_an_unknown_run_are_told_to_stop() -> None:
    """Fuzz finding (issue 21): a start report for a run the processor does not hold (a
    misrouted or forged record, or one whose run is gone) got no answer at all, while a
    heartbeat or a completion is told to stop; whatever its sender started, nobody here
    granted it."""
    for msg in (R.AttemptStarted(RID, "w9", 3, T0, T0), R.Heartbeat(RID, "w9", 3, T0),
                R.CompleteAttempt(RID, "w9", 3, R.Outcome.SUCCEEDED, T0)):
        (ev,) = R.decide(None, msg)
        assert isinstance(ev, R.StaleRejected) and (ev.worker_id, ev.token, ev.reason) == ("w9", 3, "unknown run")
    (ev,) = R.decide(None, R.ClaimRun(RID, "w9", T0))
    assert isinstance(ev, R.ClaimRejected)
    assert R.decide(None, R.ReturnGrant(RID, "w9", 3, "full", T0)) == []  # handing back: nothing to tell


@pytest.mark.parametrize("slot_ms", [253_402_300_800_000, 5_541_673_556_839_896, -62_135_596_800_001, -(2**63)])
def test_a_slot_no_calendar_holds_is_withdrawn_not_a_crash(slot_ms: int) -> None:
    """Fuzz finding (issue 21): a trigger for a slot past year 9999 (forged on run-events;
    ahead of the job's schedule position, so the processor let it create its run) made the
    release check raise ValueError from datetime. Such a slot is no slot of the schedule."""
    from gnomon.core.jobs import JobState, JobStatus

    every_minute = JobSpec(name="x", schedule=Schedule(cron="* * * * *"), target=Target(TargetType.HANDLER, "h"))
    job = JobState("j", "t", every_minute, JobStatus.ACTIVE, T0, 1, T0, T0)
    forged = JobSpec(name="x", schedule=Schedule(cron="0 * * * *"), target=every_minute.target)
    run = R.RunState(f"j@{slot_ms}", "j", "t", forged, slot_ms, T0, False, R.RunStatus.SCHEDULED, T0, T0)
    (ev,) = R.decide_timer(run, T0, R.RunConfig(), job)
    assert isinstance(ev, R.RunWithdrawn) and ev.reason == "schedule changed before the slot"


def test_cancel_and_replay_of_an_unknown_run_change_nothing_whatever_the_tenant() -> None:
    for tenant in ("t", "intruder", ""):
        assert R.decide(None, R.CancelRun(RID, tenant, T0)) == []
        assert R.decide(None, R.ReplayRun(RID, tenant, T0)) == []


STATES = st.sampled_from(["scheduled", "ready", "running", "dead"])


@settings(max_examples=100, deadline=None)
@given(STATES, st.sampled_from(["cancel", "replay"]), st.just("t") | st.text(max_size=8), st.integers(0, 10**6))
def test_only_the_runs_own_tenant_can_cancel_or_replay(which: str, kind: str, tenant: str, dt: int) -> None:
    """Any tenant but the run's own (the empty one included) is refused, and the run is
    untouched; the run's own tenant gets the normal behaviour."""
    s: R.RunState | None
    if which == "scheduled":
        s, _ = step(None, trig(at=STAGE - 10_000))
    elif which == "ready":
        s = ready()
    elif which == "running":
        s, _ = step(ready(), R.ClaimRun(RID, "w1", T0 + 5))
    else:
        s = dead_letter()
    assert s is not None
    now = T0 + 400_000 + dt
    cmd: R.RunCommand = R.CancelRun(RID, tenant, now) if kind == "cancel" else R.ReplayRun(RID, tenant, now)
    before = dataclasses.replace(s)
    if tenant != s.tenant:
        with pytest.raises(TransitionError):
            R.decide(s, cmd)
        assert s == before
        return
    own, _ = step(s, cmd)
    assert own is not None
    if kind == "cancel":
        assert own.status is (R.RunStatus.CANCELLED if not before.status.terminal else before.status)
    else:
        assert own.status is (R.RunStatus.READY if before.status is R.RunStatus.FAILED else before.status)
