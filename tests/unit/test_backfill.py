"""Backfill (issue 9, part 7): the pure decisions (BackfillJob -> backfill triggers, a
backfill trigger reopens a skipped run and leaves any other alone, a reopened range keeps
the rest of its range skipped), the API route and its history check, the SDK/CLI, and
the whole loop on the in-memory cluster (every slot of the range exactly one run)."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st

from gnomon.api.app import CommandSink, create_app
from gnomon.api.backfill import add_backfill_route, plan_backfill
from gnomon.core import jobs as J
from gnomon.core import runs as R
from gnomon.core.clock import iso_to_ms, ms_to_iso
from gnomon.core.errors import TransitionError, ValidationError
from gnomon.core.model import (
    JobSpec,
    OverlapPolicy,
    RetryPolicy,
    Schedule,
    Target,
    TargetType,
    slot_run_id,
)
from gnomon.core.runs import RunStatus
from gnomon.history.memory import InMemoryHistoryStore
from gnomon.testing import FakeWorkerPolicy, InMemoryCluster, ListProducer
from gnomon.topology import load_topology
from gnomon.web.auth import Authenticator

MIN = 60_000
T0 = iso_to_ms("2026-11-30T00:00:00Z")
CMD = Target(TargetType.COMMAND, argv=("true",))


def spec(cron: str = "* * * * *", **kw: Any) -> JobSpec:
    return JobSpec(name="b", schedule=Schedule(cron=cron), target=CMD, **kw)


def job(status: J.JobStatus = J.JobStatus.ACTIVE, next_run: int | None = T0 + 10 * MIN, **kw: Any) -> J.JobState:
    return J.JobState("job", "t", spec(**kw), status, next_run, 1, T0 - MIN, T0 - MIN)


def run(slot: int, status: RunStatus, **kw: Any) -> R.RunState:
    return R.RunState(slot_run_id("job", slot), "job", "t", spec(), slot, slot, False, status, T0, T0, **kw)


# ---- jobs.decide: BackfillJob ----------------------------------------------------------


def test_backfill_job_triggers_each_slot_marked_backfill() -> None:
    events = J.decide(job(), J.BackfillJob("job", "t", (T0 + 2 * MIN, T0), T0 + 20 * MIN))
    assert [e.slot_ms for e in events if isinstance(e, J.RunTriggered)] == [T0, T0 + 2 * MIN]
    for ev in events:
        assert isinstance(ev, J.RunTriggered)
        assert ev.backfill and not ev.manual and not ev.advances
        assert ev.run_id == slot_run_id("job", ev.slot_ms), "the scheduler's own run id: never a second run"
    assert J.evolve(job(), events[0]) == job(), "a backfill does not move the schedule"


@pytest.mark.parametrize(("state", "slots", "error", "field"), [
    (job(status=J.JobStatus.PAUSED), (T0,), TransitionError, None),
    (J.JobState("job", "t", JobSpec("b", Schedule(run_at_ms=T0), CMD), J.JobStatus.DONE, None, 1, 0, 0), (T0,),
     TransitionError, None),
    (job(), (), ValidationError, "slots"),
    (job(), (T0, T0), ValidationError, "slots"),
    (job(), (T0, T0 + 30_000), ValidationError, "slots[1]"),  # not a slot of the schedule
    (job(), (T0 + 10 * MIN,), ValidationError, "slots[0]"),  # not passed: the scheduler's
    (job(next_run=T0 + 2000 * MIN), tuple(T0 + i * MIN for i in range(J.BACKFILL_SLOTS_MAX + 1)),
     ValidationError, "slots"),
])
def test_backfill_job_refusals(state: J.JobState, slots: tuple[int, ...], error: type[Exception],
                               field: str | None) -> None:
    with pytest.raises(error) as exc:
        J.decide(state, J.BackfillJob("job", "t", slots, T0 + 20 * MIN))
    if field is not None:
        assert isinstance(exc.value, ValidationError) and exc.value.field == field


def test_backfill_of_another_tenants_or_a_deleted_job_is_refused() -> None:
    with pytest.raises(TransitionError, match="does not exist"):  # (another tenant's: as an unknown job)
        J.decide(job(), J.BackfillJob("job", "other", (T0,), T0 + 20 * MIN))
    with pytest.raises(TransitionError, match="does not exist"):
        J.decide(None, J.BackfillJob("job", "t", (T0,), T0 + 20 * MIN))


def test_slots_between_is_bounded() -> None:
    assert J.slots_between(spec(), T0, T0 + 3 * MIN, 10) == [T0, T0 + MIN, T0 + 2 * MIN, T0 + 3 * MIN]
    assert len(J.slots_between(spec(), T0, T0 + 10**9, 5)) == 6, "limit + 1: the caller sees the range is larger"
    assert J.slots_between(spec(), T0 + 1, T0 + MIN - 1, 5) == []


# ---- runs.decide: a backfill trigger ---------------------------------------------------


def _trigger(slot: int) -> J.RunTriggered:
    (ev,) = J.decide(job(), J.BackfillJob("job", "t", (slot,), T0 + 20 * MIN))
    assert isinstance(ev, J.RunTriggered)
    return ev


def test_a_backfill_trigger_creates_a_missing_run_noted_backfilled() -> None:
    (ev,) = R.decide(None, _trigger(T0))
    created = R.evolve(None, ev)
    assert created.status is RunStatus.SCHEDULED and created.backfill and created.note == "backfilled"
    (rel,) = R.decide_timer(created, T0 + 20 * MIN, job=job())
    assert isinstance(rel, R.RunReleased), "its slot has passed: released at once"


def test_a_backfill_trigger_reopens_a_skipped_run_and_records_why() -> None:
    skipped = run(T0, RunStatus.SKIPPED, reason="overlap: job@x is still running", finished_at_ms=T0)
    (ev,) = R.decide(skipped, _trigger(T0))
    assert isinstance(ev, R.RunReopened)
    reopened = R.evolve(skipped, ev)
    assert reopened.status is RunStatus.SCHEDULED and reopened.reopens == 1 and reopened.backfill
    assert reopened.note == "reopened by backfill (was skipped: overlap: job@x is still running)"
    assert reopened.finished_at_ms is None and reopened.reason is None and reopened.purge_at_ms() is None
    (rel,) = R.decide_timer(reopened, T0 + 20 * MIN, job=job())
    assert isinstance(rel, R.RunReleased)
    # the note survives the outcome
    done = R.evolve(R.evolve(reopened, rel), R.AttemptGranted(reopened.run_id, "w", 1, 1, 10**13, 10**13, T0))
    done = R.evolve(done, R.AttemptEnded(reopened.run_id, 1, R.Outcome.SUCCEEDED, "succeeded", T0 + 21 * MIN))
    assert done.status is RunStatus.SUCCEEDED and done.note == reopened.note and done.reason == "succeeded"


@pytest.mark.parametrize("status", [s for s in RunStatus if s is not RunStatus.SKIPPED])
def test_a_backfill_trigger_leaves_any_other_run_alone(status: RunStatus) -> None:
    existing = run(T0, status, attempt=2, token=2, lease_until_ms=10**13, deadline_ms=10**13,
                   next_attempt_at_ms=10**13)
    assert R.decide(existing, _trigger(T0)) == []


def test_an_ordinary_trigger_never_reopens() -> None:
    skipped = run(T0, RunStatus.SKIPPED, reason="paused")
    trig = J.RunTriggered(skipped.run_id, "job", "t", spec(), T0, T0, False, T0)
    assert R.decide(skipped, trig) == []


def test_skipped_to_scheduled_only_by_a_reopen() -> None:
    skipped = run(T0, RunStatus.SKIPPED, reason="paused")
    with pytest.raises(TransitionError):
        R.evolve(skipped, R.RunReleased(skipped.run_id, 1, T0))
    cancelled = run(T0, RunStatus.CANCELLED)
    with pytest.raises(TransitionError):
        R.evolve(cancelled, R.RunReopened(cancelled.run_id, "x", T0))


def test_reopening_a_range_keeps_the_rest_skipped() -> None:
    rng = run(T0 + 4 * MIN, RunStatus.SKIPPED, reason="catch-up policy skip", skipped_from_ms=T0, skipped_count=5)
    (ev,) = R.decide(rng, _trigger(T0 + 4 * MIN))
    assert isinstance(ev, R.RunReopened) and "its range from" in ev.note
    reopened = R.evolve(rng, ev)
    assert (reopened.skipped_from_ms, reopened.skipped_count) == (None, 1)
    rest = R.reopened_range_rest(rng, T0 + 20 * MIN, lambda _: False)
    assert rest is not None and rest.run_id == slot_run_id("job", T0 + 3 * MIN)
    assert (rest.from_ms, rest.slot_ms, rest.count, rest.reason) == (T0, T0 + 3 * MIN, 4, "catch-up policy skip")
    # a slot of the range that a backfill already ran has its own run: the rest ends before it
    taken = {slot_run_id("job", T0 + 3 * MIN)}
    rest = R.reopened_range_rest(rng, T0 + 20 * MIN, lambda rid: rid in taken)
    assert rest is not None and (rest.from_ms, rest.slot_ms, rest.count) == (T0, T0 + 2 * MIN, 3)
    single = run(T0, RunStatus.SKIPPED, reason="paused")
    assert R.reopened_range_rest(single, T0, lambda _: False) is None
    two = run(T0 + MIN, RunStatus.SKIPPED, reason="paused", skipped_from_ms=T0, skipped_count=2)
    rest = R.reopened_range_rest(two, T0, lambda _: False)
    assert rest is not None and (rest.from_ms, rest.slot_ms, rest.count) == (None, T0, 1)


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(list(RunStatus)), st.integers(0, 3))
def test_a_backfill_never_makes_a_second_run_of_a_slot(status: RunStatus, reopens: int) -> None:
    """Whatever the run of the slot is, a backfill trigger either leaves it alone or (only
    when skipped) reopens that same run; it never creates another."""
    existing = run(T0, status, reopens=reopens, lease_until_ms=10**13, deadline_ms=10**13,
                   next_attempt_at_ms=10**13, reason="r")
    events = R.decide(existing, _trigger(T0))
    assert not any(isinstance(e, R.RunCreated) for e in events)
    if status is RunStatus.SKIPPED:
        (ev,) = events
        assert R.evolve(existing, ev).reopens == reopens + 1
    else:
        assert events == []


# ---- the API ---------------------------------------------------------------------------

NOW = T0 + 30 * MIN + 500
AUTH = {"Authorization": "Bearer tok-a"}


@pytest.fixture
def api() -> tuple[TestClient, ListProducer, InMemoryHistoryStore]:
    from gnomon.core.clock import FakeClock

    producer, history = ListProducer(), InMemoryHistoryStore()
    topo = load_topology()
    sink = CommandSink(producer, topo.job_commands)
    clock = FakeClock(NOW)
    app = create_app(history=history, commands=sink, auth=Authenticator({"tok-a": "acme", "tok-b": "other"}),
                     topology=topo, clock=clock)
    if not any(getattr(r, "name", "") == "backfill_job" for r in app.routes):
        add_backfill_route(app, history=history, commands=sink, clock=clock)
    history.put_job(J.JobState("job", "acme", spec(), J.JobStatus.ACTIVE, T0 + 31 * MIN, 1, T0 - MIN, T0))
    return TestClient(app), producer, history


def _backfill(client: TestClient, frm: int, to: int, headers: dict[str, str] = AUTH) -> Any:
    return client.post("/v1/jobs/job:backfill", json={"from": ms_to_iso(frm), "to": ms_to_iso(to)}, headers=headers)


def test_api_sends_the_slots_history_does_not_show_as_run(api: Any) -> None:
    client, producer, history = api
    ran = R.RunState(slot_run_id("job", T0 + MIN), "job", "acme", spec(), T0 + MIN, T0 + MIN, False,
                     RunStatus.SUCCEEDED, T0, T0, attempt=1)
    skipped = R.RunState(slot_run_id("job", T0 + 2 * MIN), "job", "acme", spec(), T0 + 2 * MIN, T0 + 2 * MIN,
                         False, RunStatus.SKIPPED, T0, T0, reason="paused")
    history.put_run(ran)  # e.g. purged from the processor long ago: only history knows it ran
    history.put_run(skipped)
    resp = _backfill(client, T0, T0 + 3 * MIN)
    assert resp.status_code == 202, resp.text
    out = resp.json()
    assert out["slots"] == 4 and out["sent"] == 3 and out["alreadyRun"] == [ran.run_id]
    ((topic, key, cmd),) = producer.sent
    assert topic == "gnomon.job-commands" and key == "job"
    assert isinstance(cmd, J.BackfillJob) and cmd.tenant == "acme"
    assert cmd.slots_ms == (T0, T0 + 2 * MIN, T0 + 3 * MIN)
    assert out["runIds"] == [slot_run_id("job", s) for s in cmd.slots_ms]


def test_api_stops_at_the_schedule_position(api: Any) -> None:
    client, _producer, _ = api
    out = _backfill(client, T0 + 29 * MIN, NOW - 500).json()
    assert out["slots"] == 2  # 29 and 30; 31 is the scheduler's own


@pytest.mark.parametrize(("body", "field"), [
    ({"from": "2026-11-30T00:00:00Z"}, "to"),
    ({"from": "yesterday", "to": "2026-11-30T00:00:00Z"}, "from"),
    ({"from": "2026-11-30T00:10:00Z", "to": "2026-11-30T00:00:00Z"}, "to"),  # before from
    ({"from": "2026-11-30T00:00:00Z", "to": "2099-01-01T00:00:00Z"}, "to"),  # future
    ({"from": "2026-11-30T00:00:00Z", "to": "2026-11-30T00:01:00Z", "x": 1}, "x"),
    ([1], "body"),
])
def test_api_refuses_bad_ranges_naming_the_field(api: Any, body: Any, field: str) -> None:
    client, producer, _ = api
    resp = client.post("/v1/jobs/job:backfill", json=body, headers=AUTH)
    assert resp.status_code == 422 and resp.json()["field"] == field, resp.text
    assert producer.sent == []


def test_api_refuses_more_than_the_maximum_naming_to(api: Any) -> None:
    client, producer, history = api
    history.put_job(J.JobState("job", "acme", spec(), J.JobStatus.ACTIVE, T0 + 30 * MIN, 1, T0 - 3000 * MIN, T0))
    resp = _backfill(client, T0 - 2000 * MIN, T0)
    assert resp.status_code == 422 and resp.json()["field"] == "to"
    assert str(J.BACKFILL_SLOTS_MAX) in resp.json()["detail"] and producer.sent == []


def test_api_refuses_paused_one_time_and_other_tenants_jobs(api: Any) -> None:
    client, producer, history = api
    assert _backfill(client, T0, T0 + MIN, {"Authorization": "Bearer tok-b"}).status_code == 404
    history.put_job(J.JobState("job", "acme", spec(), J.JobStatus.PAUSED, T0 + 31 * MIN, 2, T0, T0))
    assert _backfill(client, T0, T0 + MIN).status_code == 409
    history.put_job(J.JobState("job", "acme", JobSpec("b", Schedule(run_at_ms=T0), CMD), J.JobStatus.DONE,
                               None, 2, T0, T0))
    assert _backfill(client, T0, T0 + MIN).status_code == 409
    assert producer.sent == []


def test_api_documents_the_route(api: Any) -> None:
    client, _, _ = api
    doc = client.get("/openapi.json").json()
    op = doc["paths"]["/v1/jobs/{job_id}:backfill"]["post"]
    ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    body = doc["components"]["schemas"][ref.rsplit("/", 1)[1]]
    assert set(body["properties"]) == {"from", "to"} and body["additionalProperties"] is False
    assert {"202", "404", "409", "422"} <= set(op["responses"])


def test_plan_backfill_without_history_sends_every_slot() -> None:
    send, ids, left, _ = plan_backfill(job(), T0, T0 + 2 * MIN, lambda _: None)
    assert send == [T0, T0 + MIN, T0 + 2 * MIN] and left == [] and ids[0] == slot_run_id("job", T0)


def test_sdk_checks_the_instants_locally() -> None:
    from gnomon.client import Client

    c = Client(url="http://127.0.0.1:9", token="x")
    with pytest.raises(ValidationError) as exc:
        c.backfill("job", "not a time", "2026-11-30T00:00:00Z")
    assert exc.value.field == "from"
    c.close()


# ---- the whole loop, in memory --------------------------------------------------------


def _cluster(overlap: OverlapPolicy = OverlapPolicy.ALLOW, duration_ms: int = 1_000) -> InMemoryCluster:
    c = InMemoryCluster(seed=3, policy=FakeWorkerPolicy(duration_ms=(duration_ms, duration_ms)))
    s = JobSpec(name="b", schedule=Schedule(cron="*/10 * * * * *"), target=CMD, overlap=overlap,
                retry=RetryPolicy(max_attempts=1), timeout_s=120)
    c.submit(J.RegisterJob("job", "t", s, c.clock.now_ms()))
    return c


def _backfill_in_memory(c: InMemoryCluster, from_ms: int, to_ms: int) -> J.BackfillJob:
    """What the API does, with the cluster's ledger as history."""
    state = c.job_state("job")
    assert state is not None
    send, _, _, _ = plan_backfill(state, from_ms, to_ms, c.run_state)
    cmd = J.BackfillJob("job", "t", tuple(send), c.clock.now_ms())
    if send:
        c.submit(cmd)
    return cmd


