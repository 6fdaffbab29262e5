"""Bulk registration over Kafka with gnomon.events: how fast the broker acknowledges the
commands, and how fast the processor applies them.

    .venv/bin/python bench/register.py [--jobs 50000] [--no-processor]

Starts Kafka + Cassandra if needed (gnomon infra up) and one processor of its own (unless
--no-processor: then the running processors must own every partition), registers N jobs
for tenant ``bench-reg`` through ``gnomon.events.JobEvents`` (cron jobs whose first slot
is next new year, so nothing runs), and prints:

* acked/s: N / the time from the first send until Kafka acknowledged all (acks=all);
* applied/s: N / the time from the first send until the processor group's committed
  offsets on the job-commands topic passed every command (a processor commits its input
  offsets in the same transaction as the state the commands produced);
* confirmed/s: N / the time from the first send until the producer has read the
  processor's answer to every command on the command-results topic (all accepted).

Then it deletes the jobs the same way. Run it on a quiet stack: other commands on the
topic count toward "applied". Prints a progress line every 5 s.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from gnomon import region
from gnomon.adapters.kafka import consumer_config
from gnomon.command_keys import operator_key
from gnomon.config import load
from gnomon.events import JobEvents
from gnomon.processor.runtime import GROUP_ID
from gnomon.topology import load_topology

REPO = Path(__file__).resolve().parent.parent
TENANT = "bench-reg"
WAIT_MAX_S = 600


def cpu_s(pid: int) -> float:
    """user + system CPU seconds of process ``pid`` (/proc/<pid>/stat fields 14 and 15)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = raw[raw.rindex(")") + 2:].split()  # fields[0] is field 3 (state)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def offsets(bootstrap: str, topic: str, partitions: int) -> tuple[int, int]:
    """(sum of end offsets, sum of the processor group's committed offsets) of ``topic``."""
    c = Consumer(consumer_config(bootstrap, region.group_id(GROUP_ID, load_topology().region), role="processor"))
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        ends = sum(c.get_watermark_offsets(tp, 10)[1] for tp in tps)
        committed = sum(max(0, tp.offset) for tp in c.committed(tps, 10))
        return ends, committed
    finally:
        c.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=50_000)
    ap.add_argument("--no-processor", action="store_true")
    ap.add_argument("--batch-max", type=int, default=None, help="the processor's --batch-max (default: its own)")
    args = ap.parse_args()
    settings = load()
    subprocess.run([sys.executable, "-m", "gnomon.infra", "up"], check=True)
    topo = load_topology()
    proc: subprocess.Popen[bytes] | None = None
    logs = settings.state_dir / "bench-logs"
    logs.mkdir(parents=True, exist_ok=True)
    if not args.no_processor:
        with open(logs / "register-processor.log", "ab") as out:
            extra = [] if args.batch_max is None else ["--batch-max", str(args.batch_max)]
            proc = subprocess.Popen([sys.executable, "-m", "gnomon.cli.main", "processor", "--instance-id", "bench-reg",
                                     *extra],
                                    cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
    try:
        time.sleep(5)  # the group settles (assignment, restore)
        spec = {"name": "bulk", "schedule": "0 0 1 1 *", "target": {"type": "handler", "name": "noop"}}
        ids: list[str] = []
        cpu0 = cpu_s(proc.pid) if proc is not None else 0.0
        with JobEvents(TENANT, settings.kafka_bootstrap, replies=True, command_key=operator_key(),
                       role="admin") as events:  # an operator's tool: reads the answers topic
            t0 = time.monotonic()
            for i in range(args.jobs):
                ids.append(events.register(spec, job_id=f"bench-reg-{i:08d}"))
            done = events.flush(120)
            acked_s = time.monotonic() - t0
            print(f"acked: {done.acknowledged} registrations in {acked_s:.2f}s = {args.jobs / acked_s:,.0f}/s",
                  flush=True)
            results = events.results(WAIT_MAX_S)
            confirmed_s = time.monotonic() - t0
        refused = [r for r in results if not r.accepted]
        print(f"confirmed: {len(results)} answers in {confirmed_s:.2f}s = {args.jobs / confirmed_s:,.0f}/s "
              f"({len(refused)} refused{': ' + str(refused[0].reason) if refused else ''})")
        ends, committed = offsets(settings.kafka_bootstrap, topo.job_commands, topo.partitions)
        last = time.monotonic()
        while committed < ends:
            if time.monotonic() - t0 > WAIT_MAX_S:
                sys.exit(f"the processor did not apply them in {WAIT_MAX_S}s ({ends - committed} left)")
            if time.monotonic() - last > 5:
                last = time.monotonic()
                print(f"  applying: {ends - committed:,} commands left", flush=True)
            time.sleep(0.2)
            _, committed = offsets(settings.kafka_bootstrap, topo.job_commands, topo.partitions)
        applied_s = time.monotonic() - t0
        print(f"applied: {args.jobs} registrations in {applied_s:.2f}s = {args.jobs / applied_s:,.0f}/s "
              "(first send to the processor's commit)")
        if proc is not None:
            used = cpu_s(proc.pid) - cpu0
            print(f"processor CPU: {used:.1f} s = {1000 * used / args.jobs:.2f} CPU-ms per command "
                  f"({used / applied_s:.0%} of one core while applying)")
        with JobEvents(TENANT, settings.kafka_bootstrap, command_key=operator_key()) as events:
            for job_id in ids:
                events.delete(job_id)
        print(f"deleted {len(ids)} jobs")
    finally:
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(60)


if __name__ == "__main__":
    main()
