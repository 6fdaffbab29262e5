"""Steady load: N jobs that fire every second, for D seconds.

    .venv/bin/python bench/steady.py --jobs 20 --duration-s 120            # idle case
    .venv/bin/python bench/steady.py --jobs 1000 --duration-s 300 --concurrency 2000

Starts Kafka + Cassandra if needed, P processors, W workers (bench/spike_app.py: the
handler records its own start time) and the history projector, registers N jobs with
the cron `* * * * * *`, waits D seconds, then deletes them. Every slot in the measured
window (after a warm-up) must have started exactly once: start lag = the handler's own
start - slot. After the end it reports how long the history projector took to catch up
(its committed offsets on gnomon.runs reach the end). (The lag samples open a consumer
and read every gnomon.* partition's end offset every 5 s: a little of the Kafka figure.)

The CPU budget (issue 22): over the measured window it prints CPU-seconds per 1,000 runs
started for each process (processor, workers, projector, the API with ``--api``, and the
Kafka and Cassandra JVMs), Kafka records per run by topic, and the history projector's lag
sampled every 5 s (records, and seconds at the ledger's write rate).

    .venv/bin/python bench/steady.py --jobs 500 --duration-s 120 --api    # the budget table
    .venv/bin/python bench/steady.py --jobs 200 --duration-s 150 --profile-s 60

Overload (issue 22): ``--high-fraction 0.1`` registers that share of the jobs with priority
high (the rest normal) and reports, per priority, start lag, slots not started and slots
recorded skipped with reason ``overload`` (read back from the run ledger, gnomon.runs), so every
measured slot is accounted for:

    .venv/bin/python bench/steady.py --jobs 4000 --duration-s 180 --high-fraction 0.1 --api

``--profile-s`` samples the processor, the projector and a worker with py-spy for that long once the
warm-up is over (collapsed stacks in .gnomon/bench-logs/profile-*.txt, flame graphs beside
them) and prints each one's top functions by inclusive and by own samples.
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
from dataclasses import replace
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from spike import gnomon_records  # bench/ is on sys.path: the script's own directory

from gnomon import codec, region
from gnomon.adapters.kafka import consumer_config, producer_config
from gnomon.command_keys import operator_headers
from gnomon.config import load
from gnomon.core.cron import CronSchedule
from gnomon.core.jobs import DeleteJob, RegisterJob
from gnomon.core.model import JobSpec, Priority, Schedule, Target, TargetType
from gnomon.history.projector import GROUP_ID as HISTORY_GROUP
from gnomon.topology import load_topology

BENCH = Path(__file__).resolve().parent


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


def history_lag(bootstrap: str, topic: str) -> int:
    c = Consumer(consumer_config(bootstrap, region.group_id(HISTORY_GROUP, load_topology().region)))
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


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    c = Consumer(consumer_config(bootstrap, f"bench-{secrets.token_hex(4)}"))
    try:
        md = c.list_topics(topic, timeout=10)
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), 10)[1] for p in md.topics[topic].partitions}
    finally:
        c.close()


def skipped_slots(bootstrap: str, topic: str, since: dict[int, int], job_ids: set[str], lo_ms: int,
                  hi_ms: int) -> Counter[tuple[str, str]]:
    """(job, reason) -> slots in [lo_ms, hi_ms) recorded skipped on ``topic`` (the run
    ledger) after ``since`` (every-second jobs: a range counts its seconds inside the
    window); a run's last skipped state counts once, however often it was written."""
    ends = end_offsets(bootstrap, topic)
    c = Consumer({**consumer_config(bootstrap, f"bench-{secrets.token_hex(4)}"), "enable.auto.commit": False})
    last: dict[str, Any] = {}
    try:
        c.assign([TopicPartition(topic, p, since.get(p, 0)) for p in ends if ends[p] > since.get(p, 0)])
        left = {p for p in ends if ends[p] > since.get(p, 0)}
        idle = 0
        while left and idle < 20:
            msgs = c.consume(5000, 1.0)
            idle = 0 if msgs else idle + 1
            for m in msgs:
                if m.error() is not None:
                    continue
                if m.offset() >= ends[m.partition()] - 1:
                    left.discard(m.partition())
                if m.value() is None:
                    continue
                st = codec.decode(m.value(), topic=topic)
                if st.status.value == "skipped" and st.job_id in job_ids:
                    last[st.run_id] = st
    finally:
        c.close()
    out: Counter[tuple[str, str]] = Counter()
    for st in last.values():
        first = st.skipped_from_ms if st.skipped_from_ms is not None else st.slot_ms
        n = max(0, (min(st.slot_ms, hi_ms - 1) - max(first, lo_ms)) // 1000 + 1)
        if n:
            out[(st.job_id, "overload" if st.reason == "overload" else "other")] += n
    return out


def cpu_s(pid: int) -> float:
    """user + system CPU seconds of process ``pid`` (/proc/<pid>/stat fields 14 and 15); 0 if gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = raw[raw.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def java_pids(marker: str) -> list[int]:
    """Pids of the processes whose command line contains ``marker`` (the Kafka and Cassandra JVMs)."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if marker.encode() in Path(f"/proc/{name}/cmdline").read_bytes():
                    out.append(int(name))
            except OSError:
                pass
    return out


def budget_snapshot(pids: dict[str, list[int]], bootstrap: str) -> tuple[float, dict[str, float], dict[str, int]]:
    return time.time(), {k: sum(cpu_s(p) for p in v) for k, v in pids.items()}, gnomon_records(bootstrap)


def print_budget(a: tuple[float, dict[str, float], dict[str, int]], b: tuple[float, dict[str, float], dict[str, int]],
                 runs: int) -> None:
    """CPU-seconds per 1,000 runs per process, and records per run by topic, between two snapshots."""
    wall = b[0] - a[0]
    if runs <= 0:
        print("budget: no runs started in the window")
        return
    cpu = {k: b[1][k] - a[1][k] for k in a[1]}
    gone = sorted(k for k, v in cpu.items() if v < 0 or b[1][k] == 0)
    if gone:
        print(f"warning: exited during the window (their CPU is not counted): {gone}")
    cpu = {k: max(0.0, v) for k, v in cpu.items()}
    print(f"CPU budget over {wall:.0f}s, {runs} runs started ({runs / wall:.0f}/s), machine of {os.cpu_count()} CPUs:")
    print(f"  {'process':<12} {'CPU-ms per run (= CPU-s per 1,000 runs)':>40} {'cores busy':>11}")
    for k, v in sorted(cpu.items(), key=lambda kv: -kv[1]):
        print(f"  {k:<12} {1000 * v / runs:40.3f} {v / wall:11.2f}")
    total = sum(cpu.values())
    print(f"  {'total':<12} {1000 * total / runs:40.3f} {total / wall:11.2f}")
    delta = {t: b[2].get(t, 0) - a[2].get(t, 0) for t in b[2]}
    print(f"records per run = {sum(delta.values()) / runs:.2f} (every gnomon.* topic, transaction markers included): "
          + " ".join(f"{t.removeprefix('gnomon.')}={d / runs:.2f}"
                     for d, t in sorted(((d, t) for t, d in delta.items() if d), reverse=True)))


def start_profiles(pids: dict[str, list[int]], roles: list[str], logs: Path, seconds: int) -> list[tuple[str, Path, subprocess.Popen[bytes]]]:
    spy = Path(sys.executable).parent / "py-spy"
    out = []
    for role in roles:
        path = logs / f"profile-{role}.txt"
        out.append((role, path, subprocess.Popen(
            [str(spy), "record", "--nonblocking", "--rate", "100", "--duration", str(seconds), "--format", "raw",
             "--output", str(path), "--pid", str(pids[role][0])],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)))
    return out


def print_profile(role: str, path: Path, top: int = 25) -> None:
    """Top functions of a py-spy collapsed-stack file, by inclusive and by own samples."""
    own: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, n_s = line.rpartition(" ")
        if not n_s.isdigit():
            continue
        n = int(n_s)
        total += n
        frames = [f.split(" (")[0] + " (" + f.split(" (")[1].split(":")[0].rsplit("/", 1)[-1] + ")" if " (" in f else f
                  for f in stack.split(";")]
        own[frames[-1]] += n
        for f in set(frames):
            incl[f] += n
    if not total:
        print(f"profile {role}: no samples")
        return
    print(f"profile {role}: {total} samples ({path})")
    print("  inclusive: " + "; ".join(f"{f} {100 * n / total:.0f}%" for f, n in incl.most_common(top)))
    print("  own:       " + "; ".join(f"{f} {100 * n / total:.1f}%" for f, n in own.most_common(top)))


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
    ap.add_argument("--api", action="store_true", help="start the API too (its CPU is in the budget)")
    ap.add_argument("--high-fraction", type=float, default=0.0, help="this share of the jobs is priority high")
    ap.add_argument("--profile-s", type=int, default=0, help="py-spy the processor, projector and worker0 this long")
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
    roles = [f"processor{i}" for i in range(args.processors)] + [f"worker{i}" for i in range(args.workers)] + ["projector"]
    if args.api:
        procs.append(subprocess.Popen([*exe, "api", "--dev"], stdout=open(logs / "steady-api.log", "wb"),  # noqa: SIM115
                                      stderr=subprocess.STDOUT, start_new_session=True, env=env))
        roles.append("api")
    pids = {role: [proc.pid] for role, proc in zip(roles, procs, strict=True)}
    pids |= {"kafka": java_pids("kafka.Kafka"), "cassandra": java_pids("CassandraDaemon")}
    tag = secrets.token_hex(3)
    job_ids = [f"steady{tag}-{i:05d}" for i in range(args.jobs)]
    high = set(job_ids[:round(args.jobs * args.high_fraction)])
    p = Producer(producer_config(s.kafka_bootstrap))
    try:
        time.sleep(8)  # group join, restore, adverts
        spec = JobSpec(name="steady", schedule=Schedule(cron="* * * * * *"),
                       target=Target(TargetType.HANDLER, handler="noop"), timeout_s=60)
        high_spec = replace(spec, priority=Priority.HIGH)
        t_reg = int(time.time() * 1000)
        history_from = end_offsets(s.kafka_bootstrap, topo.runs)
        for job_id in job_ids:
            while True:
                try:
                    value = codec.encode(RegisterJob(job_id, "bench", high_spec if job_id in high else spec, t_reg))
                    p.produce(topo.job_commands, key=job_id.encode(), value=value,
                              headers=operator_headers(topo.job_commands, job_id.encode(), value))
                    break
                except BufferError:
                    p.poll(0.05)
        p.flush(60)
        first_ms = CronSchedule("* * * * * *", "UTC").next_after(t_reg - 1)
        end_at = time.time() + args.duration_s
        budget_at = first_ms / 1000 + args.warmup_s
        profiles: list[tuple[str, Path, subprocess.Popen[bytes]]] = []
        b0 = None
        hist_lags: list[tuple[int, float]] = []  # (records behind, seconds behind at the ledger's rate)
        last_runs = None
        while time.time() < end_at:
            n = len(read_starts(logs))
            if b0 is None and time.time() >= budget_at:
                b0, n0 = budget_snapshot(pids, s.kafka_bootstrap), n
                if args.profile_s:
                    profiles = start_profiles(pids, ["processor0", "projector", "worker0"], logs, args.profile_s)
            runs_end = gnomon_records(s.kafka_bootstrap).get(topo.runs, 0)
            behind = history_lag(s.kafka_bootstrap, topo.runs)
            rate = (runs_end - last_runs[1]) / max(0.1, time.time() - last_runs[0]) if last_runs else 0.0
            last_runs = (time.time(), runs_end)
            if rate > 0:
                hist_lags.append((behind, behind / rate))
            print(f"\r{end_at - time.time():5.0f}s left; {n} starts; history {behind} records behind",
                  end="", file=sys.stderr, flush=True)
            time.sleep(5)
        b1, n1 = budget_snapshot(pids, s.kafka_bootstrap), len(read_starts(logs))
        stop_ms = int(time.time() * 1000)
        for job_id in job_ids:
            value = codec.encode(DeleteJob(job_id, "bench", stop_ms))
            p.produce(topo.job_commands, key=job_id.encode(), value=value,
                      headers=operator_headers(topo.job_commands, job_id.encode(), value))
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
    if high:
        skipped = skipped_slots(s.kafka_bootstrap, topo.runs, history_from, set(job_ids), lo, hi)
        for prio, members in (("high", high), ("normal", set(job_ids) - high)):
            mine = {rid: ms for rid, ms in wanted.items() if rid.partition("@")[0] in members}
            plags = [(ms - mine[rid]) / 1000 for rid, ms in starts if rid in mine]
            ran = sum(1 for rid in mine if counts[rid] > 0)
            over = sum(n for (j, reason), n in skipped.items() if j in members and reason == "overload")
            other = sum(n for (j, reason), n in skipped.items() if j in members and reason != "overload")
            line = (f"  {prio:<6} slots={len(mine)} started={ran} skipped(overload)={over} skipped(other)={other} "
                    f"unaccounted={len(mine) - ran - over - other}")
            if plags:
                line += (f" start lag p50={pct(plags, 50):.3f} p99={pct(plags, 99):.3f} max={max(plags):.3f}"
                         f" late>1s={sum(1 for x in plags if x > 1)}")
            print(line)
    print("history caught up " + (f"{caught_at - t_end:.1f}s after the end" if caught_at else "NOT within 120s"))
    if hist_lags:
        worst = max(hist_lags, key=lambda x: x[1])
        print(f"history lag while running (every 5s): max {max(r for r, _ in hist_lags)} records, "
              f"max {worst[1]:.1f}s behind at the ledger's write rate; last {hist_lags[-1][0]} records")
    if b0 is not None:
        print_budget(b0, b1, n1 - n0)
    else:
        print("budget: the run ended before the warm-up did (raise --duration-s)")
    for role, path, spy in profiles:
        try:
            spy.wait(60)
        except subprocess.TimeoutExpired:
            spy.kill()
            print(f"profile {role}: py-spy did not finish; skipped")
            continue
        print_profile(role, path)


if __name__ == "__main__":
    main()
