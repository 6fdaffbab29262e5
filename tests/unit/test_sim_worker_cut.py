"""Issue 51 item 3: a worker cut off from Kafka while runs are staged on it never starts
one of them beside the attempt the processors granted again elsewhere.

The worker keeps running through the cut: its timers fire at the slots and it reports the
starts, but Kafka takes nothing (its adverts neither), so after 2 s the processors find it
lost and grant those runs to the other worker. When its writes get through again its
start reports land late, behind the new grants, and are refused; its inbox, cut longer,
has not told it so yet. Before, it started each attempt as soon as Kafka took its start
report, and killed it only once the refusal came: both workers ran those runs for 3 s.
Now a start report taken late, or after a silence of the worker's adverts, starts its
attempt only once the processor answers a heartbeat for it."""

from __future__ import annotations

import pytest

from gnomon.core import runs as R
from gnomon.sim import SimCluster
from gnomon.worker import worker as worker_mod

pytestmark = pytest.mark.usefixtures("quiet_logs")


def _cut_while_staged(seed: int) -> tuple[SimCluster, set[str], set[str], int]:
    """Worker 0 cut off for 5 s (writes) / 8 s (reads) with runs staged on it. Returns the
    cluster, the runs it started after the cut began, the runs staged on it at the cut,
    and the start reports it was refused."""
    c = SimCluster(seed, duration_ms=(200, 400), workers=2)
    c.register("a", "* * * * * *")
    c.register("b", "*/2 * * * * *")
    c.run_for(5_000, faults=False)
    w0 = c.workers[0]
    assert w0.worker is not None and w0.runner is not None
    gone, runner, worker = w0.worker.worker_id, w0.runner, w0.worker
    cut_at = c.clock.now_ms()
    staged = {s.run_id for s in c.ledger() if s.worker_id == gone and s.staged and s.slot_ms > cut_at}
    c.cut_worker(0, writes_ms=5_000, reads_ms=8_000)
    c.run_for(14_000, faults=False)
    c.heal(8_000)
    rep = c.history_report()
    assert rep.ok and rep.missed == 0 and rep.duplicates == 0, f"{rep.summary()}\n{c.describe()}"
    launched = {run_id for run_id, at in runner.launched if at >= cut_at}
    return c, launched, staged, worker.starts_refused


def _run_twice(c: SimCluster, launched_on_cut: set[str]) -> list[str]:
    """Runs the cut worker started that ended up run (and counted) by the other worker."""
    last = {s.run_id: s for s in c.ledger()}
    gone = c.workers[0].worker.worker_id if c.workers[0].worker else ""
    return sorted(r for r in launched_on_cut if last[r].worker_id != gone and last[r].status is R.RunStatus.SUCCEEDED)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_cut_off_worker_never_starts_a_run_granted_again_elsewhere(seed: int) -> None:
    c, launched, staged, refused = _cut_while_staged(seed)
    assert staged, "no run was staged on the worker when it was cut off"
    last = {s.run_id: s for s in c.ledger()}
    moved = {r for r in staged if last[r].worker_id != c.workers[0].worker.worker_id}  # type: ignore[union-attr]
    assert moved, "no staged run was granted again elsewhere"
    assert all(last[r].status is R.RunStatus.SUCCEEDED and last[r].attempt == 1 for r in moved), \
        [(r, last[r].status, last[r].attempt) for r in moved]
    assert refused > 0, "no late start report was refused"
    assert not _run_twice(c, launched)


def test_without_the_confirmation_the_cut_off_worker_runs_them_beside_the_new_grants(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above is not vacuous: starting on Kafka's acknowledgement alone, the cut
    worker starts the runs the processors already granted elsewhere."""
    monkeypatch.setattr(worker_mod, "START_CONFIRM_AFTER_MS", 10**9)
    monkeypatch.setattr(worker_mod.Worker, "_may_be_lost", lambda self, now: False)
    c, launched, _, refused = _cut_while_staged(1)
    assert refused == 0
    assert _run_twice(c, launched), "the unconfirmed late starts ran beside the new grants"
