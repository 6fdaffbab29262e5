"""Top-of-the-hour spike: N jobs whose slot is the same second.

    .venv/bin/python bench/spike.py --jobs 1000 [--processors 1] [--workers 2] [--concurrency 500]
                                    [--lookahead-s 30] [--busy-worker] [--pool default]

Starts Kafka + Cassandra if needed (gnomon infra up), P processors and W workers as
separate processes (workers run bench/spike_app.py: `--app spike_app:worker`), registers
N one-time jobs (Python handler `noop`) whose slot is the same second, and waits until
every handler has started and every run succeeded (run ledger, gnomon.runs).

Start lag is measured where an outside observer sees it: the first statement of the
handler writes ``run_id start_ms`` to a per-worker file (.gnomon/bench-logs/starts-*.txt);
lag = start_ms - slot. Prints started / doubled (started more than once) / missed,
lag p50/p95/p99/max, runs/s, Kafka records per run (every gnomon.* topic) and CPU-seconds
per 1,000 runs of the processor and worker processes.

--busy-worker adds a worker with 8 slots that 8 long `sleep` jobs occupy before the
spike is registered: no spike run may wait behind it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import secrets
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

from gnomon import codec
from gnomon.adapters.kafka import consumer_config, producer_config
from gnomon.command_keys import operator_headers
from gnomon.config import load
from gnomon.core.errors import GnomonError
from gnomon.core.jobs import RegisterJob
from gnomon.core.model import JobSpec, RetryPolicy, Schedule, Target, TargetType
from gnomon.core.replies import CommandResult
from gnomon.core.runs import CancelRun, RunState, RunStatus
from gnomon.core.tenants import TenantLimits
from gnomon.topology import load_topology

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
BUSY_SLOTS = 8


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


def gnomon_records(bootstrap: str) -> dict[str, int]:
    """topic -> sum of its partitions' end offsets, for every topic named gnomon.*"""
    c = Consumer(consumer_config(bootstrap, "bench-offsets"))
    try:
        md = c.list_topics(timeout=10)
        return {name: sum(c.get_watermark_offsets(TopicPartition(name, p), 10)[1] for p in t.partitions)
                for name, t in sorted(md.topics.items()) if name.startswith("gnomon.")}
    finally:
        c.close()


def cpu_s(procs: list[subprocess.Popen[bytes]]) -> float:
    """user + system CPU seconds of these processes (/proc/<pid>/stat fields 14 and 15)."""
    total = 0.0
    for proc in procs:
        try:
            raw = Path(f"/proc/{proc.pid}/stat").read_text()
        except OSError:
            continue
        fields = raw[raw.rindex(")") + 2:].split()  # fields[0] is field 3 (state)
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


@dataclass
class Starts:
    """Reads the handlers' start files as they grow: run_id -> every start_ms seen."""

    paths: list[Path]
    prefix: str
    seen: dict[str, list[int]] = field(default_factory=dict)
    _pos: dict[Path, int] = field(default_factory=dict)

    def poll(self) -> int:
        for path in self.paths:
            try:
                with open(path, "rb") as f:
                    f.seek(self._pos.get(path, 0))
                    data = f.read()
            except FileNotFoundError:
                continue
            end = data.rfind(b"\n") + 1  # a line still being written is read next time
            self._pos[path] = self._pos.get(path, 0) + end
            for line in data[:end].decode().splitlines():
                run_id, _, ms = line.rpartition(" ")
                if run_id.startswith(self.prefix):
                    self.seen.setdefault(run_id, []).append(int(ms))
        return len(self.seen)


def register(p: Producer, topic: str, job_id: str, spec: JobSpec) -> None:
    while True:
        try:
            value = codec.encode(RegisterJob(job_id, "bench", spec, int(time.time() * 1000)))
            p.produce(topic, key=job_id.encode(), value=value,
                      headers=operator_headers(topic, job_id.encode(), value))
            return
        except BufferError:
            p.poll(0.05)


def refusals(bootstrap: str, topic: str, since: list[TopicPartition], prefix: str) -> Counter[str]:
    """The processor's refusals of this bench's commands (command-results from ``since``),
    by limit or reason."""
    c = Consumer(consumer_config(bootstrap, "bench-results-" + prefix))
    c.list_topics(topic, timeout=10)
    c.assign(since)
    left = sum(c.get_watermark_offsets(TopicPartition(topic, tp.partition), 10)[1] - tp.offset for tp in since)
    out: Counter[str] = Counter()
    deadline = time.monotonic() + 60
    while left > 0 and time.monotonic() < deadline:
        for msg in c.consume(5000, 0.5):
            left -= 1
            if msg.error() or msg.value() is None:
                continue
            try:
                res = codec.decode(msg.value())
            except GnomonError:
                continue
            if isinstance(res, CommandResult) and res.job_id.startswith(prefix) and not res.accepted:
                out[res.limit or res.reason or res.code.value] += 1
    c.close()
    return out


