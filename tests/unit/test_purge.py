"""Bounded state: finished runs leave processor state after their retention, once history
has them, and a purged slot never runs again (replayed triggers, manual keys, one-time
jobs). The in-memory cluster runs the real PartitionTask; the history checker reads every
ledger record (tombstones leave its account untouched), so a slot run twice shows up."""

from __future__ import annotations

import random

import pytest

from gnomon.core import jobs as J
from gnomon.core import runs as R
from gnomon.core.clock import FakeClock
from gnomon.core.model import JobSpec, RetryPolicy, Schedule, Target, TargetType, slot_run_id
from gnomon.core.runs import RunStatus
from gnomon.eventlog.memory import MemoryEventLog
from gnomon.processor.history_mark import HistoryWatermark
from gnomon.processor.output import Output
from gnomon.testing import FakeWorkerPolicy, InMemoryCluster

CMD = Target(TargetType.COMMAND, argv=("true",))
CFG = R.RunConfig(retention_ms=10_000, manual_key_retention_ms=60_000, dead_letter_retention_ms=120_000)


def spec(cron: str = "*/5 * * * * *", **kw: object) -> JobSpec:
    return JobSpec(name="j", schedule=Schedule(cron=cron), target=CMD,
                   retry=RetryPolicy(max_attempts=1), **kw)  # type: ignore[arg-type]


def cluster(**kw: object) -> InMemoryCluster:
    kw.setdefault("policy", FakeWorkerPolicy(duration_ms=(50, 300)))
    return InMemoryCluster(run_cfg=CFG, **kw)  # type: ignore[arg-type]


def runs_in_state(c: InMemoryCluster) -> int:
    return sum(1 for t in c.tasks.values() for _ in t.kv.scan(b"r/", b"r0", 1_000_000))


def tombstones(c: InMemoryCluster) -> list[str]:
    out: list[str] = []
    c.hooks.append(lambda o: out.append(o.key) if o.topic == c.topo.runs and o.value is None else None)
    return out


def replayed_trigger(job_id: str, slot_ms: int, at_ms: int, s: JobSpec) -> J.RunTriggered:
    return J.RunTriggered(slot_run_id(job_id, slot_ms), job_id, "t", s, slot_ms, slot_ms, False, at_ms)


def test_finished_runs_leave_state_after_retention_and_history_keeps_them() -> None:
    c = cluster()
    gone = tombstones(c)
    history: list[Output] = []
    c.hooks.append(lambda o: history.append(o) if o.topic == c.topo.runs and o.final else None)
    t0 = c.clock.now_ms()
    c.submit(J.RegisterJob("job", "t", spec(), t0))
    c.run_for(180_000)
    assert c.tasks[0].stats.purged + sum(t.stats.purged for t in c.tasks.values()) > 0
    # 180 s of a 5 s job is 36 slots; state keeps ~ (retention 10 s + lookahead 30 s) / 5 s of them
    assert 0 < runs_in_state(c) <= 12, runs_in_state(c)
    assert len(gone) >= 25 and all(c.run_state(r) is None for r in gone)
    # each purged run had its final state written to the ledger first, marked final once
    finals = [o.value.run_id for o in history]
    assert len(finals) == len(set(finals)) and set(gone) <= set(finals)
    assert all(o.value.status.terminal for o in history)
    rep = c.history_report(["job"])
    assert rep.ok and rep.missed == 0 and rep.duplicates == 0, (rep.summary(), rep.problems[:3])


def test_nothing_is_purged_while_history_lags() -> None:
    c = cluster(history_lag_ms=None)  # the projector never caught up
    c.submit(J.RegisterJob("job", "t", spec(), c.clock.now_ms()))
    c.run_for(120_000)
    assert sum(t.stats.purged for t in c.tasks.values()) == 0
    lagging = cluster(history_lag_ms=60_000)
    lagging.submit(J.RegisterJob("job", "t", spec(), lagging.clock.now_ms()))
    lagging.run_for(120_000)
    now = lagging.clock.now_ms()
    purged = [r for r in lagging.runs_of("job") if lagging.run_state(r.run_id) is None]
    assert purged and all(r.finished_at_ms is not None and r.finished_at_ms < now - 60_000 for r in purged)


