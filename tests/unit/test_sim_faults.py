"""Each fault of the simulation (gnomon.sim) is really injected and really handled, by
the real Processor and Worker loops on the in-memory event log."""

from __future__ import annotations

import pytest

from gnomon.adapters.kafka import partition_for
from gnomon.adapters.kv import MemoryKV
from gnomon.core import runs as R
from gnomon.processor.runtime import Processor
from gnomon.processor.task import PartitionTask
from gnomon.sim import SimCluster, SimFaults

pytestmark = pytest.mark.usefixtures("quiet_logs")


def rebuild(c: SimCluster, p: int) -> dict[bytes, bytes]:
    """Partition ``p``'s state rebuilt from what is committed on its changelogs."""
    task = PartitionTask(p, MemoryKV(), c.topo, c.sched_cfg, c.run_cfg)
    latest: dict[str, dict[str, bytes | None]] = {c.topo.jobs: {}, c.topo.runs: {}}
    for topic, table in latest.items():
        for r in c.log.records(topic, p):
            table[(r.key or b"").decode()] = r.value
    task.bulk_load(latest[c.topo.jobs], latest[c.topo.runs])
    return dict(task.kv.scan(b"", b"\xff", 10**9))


def state(proc: Processor, p: int) -> dict[bytes, bytes]:
    return dict(proc.tasks[p].kv.scan(b"", b"\xff", 10**9))


def cluster(seed: int = 1, **kw: object) -> SimCluster:
    c = SimCluster(seed, **kw)  # type: ignore[arg-type]
    c.register("a", "*/2 * * * * *")
    c.register("b", "*/3 * * * * *", fail_attempts=1)
    return c


def assert_clean(c: SimCluster) -> None:
    rep = c.history_report()
    why = f"{rep.summary()}\n{c.describe()}\n{rep.problems[:10]}"
    assert rep.slots > 0 and rep.ok and rep.missed == 0 and rep.duplicates == 0, why


def every_owned_partition_matches_its_changelog(c: SimCluster) -> int:
    n = 0
    for s in c.procs:
        if s.proc is None:
            continue
        for p in s.proc.tasks:
            assert state(s.proc, p) == rebuild(c, p), f"{s.name} partition {p} differs from its changelog"
            n += 1
    return n


def test_the_same_seed_replays_identically() -> None:
    def run() -> tuple[list[object], list[str]]:
        c = cluster(11, faults=SimFaults.mixed())
        c.run_for(12_000)
        c.heal(8_000)
        return [(r.partition, r.offset, r.key, r.value) for r in c.log.records(c.topo.runs)], c.events

    first, second = run(), run()
    assert first[1] and first == second


def test_a_zombie_processor_cannot_commit_and_then_learns_it_lost_its_partitions() -> None:
    c = cluster(2)
    c.run_for(4_000, faults=False)
    p0 = c.processor("p0")
    had = set(p0.tasks)
    assert had and c.log.fenced == []
    aborts = p0.aborts
    c.stall("p0", c.cfg.session_timeout_ms + 1_000)
    c.run_for(c.cfg.session_timeout_ms + 600, faults=False)
    assert all(c.owner(p) == "p1" for p in range(c.topo.partitions)), "p1 took over the stalled p0's partitions"
    assert set(p0.tasks) == had  # p0 has not noticed
    c.run_for(1_000, faults=False)  # p0 resumes and serves one batch from its lost partitions
    assert any(f.startswith("gnomon-processor-p0:") for f in c.log.fenced), c.log.fenced
    assert p0.aborts > aborts
    c.run_for(6_000, faults=False)
    assert {c.owner(p) for p in range(c.topo.partitions)} == {"p0", "p1"}  # it rejoined
    every_owned_partition_matches_its_changelog(c)
    c.heal(10_000)
    assert_clean(c)


def _abort_a_registration(c: SimCluster) -> tuple[Processor, int]:
    c.run_for(3_000, faults=False)
    p = partition_for("late", c.topo.partitions)
    owner = c.owner(p)
    assert owner is not None
    proc = c.processor(owner)
    aborts = proc.aborts
    c.register("late", "*/2 * * * * *")
    c.client.flush(0)  # on the log now
    c.fail_next_commit(owner)
    for _ in range(5):
        c.step()
        if proc.aborts > aborts:
            break
    assert proc.aborts == aborts + 1
    return proc, p


def test_an_abort_rewinds_state_and_positions_to_the_last_commit() -> None:
    c = cluster(3)
    proc, p = _abort_a_registration(c)
    assert proc.tasks[p].job("late") is None, "the aborted registration is not in state"
    assert state(proc, p) == rebuild(c, p)
    c.run_for(2_000, faults=False)  # read again from the rewound position, committed this time
    assert "late" in c.jobs()
    c.heal(8_000)
    assert_clean(c)
    assert any(r.job_id == "late" for r in c.ledger())


