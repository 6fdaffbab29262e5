"""The spec's 10M registered jobs on one box: registration time, idle cost, state size,
restore time and a kill -9 takeover, with every job's state in the processors' stores.

    .venv/bin/python bench/scale.py [--jobs 10000000] [--base 10000] [--chunk 1000000]

Run it on a fresh stack (`gnomon infra down`, remove the state directory's kafka/,
cassandra/ and processor/ folders, `gnomon infra up`): it leaves its jobs registered
(deleting 10M jobs takes as long as registering them), and other jobs on the stack
count in its figures. Phases, each printed as it ends:

1. processor pA alone; ``--base`` jobs registered through ``gnomon.events.JobEvents``
   (with replies: every answer read back, a refusal stops the bench; 500,000 jobs per
   tenant, bench-scale-00, -01, ..., under the default jobs_max), then pA's CPU while idle
   for ``--idle-s`` (nothing due: the tick reads the due index up to now + lookahead);
2. the rest up to ``--jobs``, in chunks of ``--chunk`` (a progress line every 10 s),
   then the idle CPU again: "an idle tick costs the same as with 10k jobs";
3. state size: pA's RocksDB stores (bytes on disk, keys) and the changelog topics on
   the broker's disk;
4. processor pB starts with an empty state directory: the group gives it half of the
   partitions, which it rebuilds from the changelogs (restore time per partition, from
   its log), and it builds warm standby copies of pA's half;
5. one per-second probe job per partition and a worker; kill -9 of pA once pB's standbys
   are warm: how long each of pA's partitions went without a ledger write (the probes
   run every second, so a partition that is served writes within a second);
6. pA restarts on its own (unclean) state directory: its restore time.

Every job is a daily cron job whose first slot is tomorrow, spread over the day's
minutes (``M H D MON *``: then a year later), so nothing is due while it runs.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition
from register import cpu_s  # (bench/register.py: a process's CPU seconds from /proc)

from gnomon import codec
from gnomon.adapters.kafka import consumer_config, partition_for
from gnomon.command_keys import operator_key
from gnomon.config import load
from gnomon.core.errors import EventLogError
from gnomon.core.model import JobSpec, Schedule, Target, TargetType
from gnomon.events import JobEvents
from gnomon.topology import load_topology

REPO = Path(__file__).resolve().parent.parent
TENANT = "bench-scale"  # the probes' tenant; the jobs' tenants are bench-scale-00, -01, ...
PER_TENANT = 500_000  # jobs per tenant (a tenant's default jobs_max is 1,000,000)
ANSWERS_MAX_S = 3_600  # per chunk: the processor applies a chunk of 1M in a few minutes
WARM_MAX_S = 1_800  # pB's restore and standbys
NOOP = Target(TargetType.HANDLER, handler="noop")


def du(path: Path) -> int:
    """Bytes allocated on disk under ``path`` (Kafka preallocates its index files sparse)."""
    return sum(f.stat().st_blocks * 512 for f in path.rglob("*") if f.is_file()) if path.exists() else 0


class Procs:
    """gnomon processes of this bench, each in its own session with a log file."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        with open(self.logs / f"{name}.log", "ab") as out:
            p = subprocess.Popen([sys.executable, "-m", "gnomon.cli.main", *args], cwd=REPO,
                                 env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=out,
                                 stderr=subprocess.STDOUT, start_new_session=True)
        self.procs[name] = p
        return p

    def processor(self, name: str) -> subprocess.Popen[bytes]:
        return self.start(name, "processor", "--instance-id", f"scale-{name}")

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")

    def kill(self, name: str, sig: int) -> None:
        p = self.procs.pop(name)
        os.killpg(p.pid, sig)
        p.wait(120)

    def stop_all(self) -> None:
        for name in list(self.procs):
            if self.procs[name].poll() is None:
                self.kill(name, signal.SIGTERM)


def owned(text: str) -> list[int]:
    found: list[int] = []
    for line in text.splitlines():
        if m := re.search(r"assigned partitions \[([0-9, ]*)\]", line):
            found = [int(x) for x in m.group(1).split(",") if x.strip()]
    return found