def test_a_replayed_trigger_for_a_purged_slot_is_refused() -> None:
    c = cluster()
    s = spec()
    c.submit(J.RegisterJob("job", "t", s, c.clock.now_ms()))
    c.run_for(60_000)
    first = c.runs_of("job")[0]
    assert c.run_state(first.run_id) is None  # purged
    c.submit(replayed_trigger("job", first.slot_ms, first.created_at_ms, s))
    c.submit(J.RunSkipped(first.run_id, "job", "t", s, first.slot_ms, "replayed", first.created_at_ms))
    c.run_for(10_000)
    assert len(c.rejected) == 2 and all("refused" in why for _, why in c.rejected)
    assert c.run_state(first.run_id) is None
    rep = c.history_report(["job"])
    assert rep.ok and rep.duplicates == 0, rep.problems[:3]


def test_a_trigger_for_a_slot_still_ahead_is_applied_once() -> None:
    c = cluster()
    s = spec("0 0 * * * *")  # hourly: the next slot is far ahead
    c.submit(J.RegisterJob("job", "t", s, c.clock.now_ms()))
    c.drain()
    job = c.job_state("job")
    assert job is not None and job.next_run_at_ms is not None
    c.submit(replayed_trigger("job", job.next_run_at_ms, c.clock.now_ms(), s))
    c.drain()
    assert c.rejected == [] and c.run_state(slot_run_id("job", job.next_run_at_ms)) is not None


@pytest.mark.parametrize("seed", range(8))
def test_triggers_replayed_at_random_times_never_double_a_slot(seed: int) -> None:
    """Purges race replays: every slot of the run is replayed at a random later moment,
    before or after its purge. Each is a no-op (run still there) or refused (purged)."""
    rng = random.Random(seed)
    c = cluster(seed=seed, policy=FakeWorkerPolicy(p_fail=0.2, duration_ms=(50, 3000)))
    s = spec("*/3 * * * * *")
    c.submit(J.RegisterJob("job", "t", s, c.clock.now_ms()))
    pending: list[tuple[int, R.RunState]] = []
    for _ in range(600):
        c.run_for(200)
        now = c.clock.now_ms()
        for r in c.runs_of("job"):
            if r.status.terminal and all(p[1].run_id != r.run_id for p in pending) and rng.random() < 0.5:
                pending.append((now + rng.randint(0, 30_000), r))
        for due, r in [p for p in pending if p[0] <= now]:
            c.submit(replayed_trigger("job", r.slot_ms, r.created_at_ms, s))
            pending.remove((due, r))
    rep = c.history_report(["job"])
    assert rep.ok and rep.duplicates == 0 and rep.missed == 0, (rep.summary(), rep.problems[:3])
    assert sum(t.stats.purged for t in c.tasks.values()) > 0
    assert sum(t.stats.replays_refused for t in c.tasks.values()) > 0


def test_a_manual_key_is_kept_for_its_retention_then_a_replay_is_refused() -> None:
    c = cluster()
    c.submit(J.RegisterJob("job", "t", spec("0 0 1 1 *"), c.clock.now_ms()))
    c.drain()
    asked = c.clock.now_ms()
    c.submit(J.TriggerJob("job", "t", "k1", asked))
    c.run_for(30_000)  # done and past the 10 s retention, but the key is kept 60 s
    run_id = "job@manual:k1"
    assert c.run_state(run_id) is not None
    c.submit(J.TriggerJob("job", "t", "k1", asked))  # a retry within the key's retention: no-op
    c.run_for(40_000)
    assert c.run_state(run_id) is None  # purged after 60 s
    c.submit(J.TriggerJob("job", "t", "k1", asked))  # a replay of the original request
    c.drain()
    assert len(c.rejected) == 1 and "idempotency-key retention" in c.rejected[0][1]
    assert [r.run_id for r in c.runs_of("job") if r.manual] == [run_id]
    rep = c.history_report(["job"])
    assert rep.duplicates == 0, rep.problems[:3]


def test_a_one_time_job_is_not_run_again_after_its_purge() -> None:
    c = cluster()
    at = c.clock.now_ms() + 5_000
    s = JobSpec(name="once", schedule=Schedule(run_at_ms=at), target=CMD)
    c.submit(J.RegisterJob("once", "t", s, c.clock.now_ms()))
    c.run_for(60_000)
    job = c.job_state("once")
    assert job is not None and job.status is J.JobStatus.DONE
    assert c.run_state(slot_run_id("once", at)) is None  # purged
    c.submit(replayed_trigger("once", at, at - 30_000, s))
    c.drain()
    assert len(c.rejected) == 1
    assert [r.status for r in c.runs_of("once")] == [RunStatus.SUCCEEDED]


