"""Top-of-the-hour spike: N jobs whose slot is the same second.

    .venv/bin/python bench/spike.py --jobs 1000 [--processors 1] [--workers 2] [--concurrency 500]

Starts Kafka + Cassandra if needed (gnomon infra up), one processor and W workers as
separate processes, registers N one-time jobs (Python handler `noop`) whose slot is the
same second, and reads the run ledger (gnomon.runs) until every run succeeded. Prints
runs/s and start lag (slot -> attempt granted) p50/p95/p99/max.
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

from gnomon import codec
from gnomon.adapters.kafka import consumer_config, producer_config
from gnomon.config import load
from gnomon.core.jobs import RegisterJob
from gnomon.core.model import JobSpec, Schedule, Target, TargetType
from gnomon.core.runs import RunState, RunStatus
from gnomon.topology import load_topology


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


def end_offsets(bootstrap: str, topic: str) -> list[TopicPartition]:
    c = Consumer(consumer_config(bootstrap, "bench-offsets"))
    md = c.list_topics(topic, timeout=10)
    out = [TopicPartition(topic, p, c.get_watermark_offsets(TopicPartition(topic, p), 10)[1])
           for p in md.topics[topic].partitions]
    c.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--processors", type=int, default=1)
    ap.add_argument("--concurrency", type=int, default=500)
    ap.add_argument("--lead-s", type=float, default=0, help="seconds between registration end and the slot")
    ap.add_argument("--timeout-s", type=float, default=600)
    args = ap.parse_args()
    s, topo = load(), load_topology()
    from gnomon.infra import manager

    manager.up(s)
    logs = Path(s.state_dir) / "bench-logs"
    logs.mkdir(parents=True, exist_ok=True)
    exe = [sys.executable, "-m", "gnomon.cli.main"]
    procs = [subprocess.Popen([*exe, "processor", "--instance-id", f"bench-{i}"],
                              stdout=open(logs / f"processor{i}.log", "wb"),  # noqa: SIM115
                              stderr=subprocess.STDOUT, start_new_session=True) for i in range(args.processors)]
    for i in range(args.workers):
        procs.append(subprocess.Popen([*exe, "worker", "--worker-id", f"bench-w{i}", "--concurrency", str(args.concurrency)],
                                      stdout=open(logs / f"worker{i}.log", "wb"), stderr=subprocess.STDOUT,  # noqa: SIM115
                                      start_new_session=True))
    try:
        time.sleep(8)  # group join + restore
        start_offsets = end_offsets(s.kafka_bootstrap, topo.runs)
        # register every job first (slot far enough ahead), so the slot is the same second for all
        reg_rate_s = 3000.0
        slot_ms = (int(time.time() + args.jobs / reg_rate_s + 35 + args.lead_s)) * 1000
        spec = JobSpec(name="spike", schedule=Schedule(run_at_ms=slot_ms), target=Target(TargetType.HANDLER, handler="noop"),
                       timeout_s=60)
        tag = secrets.token_hex(3)
        p = Producer(producer_config(s.kafka_bootstrap))
        t_reg = time.time()
        for i in range(args.jobs):
            job_id = f"spike{tag}-{i:06d}"
            while True:
                try:
                    p.produce(topo.job_commands, key=job_id.encode(),
                              value=codec.encode(RegisterJob(job_id, "bench", spec, int(time.time() * 1000))))
                    break
                except BufferError:
                    p.poll(0.05)
            if i % 1000 == 0:
                print(f"\rregistering {i}/{args.jobs}", end="", file=sys.stderr, flush=True)
        p.flush(60)
        print(f"\rregistered {args.jobs} jobs in {time.time() - t_reg:.1f}s; slot {slot_ms} is "
              f"{(slot_ms / 1000 - time.time()):.1f}s away", file=sys.stderr)
        if slot_ms / 1000 - time.time() < 31:
            print("warning: slot is inside the 30 s lookahead already", file=sys.stderr)

        c = Consumer(consumer_config(s.kafka_bootstrap, "bench-" + tag))
        c.assign(start_offsets)
        started: dict[str, int] = {}
        done: set[str] = set()
        deadline = time.monotonic() + args.timeout_s
        while len(done) < args.jobs and time.monotonic() < deadline:
            for msg in c.consume(1000, 0.5):
                if msg.error() or msg.value() is None:
                    continue
                st = codec.decode(msg.value())
                if not isinstance(st, RunState) or not st.job_id.startswith(f"spike{tag}-"):
                    continue
                if st.started_at_ms is not None:
                    started.setdefault(st.run_id, st.started_at_ms)
                if st.status is RunStatus.SUCCEEDED:
                    done.add(st.run_id)
            print(f"\rsucceeded {len(done)}/{args.jobs}", end="", file=sys.stderr, flush=True)
        print(file=sys.stderr)
        c.close()
        lags = [(t - slot_ms) / 1000 for t in started.values()]
        if not lags:
            raise SystemExit("no run started; see " + str(logs))
        span = (max(started.values()) - min(started.values())) / 1000 or 0.001
        print(f"jobs={args.jobs} processors={args.processors} workers={args.workers}x{args.concurrency} "
              f"started={len(started)} succeeded={len(done)}")
        print(f"runs/s (first to last start) = {len(started) / span:.0f}")
        print(f"start lag s: p50={pct(lags, 50):.3f} p95={pct(lags, 95):.3f} p99={pct(lags, 99):.3f} max={max(lags):.3f}")
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


if __name__ == "__main__":
    main()
