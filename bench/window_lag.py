"""Start lag of a finished benchmark's runs in a time window, read back from the ledger.

    .venv/bin/python bench/window_lag.py TAG FROM TO   # FROM/TO: 'YYYY-MM-DD HH:MM:SS' (UTC)

TAG is the job-id prefix a bench printed or used for its log directory
(.gnomon/bench-logs/TAG). Reads the last 200,000 records of each gnomon.runs partition
and prints, for the runs whose slot is in [FROM, TO): how many started, how many had more
than one attempt, and the start-lag percentiles (worker-reported start - slot).
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from pathlib import Path

from confluent_kafka import TopicPartition

from gnomon.config import load
from gnomon.topology import load_topology

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # topic_reading
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "chaos"))  # chaoslib
from chaoslib import end_offsets, read_range


def _ms(text: str) -> int:
    return int(datetime.strptime(text, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp() * 1000)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("tag")
    ap.add_argument("start")
    ap.add_argument("end")
    ap.add_argument("--records", type=int, default=200_000, help="records read back per partition")
    args = ap.parse_args()
    bootstrap, lo, hi = load().kafka_bootstrap, _ms(args.start), _ms(args.end)
    start = [TopicPartition(tp.topic, tp.partition, max(0, tp.offset - args.records))
             for tp in end_offsets(bootstrap, load_topology().runs)]
    runs = {r.run_id: r for r in read_range(bootstrap, start, timeout_s=600)
            if getattr(r, "job_id", "").startswith(args.tag)}
    window = [r for r in runs.values() if lo <= r.slot_ms < hi]
    lags = sorted((r.started_at_ms - r.slot_ms) / 1000 for r in window if r.started_at_ms)
    if not lags:
        print(f"no started runs of {args.tag} with a slot in the window")
        return
    def pct(q: float) -> float:
        return lags[min(len(lags) - 1, int(q * len(lags)))]
    print(f"slots {len(window)} started {len(lags)} not started {len(window) - len(lags)} more than one attempt "
          f"{sum(1 for r in window if r.attempt > 1)}; start lag p50={pct(0.5):.3f} p99={pct(0.99):.3f} "
          f"max={lags[-1]:.3f} s")


if __name__ == "__main__":
    main()
