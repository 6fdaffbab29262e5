"""Catch-up without a flood: a long processor outage, then slots due now must start on time.

    .venv/bin/python bench/outage.py [--backlog-jobs 100] [--punctual-jobs 20] [--outage-s 1200]

Starts one processor and two workers on the running broker (`gnomon infra up` first) and
registers two groups of jobs firing every second (catch-up `once`): the backlog jobs and
the punctual jobs. Then the processor is killed (kill -9) and kept down for
`--outage-s` while the workers stay up. When it comes back, every job has missed
`outage-s` slots: each job's missed slots must become one skipped range (plus the one
catch-up run), and the slots due from the moment the processor owns its partitions
again must start on time while that backlog is decided.

Prints: skip records written and the slots they account for (the history checker over
every ledger record: missed and doubled must be 0), and the start lag (worker-reported
start - slot) of the punctual jobs' slots in the first 60 s after the processor owned its
partitions again.
"""

from __future__ import annotations

import argparse
import re
import secrets
import signal
import sys
import time
from datetime import datetime
from pathlib import Path

from gnomon.config import load
from gnomon.core.jobs import PauseJob, RegisterJob
from gnomon.core.model import CatchUp, JobSpec, Schedule, Target, TargetType
from gnomon.core.runs import RunStatus

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # topic_reading
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "chaos"))  # chaoslib
from chaoslib import Scenario


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] if xs else float("nan")


def owned_at_ms(logfile: Path, after_ms: int) -> int | None:
    """When the processor logged its last partition restored, after ``after_ms``."""
    last = None
    for line in logfile.read_text(errors="replace").splitlines():
        if "restored:" not in line:
            continue
        m = re.match(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})", line)
        if m:
            ms = int(datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp() * 1000)
            if ms > after_ms:
                last = ms
    return last


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backlog-jobs", type=int, default=100)
    ap.add_argument("--punctual-jobs", type=int, default=20)
    ap.add_argument("--outage-s", type=float, default=1200)
    ap.add_argument("--after-s", type=float, default=75, help="how long to run after the processor is back")
    args = ap.parse_args()
    s = load()
    from gnomon.infra import manager

    manager.up(s)
    tag = "out" + secrets.token_hex(3)
    logs = Path(s.state_dir) / "bench-logs" / tag
    logs.mkdir(parents=True, exist_ok=True)
    sc = Scenario(tag, logs, lease_s=30, lookahead_s=30, worker_tenants=("bench",))
    every_s = JobSpec(name="o", schedule=Schedule(cron="* * * * * *"), target=Target(TargetType.HANDLER, handler="noop"),
                      timeout_s=30, catch_up=CatchUp.ONCE)
    backlog = [f"{tag}-b{i:04d}" for i in range(args.backlog_jobs)]
    punctual = [f"{tag}-p{i:03d}" for i in range(args.punctual_jobs)]
    try:
        sc.processor("p1")
        sc.worker("w1", 200)
        sc.worker("w2", 200)
        time.sleep(12)
        now = int(time.time() * 1000)
        for job_id in [*backlog, *punctual]:
            sc.send(RegisterJob(job_id, "bench", every_s, now))
        sc.flush()
        time.sleep(10)
        sc.signal("p1", signal.SIGKILL)
        t_down = int(time.time() * 1000)
        print(f"processor down for {args.outage_s:.0f} s", file=sys.stderr)
        waited = 0.0
        while waited < args.outage_s:
            step = min(60.0, args.outage_s - waited)
            time.sleep(step)
            waited += step
            print(f"  outage: {waited:.0f}/{args.outage_s:.0f} s", file=sys.stderr)
        t_back = int(time.time() * 1000)
        sc.processor("p1")
        time.sleep(args.after_s)
        t_pause = int(time.time() * 1000)
        for job_id in [*backlog, *punctual]:
            sc.send(PauseJob(job_id, "bench", t_pause))
        sc.flush()
        time.sleep(5)
    finally:
        sc.stop_all()
    owned = owned_at_ms(logs / "p1.log", t_back) or t_back
    report, runs, _ = sc.check(int(time.time() * 1000))
    final = {r.run_id: r for r in runs}
    skips = [r for r in final.values() if r.status is RunStatus.SKIPPED and r.reason and "catch-up" in r.reason]
    window = [r for r in final.values() if r.job_id in set(punctual) and owned <= r.slot_ms < min(owned + 60_000, t_pause)]
    lags = [(r.started_at_ms - r.slot_ms) / 1000 for r in window if r.started_at_ms]
    print(f"jobs={args.backlog_jobs}+{args.punctual_jobs} (every 1 s, catch-up once) outage={(t_back - t_down) / 1000:.0f} s "
          f"processor owned its partitions {(owned - t_back) / 1000:.1f} s after its restart")
    print(f"catch-up: {len(skips)} skipped-range records for {sum(r.skipped_count for r in skips)} missed slots; "
          f"checker: {report.summary()}")
    print(f"punctual jobs, slots in the first 60 s after the partitions were owned again: start lag "
          f"p50={pct(lags, 50):.3f} p99={pct(lags, 99):.3f} max={max(lags, default=float('nan')):.3f} s "
          f"(n={len(lags)}, not started={sum(1 for r in window if r.started_at_ms is None)})")


if __name__ == "__main__":
    main()
