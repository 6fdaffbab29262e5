"""Weighted priorities under contention, and each tenant's share of the pool, on the real stack.

    .venv/bin/python bench/fairness.py [--jobs 3000] [--slots 40] [--hold-s 1] [--tenants 2] [--quota N]

Starts one processor on the running broker (`gnomon infra up` first), registers ``--jobs``
one-time jobs, a third per priority, spread evenly over ``--tenants`` tenants, all due in
the same second, each holding a worker slot for ``--hold-s``. Only once they all wait
does one worker with ``--slots`` slots start (serving every tenant), so the whole backlog
competes for the slots from the first start on. With one tenant the jobs run the `sleep`
handler; with several, the pool is shared, so they run ``sleep`` as sandboxed commands.
Prints, from the run ledger:

* the priority mix over the first ``--first`` starts (1,000) and over the first starts
  while every tier still had a backlog (the target is the processor's
  --priority-weights, 70/20/10 by default), and per 100 starts;
* start lag (worker start - slot) per priority;
* per tenant, the runs running in each second (mean and most at once, sampled every 100 ms).
"""

from __future__ import annotations

import argparse
import secrets
import sys
import time
from collections import Counter
from pathlib import Path

from gnomon import codec
from gnomon.config import load
from gnomon.core.jobs import RegisterJob
from gnomon.core.model import JobSpec, Priority, RetryPolicy, Schedule, Target, TargetType
from gnomon.core.runs import RunState
from gnomon.core.tenants import TenantLimits

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # topic_reading
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "chaos"))  # chaoslib
from chaoslib import Scenario

TIERS = ("high", "normal", "low")


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] if xs else float("nan")


def mix(runs: list[RunState], tier_of: dict[str, str]) -> str:
    n = Counter(tier_of[r.job_id] for r in runs)
    return " ".join(f"{t}={100 * n[t] / max(1, len(runs)):.1f}%" for t in TIERS)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=3000)
    ap.add_argument("--slots", type=int, default=40)
    ap.add_argument("--hold-s", type=float, default=1.0)
    ap.add_argument("--tenants", type=int, default=2)
    ap.add_argument("--first", type=int, default=1000, help="starts the mix is measured over")
    ap.add_argument("--quota", type=int, default=0,
                    help="concurrency quota of the first tenant (0: none), set on the tenants topic")
    args = ap.parse_args()
    s = load()
    from gnomon.infra import manager

    manager.up(s)
    tag = "fair" + secrets.token_hex(3)
    logs = Path(s.state_dir) / "bench-logs" / tag
    logs.mkdir(parents=True, exist_ok=True)
    tenants = tuple(f"{tag}-t{i}" for i in range(args.tenants))
    sc = Scenario(tag, logs, lease_s=30, lookahead_s=30, worker_tenants=tenants)
    if args.tenants > 1:  # a shared pool runs sandboxed targets only
        target = Target(TargetType.COMMAND, argv=("sleep", f"{args.hold_s:g}"))
        payload = "null"
    else:
        target = Target(TargetType.HANDLER, handler="sleep")
        payload = f'{{"s": {args.hold_s}}}'
    tier_of: dict[str, str] = {}
    try:
        if args.quota:
            limits = TenantLimits(tenants[0], concurrency_max=args.quota, updated_at_ms=int(time.time() * 1000))
            sc.producer.produce(sc.topo.tenants, key=tenants[0].encode(), value=codec.encode(limits, sc.topo.tenants))
            sc.flush()
            print(f"tenant {tenants[0]}: concurrency quota {args.quota}", file=sys.stderr)
        sc.processor("p1")
        slot = (int(time.time()) + 5) * 1000
        for i in range(args.jobs):
            tier, tenant = TIERS[i % 3], tenants[(i // 3) % args.tenants]
            job_id = f"{tag}-{i:05d}"
            tier_of[job_id] = tier
            spec = JobSpec(name="fair", schedule=Schedule(run_at_ms=slot), target=target, payload_json=payload,
                           priority=Priority(tier), timeout_s=300, retry=RetryPolicy(max_attempts=1))
            sc.send(RegisterJob(job_id, tenant, spec, int(time.time() * 1000)))
        sc.flush()
        time.sleep(max(0.0, slot / 1000 + 5 - time.time()))  # all due, waiting: no worker serves them yet
        sc.worker("w1", args.slots)
        expected_s = args.jobs * args.hold_s / args.slots
        print(f"{args.jobs} runs due at one slot, {args.tenants} tenant(s), {args.slots} worker slots, "
              f"{args.hold_s:g} s each: about {expected_s:.0f} s", file=sys.stderr)
        time.sleep(expected_s * 1.3 + 20)
    finally:
        sc.stop_all()
    report, runs, _ = sc.check(int(time.time() * 1000))
    final = {r.run_id: r for r in runs if r.job_id in tier_of}
    started = sorted((r for r in final.values() if r.started_at_ms), key=lambda r: r.started_at_ms or 0)
    print(f"runs={len(final)} started={len(started)} checker: {report.summary()}")
    per_tier = args.jobs // 3
    backlog_n = 0  # starts before the first tier ran out
    seen: Counter[str] = Counter()
    for r in started:
        seen[tier_of[r.job_id]] += 1
        if min(per_tier - seen[t] for t in TIERS) <= 0:
            break
        backlog_n += 1
    print(f"mix over the first {min(args.first, len(started))} starts: {mix(started[:args.first], tier_of)}")
    print(f"mix over the first {backlog_n} starts (every tier still waiting): {mix(started[:backlog_n], tier_of)}")
    print("starts     " + "  ".join(f"{t:>6}" for t in TIERS))
    for i in range(0, len(started), 100):
        window = Counter(tier_of[r.job_id] for r in started[i:i + 100])
        print(f"{i + 1:>5}-{min(i + 100, len(started)):<5}" + "  ".join(f"{window[t]:>6}" for t in TIERS))
    for t in TIERS:
        lags = [((r.started_at_ms or 0) - r.not_before_ms) / 1000 for r in started if tier_of[r.job_id] == t]
        print(f"start lag {t:<6} p50={pct(lags, 50):7.2f} s  p99={pct(lags, 99):7.2f} s  max={max(lags, default=0):7.2f} s")
    if not started:
        return
    t0 = min(r.started_at_ms or 0 for r in started)
    t1 = max(r.finished_at_ms or r.started_at_ms or 0 for r in started)
    print(f"runs running per tenant in each second from the first start, mean / most at once (sampled every "
          f"100 ms; {args.slots} worker slots; quotas: none set):")
    print("  second  " + "  ".join(f"{t:>16}" for t in tenants) + "        total")
    for sec in range(t0, t1 + 1, 1000):
        samples = [Counter(r.tenant for r in started if (r.started_at_ms or 0) <= at < (r.finished_at_ms or t1 + 1))
                   for at in range(sec, sec + 1000, 100)]
        cells = [(sum(c[t] for c in samples) / len(samples), max(c[t] for c in samples)) for t in (*tenants, None)]
        cells[-1] = (sum(sum(c.values()) for c in samples) / len(samples), max(sum(c.values()) for c in samples))
        print(f"  t+{(sec - t0) // 1000:<4}  " + "  ".join(f"{avg:>10.1f} / {peak:>3}" for avg, peak in cells))

if __name__ == "__main__":
    main()