def test_backfill_reopens_paused_slots_and_leaves_run_ones_alone() -> None:
    c = _cluster()
    c.run_for(40_000)
    first = min(r.slot_ms for r in c.runs_of("job"))
    c.submit(J.PauseJob("job", "t", c.clock.now_ms()))
    c.run_for(120_000)  # slots in the lookahead are withdrawn one by one, the later ones...
    c.submit(J.ResumeJob("job", "t", c.clock.now_ms()))  # ...are one skipped range
    c.run_for(30_000)
    before = {r.run_id: r for r in c.runs_of("job")}
    skipped = [r for r in before.values() if r.status is RunStatus.SKIPPED]
    assert skipped and any(r.skipped_count > 1 for r in skipped), [(r.run_id, r.skipped_count) for r in skipped]
    end = max(r.slot_ms for r in before.values() if r.status is RunStatus.SUCCEEDED)
    _backfill_in_memory(c, first, end)
    c.run_for(20_000)
    after = {r.run_id: r for r in c.runs_of("job")}
    for run_id, old in before.items():
        if old.status is RunStatus.SUCCEEDED:
            assert after[run_id].attempt == old.attempt and after[run_id].updated_at_ms == old.updated_at_ms
    slots = J.slots_between(after[next(iter(after))].spec, first, end, 1000)
    by_slot = {r.slot_ms: r for r in after.values()}
    for slot in slots:
        r = by_slot[slot]
        assert r.status is RunStatus.SUCCEEDED, (r.run_id, r.status, r.reason)
    reopened = [r for r in after.values() if r.reopens]
    assert reopened and all((r.note or "").startswith("reopened by backfill (was skipped: paused") for r in reopened)
    assert [r for r in after.values() if r.note == "backfilled"], "the slots inside the range got runs"
    assert c.history_report(["job"]).ok, c.history_report(["job"]).problems[:5]


