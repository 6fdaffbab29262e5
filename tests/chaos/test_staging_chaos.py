"""Issue 6 chaos cases: runs staged on workers ahead of their slot, then

  1. a worker holding staged runs is killed (kill -9) before their slot: the runs move
     to the other worker and still start at their slot;
  2. the only processor is killed (kill -9) while runs are staged and stays down past
     their slot: the workers start them at the slot anyway;
  3. a staged run is cancelled and a staged job is paused: neither command ever runs.

Every ledger and inbox record of the scenario then goes through the history checker.
"Starts on time" is checked loosely: within a few seconds of the slot, while the
fallback without staging (a lease lapse, or a processor that has to restart) would take
at least the 8 s lease or the outage.
"""

from __future__ import annotations

import secrets
import signal
import time
from pathlib import Path

import pytest
from chaoslib import Scenario, log

from gnomon.core.jobs import PauseJob, RegisterJob
from gnomon.core.model import JobSpec, RetryPolicy, Schedule, Target, TargetType
from gnomon.core.runs import CancelRun, RunState, RunStatus

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

ON_TIME_S = 3.0  # far below the 8 s lease and the processor outage below


POOL = "batch"  # its own pool: nothing else in the cluster competes for these workers' slots


def _spec(name: str, schedule: Schedule, argv: tuple[str, ...]) -> JobSpec:
    return JobSpec(name=name, schedule=schedule, target=Target(TargetType.COMMAND, argv=argv), timeout_s=30,
                   retry=RetryPolicy(max_attempts=3, backoff_base_s=0.5, backoff_cap_s=2), pool=POOL)


def _latest(runs: list[RunState]) -> dict[str, RunState]:
    return {r.run_id: r for r in runs}


def _wait_staged(sc: Scenario, prefix: str, n: int, timeout_s: float = 20) -> dict[str, RunState]:
    """Read the ledger until ``n`` runs of jobs ``prefix*`` are staged on a worker."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        runs, _, _ = sc.history()
        staged = {rid: r for rid, r in _latest(runs).items() if rid.startswith(prefix) and r.staged}
        if len(staged) >= n:
            return staged
        time.sleep(0.5)
    raise AssertionError(f"{n} runs of {prefix} were not staged within {timeout_s}s")


def test_staged_runs_survive_worker_and_processor_kills(tmp_path_factory: pytest.TempPathFactory) -> None:
    tag = "stage" + secrets.token_hex(3)
    sc = Scenario(tag, tmp_path_factory.mktemp("staging-logs"), lookahead_s=20)
    markers = tmp_path_factory.mktemp("markers")
    try:
        sc.processor("p1")
        sc.worker("w1", pool=POOL)
        sc.worker("w2", pool=POOL)
        time.sleep(10)  # group join, adverts

        # 1. kill a worker that holds staged runs
        slot1 = (int(time.time()) + 16) * 1000
        for i in range(20):
            sc.send(RegisterJob(f"{tag}-a{i:02d}", "chaos",
                                _spec(f"a{i}", Schedule(run_at_ms=slot1), ("sleep", "0.2")), int(time.time() * 1000)))
        sc.flush()
        staged = _wait_staged(sc, f"{tag}-a", 20)
        on_w1 = sorted(rid for rid, r in staged.items() if r.worker_id == f"{tag}-w1")
        assert on_w1, "runs are spread over both workers"
        sc.signal("w1", signal.SIGKILL)
        log(f"killed w1 holding {len(on_w1)} staged runs, {(slot1 / 1000 - time.time()):.1f}s before their slot")

        # 3. cancel a staged run; pause a staged cron job (their commands must never run)
        slot3 = (int(time.time()) + 15) * 1000
        cancel_marker, pause_marker = markers / "cancelled-ran", markers / "paused-ran"
        sc.send(RegisterJob(f"{tag}-cancel", "chaos", _spec("cancel", Schedule(run_at_ms=slot3),
                                                            ("touch", str(cancel_marker))), int(time.time() * 1000)))
        pause_second = (int(time.time()) + 15) % 60  # once a minute, first slot ~15 s ahead (inside the lookahead)
        sc.send(RegisterJob(f"{tag}-pause", "chaos", _spec("pause", Schedule(cron=f"{pause_second} * * * * *"),
                                                           ("touch", str(pause_marker))), int(time.time() * 1000)))
        sc.flush()
        cancel_run = next(iter(_wait_staged(sc, f"{tag}-cancel", 1)))
        pause_runs = _wait_staged(sc, f"{tag}-pause", 1)
        sc.producer.produce(sc.topo.job_commands, key=f"{tag}-cancel".encode(),  # the API's topic
                            value=_encode(CancelRun(cancel_run, "chaos", int(time.time() * 1000))))
        sc.send(PauseJob(f"{tag}-pause", "chaos", int(time.time() * 1000)))
        sc.flush()
        log(f"cancelled {cancel_run}, paused {tag}-pause with {sorted(pause_runs)} staged")

        # 2. kill the only processor while runs are staged; keep it down past their slot
        time.sleep(max(0.0, slot1 / 1000 - time.time()) + 2)
        slot2 = (int(time.time()) + 12) * 1000
        for i in range(20):
            sc.send(RegisterJob(f"{tag}-b{i:02d}", "chaos",
                                _spec(f"b{i}", Schedule(run_at_ms=slot2), ("sleep", "0.2")), int(time.time() * 1000)))
        sc.flush()
        _wait_staged(sc, f"{tag}-b", 20)
        sc.signal("p1", signal.SIGKILL)
        log("killed the only processor with 20 runs staged")
        time.sleep(max(0.0, slot2 / 1000 - time.time()) + 5)
        sc.processor("p1")
        time.sleep(25)  # restore, start reports and completions applied
        end_ms = int(time.time() * 1000)
    finally:
        sc.stop_all()

    report, runs, _ = sc.check(end_ms)
    assert report.ok, report.summary()
    final = _latest(runs)
    for group, slot in (("a", slot1), ("b", slot2)):
        mine = {rid: r for rid, r in final.items() if rid.startswith(f"{tag}-{group}")}
        assert len(mine) == 20 and all(r.status is RunStatus.SUCCEEDED for r in mine.values()), \
            {rid: r.status.value for rid, r in mine.items()}
        lags = sorted(((r.started_at_ms or 0) - slot) / 1000 for r in mine.values())
        log(f"group {group}: start lag min {lags[0]:.3f}s max {lags[-1]:.3f}s")
        assert all(0 <= lag <= ON_TIME_S for lag in lags), lags  # never early; on time despite the kill
    moved = [final[rid] for rid in on_w1]
    assert all(r.worker_id == f"{tag}-w2" and r.attempt == 1 for r in moved)
    cancelled = final[cancel_run]
    assert cancelled.status is RunStatus.CANCELLED and cancelled.started_at_ms is None
    for rid in pause_runs:
        assert final[rid].status is RunStatus.SKIPPED and final[rid].reason == "paused"
    assert not Path(cancel_marker).exists() and not Path(pause_marker).exists(), "a dropped run was started"


def _encode(obj: object) -> bytes:
    from gnomon import codec

    return codec.encode(obj)
