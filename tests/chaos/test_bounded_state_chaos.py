"""Issue 7 chaos cases on the real broker: bounded state under a rolling restart.

Two processors purge finished runs 3 s after they end (``--retention-s 3``), once the
history projector has them, while 10 jobs fire every second on two workers. During the
run:

  1. triggers for slots already run are replayed onto gnomon.run-events, some for runs
     already purged (tombstoned), some racing their purge: none may run a slot again;
  2. both processors are restarted one by one with SIGTERM (a rolling restart): their
     partitions are handed over, nothing is missed or doubled;
  3. one processor is killed (kill -9): the other takes its partitions over from its
     warm standby copies (it reads only the changelog tail).

Then every ledger and inbox record of the scenario goes through the history checker:
0 missed, 0 doubled, 0 stale accepted. The purge is shown by the tombstones on the
ledger, and the start lag of the slots around the restarts is printed.
"""

from __future__ import annotations

import secrets
import signal
import time
from pathlib import Path

import pytest
from chaoslib import Scenario, end_offsets, log, read_range

from gnomon import codec
from gnomon.core.jobs import RegisterJob, RunTriggered
from gnomon.core.messages import PoisonRecord
from gnomon.core.model import JobSpec, RetryPolicy, Schedule, Target, TargetType, slot_run_id
from gnomon.core.runs import RunState, RunStatus

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

POOL = "batch"
JOBS = 10
RETENTION_S = 3


def _spec(name: str) -> JobSpec:
    return JobSpec(name=name, schedule=Schedule(cron="* * * * * *"), target=Target(TargetType.COMMAND, argv=("true",)),
                   timeout_s=30, retry=RetryPolicy(max_attempts=3, backoff_base_s=0.5, backoff_cap_s=2), pool=POOL)


def _replay(sc: Scenario, tag: str, runs: list[RunState]) -> int:
    """Produce a trigger for every finished slot seen so far (as a stale replay would)."""
    n = 0
    for r in {r.run_id: r for r in runs}.values():
        if not r.status.terminal or r.manual:
            continue
        cmd = RunTriggered(slot_run_id(r.job_id, r.slot_ms), r.job_id, r.tenant, _spec(r.job_id), r.slot_ms,
                           r.slot_ms, False, r.created_at_ms)
        sc.producer.produce(sc.topo.run_events, key=r.job_id.encode(), value=codec.encode(cmd))
        n += 1
    sc.flush()
    return n


def _restored_since(path: Path, offset: int) -> list[str]:
    """The "partition N restored:" lines ``path`` has after byte ``offset``."""
    with open(path, "rb") as f:
        f.seek(offset)
        return [ln for ln in f.read().decode(errors="replace").splitlines() if "restored:" in ln]


def _restart(sc: Scenario, name: str, retention: list[str]) -> None:
    sc.signal(name, signal.SIGTERM)
    sc.procs[name].wait(60)
    del sc.procs[name]
    sc.start(name, "processor", "--instance-id", f"{sc.tag}-{name}", "--lease-s", str(sc.lease_s),
             "--lookahead-s", str(sc.lookahead_s), *retention)


