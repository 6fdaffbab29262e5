"""Processor failover: kill -9 one of two processors under load and measure how long
its partitions go quiet, and the start lag of runs whose slots fall in the failover.

    .venv/bin/python bench/failover.py [--jobs 200] [--kills 3]
    .venv/bin/python bench/failover.py --mode rolling [--kills 2]   # SIGTERM + restart, one by one
    .venv/bin/python bench/failover.py --mode quiet --quiet-s 600   # no faults: count false takeovers

Starts 2 processors and 2 workers as separate processes on the running broker
(`gnomon infra up` first), registers N jobs firing every second, and kills -9 a
processor `--kills` times (restarting it each time). For each kill it prints the gap
from the kill until the first ledger write on each of the victim's partitions, and the
start-lag percentiles (worker-reported start - slot) of runs whose slot is within 60 s after it
(and before the jobs are paused at the end),
and how many of those slots did not run (missed) or ran twice (more than one attempt started).
"""

from __future__ import annotations

import argparse
import re
import secrets
import signal
import sys
import time
from pathlib import Path

from gnomon.adapters.kafka import partition_for
from gnomon.config import load
from gnomon.core.jobs import PauseJob, RegisterJob
from gnomon.core.model import JobSpec, Schedule, Target, TargetType
from gnomon.topology import load_topology

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # topic_reading
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "chaos"))  # chaoslib
from chaoslib import Scenario


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] if xs else float("nan")


def owned_partitions(logfile: Path) -> list[int]:
    found: list[int] = []
    for line in logfile.read_text(errors="replace").splitlines():
        m = re.search(r"assigned partitions \[([0-9, ]*)\]", line)
        if m:
            found = [int(x) for x in m.group(1).split(",") if x.strip()]
        if "revoked partitions" in line:
            found = []
    return found


def partition_moves(logfile: Path) -> int:
    """Rebalances that took partitions from this processor (revoked or lost)."""
    text = logfile.read_text(errors="replace") if logfile.exists() else ""
    return text.count("revoked partitions [") - text.count("revoked partitions []") + text.count("lost partitions [")


