"""The start lag of a downstream run after its upstream ends (issue 25), on the real stack.

    .venv/bin/python bench/dependencies.py --chains 20 --duration-s 90
    .venv/bin/python bench/dependencies.py --chains 20 --duration-s 90 --independent   # the same jobs, no after
    .venv/bin/python bench/dependencies.py --chains 20 --duration-s 90 --processors 2  # pairs split across processors
    .venv/bin/python bench/dependencies.py --chains 20 --duration-s 90 --no-schedule   # down: no schedule of its own

Starts Kafka + Cassandra if needed, one processor, one worker (bench/deps_app.py: the
handler records its own start and end) and the history projector; registers N chains
``up -> down`` (both every 2 s, the handler working 50 ms; each pair's jobs on different
partitions when the ids allow), waits D seconds, deletes them. For every measured slot
(after a warm-up): downstream handler start - upstream handler end, p50/p99/max, and the
Kafka records per downstream run by topic (``--independent`` registers the same jobs
without ``after``: the difference is what a dependency adds). Every downstream slot of
the window must have run once, after its upstream. With ``--processors 2`` the lags are
reported apart for pairs whose jobs one processor owns (the end is delivered in process)
and pairs split across the two (the end goes round through gnomon.dependencies).
"""

from __future__ import annotations

import argparse
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

from confluent_kafka import Producer
from spike import gnomon_records  # bench/ is on sys.path: the script's own directory

from gnomon import codec
from gnomon.adapters.kafka import partition_for, producer_config
from gnomon.command_keys import operator_headers
from gnomon.config import load
from gnomon.core.jobs import DeleteJob, RegisterJob
from gnomon.core.model import JobSpec, Schedule, Target, TargetType, Upstream, slot_run_id
from gnomon.topology import load_topology

BENCH = Path(__file__).resolve().parent
EVERY_MS = 2000


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