def processor_flags() -> str:
    out = subprocess.run([sys.executable, "-m", "gnomon.cli.main", "processor", "--help"], capture_output=True,
                         text=True, env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}, check=False)
    return out.stdout


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--processors", type=int, default=1)
    ap.add_argument("--concurrency", type=int, default=500,
                    help="slots per worker: a thread each; threads of all processes share the kernel's pid_max")
    ap.add_argument("--lookahead-s", type=int, default=30, help="processor --lookahead-s")
    ap.add_argument("--stage-ahead-s", type=int, default=None,
                    help="processor --stage-ahead-s if it has that flag (default: = lookahead)")
    ap.add_argument("--busy-worker", action="store_true",
                    help=f"add a worker whose {BUSY_SLOTS} slots are held by long sleep jobs")
    ap.add_argument("--pool", default="default", help="worker pool of the jobs and workers: one of the "
                    "topology's pools (default, batch); workers of others on the same pool may take runs")
    ap.add_argument("--lead-s", type=float, default=0, help="extra seconds between registration end and the slot")
    ap.add_argument("--timeout-s", type=float, default=600)
    args = ap.parse_args()
    s, topo = load(), load_topology()
    from gnomon.infra import manager

    manager.up(s)
    tag = secrets.token_hex(3)
    pool = args.pool
    logs = Path(s.state_dir) / "bench-logs"
    logs.mkdir(parents=True, exist_ok=True)
    for old in logs.glob("starts-*.txt"):
        old.unlink()
    exe = [sys.executable, "-m", "gnomon.cli.main"]

    proc_args = ["--lookahead-s", str(args.lookahead_s)]
    stage_ahead = "processor default (no --stage-ahead-s flag)"
    if "--stage-ahead" in processor_flags():
        sa = args.lookahead_s if args.stage_ahead_s is None else args.stage_ahead_s
        proc_args += ["--stage-ahead-s", str(sa)]
        stage_ahead = str(sa)
    elif args.stage_ahead_s is not None:
        raise SystemExit("gnomon processor has no --stage-ahead-s flag")

    def spawn(argv: list[str], log_name: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        return subprocess.Popen([*exe, *argv], stdout=open(logs / log_name, "wb"),
                                stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO,
                                env={**os.environ, **(env or {})})

    def spawn_worker(name: str, concurrency: int) -> subprocess.Popen[bytes]:
        pythonpath = os.pathsep.join(x for x in (str(BENCH), os.environ.get("PYTHONPATH", "")) if x)
        # `worker --app` overwrites the app Worker's pool and concurrency with these flags
        return spawn(["worker", "--app", "spike_app:worker", "--worker-id", f"bench-{name}-{tag}", "--pool", pool,
                      "--concurrency", str(concurrency)], f"worker-{name}.log",
                     {"PYTHONPATH": pythonpath, "SPIKE_STARTS_FILE": str(logs / f"starts-{name}.txt"),
                      "SPIKE_CONCURRENCY": str(concurrency)})

    p = Producer(producer_config(s.kafka_bootstrap))
    # one-time jobs count against the tenant's backlog_max (default 10,000): the bench's
    # tenant is allowed its spike, as an admin would allow a team's (`gnomon tenants set
    # bench --backlog-max N`)
    limits = TenantLimits("bench", backlog_max=max(TenantLimits("bench").backlog_max, 2 * args.jobs + BUSY_SLOTS))
    p.produce(topo.tenants, key=b"bench", value=codec.encode(limits, topo.tenants))
    p.flush(30)
    print(f"tenant bench: backlog_max {limits.backlog_max}", file=sys.stderr)
    processors = [spawn(["processor", "--instance-id", f"bench-{i}", *proc_args], f"processor{i}.log")
                  for i in range(args.processors)]
    workers: list[subprocess.Popen[bytes]] = []
    busy = Starts([logs / "starts-busy.txt"], f"busy{tag}-")
    try:
        if args.busy_worker:
            workers.append(spawn_worker("busy", BUSY_SLOTS))
            time.sleep(8)  # group join + restore + first advert
            sleep_spec = JobSpec(name="spike-busy", schedule=Schedule(run_at_ms=int(time.time() * 1000) + 2000),
                                 target=Target(TargetType.HANDLER, handler="sleep"),
                                 payload_json=json.dumps({"sleep_s": 600}, separators=(",", ":"), sort_keys=True),
                                 timeout_s=3600, retry=RetryPolicy(max_attempts=1), pool=pool)
            for i in range(BUSY_SLOTS):
                register(p, topo.job_commands, f"busy{tag}-{i}", sleep_spec)
            p.flush(60)
            deadline = time.monotonic() + 90
            while busy.poll() < BUSY_SLOTS and time.monotonic() < deadline:
                print(f"\rbusy worker: {len(busy.seen)}/{BUSY_SLOTS} sleep jobs started", end="", file=sys.stderr,
                      flush=True)
                time.sleep(0.2)
            print(f"\rbusy worker: {len(busy.seen)}/{BUSY_SLOTS} sleep jobs started", file=sys.stderr)
            if len(busy.seen) < BUSY_SLOTS:
                raise SystemExit(f"the busy worker started only {len(busy.seen)} sleep jobs; see {logs}")
        for i in range(args.workers):
            workers.append(spawn_worker(f"w{i}", args.concurrency))
        time.sleep(8)  # group join + restore + first adverts
        dead = [proc.args for proc in processors + workers if proc.poll() is not None]
        if dead:
            raise SystemExit(f"exited early: {dead}; see {logs}")

        # idle baseline, so the CPU figures can be judged (the window below includes idle time)
        idle_t0, idle_p0, idle_w0 = time.monotonic(), cpu_s(processors), cpu_s(workers)
        time.sleep(5)
        idle_dt = time.monotonic() - idle_t0
        idle_p, idle_w = (cpu_s(processors) - idle_p0) / idle_dt, (cpu_s(workers) - idle_w0) / idle_dt

        start_offsets = end_offsets(s.kafka_bootstrap, topo.runs)
        result_offsets = end_offsets(s.kafka_bootstrap, topo.command_results)
        records_before = gnomon_records(s.kafka_bootstrap)
        t_cpu0, cpu_p0, cpu_w0 = time.monotonic(), cpu_s(processors), cpu_s(workers)

        # register every job first (slot beyond the lookahead), so the slot is the same second for all
        reg_rate_s = 3000.0
        slot_ms = math.ceil(time.time() + args.jobs / reg_rate_s + args.lookahead_s + 5 + args.lead_s) * 1000
        spec = JobSpec(name="spike", schedule=Schedule(run_at_ms=slot_ms), target=Target(TargetType.HANDLER, handler="noop"),
                       timeout_s=60, pool=pool)
        t_reg = time.time()
        step = max(1, min(1000, args.jobs // 20))
        for i in range(args.jobs):
            register(p, topo.job_commands, f"spike{tag}-{i:06d}", spec)
            if i % step == 0:
                print(f"\rregistering {i}/{args.jobs}", end="", file=sys.stderr, flush=True)
        p.flush(60)
        print(f"\rregistered {args.jobs} jobs in {time.time() - t_reg:.1f}s; slot {slot_ms} is "
              f"{(slot_ms / 1000 - time.time()):.1f}s away", file=sys.stderr)
        if slot_ms / 1000 - time.time() < args.lookahead_s + 5:
            print(f"warning: slot is less than lookahead + 5 s ({args.lookahead_s + 5} s) away", file=sys.stderr)

        starts = Starts([logs / f"starts-w{i}.txt" for i in range(args.workers)] + [logs / "starts-busy.txt"],
                        f"spike{tag}-")
        c = Consumer(consumer_config(s.kafka_bootstrap, "bench-" + tag))
        c.assign(start_offsets)
        done: set[str] = set()
        ended: dict[str, RunState] = {}  # run_id -> terminal state (ledger)
        all_ended_at: float | None = None
        deadline = time.monotonic() + args.timeout_s
        while (starts.poll() < args.jobs or len(done) < args.jobs) and time.monotonic() < deadline:
            for msg in c.consume(1000, 0.2):
                if msg.error() or msg.value() is None:
                    continue
                try:
                    st = codec.decode(msg.value())
                except GnomonError:
                    continue
                if isinstance(st, RunState) and st.job_id.startswith(f"spike{tag}-") and st.status.terminal:
                    ended[st.run_id] = st
                    if st.status is RunStatus.SUCCEEDED:
                        done.add(st.run_id)
            if len(ended) >= args.jobs:  # every run ended: wait a little for starts still unseen, no more
                all_ended_at = all_ended_at or time.monotonic()
                if time.monotonic() - all_ended_at > 10:
                    break
            to_slot = slot_ms / 1000 - time.time()
            when = f"slot in {to_slot:4.0f}s" if to_slot > 0 else f"slot +{-to_slot:.0f}s"
            print(f"\r{when}  started {starts.poll()}/{args.jobs}  succeeded {len(done)}/{args.jobs}  ",
                  end="", file=sys.stderr, flush=True)
        print(file=sys.stderr)
        c.close()
        refused = refusals(s.kafka_bootstrap, topo.command_results, result_offsets, f"spike{tag}-")
        if refused:
            print(f"warning: the processor refused {sum(refused.values())} registrations: "
                  + "; ".join(f"{n} {why}" for why, n in refused.most_common(5)), file=sys.stderr)
        complete = len(starts.seen) >= args.jobs and len(done) >= args.jobs
        timed_out = len(ended) < args.jobs
        time.sleep(3)  # settle: the last completions, commits and history records
        starts.poll()
        records_after = gnomon_records(s.kafka_bootstrap)
        t_cpu1, cpu_p1, cpu_w1 = time.monotonic(), cpu_s(processors), cpu_s(workers)
        dead = [proc.args for proc in processors + workers if proc.poll() is not None]

        first = {run_id: min(ts) for run_id, ts in starts.seen.items()}
        if not first:
            raise SystemExit("no handler started; see " + str(logs))
        lags = [(t - slot_ms) / 1000 for t in first.values()]
        doubled = sum(1 for ts in starts.seen.values() if len(ts) > 1)
        span = (max(first.values()) - min(first.values())) / 1000 or 0.001
        n = args.jobs
        print(f"jobs={n} processors={args.processors} workers={args.workers}x{args.concurrency}"
              f"{f' + busy 1x{BUSY_SLOTS} (all slots held)' if args.busy_worker else ''} "
              f"lookahead_s={args.lookahead_s} stage_ahead_s={stage_ahead} pool={pool}")
        ours = {f"bench-{w}-{tag}" for w in ["busy", *(f"w{i}" for i in range(args.workers))]}
        elsewhere = sorted({st.worker_id or "?" for st in ended.values() if st.worker_id not in ours})
        n_elsewhere = sum(1 for st in ended.values() if st.worker_id not in ours)
        print(f"started={len(first)} doubled={doubled} missed={n - len(first)} succeeded={len(done)} "
              f"ended_not_succeeded={len(ended) - len(done)}"
              f"{f'  (TIMED OUT after {args.timeout_s:g}s)' if timed_out else ''}")
        if n_elsewhere:
            print(f"warning: {n_elsewhere} runs ended on workers this bench did not start ({', '.join(elsewhere)}): "
                  f"another test run shares pool {pool!r}; their starts are not measured (use --pool)")
        print(f"start lag s (handler start - slot): p50={pct(lags, 50):.3f} p95={pct(lags, 95):.3f} "
              f"p99={pct(lags, 99):.3f} max={max(lags):.3f} (min={min(lags):.3f})")
        print(f"runs/s (first to last handler start) = {len(first) / span:.0f}")
        delta = {t: records_after.get(t, 0) - records_before.get(t, 0) for t in records_after}
        print(f"records per run = {sum(delta.values()) / n:.2f} (all gnomon.* topics; includes job registration, "
              f"history/log topics, worker adverts and transaction markers"
              f"{'' if complete else '; run incomplete'})")
        top = sorted(((d, t) for t, d in delta.items() if d), reverse=True)[:10]
        print("records per run by topic: " + " ".join(f"{t.removeprefix('gnomon.')}={d / n:.2f}" for d, t in top))
        window = t_cpu1 - t_cpu0
        per_k_p, per_k_w = (cpu_p1 - cpu_p0) / n * 1000, (cpu_w1 - cpu_w0) / n * 1000
        print(f"CPU-seconds per 1,000 runs: processors={per_k_p:.2f} workers={per_k_w:.2f} (registration to "
              f"completion + settle, a {window:.0f}s window incl. idle time; idle rate before registration: "
              f"processors={idle_p:.3f} workers={idle_w:.3f} CPU-s/s over {idle_dt:.0f}s)")
        if dead:
            print(f"warning: exited during the run (their CPU is not counted): {dead}")
    finally:
        if busy.seen:  # end the sleep jobs, so the runs do not linger on their leases
            now = int(time.time() * 1000)
            for run_id in busy.seen:
                key = run_id.partition("@")[0].encode()
                value = codec.encode(CancelRun(run_id, "bench", now, "spike bench finished"), topo.job_commands)
                p.produce(topo.job_commands, key=key, value=value,
                          headers=operator_headers(topo.job_commands, key, value))
            p.flush(10)
            time.sleep(2)
        for proc in processors + workers:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in processors + workers:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


if __name__ == "__main__":
    main()
