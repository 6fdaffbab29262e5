"""Issue 51 item 2: an aborted transaction costs the transaction, not a rebuild.

Each partition's writes since its last commit are journaled (``PartitionTask.txn_begin``);
a rewind puts the store back at the last commit and reads the changelogs' tail from the
offsets that commit reached at least, so a transaction whose commit went through although
the processor was told it failed is read back, not lost. Proven here on the real
Processor loops over the in-memory log: after every rewind each owned partition's state
equals a rebuild from its changelogs, and the history checker accounts for every slot once."""

from __future__ import annotations

import pytest
from test_sim_faults import assert_clean, cluster, every_owned_partition_matches_its_changelog

from gnomon.adapters.kafka import partition_for
from gnomon.processor.runtime import Processor
from gnomon.sim import SimCluster

pytestmark = pytest.mark.usefixtures("quiet_logs")

ROLLED = "rolled back to its last commit"


def _busy(c: SimCluster) -> str:
    """The processor that owns job a's partition (it commits every tick)."""
    name = c.owner(partition_for("a", c.topo.partitions))
    assert name is not None
    return name


def _aborts(c: SimCluster, n: int, *, answer_lost: bool) -> Processor:
    """``n`` of a busy processor's commits fail one after the other, 1.5 s apart; the
    state is checked against the changelogs after each rewind."""
    name = _busy(c)
    proc = c.processor(name)
    for _ in range(n):
        before = proc.aborts
        tid = f"gnomon-processor-{name}"
        (c.log.commit_answer_lost if answer_lost else c.log.fail_next_commit).add(tid)
        for _ in range(200):  # until the failed commit's rewind is done, and no further
            c.run_for(c.step_ms, faults=False)
            if proc.aborts > before and not proc.recovering:
                break
        assert proc.aborts > before, "the injected failure did not fail a commit"
        assert every_owned_partition_matches_its_changelog(c) > 0
        c.run_for(1_500, faults=False)
    return proc


@pytest.mark.parametrize("seed", [1, 2])
def test_an_aborted_transaction_is_rolled_back_not_rebuilt(seed: int) -> None:
    c = cluster(seed, duration_ms=(200, 400))
    c.run_for(4_000, faults=False)
    rebuilt = c.processor(_busy(c)).restores.get("full rebuild", 0)  # (at the start: no checkpoint)
    proc = _aborts(c, 5, answer_lost=False)
    assert proc.restores.get(ROLLED, 0) >= 5 * len(proc.tasks), proc.restores
    assert proc.restores.get("full rebuild", 0) == rebuilt, proc.restores
    c.heal(8_000)
    assert_clean(c)


@pytest.mark.parametrize("seed", [1, 2])
def test_a_commit_that_went_through_unanswered_is_read_back_from_the_changelogs(seed: int) -> None:
    """The coordinator committed; the processor was told it timed out (fatal): a new
    producer, the store rolled back to the commit before, and the tail brings the
    transaction's own writes back in (a rollback alone would lose what it decided)."""
    c = cluster(seed, duration_ms=(200, 400))
    c.run_for(4_000, faults=False)
    proc = _aborts(c, 4, answer_lost=True)
    assert proc.restores.get(ROLLED, 0) >= 4 * len(proc.tasks), proc.restores
    c.heal(8_000)
    assert_clean(c)


def test_without_the_tail_a_rollback_loses_a_commit_that_went_through(monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks above are not vacuous: read no tail after the rollback (take the
    unanswered commit for an abort) and the state is behind its changelogs."""
    real = Processor._restore

    def no_tail(self: Processor, partition: int, **kw: object) -> object:
        rolled = kw.get("rolled_back")
        if rolled is not None:
            store, _ = rolled  # type: ignore[misc]
            kw["rolled_back"] = (store, {t: 10**9 for t in (self.topo.jobs, self.topo.runs)})
        return real(self, partition, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(Processor, "_restore", no_tail)
    c = cluster(1, duration_ms=(200, 400))
    c.run_for(4_000, faults=False)
    with pytest.raises(AssertionError, match="differs from its changelog"):
        _aborts(c, 4, answer_lost=True)


def test_a_transaction_too_large_for_its_journal_is_rebuilt(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past ``TXN_KEYS_MAX`` the journal gives up and an abort rebuilds the partition, as
    before (and the state still matches its changelogs)."""
    from gnomon.processor import task as task_mod

    monkeypatch.setattr(task_mod, "TXN_KEYS_MAX", 2)
    c = cluster(1, duration_ms=(200, 400))
    c.run_for(4_000, faults=False)
    rebuilt = c.processor(_busy(c)).restores.get("full rebuild", 0)
    proc = _aborts(c, 2, answer_lost=False)
    assert proc.restores.get("full rebuild", 0) > rebuilt, proc.restores
    c.heal(8_000)
    assert_clean(c)


@pytest.mark.parametrize("stop_after", [False, True])
def test_partitions_lost_by_a_stalled_processor_stay_warm_at_its_last_commit(stop_after: bool) -> None:
    """p1 frozen past its session (its partitions go to p0, which writes more to their
    changelogs); when it thaws it finds them lost. Before, it dropped their stores (the
    next open rebuilt them in full); now it undoes what it had not committed and keeps
    each store as a warm standby from the offsets its last commit reached at least, so it
    reads p0's writes like any standby, and the group's next assignment restores them from
    those copies. ``stop_after``: p1 also stops and starts again, so the copies go through
    a checkpoint (the scenario where a stale store, checkpointed, once brought a finished
    run back to RUNNING)."""
    c = cluster(7, duration_ms=(200, 400))
    for i in range(8):
        c.register(f"j{i}", "*/5 * * * * *")
    c.run_for(4_000, faults=False)
    p1 = c.processor("p1")
    had, rebuilt = set(p1.tasks), p1.restores.get("full rebuild", 0)
    assert had and all(c.log.end_offset(c.topo.runs, p) > 0 for p in had)
    c.stall("p1", c.cfg.session_timeout_ms + 3_000)
    c.run_for(c.cfg.session_timeout_ms + 4_000, faults=False)  # p1 thawed, found them lost, rejoined
    assert p1.restores.get("full rebuild", 0) == rebuilt, p1.restores
    assert p1.restores.get("from a warm standby", 0) >= len(had), p1.restores
    assert every_owned_partition_matches_its_changelog(c) == c.topo.partitions
    if stop_after:
        c.stop("p1", down_ms=500)
        c.run_for(1_000, faults=False)
    c.stop("p0", down_ms=5_000)  # p1 takes every partition
    c.run_for(3_000, faults=False)
    p1 = c.processor("p1")
    assert set(p1.tasks) == set(range(c.topo.partitions))
    assert p1.restores.get("full rebuild", 0) == (0 if stop_after else rebuilt), p1.restores
    assert every_owned_partition_matches_its_changelog(c) == c.topo.partitions
    c.heal(8_000)
    assert_clean(c)