def owners(logs: Path, processors: int) -> dict[int, int]:
    """partition -> the processor that last said it was assigned it (its log)."""
    out: dict[int, int] = {}
    for i in range(processors):
        for line in (logs / f"deps-processor{i}.log").read_text(errors="replace").splitlines():
            if "assigned partitions [" in line:
                for p in line.split("[", 1)[1].split("]", 1)[0].split(","):
                    if p.strip():
                        out[int(p)] = i
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chains", type=int, default=20)
    ap.add_argument("--duration-s", type=int, default=90)
    ap.add_argument("--warmup-s", type=int, default=20)
    ap.add_argument("--independent", action="store_true", help="no after: the baseline")
    ap.add_argument("--processors", type=int, default=1)
    ap.add_argument("--no-schedule", action="store_true",
                    help="the downstreams have no schedule of their own (a run after each upstream run)")
    args = ap.parse_args()
    s, topo = load(), load_topology()
    from gnomon.infra import manager

    manager.up(s)
    logs = Path(s.state_dir) / "bench-logs"
    logs.mkdir(parents=True, exist_ok=True)
    times = logs / "deps-times.txt"
    times.unlink(missing_ok=True)
    exe = [sys.executable, "-m", "gnomon.cli.main"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(BENCH), os.environ.get("PYTHONPATH", "")]),
           "DEPS_TIMES_FILE": str(times)}
    procs = [subprocess.Popen([*exe, *cmd], stdout=open(logs / f"deps-{name}.log", "wb"),  # noqa: SIM115
                              stderr=subprocess.STDOUT, start_new_session=True, env=env)
             for name, cmd in ((f"processor{i}", ["processor", "--instance-id", f"deps-{i}"])
                               for i in range(args.processors))]
    procs += [subprocess.Popen([*exe, *cmd], stdout=open(logs / f"deps-{name}.log", "wb"),  # noqa: SIM115
                               stderr=subprocess.STDOUT, start_new_session=True, env=env)
              for name, cmd in (("worker", ["worker", "--app", "deps_app:worker", "--worker-id", "deps-w0",
                                           "--concurrency", "200"]),
                               ("projector", ["projector"]))]
    tag = secrets.token_hex(3)
    pairs: list[tuple[str, str]] = []
    i = 0
    while len(pairs) < args.chains:  # up and down on different partitions (a cross-partition hop)
        up, down = f"deps{tag}-up-{i:04d}", f"deps{tag}-down-{i:04d}"
        i += 1
        if partition_for(up, topo.partitions) != partition_for(down, topo.partitions):
            pairs.append((up, down))
    p = Producer(producer_config(s.kafka_bootstrap))

    def send(cmd: RegisterJob | DeleteJob) -> None:
        value = codec.encode(cmd)
        p.produce(topo.job_commands, key=cmd.job_id.encode(), value=value,
                  headers=operator_headers(topo.job_commands, cmd.job_id.encode(), value))

    try:
        time.sleep(8 + 4 * (args.processors - 1))  # group join, restore, adverts
        base = JobSpec(name="deps", schedule=Schedule(cron="*/2 * * * * *"),
                       target=Target(TargetType.HANDLER, handler="step"), timeout_s=60)
        now = int(time.time() * 1000)
        for up, _ in pairs:
            send(RegisterJob(up, "bench", base, now))
        p.flush(30)
        time.sleep(2)  # the upstreams first (as the API insists)
        now = int(time.time() * 1000)
        for up, down in pairs:
            after = () if args.independent else (Upstream(up),)
            sched = Schedule() if args.no_schedule and after else base.schedule
            send(RegisterJob(down, "bench", JobSpec(**{**base.__dict__, "after": after, "schedule": sched}), now))
        p.flush(30)
        lo_ms = (now // EVERY_MS + 1) * EVERY_MS + args.warmup_s * 1000
        while time.time() * 1000 < lo_ms:
            time.sleep(0.5)
        r0 = gnomon_records(s.kafka_bootstrap)
        end_at = time.time() + args.duration_s
        while time.time() < end_at:
            print(f"\r{end_at - time.time():5.0f}s left", end="", file=sys.stderr, flush=True)
            time.sleep(5)
        hi_ms = int(time.time() * 1000) // EVERY_MS * EVERY_MS
        r1 = gnomon_records(s.kafka_bootstrap)
        stop = int(time.time() * 1000)
        for up, down in pairs:
            send(DeleteJob(down, "bench", stop))
            send(DeleteJob(up, "bench", stop))
        p.flush(30)
        time.sleep(3)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(30)
    seen: dict[str, tuple[int, int]] = {}
    runs_of: dict[str, int] = {}
    for line in times.read_text().splitlines():
        run_id, start, end = line.split()
        runs_of[run_id] = runs_of.get(run_id, 0) + 1
        seen.setdefault(run_id, (int(start), int(end)))
    owner = owners(logs, args.processors)
    lags, missing, early = [], 0, 0
    split: dict[bool, list[float]] = {True: [], False: []}
    slots = range(lo_ms, hi_ms - EVERY_MS, EVERY_MS)  # (the last slot may not have finished)
    for up, down in pairs:
        for slot in slots:
            u, d = seen.get(slot_run_id(up, slot)), seen.get(slot_run_id(down, slot))
            if u is None or d is None:
                missing += 1
                continue
            lags.append(d[0] - u[1])
            early += d[0] < u[1]
            if owner:
                same = owner.get(partition_for(up, topo.partitions)) == owner.get(partition_for(down, topo.partitions))
                split[same].append(d[0] - u[1])
    downs = len(pairs) * len(slots)
    twice = sum(1 for n in runs_of.values() if n > 1)
    kind = ("independent jobs (no after)" if args.independent
            else "chains up -> down (down: no schedule of its own)" if args.no_schedule else "chains up -> down")
    print(f"\n{kind}: {len(pairs)} pairs, "
          f"{len(slots)} slots each measured, machine of {os.cpu_count()} CPUs")
    if lags:
        print(f"downstream start - upstream end (ms): p50 {pct(lags, 50):.0f}  p99 {pct(lags, 99):.0f}  "
              f"max {max(lags):.0f}  (n={len(lags)}; started before its upstream ended: {early}; "
              f"missing: {missing}; run twice: {twice})")
    if args.processors > 1:
        for same, xs in split.items():
            if xs:
                print(f"  {'one processor owns both' if same else 'across processors'}: p50 {pct(xs, 50):.0f}  "
                      f"p99 {pct(xs, 99):.0f}  max {max(xs):.0f} (n={len(xs)})")
    delta = {t: r1.get(t, 0) - r0.get(t, 0) for t in r1}
    print(f"records per downstream run over the window ({downs} downstream runs): "
          + " ".join(f"{t.removeprefix('gnomon.')}={d / downs:.2f}"
                     for d, t in sorted(((d, t) for t, d in delta.items() if d), reverse=True)))


if __name__ == "__main__":
    main()