def workers_lost(logfile: Path) -> int:
    """Workers this processor declared lost (no advert for DEAD_AFTER_MS): with no fault,
    each is a false one (its staged runs moved while it was alive)."""
    text = logfile.read_text(errors="replace") if logfile.exists() else ""
    return len(re.findall(r"worker \S+ lost \(", text))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--kills", type=int, default=3)
    ap.add_argument("--between-s", type=float, default=65)
    ap.add_argument("--mode", choices=("kill", "rolling", "quiet"), default="kill",
                    help="kill: kill -9 and restart; rolling: SIGTERM, wait for the exit, restart at once; "
                         "quiet: no faults for --quiet-s, then count partition moves (false takeovers)")
    ap.add_argument("--quiet-s", type=float, default=600)
    ap.add_argument("--warmup-s", type=float, default=15, help="load before the first event")
    ap.add_argument("--settle-s", type=float, default=10,
                    help="after restarting a victim, wait this long before the next event (its standbys warm up)")
    ap.add_argument("--no-standbys", action="store_true", help="processors without warm standbys (for comparison)")
    args = ap.parse_args()
    s, topo = load(), load_topology()
    from gnomon.infra import manager

    manager.up(s)
    tag = "fo" + secrets.token_hex(3)
    logs = Path(s.state_dir) / "bench-logs" / tag
    logs.mkdir(parents=True, exist_ok=True)
    sc = Scenario(tag, logs, lease_s=30, lookahead_s=30, worker_tenants=("bench",),
                  processor_args=("--no-standbys",) if args.no_standbys else ())
    kills: list[tuple[int, list[int]]] = []
    t_pause = 1 << 62
    quiet_from = quiet_to = 0
    try:
        sc.processor("pA")
        sc.processor("pB")
        sc.worker("w1", 500)
        sc.worker("w2", 500)
        time.sleep(12)
        spec = JobSpec(name="fo", schedule=Schedule(cron="* * * * * *"), target=Target(TargetType.HANDLER, handler="noop"),
                       timeout_s=30)
        now = int(time.time() * 1000)
        for i in range(args.jobs):
            sc.send(RegisterJob(f"{tag}-{i:05d}", "bench", spec, now))
        sc.flush()
        time.sleep(args.warmup_s)
        moves_before = {n: partition_moves(logs / f"{n}.log") for n in ("pA", "pB")}
        lost_before = {n: workers_lost(logs / f"{n}.log") for n in ("pA", "pB")}
        if args.mode == "quiet":
            print(f"no faults for {args.quiet_s:.0f} s", file=sys.stderr)
            quiet_from = int(time.time() * 1000)
            time.sleep(args.quiet_s)
            quiet_to = int(time.time() * 1000)
            moves = {n: partition_moves(logs / f"{n}.log") - moves_before[n] for n in ("pA", "pB")}
            lost = {n: workers_lost(logs / f"{n}.log") - lost_before[n] for n in ("pA", "pB")}
        for k in range(args.kills if args.mode != "quiet" else 0):
            victim = "pA" if k % 2 == 0 else "pB"
            parts = owned_partitions(logs / f"{victim}.log")
            t_kill = int(time.time() * 1000)
            if args.mode == "rolling":
                sc.signal(victim, signal.SIGTERM)
                sc.procs[victim].wait(60)
                del sc.procs[victim]
                print(f"restart {k + 1}: {victim} stopped in {time.time() - t_kill / 1000:.1f} s", file=sys.stderr)
            else:
                sc.signal(victim, signal.SIGKILL)
                time.sleep(args.between_s)
            kills.append((t_kill, parts))
            print(f"{args.mode} {k + 1}: {victim} owned partitions {parts}", file=sys.stderr)
            sc.processor(victim)
            time.sleep(args.between_s if args.mode == "rolling" else args.settle_s)
        now = t_pause = int(time.time() * 1000)
        for i in range(args.jobs):
            sc.send(PauseJob(f"{tag}-{i:05d}", "bench", now))
        sc.flush()
        time.sleep(5)
    finally:
        sc.stop_all()
    runs, _, _ = sc.history()
    print(f"jobs={args.jobs} (every 1 s) processors=2 workers=2 mode={args.mode} events={len(kills)} "
          f"standbys={'off' if args.no_standbys else 'on'}")
    for name in ("pA", "pB"):
        for line in (logs / f"{name}.log").read_text(errors="replace").splitlines():
            if "restored:" in line and "restored: 0 records" not in line:
                print(f"  {name}: {line.split(': ', 1)[-1]}")
    if args.mode == "quiet":
        final = {x.run_id: x for x in runs}
        window = [r for r in final.values() if quiet_from <= r.slot_ms < quiet_to]  # not the start-up
        lags = [(r.started_at_ms - r.slot_ms) / 1000 for r in window if r.started_at_ms]
        print(f"quiet {args.quiet_s:.0f} s: partition moves (revoked or lost) after warm-up: {moves}; "
              f"live workers declared lost: {lost}; "
              f"start lag p50={pct(lags, 50):.3f} p99={pct(lags, 99):.3f} max={max(lags, default=0):.3f} s "
              f"(n={len(lags)}, not started={len(window) - len(lags)}, "
              f"more than one attempt={sum(1 for r in window if r.attempt > 1)})")
    for k, (t_kill, parts) in enumerate(kills, 1):
        first_write: dict[int, int] = {}
        for r in runs:
            p = partition_for(r.job_id, topo.partitions)
            if p in parts and r.updated_at_ms > t_kill:
                first_write[p] = min(first_write.get(p, 1 << 62), r.updated_at_ms)
        gaps = [(first_write.get(p, 1 << 62) - t_kill) / 1000 for p in parts]
        final = {x.run_id: x for x in runs}
        window = [r for r in final.values() if t_kill <= r.slot_ms < min(t_kill + 60_000, t_pause - 2_000)]
        lags = [(r.started_at_ms - r.slot_ms) / 1000 for r in window if r.started_at_ms]
        not_run = sum(1 for r in window if r.started_at_ms is None)
        retried = sum(1 for r in window if r.attempt > 1)
        print(f"{args.mode} {k}: partitions {parts} quiet for {min(gaps):.1f}-{max(gaps):.1f} s; "
              f"start lag of slots in the next 60 s: p50={pct(lags, 50):.3f} p99={pct(lags, 99):.3f} "
              f"max={max(lags) if lags else float('nan'):.3f} s (n={len(lags)}, not started={not_run}, "
              f"more than one attempt={retried})")


if __name__ == "__main__":
    main()
