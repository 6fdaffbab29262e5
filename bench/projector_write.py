"""CPU per run of ``CassandraHistoryStore.write_batch``, without Kafka (issue 22).

Writes what the history projector writes per run -- its RunState (a finished run, with
the codec bytes of its Kafka record), one LogLine and its job's JobState -- in batches
of ``--batch-runs`` runs of distinct jobs (the projector coalesces a batch to one state
per key), into a keyspace of its own on the local Cassandra (dropped at the end), and
prints process CPU (``time.process_time``: every thread, the driver's I/O thread too)
and the Cassandra JVM's CPU per 1,000 runs. The Cassandra figure is only meaningful when
nothing else loads Cassandra meanwhile.

Variants, interleaved round by round so that drift hits them alike:

* ``before``: the store of another source file (``--baseline``), e.g. the last commit's:
  ``git show HEAD:src/gnomon/history/cassandra.py > /tmp/baseline_cassandra.py``
* ``per-statement``: this tree's store with one statement per request (grouping off)
* ``grouped, re-encode``: grouped requests, no record bytes (every state encoded again)
* ``after``: grouped requests and record bytes (what the projector now does)

    .venv/bin/python bench/projector_write.py --runs 4000 --rounds 3 --baseline /tmp/baseline_cassandra.py
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gnomon.codec import encode
from gnomon.config import load
from gnomon.core.jobs import JobState, JobStatus
from gnomon.core.messages import LogLine, LogStream
from gnomon.core.model import JobSpec, RetryPolicy, Schedule, Target, TargetType, slot_run_id
from gnomon.core.runs import RunState, RunStatus
from gnomon.history import cassandra as store_module
from gnomon.history.base import HistoryBatch
from gnomon.history.cassandra import CassandraHistoryStore

SPEC = JobSpec(
    name="every second",
    schedule=Schedule(cron="* * * * * *", tz="UTC"),
    target=Target(TargetType.COMMAND, argv=("python", "-c", "print('tick')")),
    timeout_s=30,
    retry=RetryPolicy(max_attempts=3, backoff_base_s=1.0, backoff_cap_s=30.0),
)
T0 = 1_795_939_200_000


def job_state(i: int, slot_ms: int) -> JobState:
    return JobState(f"bench_job_{i:04d}", f"tenant_{i % 8}", SPEC, JobStatus.ACTIVE, slot_ms + 1000, 1 + slot_ms // 1000,
                    T0, slot_ms)


def run_state(job: JobState, slot_ms: int) -> RunState:
    return RunState(
        run_id=slot_run_id(job.job_id, slot_ms), job_id=job.job_id, tenant=job.tenant, spec=SPEC, slot_ms=slot_ms,
        not_before_ms=slot_ms, manual=False, status=RunStatus.SUCCEEDED, created_at_ms=slot_ms - 50,
        updated_at_ms=slot_ms + 180, attempt=1, token=1, worker_id="worker-7", lease_until_ms=slot_ms + 30_000,
        deadline_ms=slot_ms + 60_000, dispatched_at_ms=slot_ms + 5, started_at_ms=slot_ms + 20,
        finished_at_ms=slot_ms + 170, exit_code=0, reason="succeeded", granted_at_ms=slot_ms + 5,
        attempt_started_at_ms=slot_ms + 20,
    )


def log_line(r: RunState) -> LogLine:
    return LogLine(r.run_id, r.job_id, r.tenant, 1, 0, LogStream.STDOUT, "tick", r.slot_ms + 100)


@dataclass
class Batch:
    with_bytes: HistoryBatch
    without_bytes: HistoryBatch


def batches(runs: int, batch_runs: int, first_slot_ms: int) -> list[Batch]:
    """``runs`` runs of ``batch_runs`` jobs, one slot (second) per batch."""
    out = []
    for b in range((runs + batch_runs - 1) // batch_runs):
        slot = first_slot_ms + b * 1000
        n = min(batch_runs, runs - b * batch_runs)
        jobs = [job_state(i, slot) for i in range(n)]
        rs = [run_state(j, slot) for j in jobs]
        plain = HistoryBatch(jobs=jobs, runs=rs, logs=[log_line(r) for r in rs])
        # the record bytes, as the projector gets them from Kafka (encoded by the processor)
        blobs = replace(plain, job_blobs={j.job_id: encode(j) for j in jobs}, run_blobs={r.run_id: encode(r) for r in rs})
        out.append(Batch(blobs, plain))
    return out


def cassandra_pid() -> int | None:
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if b"CassandraDaemon" in (d / "cmdline").read_bytes():
                    return int(d.name)
            except OSError:
                continue
    return None


def jvm_cpu_s(pid: int | None) -> float:
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


@contextmanager
def group_limit(statements_max: int) -> Iterator[None]:
    saved = store_module.WRITE_BATCH_STATEMENTS_MAX
    store_module.WRITE_BATCH_STATEMENTS_MAX = statements_max
    try:
        yield
    finally:
        store_module.WRITE_BATCH_STATEMENTS_MAX = saved


@dataclass
class Variant:
    name: str
    store: Any
    with_bytes: bool
    statements_max: int = store_module.WRITE_BATCH_STATEMENTS_MAX
    cpu_s: float = 0.0
    jvm_s: float = 0.0
    wall_s: float = 0.0
    runs: int = 0

    def write(self, work: list[Batch], pid: int | None) -> None:
        with group_limit(self.statements_max):
            c0, j0, w0 = time.process_time(), jvm_cpu_s(pid), time.perf_counter()
            for b in work:
                self.store.write_batch(b.with_bytes if self.with_bytes else b.without_bytes)
            self.cpu_s += time.process_time() - c0
            self.jvm_s += jvm_cpu_s(pid) - j0
            self.wall_s += time.perf_counter() - w0
        self.runs += sum(len(b.with_bytes.runs) for b in work)


def baseline_store_class(path: Path) -> Callable[..., Any]:
    spec = importlib.util.spec_from_file_location("gnomon_bench_baseline_cassandra", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod.CassandraHistoryStore  # type: ignore[no-any-return]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=4000, help="runs per variant and round")
    ap.add_argument("--batch-runs", type=int, default=200, help="runs per write_batch (distinct jobs)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--baseline", type=Path, help="a cassandra.py to compare with (the 'before' variant)")
    ap.add_argument("--keyspace", default=f"gnomon_bench_{uuid.uuid4().hex[:8]}")
    ap.add_argument("--keep", action="store_true", help="do not drop the keyspace")
    args = ap.parse_args()

    s = load()
    hosts, port = s.cassandra_hosts, s.cassandra_port
    before = baseline_store_class(args.baseline) if args.baseline else None
    main_store = CassandraHistoryStore(hosts, port, args.keyspace, ensure_schema=True).connect()
    variants: list[Variant] = []
    if before is not None:
        variants.append(Variant("before", before(hosts, port, args.keyspace).connect(), with_bytes=False))
    variants += [
        Variant("per-statement", main_store, with_bytes=False, statements_max=1),
        Variant("grouped, re-encode", main_store, with_bytes=False),
        Variant("after", main_store, with_bytes=True),
    ]
    pid = cassandra_pid()
    slot = T0 + int(time.time()) * 1000 % (10**9)
    try:
        for v in variants:  # warm up: connections, prepared statements, caches
            v.write(batches(args.batch_runs, args.batch_runs, slot), None)
            slot += 1000
            v.cpu_s = v.jvm_s = v.wall_s = 0.0
            v.runs = 0
        for rnd in range(args.rounds):
            for v in variants if rnd % 2 == 0 else reversed(variants):
                work = batches(args.runs, args.batch_runs, slot)
                slot += 1000 * len(work)
                v.write(work, pid)
        print(f"{args.rounds} rounds x {args.runs} runs per variant, {args.batch_runs} runs per write_batch "
              f"(each run: 1 RunState + 1 LogLine + 1 JobState)")
        print(f"{'variant':<20} {'process CPU ms/1k runs':>23} {'Cassandra CPU ms/1k runs':>25} {'wall ms/1k runs':>16}")
        for v in variants:
            k = v.runs / 1000
            print(f"{v.name:<20} {v.cpu_s * 1000 / k:23.0f} {v.jvm_s * 1000 / k:25.0f} {v.wall_s * 1000 / k:16.0f}")
        if pid is None:
            print("(Cassandra JVM not found in /proc: its CPU is not measured)", file=sys.stderr)
    finally:
        for v in variants:
            if v.store is not main_store:
                v.store.close()
        if not args.keep:
            session = main_store._ready()[0]
            session.execute(f"DROP KEYSPACE IF EXISTS {args.keyspace}", timeout=60)
        main_store.close()


if __name__ == "__main__":
    main()