def test_purge_races_replays_through_a_rolling_restart(tmp_path_factory: pytest.TempPathFactory) -> None:
    tag = "purge" + secrets.token_hex(3)
    sc = Scenario(tag, tmp_path_factory.mktemp("purge-logs"))
    retention = ["--retention-s", str(RETENTION_S)]
    poison_from = end_offsets(sc.settings.kafka_bootstrap, sc.topo.poison)
    try:
        sc.start("history", "projector")
        for name in ("p1", "p2"):
            sc.start(name, "processor", "--instance-id", f"{tag}-{name}", "--lease-s", str(sc.lease_s),
                     "--lookahead-s", str(sc.lookahead_s), *retention)
        sc.worker("w1", pool=POOL)
        sc.worker("w2", pool=POOL)
        time.sleep(10)  # group join, adverts
        t0 = int(time.time() * 1000)
        for i in range(JOBS):
            sc.send(RegisterJob(f"{tag}-j{i:02d}", "chaos", _spec(f"j{i}"), t0))
        sc.flush()
        time.sleep(25)  # runs end, history takes them, the purge follows 3 s later

        runs, _, _ = sc.history()
        purged_before = sc.tombstones(f"{tag}-")
        log(f"{len(purged_before)} runs purged so far; replaying {_replay(sc, tag, runs)} triggers")
        assert purged_before, "finished runs should have left state by now"

        restart_from = int(time.time() * 1000)
        _restart(sc, "p1", retention)  # rolling restart, one processor at a time
        time.sleep(12)
        runs, _, _ = sc.history()
        log(f"replaying {_replay(sc, tag, runs)} triggers while p2 restarts")
        _restart(sc, "p2", retention)
        time.sleep(12)
        restart_to = int(time.time() * 1000)
        runs, _, _ = sc.history()
        log(f"replaying {_replay(sc, tag, runs)} triggers after the restarts")
        time.sleep(8)
        survivor_log = sc.logs / "p2.log"
        before_kill = survivor_log.stat().st_size
        sc.signal("p1", signal.SIGKILL)  # standby takeover
        kill_ms = int(time.time() * 1000)
        # the survivor takes every partition over (the session timeout, then a restore from
        # its standbys: slower on a loaded machine), then expires the leases that lapsed
        # meanwhile; a fixed sleep here once ended the scenario before it had
        partitions = len(end_offsets(sc.settings.kafka_bootstrap, sc.topo.run_events))
        deadline = time.monotonic() + 90
        while len(_restored_since(survivor_log, before_kill)) < partitions and time.monotonic() < deadline:
            time.sleep(0.5)
        log(f"survivor restored {len(_restored_since(survivor_log, before_kill))}/{partitions} partitions "
            f"{(time.time() * 1000 - kill_ms) / 1000:.1f}s after the kill")
        time.sleep(max(15 - (time.time() * 1000 - kill_ms) / 1000, sc.lease_s + 4))
        end_ms = int(time.time() * 1000)
    finally:
        sc.stop_all()

    report, runs, _ = sc.check(end_ms)
    assert report.ok and report.missed == 0 and report.duplicates == 0, report.summary()
    purged = sc.tombstones(f"{tag}-")
    final = {r.run_id: r for r in runs}
    assert len(purged) > len(purged_before) > 0
    assert all(final[rid].status.terminal for rid in purged), "only finished runs are purged"
    lags = sorted(((r.started_at_ms or 0) - r.slot_ms) / 1000 for r in final.values()
                  if r.status is RunStatus.SUCCEEDED and restart_from <= r.slot_ms <= restart_to)
    assert lags, "slots during the rolling restart ran"
    p99 = lags[min(len(lags) - 1, int(len(lags) * 0.99))]
    log(f"rolling restart: {len(lags)} slots, start lag p50 {lags[len(lags) // 2]:.3f}s p99 {p99:.3f}s "
        f"max {lags[-1]:.3f}s; {len(purged)} runs purged")
    assert lags[0] >= 0  # never early
    takeover = _restored_since(survivor_log, before_kill)
    log("takeover after kill -9: " + "; ".join(ln.split(": ", 1)[-1] for ln in takeover))
    assert takeover and all("from a warm standby" in ln for ln in takeover), takeover
    kill_lags = sorted(((r.started_at_ms or 0) - r.slot_ms) / 1000 for r in final.values()
                       if r.status is RunStatus.SUCCEEDED and kill_ms <= r.slot_ms <= end_ms - 5_000)
    assert kill_lags and kill_lags[0] >= 0
    log(f"kill -9: {len(kill_lags)} slots after it, start lag p50 {kill_lags[len(kill_lags) // 2]:.3f}s "
        f"max {kill_lags[-1]:.3f}s")
    refused = [p for p in read_range(sc.settings.kafka_bootstrap, poison_from)
               if isinstance(p, PoisonRecord) and (p.key or b"").startswith(tag.encode()) and "refused" in p.reason]
    log(f"{len(refused)} replayed triggers refused (on gnomon.poison with the reason)")
    assert refused, "triggers replayed for purged slots are refused, visibly"
