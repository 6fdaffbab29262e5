"""Issue 3 chaos suite: real processes killed on purpose under load from many jobs,
then every ledger and inbox record of the scenario goes through the history checker.

Timeline (lease 8 s, lookahead 10 s so the scenario fits CI):
  two processors, two workers, 40 jobs (every 2/3/5 s; some attempts take 3 s;
  catch-up policies skip/once/all) ->
  kill -9 processor A (B takes its partitions over from warm standby copies, as the
  restore lines of B's log must say); restart A 15 s later ->
  SIGSTOP worker 2 past its lease, SIGCONT (its late completions must be rejected) ->
  kill -9 worker 1 mid-attempt (its leases lapse, others retry); start worker 3 ->
  kill -9 both processors, keep them down 35 s past a 20 s misfire grace (120 s past the
  default 60 s with ``make test-long``), restart (catch-up policies apply) ->
  pause every job, let the lookahead drain, and check.
"""

from __future__ import annotations

import secrets
import signal
import time
from collections import Counter
from pathlib import Path

import pytest
from chaoslib import LONG, Scenario, log

from gnomon.core.jobs import PauseJob, RegisterJob
from gnomon.core.model import CatchUp, JobSpec, RetryPolicy, Schedule, Target, TargetType
from gnomon.core.runs import RunStatus

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

OUTAGE_S = 120 if LONG else 35  # every processor down: longer than the grace, so catch-up applies
GRACE_S = 60 if LONG else 20  # the processors' --misfire-grace-s


def _restored_since(path: Path, offset: int) -> list[str]:
    """The "partition N restored:" lines ``path`` has after byte ``offset``."""
    with open(path, "rb") as f:
        f.seek(offset)
        return [ln for ln in f.read().decode(errors="replace").splitlines() if "restored:" in ln]


def test_processors_and_workers_killed_under_load(tmp_path_factory: pytest.TempPathFactory) -> None:
    tag = "chaos" + secrets.token_hex(3)
    sc = Scenario(tag, tmp_path_factory.mktemp("chaos-logs"), processor_args=("--misfire-grace-s", str(GRACE_S)))
    policies = [CatchUp.SKIP, CatchUp.ONCE, CatchUp.ALL]
    jobs: dict[str, CatchUp] = {}
    try:
        sc.processor("pA")
        sc.processor("pB")
        sc.worker("w1")
        sc.worker("w2")
        sc.wait_ready("pA", "pB", "w1", "w2")  # group joins and restores
        time.sleep(2)  # the group settles: a processor that joined first is rebalanced once more
        now = int(time.time() * 1000)
        for i in range(40):
            job_id = f"{tag}-{i:02d}"
            # some attempts outlive a lease, so a stopped or killed worker always holds one
            argv = ("sleep", "12") if i % 8 == 0 else ("sleep", "3") if i % 4 == 0 else ("sleep", "0.2")
            spec = JobSpec(name=job_id, schedule=Schedule(cron=["*/2 * * * * *", "*/3 * * * * *", "*/5 * * * * *"][i % 3]),
                           target=Target(TargetType.COMMAND, argv=argv), timeout_s=20,
                           retry=RetryPolicy(max_attempts=5, backoff_base_s=0.5, backoff_cap_s=2),
                           catch_up=policies[i % 3])
            jobs[job_id] = spec.catch_up
            sc.send(RegisterJob(job_id, "chaos", spec, now))
        sc.flush()
        log("registered 40 jobs")
        time.sleep(15)
        survivor_log = sc.logs / "pB.log"
        before_kill = survivor_log.stat().st_size
        sc.signal("pA", signal.SIGKILL)  # pB takes pA's partitions over from its warm standbys
        time.sleep(15)
        takeover = _restored_since(survivor_log, before_kill)
        sc.processor("pA")
        time.sleep(8)
        sc.signal("w2", signal.SIGSTOP)
        time.sleep(sc.lease_s + 6)
        sc.signal("w2", signal.SIGCONT)
        time.sleep(6)
        sc.signal("w1", signal.SIGKILL)
        sc.worker("w3")
        time.sleep(14)
        down_at = int(time.time() * 1000)
        sc.signal("pA", signal.SIGKILL)
        sc.signal("pB", signal.SIGKILL)
        log(f"all processors down for {OUTAGE_S}s")
        time.sleep(OUTAGE_S)
        sc.processor("pA")
        sc.processor("pB")
        sc.wait_ready("pA", "pB", timeout_s=120)  # (a slow box restores for longer: catch-up runs from then)
        time.sleep(15)
        now = int(time.time() * 1000)
        for job_id in jobs:
            sc.send(PauseJob(job_id, "chaos", now))
        sc.flush()
        log("paused every job; draining the lookahead")
        sc.settle(list(jobs))
        end_ms = int(time.time() * 1000)
    finally:
        sc.stop_all()
    log("takeover after kill -9: " + "; ".join(ln.split(": ", 1)[-1] for ln in takeover))
    assert takeover and all("from a warm standby" in ln for ln in takeover), takeover
    report, runs, _last = sc.check(end_ms)
    assert report.ok, report.verdict()
    # every job accounted for, each from its first slot to its pause (over two minutes:
    # at least 24 slots of the sparsest schedule, every 5 s)
    assert set(report.jobs) == set(jobs) and not report.jobs_short_of(20), report.jobs_short_of(20)
    assert report.stale_rejected > 0, "worker 2's late completions should have been rejected"
    final = {r.run_id: r for r in runs}
    retried = [r for r in final.values() if r.attempt >= 2]
    assert retried, "attempts on the killed/stopped workers should have been retried"
    assert all(r.status is not RunStatus.RUNNING or (r.lease_until_ms or 0) >= end_ms for r in final.values())
    # catch-up after the outage: slots missed by more than the grace follow each job's policy
    reasons = Counter((jobs[r.job_id], r.reason) for r in final.values() if r.status is RunStatus.SKIPPED
                      and r.slot_ms >= down_at)
    log(f"skips after the outage by (policy, reason): {dict(reasons)}")
    assert reasons[(CatchUp.SKIP, "catch-up policy skip")] > 0
    assert reasons[(CatchUp.ONCE, "catch-up policy once")] > 0
    assert not any(policy is CatchUp.ALL and "catch-up" in (reason or "") for policy, reason in reasons)