def restores(text: str, since: int = 0) -> list[str]:
    return [line.split(": ", 1)[-1] for line in text[since:].splitlines() if "restored:" in line]


def wait_for(what: str, ok: object, limit_s: float) -> None:
    t0 = time.monotonic()
    last = t0
    while not ok():  # type: ignore[operator]
        if time.monotonic() - t0 > limit_s:
            sys.exit(f"gave up waiting for {what} after {limit_s:.0f} s")
        if time.monotonic() - last > 10:
            last = time.monotonic()
            print(f"  waiting for {what} ({time.monotonic() - t0:.0f} s)", flush=True)
        time.sleep(0.5)


def specs(tomorrow: datetime) -> list[JobSpec]:
    """One daily spec per minute of tomorrow (first slot tomorrow, then a year later)."""
    return [JobSpec(name="scale", schedule=Schedule(cron=f"{m} {h} {tomorrow.day} {tomorrow.month} *"), target=NOOP)
            for h in range(24) for m in range(60)]


def segments(first: int, last: int, chunk: int) -> list[tuple[int, int]]:
    """[lo, hi) ranges of at most ``chunk`` jobs, none across a tenant's boundary."""
    out = []
    lo = first
    while lo < last:
        hi = min(last, lo + chunk, (lo // PER_TENANT + 1) * PER_TENANT)
        out.append((lo, hi))
        lo = hi
    return out


def register(bootstrap: str, first: int, last: int, chunk: int, pa: int) -> None:
    """Register jobs [first, last), job i for tenant bench-scale-{i // PER_TENANT}, a chunk
    at a time; print rates; exit on a refusal."""
    plan = specs(datetime.now(UTC) + timedelta(days=1))
    n = last - first
    t0, cpu0 = time.monotonic(), cpu_s(pa)
    done = 0
    last_print = t0
    for lo, hi in segments(first, last, chunk):
        with JobEvents(f"{TENANT}-{lo // PER_TENANT:02d}", bootstrap, replies=True, linger_ms=50,
                       command_key=operator_key(), role="admin") as events:  # an operator's tool: reads the answers topic
            for i in range(lo, hi):
                events.register(plan[i % len(plan)], job_id=f"scale-{i:08d}")
                if i % 20_000 == 0 and time.monotonic() - last_print > 10:
                    last_print = time.monotonic()
                    print(f"  sent {i - first:,}/{n:,}; answered {done:,} "
                          f"({done / (last_print - t0):,.0f}/s)", flush=True)
            events.flush(120)
            t_wait = time.monotonic()
            while True:
                try:
                    results = events.results(30)
                    break
                except EventLogError as exc:  # not all answered yet: keep waiting
                    if time.monotonic() - t_wait > ANSWERS_MAX_S:
                        sys.exit(f"answers did not come in {ANSWERS_MAX_S} s: {exc}")
                    print(f"  sent {hi - first:,}/{n:,}; waiting for the processor's answers "
                          f"({time.monotonic() - t0:.0f} s in)", flush=True)
        refused = [r for r in results if not r.accepted]
        if refused:
            sys.exit(f"{len(refused)} registrations refused, first: {refused[0].reason}")
        done += len(results)
        el = time.monotonic() - t0
        print(f"  answered {done:,}/{n:,} in {el:.0f} s ({done / el:,.0f}/s)", flush=True)
    el = time.monotonic() - t0
    used = cpu_s(pa) - cpu0
    print(f"registered {n:,} jobs (all accepted) in {el:.1f} s = {n / el:,.0f}/s; processor pA "
          f"{used:.0f} CPU-s = {1000 * used / n:.3f} CPU-ms per registration", flush=True)


def idle_cpu(name: str, pid: int, seconds: float) -> float:
    c0, t0 = cpu_s(pid), time.monotonic()
    time.sleep(seconds)
    rate = (cpu_s(pid) - c0) / (time.monotonic() - t0)
    print(f"idle: {name} used {rate * 1000:.1f} CPU-ms per second over {seconds:.0f} s", flush=True)
    return rate


def sizes(state_dir: Path, topo_names: list[str], status: str) -> None:
    """The state's size as pA reports it (RocksDB's estimates: keys and live bytes per
    partition; its memtables are on disk only after a flush) and the topics on disk."""
    parts = re.findall(r"p(\d+):(\d+)keys/(\d+)KiB", status)
    print(f"state: pA's stores hold {sum(int(k) for _, k, _ in parts):,} keys, "
          f"{sum(int(b) for _, _, b in parts) / 1024:,.0f} MiB estimated, over {len(parts)} partitions")
    kafka = state_dir / "kafka"
    for topic in topo_names:
        dirs = [d for d in kafka.rglob(f"{topic}-*") if d.is_dir() and re.fullmatch(rf"{re.escape(topic)}-\d+", d.name)]
        print(f"  topic {topic}: {sum(du(d) for d in dirs) / 2**20:,.0f} MiB on the broker's disk "
              f"({len(dirs)} partitions)", flush=True)


def probes(parts: int) -> list[str]:
    """One job id per partition."""
    ids: dict[int, str] = {}
    i = 0
    while len(ids) < parts:
        jid = f"scale-probe-{i}"
        ids.setdefault(partition_for(jid, parts), jid)
        i += 1
    return [ids[p] for p in range(parts)]


def takeover_gaps(bootstrap: str, runs_topic: str, parts: list[int], t_kill_ms: int, probe_ids: set[str],
                  start: list[TopicPartition], limit_s: float = 120) -> dict[int, float]:
    """Per partition of ``parts``: seconds from the kill to the first ledger record of a
    probe written after it (the record's timestamp: when the processor produced it)."""
    c = Consumer({**consumer_config(bootstrap, "scale-bench-tap", role="processor"),
                  "enable.auto.commit": False, "isolation.level": "read_committed"})
    c.assign([tp for tp in start if tp.partition in parts])
    first: dict[int, float] = {}
    t0 = time.monotonic()
    try:
        while len(first) < len(parts) and time.monotonic() - t0 < limit_s:
            for m in c.consume(500, 1.0):
                if m.error() or m.value() is None or m.partition() in first:
                    continue
                if (m.key() or b"").decode().split("@", 1)[0] not in probe_ids:
                    continue
                ts = m.timestamp()[1]
                if ts > t_kill_ms:
                    codec.decode(m.value())  # a record the processor wrote, decodable
                    first[m.partition()] = (ts - t_kill_ms) / 1000
    finally:
        c.close()
    return first


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=10_000_000)
    ap.add_argument("--base", type=int, default=10_000, help="jobs registered before the first idle measure")
    ap.add_argument("--chunk", type=int, default=1_000_000, help="registrations sent before reading their answers")
    ap.add_argument("--idle-s", type=float, default=60)
    args = ap.parse_args()
    s, topo = load(), load_topology()
    subprocess.run([sys.executable, "-m", "gnomon.infra", "up"], check=True)
    logs = s.state_dir / "bench-logs" / f"scale-{int(time.time())}"
    logs.mkdir(parents=True)
    print(f"logs: {logs}", flush=True)
    procs = Procs(logs)
    try:
        pa = procs.processor("pA")
        wait_for("pA to own every partition", lambda: len(owned(procs.log("pA"))) == topo.partitions, 120)
        print(f"phase 1: {args.base:,} jobs", flush=True)
        register(s.kafka_bootstrap, 0, args.base, args.chunk, pa.pid)
        time.sleep(5)
        idle_small = idle_cpu(f"pA with {args.base:,} jobs", pa.pid, args.idle_s)

        print(f"phase 2: {args.jobs - args.base:,} more jobs", flush=True)
        register(s.kafka_bootstrap, args.base, args.jobs, args.chunk, pa.pid)
        time.sleep(5)
        mark = len(procs.log("pA"))
        idle_big = idle_cpu(f"pA with {args.jobs:,} jobs", pa.pid, args.idle_s)
        print(f"idle cost ratio ({args.jobs:,} vs {args.base:,} jobs): {idle_big / max(idle_small, 1e-9):.2f}x")
        wait_for("pA's next status line", lambda: "partitions=" in procs.log("pA")[mark:], 60)
        status = [x for x in procs.log("pA").splitlines() if "partitions=" in x][-1]

        print("phase 3: state size", flush=True)
        sizes(s.state_dir, [topo.jobs, topo.runs, topo.job_commands], status)

        print("phase 4: pB starts empty", flush=True)
        t_b = time.monotonic()
        procs.processor("pB")
        half = topo.partitions // 2
        wait_for("pB to restore its partitions", lambda: len(restores(procs.log("pB"))) >= half, WARM_MAX_S)
        print(f"pB restored {half} partitions {time.monotonic() - t_b:.1f} s after it started:")
        for line in restores(procs.log("pB")):
            print(f"  pB: {line}")

        def warm() -> bool:
            status = [x for x in procs.log("pB").splitlines() if "standbys=" in x]
            m = re.search(r"standbys=(\{[^}]*\})", status[-1]) if status else None
            lag = ast.literal_eval(m.group(1)) if m else {}
            return bool(lag) and all(0 <= v < 1_000 for v in lag.values())

        wait_for("pB's standbys of pA's partitions to be warm", warm, WARM_MAX_S)
        print(f"pB's standbys warm {time.monotonic() - t_b:.1f} s after it started", flush=True)

        print("phase 5: probes, a worker, kill -9 of pA", flush=True)
        probe_ids = probes(topo.partitions)
        every_s = JobSpec(name="probe", schedule=Schedule(cron="* * * * * *"), target=NOOP, timeout_s=30)
        with JobEvents(TENANT, s.kafka_bootstrap, replies=True, command_key=operator_key(),
                       role="admin") as events:  # an operator's tool: reads the answers topic
            for jid in probe_ids:
                events.register(every_s, job_id=jid)
            assert all(r.accepted for r in events.results(120)), "a probe job was refused"
        procs.start("w1", "worker", "--worker-id", "scale-w1", "--tenant", TENANT, "--concurrency", "64")
        time.sleep(20)
        victim_parts = owned(procs.log("pA"))
        c = Consumer(consumer_config(s.kafka_bootstrap, "scale-bench-tap", role="processor"))
        start = [TopicPartition(topo.runs, p, c.get_watermark_offsets(TopicPartition(topo.runs, p), 10)[1])
                 for p in range(topo.partitions)]
        c.close()
        t_kill_ms = int(time.time() * 1000)
        procs.kill("pA", signal.SIGKILL)
        print(f"killed pA (owned {victim_parts})", flush=True)
        gaps = takeover_gaps(s.kafka_bootstrap, topo.runs, victim_parts, t_kill_ms, set(probe_ids), start)
        for p in victim_parts:
            print(f"  partition {p}: first ledger write {gaps[p]:.1f} s after the kill" if p in gaps
                  else f"  partition {p}: no ledger write in 120 s")
        pb_restores = restores(procs.log("pB"))
        print("  pB's restores after the kill: " + "; ".join(pb_restores[half:]))

        print("phase 6: pA restarts on its unclean state directory", flush=True)
        mark = len(procs.log("pA"))
        t_a = time.monotonic()
        procs.processor("pA")
        wait_for("pA to restore what it is given",
                 lambda: (o := owned(procs.log("pA")[mark:])) != [] and len(restores(procs.log("pA"), mark)) >= len(o),
                 WARM_MAX_S)
        print(f"pA restored {time.monotonic() - t_a:.1f} s after it started:")
        for line in restores(procs.log("pA"), mark):
            print(f"  pA: {line}")
        with JobEvents(TENANT, s.kafka_bootstrap, command_key=operator_key()) as events:
            for jid in probe_ids:
                events.delete(jid)
    finally:
        procs.stop_all()
    root = s.state_dir / "processor"
    print(f"on disk after a clean stop (stores flushed): pA {du(root / 'scale-pA') / 2**20:,.0f} MiB, "
          f"pB {du(root / 'scale-pB') / 2**20:,.0f} MiB (each: its partitions and its standby copies)")
    print(f"done; the {args.jobs:,} jobs stay registered (tenants {TENANT}-00, ...): reset the stack to remove them")


if __name__ == "__main__":
    main()
