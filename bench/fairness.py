"""Weighted priorities under contention, on the real stack.

    .venv/bin/python bench/fairness.py [--jobs 600] [--slots 20] [--hold-s 1]

Starts one processor and one worker with ``--slots`` slots on the running broker
(`gnomon infra up` first), registers ``--jobs`` one-time jobs, a third per priority, all
due in the same second, each holding a worker slot for ``--hold-s`` (the `sleep`
handler), so ``jobs`` runs compete for ``slots`` slots. Prints, from the run ledger:

* the priority mix of the starts, per window of 100 starts, and over the first
  starts while every tier still had a backlog (the target is the processor's
  --priority-weights, 70/20/10 by default);
* start lag (worker start - slot) per priority;
* runs running at once per tenant, the most in each 5-second window (quotas are not built yet:
  one tenant here).
"""

from __future__ import annotations

import argparse
import secrets
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

from gnomon.config import load
from gnomon.core.jobs import RegisterJob
from gnomon.core.model import JobSpec, Priority, RetryPolicy, Schedule, Target, TargetType

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "chaos"))
from chaoslib import Scenario

TIERS = ("high", "normal", "low")


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=600)
    ap.add_argument("--slots", type=int, default=20)
    ap.add_argument("--hold-s", type=float, default=1.0)
    args = ap.parse_args()
    s = load()
    from gnomon.infra import manager

    manager.up(s)
    tag = "fair" + secrets.token_hex(3)
    logs = Path(s.state_dir) / "bench-logs" / tag
    logs.mkdir(parents=True, exist_ok=True)
    sc = Scenario(tag, logs, lease_s=30, lookahead_s=30, worker_tenants=("bench",))
    prio_of: dict[str, str] = {}
    try:
        sc.processor("p1")
        sc.worker("w1", args.slots)
        time.sleep(12)
        slot = (int(time.time()) + 20) * 1000
        for i in range(args.jobs):
            tier = TIERS[i % 3]
            job_id = f"{tag}-{i:05d}"
            prio_of[job_id] = tier
            spec = JobSpec(name="fair", schedule=Schedule(run_at_ms=slot),
                           target=Target(TargetType.HANDLER, handler="sleep"), payload_json=f'{{"s": {args.hold_s}}}',
                           priority=Priority(tier), timeout_s=300, retry=RetryPolicy(max_attempts=1))
            sc.send(RegisterJob(job_id, "bench", spec, int(time.time() * 1000)))
        sc.flush()
        expected_s = 20 + args.jobs * args.hold_s / args.slots
        print(f"{args.jobs} runs due at one slot, {args.slots} worker slots, {args.hold_s:g} s each: "
              f"about {expected_s:.0f} s", file=sys.stderr)
        time.sleep(expected_s + 15)
    finally:
        sc.stop_all()
    report, runs, _ = sc.check(int(time.time() * 1000))
    final = {r.run_id: r for r in runs if r.job_id in prio_of}
    started = sorted((r for r in final.values() if r.started_at_ms), key=lambda r: r.started_at_ms or 0)
    print(f"runs={len(final)} started={len(started)} checker: {report.summary()}")
    per_tier = args.jobs // 3
    backlog_n = 0  # starts before the first tier ran out
    seen: Counter[str] = Counter()
    for r in started:
        seen[prio_of[r.job_id]] += 1
        if min(per_tier - seen[t] for t in TIERS) <= 0:
            break
        backlog_n += 1
    first = Counter(prio_of[r.job_id] for r in started[:backlog_n])
    print(f"mix over the first {backlog_n} starts (every tier still waiting): "
          + " ".join(f"{t}={100 * first[t] / max(1, backlog_n):.1f}%" for t in TIERS))
    print("starts   " + "  ".join(f"{t:>6}" for t in TIERS))
    for i in range(0, len(started), 100):
        window = Counter(prio_of[r.job_id] for r in started[i:i + 100])
        print(f"{i + 1:>4}-{min(i + 100, len(started)):<4}" + "  ".join(f"{window[t]:>6}" for t in TIERS))
    for t in TIERS:
        lags = [((r.started_at_ms or 0) - r.not_before_ms) / 1000 for r in started if prio_of[r.job_id] == t]
        print(f"start lag {t:<6} p50={pct(lags, 50):7.2f} s  p99={pct(lags, 99):7.2f} s  max={max(lags, default=0):7.2f} s")
    t0 = min((r.started_at_ms or 0) for r in started) if started else 0
    t1 = max((r.finished_at_ms or r.started_at_ms or 0) for r in started) if started else 0
    peak: dict[int, Counter[str]] = defaultdict(Counter)
    for at in range(t0, t1 + 1, 250):  # sample every 250 ms: runs started and not yet finished
        now = Counter(r.tenant for r in started if (r.started_at_ms or 0) <= at < (r.finished_at_ms or t1 + 1))
        window = (at - t0) // 5000 * 5
        for tenant, n in now.items():
            peak[window][tenant] = max(peak[window][tenant], n)
    print(f"per-tenant runs running at once, the most in each 5 s window ({args.slots} worker slots; "
          "quotas: not built):")
    for sec in sorted(peak)[:12]:
        print(f"  t+{sec:>3}s  " + " ".join(f"{tenant}={n}" for tenant, n in sorted(peak[sec].items())))


if __name__ == "__main__":
    main()