def test_a_dead_letter_stays_replayable_for_its_own_retention() -> None:
    c = cluster(policy=FakeWorkerPolicy(p_fail=1.0, duration_ms=(50, 100)))
    c.submit(J.RegisterJob("job", "t", spec("0 0 1 1 *"), c.clock.now_ms()))
    c.drain()
    c.submit(J.TriggerJob("job", "t", "k", c.clock.now_ms()))
    c.run_for(90_000)  # past the manual key's 60 s, within the dead letter's 120 s
    run = c.run_state("job@manual:k")
    assert run is not None and run.status is RunStatus.FAILED
    c.run_for(60_000)
    assert c.run_state("job@manual:k") is None


def test_history_watermark_waits_for_the_projector_past_each_sample() -> None:
    clock = FakeClock()
    mark = HistoryWatermark(MemoryEventLog(clock), "gnomon.runs", clock)
    try:
        mark._observe(0, 1_000, end=10, committed=-1001)  # the projector never committed
        assert mark.until_ms(0) is None
        mark._observe(0, 2_000, end=20, committed=8)
        assert mark.until_ms(0) is None
        mark._observe(0, 3_000, end=30, committed=9)  # offset 9 is the commit marker of the first sample
        assert mark.until_ms(0) == 1_000
        mark._observe(0, 4_000, end=30, committed=29)
        assert mark.until_ms(0) == 4_000
    finally:
        mark.close()


def test_changed_retention_settings_reindex_finished_runs() -> None:
    """A restart with a longer retention: entries computed with the old one come due
    first and are replaced by the run's own, never dropped (a run that lost its purge
    entry would stay in state forever). (A shorter one applies to runs that ended before
    the change at their old time.)"""
    c = cluster(history_lag_ms=None)  # 10 s retention, but history never caught up: nothing purged
    c.submit(J.RegisterJob("job", "t", spec(), c.clock.now_ms()))
    c.run_for(60_000)
    assert sum(t.stats.purged for t in c.tasks.values()) == 0
    for t in c.tasks.values():
        t.run_cfg = R.RunConfig(retention_ms=20_000)
    c.history_lag_ms = 0
    c.run_for(30_000)  # the old entries (ended + 10 s) come due: re-indexed at ended + 20 s, purged then
    old = [r for r in c.runs_of("job") if r.finished_at_ms is not None and r.finished_at_ms < c.clock.now_ms() - 25_000]
    assert len(old) > 5 and all(c.run_state(r.run_id) is None for r in old)


def test_a_run_withdrawn_before_its_slot_is_kept_until_the_slot_has_passed() -> None:
    cfg = R.RunConfig(retention_ms=1_000, stage_ahead_ms=30_000)
    c = InMemoryCluster(run_cfg=cfg, sched_cfg=J.SchedulerConfig(lookahead_ms=30_000))
    c.submit(J.RegisterJob("job", "t", spec("*/20 * * * * *"), c.clock.now_ms()))
    c.run_for(1_000)
    ahead = [r for r in c.runs_of("job") if r.slot_ms > c.clock.now_ms() + 12_000]
    assert ahead
    c.submit(J.PauseJob("job", "t", c.clock.now_ms()))  # withdraws them: skipped, finished now
    c.run_for(8_000)  # past retention (1 s) and the purge's clock margin (5 s)
    assert all(c.run_state(r.run_id) is not None for r in ahead)  # but the slot is still ahead
    c.submit(J.ResumeJob("job", "t", c.clock.now_ms()))
    c.run_for(40_000)
    rep = c.history_report(["job"])
    assert rep.duplicates == 0, rep.problems[:3]


def test_cancel_and_replay_are_accepted_only_from_the_api_topic() -> None:
    """Workers may write gnomon.run-events; a cancel or replay read from there is refused,
    whatever tenant it names. From gnomon.job-commands (the API's) it applies."""
    from gnomon.core.errors import TransitionError
    from gnomon.testing import partition_for

    c = cluster(policy=FakeWorkerPolicy(duration_ms=(60_000, 60_000)))
    c.submit(J.RegisterJob("job", "t", spec(), c.clock.now_ms()))
    c.run_for(7_000)
    running = next(r for r in c.runs_of("job") if r.status is RunStatus.RUNNING)
    task = c.tasks[partition_for("job", c.partitions)]
    now = c.clock.now_ms()
    for cmd in (R.CancelRun(running.run_id, "t", now), R.ReplayRun(running.run_id, "t", now)):
        with pytest.raises(TransitionError, match=r"only from gnomon\.job-commands"):
            task.handle(cmd, now, c.topo.run_events)
    assert task.run(running.run_id).status is RunStatus.RUNNING
    task.handle(R.CancelRun(running.run_id, "t", now), now, c.topo.job_commands)
    assert task.run(running.run_id).status is RunStatus.CANCELLED
