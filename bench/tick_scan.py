"""Tick cost vs. jobs registered: a partition with N idle jobs and a handful due.

    .venv/bin/python bench/tick_scan.py [--idle 100000] [--due 5]

Registers the jobs straight into one partition's RocksDB state (the same PartitionTask
the processor runs), then times ticks. Prints, for N = 1,000 and N = --idle, the time
per tick and how many jobs each tick examined. The tick reads the due index up to
now + lookahead, so both numbers should stay flat as N grows.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from gnomon.adapters.kv import RocksKV
from gnomon.core import jobs as J
from gnomon.core.model import JobSpec, Schedule, Target, TargetType
from gnomon.processor.task import PartitionTask
from gnomon.topology import load_topology

T0 = 1_803_859_200_000  # 2027-03-01T00:00:00Z; idle jobs next fire 2028-01-01
CMD = Target(TargetType.COMMAND, argv=("true",))


def build(n_idle: int, n_due: int, root: Path) -> PartitionTask:
    task = PartitionTask(0, RocksKV(root / f"idle{n_idle}", fresh=True), load_topology())
    idle = JobSpec(name="idle", schedule=Schedule(cron="0 0 1 1 *"), target=CMD)  # next: a year away
    due = JobSpec(name="due", schedule=Schedule(cron="*/5 * * * * *"), target=CMD)
    step = max(1, n_idle // 20)
    for i in range(n_idle):
        task.handle(J.RegisterJob(f"idle-{i:07d}", "t", idle, T0))
        if i % step == 0:
            print(f"\r  registering idle jobs {i:>8}/{n_idle}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    for i in range(n_due):
        task.handle(J.RegisterJob(f"due-{i}", "t", due, T0))
    return task


def measure(task: PartitionTask, ticks: int) -> tuple[float, float, int]:
    times = []
    examined_before = task.stats.tick_jobs_examined
    now = T0
    for _ in range(ticks):
        now += 1000
        t = time.perf_counter()
        task.tick(now)
        times.append((time.perf_counter() - t) * 1000)
    examined = task.stats.tick_jobs_examined - examined_before
    return statistics.median(times), max(times), examined // ticks


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--idle", type=int, default=100_000)
    ap.add_argument("--due", type=int, default=5)
    ap.add_argument("--ticks", type=int, default=200)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        rows = []
        for n in (1_000, args.idle):
            task = build(n, args.due, Path(d))
            med, worst, examined = measure(task, args.ticks)
            rows.append((n, med, worst, examined))
            task.kv.close()
    print(f"{'idle jobs':>10} {'due jobs':>8} {'tick p50 ms':>12} {'tick max ms':>12} {'jobs examined/tick':>19}")
    for n, med, worst, examined in rows:
        print(f"{n:>10} {args.due:>8} {med:>12.3f} {worst:>12.3f} {examined:>19}")
    print(f"ratio p50 ({rows[1][0]} / {rows[0][0]} idle): {rows[1][1] / rows[0][1]:.2f}x")


if __name__ == "__main__":
    main()