def test_backfill_reopens_overlap_skips() -> None:
    c = _cluster(OverlapPolicy.FORBID, 15_000)
    c.run_for(60_000)
    skipped = [r for r in c.runs_of("job") if r.status is RunStatus.SKIPPED]
    assert skipped
    first = min(r.slot_ms for r in c.runs_of("job"))
    _backfill_in_memory(c, first, max(r.slot_ms for r in skipped))
    c.run_for(120_000)
    for r in skipped:
        now = c.run_state(r.run_id)
        assert now is not None and now.reopens == 1 and (now.note or "").startswith("reopened by backfill")
    assert c.history_report(["job"]).ok, c.history_report(["job"]).problems[:5]


def test_a_second_backfill_of_the_same_range_changes_nothing() -> None:
    c = _cluster()
    c.run_for(30_000)
    first = min(r.slot_ms for r in c.runs_of("job"))
    c.run_for(1)
    cmd = _backfill_in_memory(c, first, c.clock.now_ms() - 10_000)
    assert cmd.slots_ms == (), "every slot ran: nothing to send"
    state = c.job_state("job")
    assert state is not None
    # even if sent anyway (history lagging), the processor leaves run slots alone
    before = {r.run_id: r for r in c.runs_of("job")}
    c.submit(J.BackfillJob("job", "t", tuple(J.slots_between(state.spec, first, first + 20_000, 10)),
                           c.clock.now_ms()))
    c.run_for(5_000)
    for run_id, old in before.items():
        assert c.run_state(run_id) is not None
        assert c.run_state(run_id).attempt == old.attempt  # type: ignore[union-attr]
    assert c.history_report(["job"]).ok