def test_without_the_rewind_an_abort_leaves_uncommitted_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above is not vacuous: with the rewind disabled it fails."""
    monkeypatch.setattr(Processor, "_rewind", lambda self: None)
    c = cluster(3)
    proc, p = _abort_a_registration(c)
    assert proc.tasks[p].job("late") is not None
    assert state(proc, p) != rebuild(c, p)


def test_a_killed_processor_restores_its_partitions_from_the_changelogs() -> None:
    c = cluster(4)
    c.run_for(4_000, faults=False)
    c.kill("p0", drop_state=True, down_ms=500)
    c.run_for(c.cfg.session_timeout_ms + 700, faults=False)
    c.run_for(4_000, faults=False)
    owners = {c.owner(p) for p in range(c.topo.partitions)}
    assert owners == {"p0", "p1"}, owners
    p0 = c.processor("p0")
    assert p0.tasks and p0.transactions > 0
    assert every_owned_partition_matches_its_changelog(c) == c.topo.partitions
    c.heal(10_000)
    assert_clean(c)


def test_a_clean_stop_checkpoints_and_the_restart_resumes_from_the_checkpoints() -> None:
    c = cluster(5, standbys=False)
    c.run_for(4_000, faults=False)
    had = set(c.processor("p1").tasks)
    c.stop("p1", down_ms=1_000)
    assert set(c._slot("p1").stores.checkpoints) == had
    assert all(c.owner(p) in (None, "p0") for p in range(c.topo.partitions))
    c.run_for(500, faults=False)
    assert all(c.owner(p) == "p0" for p in range(c.topo.partitions)), "the revoked partitions moved at once"
    c.run_for(3_000, faults=False)
    assert set(c.processor("p1").tasks) == had  # the range assignor gives them back
    assert c._slot("p1").stores.checkpoints == {}, "the checkpoints were used (and consumed)"
    every_owned_partition_matches_its_changelog(c)
    c.heal(8_000)
    assert_clean(c)


def test_a_processor_stopped_after_its_partitions_moved_away_does_not_checkpoint_its_stale_store() -> None:
    """A process frozen past its session (SIGSTOP) and then told to stop: its partitions
    went to p0, which wrote more to their changelogs meanwhile. Its clean stop must not
    checkpoint its stores as holding the changelogs to their ends (found by the purge
    scenario: the restart trusted the stale stores and a finished run went back to
    RUNNING); the group refuses its commit, so it drops them and rebuilds on the next open."""
    c = cluster(7, standbys=False)
    for i in range(8):
        c.register(f"j{i}", "*/5 * * * * *")
    c.run_for(4_000, faults=False)
    had = set(c.processor("p1").tasks)
    assert had and all(c.log.end_offset(c.topo.runs, p) > 0 for p in had)
    c.stall("p1", c.cfg.session_timeout_ms + 3_000)
    c.run_for(c.cfg.session_timeout_ms + 2_500, faults=False)
    assert all(c.owner(p) == "p0" for p in had), "p0 took the stalled processor's partitions"
    c.stop("p1", down_ms=500)  # the stop it was told while frozen, handled once it thaws
    assert c._slot("p1").stores.checkpoints == {}, "a stale store was checkpointed"
    c.run_for(3_000, faults=False)
    assert set(c.processor("p1").tasks) == had  # back, rebuilt from the changelogs
    assert every_owned_partition_matches_its_changelog(c) == c.topo.partitions
    c.heal(8_000)
    assert_clean(c)


def test_duplicated_and_reordered_deliveries_are_absorbed() -> None:
    c = cluster(6, faults=SimFaults(duplicate=0.3, reorder=0.3))
    c.run_for(15_000)
    c.heal(10_000)
    pf = c.log.plain_faults
    assert pf is not None and pf.duplicated >= 10 and pf.reordered >= 10
    rep = c.history_report()
    assert rep.stale_rejected > 0, "some duplicated reports were refused as stale"
    assert_clean(c)


def test_a_crashed_workers_attempts_are_granted_again() -> None:
    c = cluster(7, duration_ms=(3_000, 4_000))
    c.run_for(6_000, faults=False)
    w0 = c.workers[0]
    assert w0.worker is not None and w0.runner is not None and w0.runner.running() > 0
    gone = w0.worker.worker_id
    c.crash_worker(0, down_ms=2_000)
    c.heal(25_000)
    grants = [s for s in c.ledger() if s.worker_id == gone]
    assert grants
    later = {s.run_id for s in c.ledger() if s.token >= 2 and s.worker_id != gone}
    assert {s.run_id for s in grants} & later, "a run of the crashed worker was granted again elsewhere"
    assert_clean(c)


def test_workers_with_skewed_clocks() -> None:
    c = cluster(8, faults=SimFaults(skew_ms=2_500), workers=3)
    assert any("clock skew" in e for e in c.events)
    c.run_for(12_000)
    c.heal(10_000)
    assert_clean(c)


def test_a_store_that_does_not_open_after_a_clean_stop_is_rebuilt_from_the_changelogs() -> None:
    """A checkpointed store that fails to open (RocksDB reporting corruption, say: found
    when two processes shared an instance id's state directory) is rebuilt from the
    changelogs instead of stopping the processor at every restart."""
    from gnomon.core.errors import StateStoreError
    from gnomon.ports import KeyValueStore
    from gnomon.processor.stores import MemoryStores

    class Corrupt(MemoryStores):
        refused: list[int] = []

        def open(self, partition: int, *, fresh: bool) -> KeyValueStore:
            if not fresh:
                Corrupt.refused.append(partition)
                raise StateStoreError(f"cannot open RocksDB at p{partition:03d}: Corruption: bad table magic number")
            return super().open(partition, fresh=fresh)

    c = cluster(6, standbys=False)
    c.run_for(4_000, faults=False)
    had = set(c.processor("p1").tasks)
    c.stop("p1", down_ms=1_000)
    slot = c._slot("p1")
    corrupt = Corrupt()
    corrupt.stores, corrupt.checkpoints = slot.stores.stores, slot.stores.checkpoints
    slot.stores = corrupt
    c.run_for(4_000, faults=False)
    assert set(c.processor("p1").tasks) == had and sorted(Corrupt.refused) == sorted(had)
    every_owned_partition_matches_its_changelog(c)
    c.heal(8_000)
    assert_clean(c)


def _commit_with_late_markers_then_die(c: SimCluster) -> None:
    c.run_for(4_000, faults=False)
    p0 = c.processor("p0")
    c.delay_commit_markers("p0", c.cfg.session_timeout_ms + 6_000)
    before = p0.transactions
    for _ in range(100):  # (a commit comes within a few steps)
        if p0.transactions != before:
            break
        c.run_for(c.step_ms, faults=False)
    assert p0.transactions != before, "p0 committed nothing"
    c.kill("p0", drop_state=False, down_ms=30_000)
    c.run_for(c.cfg.session_timeout_ms + 10_000, faults=False)


def test_a_commit_whose_markers_land_late_is_read_by_the_next_owner_not_decided_again() -> None:
    """Kafka answers a commit once its coordinator wrote PrepareCommit; the records become
    readable when the markers are written, which a coordinator cut off or moving delays.
    A processor dying right after such a commit leaves the next owner a transaction its
    read_committed restore cannot see yet: it waits for it instead of deciding its slots
    again (found by the host cut-off chaos test: runs created twice, tokens granted twice)."""
    c = cluster(6)
    _commit_with_late_markers_then_die(c)
    assert {c.owner(p) for p in range(c.topo.partitions)} == {"p1"}
    c.heal(10_000)
    assert_clean(c)


def test_without_waiting_for_open_transactions_the_next_owner_decides_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above is not vacuous: restoring without waiting doubles runs."""
    from gnomon.eventlog.memory import MemoryEventLog

    monkeypatch.setattr(MemoryEventLog, "wait_stable", lambda self, topic, partition: None)
    c = cluster(6)
    _commit_with_late_markers_then_die(c)
    c.heal(10_000)
    rep = c.history_report()
    assert not rep.ok and (rep.duplicates or rep.overlapping_grants), rep.summary()


def _records_on_their_way_then_stall(c: SimCluster) -> None:
    """p0's next transaction sends its offsets while its records are on their way (as
    librdkafka sends them beside the records), is answered, and p0 stalls past its
    session; the records land after the group gave its partitions to p1."""
    c.run_for(4_000, faults=False)
    had = {p for p in range(c.topo.partitions) if c.owner(p) == "p0"}
    assert had, "p0 owns nothing"
    session = c.cfg.session_timeout_ms
    c.delay_records("p0", session + 4_000, stall_ms=session + 8_000)
    c.run_for(session + 6_000, faults=False)
    assert {c.owner(p) for p in had} == {"p1"}, "p0's partitions did not move while it stalled"
    c.run_for(6_000, faults=False)


def test_records_on_their_way_when_the_offsets_went_are_read_by_the_next_owner_not_decided_again() -> None:
    """The processor waits for its records to be in their logs before it sends its
    offsets (the group's fencing): offsets the group accepts then come before any new
    owner's assignment, so that owner finds the records as an open transaction and
    waits for its end instead of deciding again what it decided."""
    c = cluster(6)
    _records_on_their_way_then_stall(c)
    c.heal(10_000)
    assert_clean(c)


def test_offsets_sent_before_the_records_are_in_let_the_next_owner_decide_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above is not vacuous: without that flush, runs are decided twice."""
    from gnomon.eventlog.memory import MemoryTransactionalProducer

    monkeypatch.setattr(MemoryTransactionalProducer, "flush", lambda self, timeout_s: 0)
    c = cluster(6)
    _records_on_their_way_then_stall(c)
    c.heal(10_000)
    rep = c.history_report()
    assert not rep.ok and (rep.duplicates or rep.overlapping_grants or rep.stale_accepted), rep.summary()


def _lost_then_rewound() -> list[tuple[str, float]]:
    """Worker 0 crashes; the transaction of the tick that finds it lost aborts, so the
    rewound partitions still hold attempts staged on it. The runs that started late."""
    c = cluster(9, duration_ms=(200, 400), workers=2)
    c.run_for(5_000, faults=False)
    p0 = c.processor("p0")
    w0 = c.workers[0].worker
    assert w0 is not None
    gone = w0.worker_id
    crashed_at = c.clock.now_ms()
    c.crash_worker(0, down_ms=60_000)
    for _ in range(200):  # (found lost within a few seconds of silence)
        if gone in p0._lost_workers:
            break
        if not p0.directory.alive(gone, c.clock.now_ms() + c.step_ms):
            c.fail_next_commit("p0")  # the tick that finds it lost commits nothing
        c.run_for(c.step_ms, faults=False)
    assert gone in p0._lost_workers
    assert p0.aborts >= 1
    c.run_for(12_000, faults=False)
    late = [(s.run_id, (s.started_at_ms - s.slot_ms) / 1000) for s in c.ledger()
            if s.started_at_ms is not None and s.slot_ms > crashed_at + 3_000
            and s.started_at_ms - s.slot_ms > 2_000]
    c.heal(8_000)
    assert_clean(c)
    return late


def test_runs_staged_on_a_worker_lost_before_their_partition_was_restored_move_at_once() -> None:
    """A worker found lost is reported once; a partition restored after that (taken over,
    or rewound by an abort, as here: the transaction that moved its runs failed) still
    holds attempts staged on it: they move at the next tick, not when their lease lapses."""
    late = _lost_then_rewound()
    assert not late, f"runs started late after the worker was lost: {late[:5]}"


def test_without_the_move_on_restore_those_runs_wait_out_their_lease(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above is not vacuous: without the move they start a lease late."""
    def forget(self: Processor, now: int) -> list[object]:
        self._restored = set()
        return []

    monkeypatch.setattr(Processor, "_staged_on_lost_workers", forget)
    late = _lost_then_rewound()
    assert late and min(lag for _, lag in late) >= 5.0, late


def _runs_due_while_a_worker_lay_dead(seed: int) -> tuple[list[R.RunState], str]:
    """Worker 0 crashes; the last state of each run of job ``a`` due in the 3 s after the
    crash (staged on it or on worker 1 before it: granted ahead of their slots), and the
    dead worker's id."""
    c = SimCluster(seed, duration_ms=(200, 400), workers=2)
    c.register("a", "* * * * * *")
    c.run_for(5_000, faults=False)
    w0 = c.workers[0].worker
    assert w0 is not None
    gone, crashed_at = w0.worker_id, c.clock.now_ms()
    granted_to_it = {s.run_id for s in c.ledger() if s.worker_id == gone and s.slot_ms > crashed_at}
    c.crash_worker(0, down_ms=60_000)
    c.run_for(40_000, faults=False)
    c.heal(8_000)
    assert_clean(c)
    last = {s.run_id: s for s in c.ledger()}
    due = [s for s in last.values() if crashed_at < s.slot_ms <= crashed_at + 3_000]
    assert {s.run_id for s in due} & granted_to_it, "no run was staged on the worker that died"
    return due, gone


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_runs_staged_on_a_worker_that_died_start_elsewhere_within_seconds_using_no_attempt(seed: int) -> None:
    """Issue 51: the worker is found lost after 2 s of silence, and every attempt staged
    on it that it had not reported started (a worker starts one only once Kafka took its
    start report) is granted again then, slot passed or not, with no attempt used. Before:
    those whose slot passed before the worker was found lost (4 s) waited out their 30 s
    lease and failed 'lease lost', using an attempt."""
    due, gone = _runs_due_while_a_worker_lay_dead(seed)
    late = [(s.run_id, s.attempt, (s.started_at_ms or 0) - s.slot_ms) for s in due
            if s.status is not R.RunStatus.SUCCEEDED or s.attempt != 1 or s.worker_id == gone
            or s.started_at_ms is None or s.started_at_ms - s.slot_ms > 3_000]
    assert not late, late
