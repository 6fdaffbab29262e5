"""Ride out a broker outage (issue 21), with outages of any length: every broker of a
cluster of its own stopped under per-second jobs, then started again.

    .venv/bin/python bench/broker_outage.py [--nodes 1|3] [--outage-s 600] [--jobs 20] [--after-s 60]

Starts a Kafka cluster of its own (ports 24092+ for one node, 29092+ for three: the shared
stack is not touched), one processor and one worker on it, and `--jobs` jobs firing every
second (catch-up `once`). Prints per outage when runs started again after the brokers
were back, the start lag of the slots from 30 s after the return, the history checker's
verdict and whether every process is alive and healthy (`/healthz`).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # topic_reading
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "chaos"))  # chaoslib
from outagelib import own_cluster, run_outages


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, choices=(1, 3), default=1)
    ap.add_argument("--outage-s", type=float, action="append", help="repeat for several outages (default 600)")
    ap.add_argument("--jobs", type=int, default=20)
    ap.add_argument("--after-s", type=float, default=60.0, help="how long to run after each return")
    args = ap.parse_args()
    outages = args.outage_s or [600.0]
    with tempfile.TemporaryDirectory(prefix="gnomon-outage-") as tmp:
        logs = Path(tmp)
        port = 24092 if args.nodes == 1 else 29092
        with own_cluster(logs / f"kafka{args.nodes}", args.nodes, port) as settings:
            res = run_outages(logs, settings, args.nodes, outages, jobs_n=args.jobs, after_s=args.after_s)
        print(f"{args.nodes} broker(s), {args.jobs} jobs every 1 s (catch-up once)")
        for o in res.outages:
            print(o.summary())
        skips = [r for r in {r.run_id: r for r in res.runs}.values() if r.reason and "catch-up" in r.reason]
        print(f"catch-up: {len(skips)} skipped-range records for {sum(r.skipped_count for r in skips)} slots; "
              f"checker: {res.report.summary()}")
        print(f"alive: {res.alive}; health: {res.healthy}")


if __name__ == "__main__":
    main()