def test_a_stale_backfill_and_a_backfill_trigger_from_a_topic_are_refused() -> None:
    """A BackfillJob applied long after the API checked history could run a slot whose
    run was purged since; a backfill trigger read from a log is a replay or a forgery."""
    c = _cluster()
    c.run_for(30_000)
    state = c.job_state("job")
    assert state is not None
    first = min(r.slot_ms for r in c.runs_of("job"))
    stale = J.BackfillJob("job", "t", (first,), c.clock.now_ms() - c.run_cfg.retention_ms)
    task = c.tasks[next(p for p, t in c.tasks.items() if t.job("job") is not None)]
    with pytest.raises(TransitionError, match="retention"):
        task.handle(stale, c.clock.now_ms())
    (trig,) = J.decide(state, J.BackfillJob("job", "t", (first,), c.clock.now_ms()))
    with pytest.raises(TransitionError, match="never read from a topic"):
        task.handle(trig, c.clock.now_ms(), source=c.topo.run_events)


def test_cli_backfill(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from gnomon.cli import jobs as cli_jobs

    calls: list[tuple[str, str, str]] = []

    class FakeClient:
        def backfill(self, job_id: str, from_iso: str, to_iso: str) -> dict[str, Any]:
            calls.append((job_id, from_iso, to_iso))
            return {"id": job_id, "accepted": "backfill", "slots": 3, "sent": 2, "runIds": ["j@a", "j@b"],
                    "alreadyRun": ["j@c"]}

    monkeypatch.setattr(cli_jobs, "Client", FakeClient)
    out = CliRunner().invoke(cli_jobs.jobs_app, ["backfill", "j", "--from", "2026-11-30T00:00:00Z",
                                                 "--to", "2026-11-30T00:02:00Z"])
    assert out.exit_code == 0, out.output
    assert calls == [("j", "2026-11-30T00:00:00Z", "2026-11-30T00:02:00Z")]
    assert "j@a" in out.output and "sent" in out.output
