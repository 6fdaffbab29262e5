"""Steady load: N jobs that fire every second, for D seconds.

    .venv/bin/python bench/steady.py --jobs 20 --duration-s 120            # idle case
    .venv/bin/python bench/steady.py --jobs 1000 --duration-s 300 --concurrency 2000

Starts Kafka + Cassandra if needed, P processors, W workers (bench/spike_app.py: the
handler records its own start time) and the history projector, registers N jobs with
the cron `* * * * * *`, waits D seconds, then deletes them. Every slot in the measured
window (after a warm-up) must have started exactly once: start lag = the handler's own
start - slot. After the end it reports how long the history projector took to catch up
(its committed offsets on gnomon.runs reach the end).
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

from gnomon import codec
from gnomon.adapters.kafka import consumer_config, producer_config
from gnomon.config import load
from gnomon.core.cron import CronSchedule
from gnomon.core.jobs import DeleteJob, RegisterJob
from gnomon.core.model import JobSpec, Schedule, Target, TargetType
from gnomon.history.projector import GROUP_ID as HISTORY_GROUP
from gnomon.topology import load_topology

BENCH = Path(__file__).resolve().parent


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


def history_lag(bootstrap: str, topic: str) -> int:
    c = Consumer(consumer_config(bootstrap, HISTORY_GROUP))
    try:
        md = c.list_topics(topic, timeout=10)
        tps = [TopicPartition(topic, p) for p in md.topics[topic].partitions]
        committed = c.committed(tps, 10)
        lag = 0
        for tp in committed:
            high = c.get_watermark_offsets(TopicPartition(topic, tp.partition), 10)[1]
            # the last offset of a partition written in transactions is a commit marker,
            # which a consumer never commits past: a lag of 1 is caught up
            lag += max(0, high - max(tp.offset, 0) - 1)
        return lag
    finally:
        c.close()


def read_starts(logs: Path) -> list[tuple[str, int]]:
    out = []
    for f in logs.glob("steady-starts-*.txt"):
        for line in f.read_text().splitlines():
            rid, _, ms = line.partition(" ")
            if ms.isdigit():
                out.append((rid, int(ms)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=20)
    ap.add_argument("--duration-s", type=int, default=120)
    ap.add_argument("--warmup-s", type=int, default=40, help="slots before this are not measured")
    ap.add_argument("--processors", type=int, default=1)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=200)
    ap.add_argument("--lookahead-s", type=int, default=30)
    args = ap.parse_args()
    s, topo = load(), load_topology()
    from gnomon.infra import manager

    manager.up(s)
    logs = Path(s.state_dir) / "bench-logs"
    logs.mkdir(parents=True, exist_ok=True)
    for f in logs.glob("steady-starts-*.txt"):
        f.unlink()
    exe = [sys.executable, "-m", "gnomon.cli.main"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(BENCH), os.environ.get("PYTHONPATH", "")])}
    procs = [subprocess.Popen([*exe, "processor", "--instance-id", f"steady-{i}", "--lookahead-s", str(args.lookahead_s)],
                              stdout=open(logs / f"steady-processor{i}.log", "wb"),  # noqa: SIM115
                              stderr=subprocess.STDOUT, start_new_session=True, env=env)
             for i in range(args.processors)]
    for i in range(args.workers):
        wenv = {**env, "SPIKE_STARTS_FILE": str(logs / f"steady-starts-{i}.txt"),
                "SPIKE_CONCURRENCY": str(args.concurrency)}
        procs.append(subprocess.Popen([*exe, "worker", "--app", "spike_app:worker", "--worker-id", f"steady-w{i}",
                                       "--concurrency", str(args.concurrency)],
                                      stdout=open(logs / f"steady-worker{i}.log", "wb"),  # noqa: SIM115
                                      stderr=subprocess.STDOUT, start_new_session=True, env=wenv))
    procs.append(subprocess.Popen([*exe, "projector"], stdout=open(logs / "steady-projector.log", "wb"),  # noqa: SIM115
                                  stderr=subprocess.STDOUT, start_new_session=True, env=env))
    tag = secrets.token_hex(3)
    job_ids = [f"steady{tag}-{i:05d}" for i in range(args.jobs)]
    p = Producer(producer_config(s.kafka_bootstrap))
    try:
        time.sleep(8)  # group join, restore, adverts
        spec = JobSpec(name="steady", schedule=Schedule(cron="* * * * * *"),
                       target=Target(TargetType.HANDLER, handler="noop"), timeout_s=60)
        t_reg = int(time.time() * 1000)
        for job_id in job_ids:
            while True:
                try:
                    p.produce(topo.job_commands, key=job_id.encode(),
                              value=codec.encode(RegisterJob(job_id, "bench", spec, t_reg)))
                    break
                except BufferError:
                    p.poll(0.05)
        p.flush(60)
        first_ms = CronSchedule("* * * * * *", "UTC").next_after(t_reg - 1)
        end_at = time.time() + args.duration_s
        while time.time() < end_at:
            n = len(read_starts(logs))
            print(f"\r{end_at - time.time():5.0f}s left; {n} starts", end="", file=sys.stderr, flush=True)
            time.sleep(5)
        stop_ms = int(time.time() * 1000)
        for job_id in job_ids:
            p.produce(topo.job_commands, key=job_id.encode(),
                      value=codec.encode(DeleteJob(job_id, "bench", stop_ms)))
            p.poll(0)
        p.flush(60)
        time.sleep(5)  # let the last measured slots finish
        caught_at = None
        t_end = time.time()
        while time.time() - t_end < 120:
            lag = history_lag(s.kafka_bootstrap, topo.runs)
            print(f"\rhistory lag {lag} records", end="", file=sys.stderr, flush=True)
            if lag == 0:
                caught_at = time.time()
                break
            time.sleep(1)
        print(file=sys.stderr)
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
    starts = read_starts(logs)
    lo = first_ms + args.warmup_s * 1000
    hi = stop_ms - 10_000  # slots staged before the delete may be withdrawn: not measured
    wanted = {f"{j}@{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(ms / 1000))}": ms
              for j in job_ids for ms in range(lo, hi, 1000)}
    counts = Counter(rid for rid, _ in starts if rid in wanted)
    lags = [(ms - wanted[rid]) / 1000 for rid, ms in starts if rid in wanted]
    missed = sum(1 for rid in wanted if counts[rid] == 0)
    doubled = sum(1 for c in counts.values() if c > 1)
    print(f"jobs={args.jobs} (every second) duration={args.duration_s}s processors={args.processors} "
          f"workers={args.workers}x{args.concurrency} lookahead={args.lookahead_s}s")
    print(f"measured slots={len(wanted)} started={len(counts)} not_started={missed} doubled={doubled} "
          f"(window {(hi - lo) / 1000:.0f}s after a {args.warmup_s}s warm-up; not_started = still waiting "
          f"when the jobs were deleted, so recorded skipped, never silently dropped)")
    if lags:
        print(f"start lag s (handler start - slot): p50={pct(lags, 50):.3f} p95={pct(lags, 95):.3f} "
              f"p99={pct(lags, 99):.3f} max={max(lags):.3f} min={min(lags):.3f}")
    print("history caught up " + (f"{caught_at - t_end:.1f}s after the end" if caught_at else "NOT within 120s"))


if __name__ == "__main__":
    main()
