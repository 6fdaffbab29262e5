"""Full rebuild of one partition's state after N finished runs were purged from the ledger,
measured after the log cleaner has removed them (and their tombstones).

    .venv/bin/python bench/rebuild.py [--runs 1000,1000000] [--keep-topics] [--bootstrap HOST:PORT]

For each N in --runs, on dedicated single-partition compacted topics
(``bench.rebuild.runs.<N>.<pid>``, ``bench.rebuild.jobs.<N>.<pid>``; gnomon.* is not
touched) it produces 100 jobs (``JobState``), N finished runs (``RunState``, SUCCEEDED),
each followed later by its tombstone, and 1,000 live runs that stay. The topic configs
make the broker's cleaner compact within the bench's time, and a short
``delete.retention.ms`` lets a later pass drop the tombstones too: it stands for "the
purges happened more than delete.retention.ms ago". The bench waits (capped) until no
tombstone and no purged run is left, then times the processor's full rebuild
(``Processor._restore`` without a checkpoint): ``read_partition_to_end`` on both
changelog partitions keeping the last value per key, then ``PartitionTask.bulk_load`` into
a fresh RocksDB. Three rebuilds per N; prints the median, the records read, the live keys
and the state bytes (``RocksKV.size()``), and the ratio of the largest N to the smallest.

The records are produced by a plain idempotent producer, not in transactions as the
processor writes them. Needs a running broker (`python -m gnomon.infra up`).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from confluent_kafka import KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import ConfigResource, NewTopic  # type: ignore[attr-defined]

from gnomon import codec
from gnomon.adapters.kafka import producer_config
from gnomon.adapters.kv import RocksKV
from gnomon.config import load
from gnomon.core import jobs as J
from gnomon.core import runs as R
from gnomon.core.model import JobSpec, Schedule, Target, TargetType, slot_run_id
from gnomon.core.workers import WorkerDirectory
from gnomon.eventlog.kafka import read_partition_to_end
from gnomon.infra.kafka import admin
from gnomon.processor.task import PartitionTask
from gnomon.topology import load_topology

T0 = 1_803_859_200_000  # 2027-03-01T00:00:00Z: the first finished run's slot
EVERY_MS = 10_000  # every job fires every 10 s
JOBS = 100
LIVE_FINISHED = 900  # finished runs still inside the retention window (not purged)
LIVE_RUNS = LIVE_FINISHED + JOBS  # + one scheduled run per job
TOMBSTONE_LAG = 10_000  # a run's tombstone follows this many runs after it (the retention window)
REPEATS = 3
RESTORE_TIMEOUT_S = 600.0
SPEC = JobSpec(name="bench", schedule=Schedule(cron="*/10 * * * * *"),
               target=Target(TargetType.COMMAND, argv=("true",)))
SEGMENT_MS = 5_000
TOPIC_CONFIG = {
    "cleanup.policy": "compact",
    "segment.bytes": str(4 * 1024 * 1024),
    "segment.ms": str(SEGMENT_MS),
    "max.compaction.lag.ms": str(SEGMENT_MS),
    "min.cleanable.dirty.ratio": "0.01",
    "min.compaction.lag.ms": "0",
    "delete.retention.ms": "1000",
}
BROKER_KEYS = ("log.cleaner.enable", "log.cleaner.threads", "log.cleaner.backoff.ms",
               "log.cleaner.dedupe.buffer.size", "log.cleaner.io.max.bytes.per.second")


@dataclass(frozen=True)
class Topics:
    jobs: str
    runs: str


@dataclass
class Rebuild:
    seconds: float
    read_s: float
    load_s: float
    records: int
    loaded: int
    kv_keys: int
    kv_bytes: int
    disk_bytes: int


# ---- synthetic records ---------------------------------------------------------------


def job_id(j: int) -> str:
    return f"bench-job-{j:03d}"


def slot_of(i: int) -> int:
    return T0 + (i // JOBS) * EVERY_MS


def run_id(i: int) -> str:
    return slot_run_id(job_id(i % JOBS), slot_of(i))


def finished_run(i: int) -> R.RunState:
    slot, jid = slot_of(i), job_id(i % JOBS)
    return R.RunState(slot_run_id(jid, slot), jid, "bench", SPEC, slot, slot, False, R.RunStatus.SUCCEEDED,
                      slot - 30_000, slot + 900, attempt=1, token=1, worker_id="bench-w1",
                      dispatched_at_ms=slot - 30_000, granted_at_ms=slot - 30_000, started_at_ms=slot + 2,
                      attempt_started_at_ms=slot + 2, finished_at_ms=slot + 900, exit_code=0)


def live_runs(n: int) -> list[tuple[str, bytes]]:
    """The runs that stay: the last LIVE_FINISHED finished ones and the next slot of each job."""
    done = [finished_run(i) for i in range(n, n + LIVE_FINISHED)]
    base = n + LIVE_FINISHED
    scheduled = [replace(finished_run(i), status=R.RunStatus.SCHEDULED, attempt=0, token=0, worker_id=None,
                         dispatched_at_ms=None, granted_at_ms=None, started_at_ms=None,
                         attempt_started_at_ms=None, finished_at_ms=None, exit_code=None)
                 for i in range(base, base + JOBS)]
    return [(r.run_id, codec.encode(r, load_topology().runs)) for r in done + scheduled]


def jobs(n: int) -> list[tuple[str, bytes]]:
    nxt = slot_of(n + LIVE_RUNS)
    return [(job_id(j), codec.encode(J.JobState(job_id(j), "bench", SPEC, J.JobStatus.ACTIVE, nxt, 1, T0, T0),
                                     load_topology().jobs)) for j in range(JOBS)]


def purged_records(n: int) -> Iterator[tuple[str, bytes | None]]:
    """n finished runs; each one's tombstone comes TOMBSTONE_LAG runs after it."""
    lag = min(n, TOMBSTONE_LAG)
    for i in range(n):
        run = finished_run(i)
        yield run.run_id, codec.encode(run, load_topology().runs)
        if i >= lag:
            yield run_id(i - lag), None
    for i in range(n - lag, n):
        yield run_id(i), None


# ---- Kafka ---------------------------------------------------------------------------


class Sender:
    """A plain idempotent producer (no transactions) to partition 0, counting failures."""

    def __init__(self, bootstrap: str) -> None:
        self.producer = Producer(producer_config(bootstrap, **{
            "linger.ms": 50, "batch.size": 1_000_000, "queue.buffering.max.messages": 1_000_000,
            "queue.buffering.max.kbytes": 1_048_576}))
        self.failed = 0
        self.sent = 0

    def _done(self, err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            self.failed += 1

    def send(self, topic: str, key: str, value: bytes | None) -> None:
        while True:
            try:
                self.producer.produce(topic, key=key.encode(), value=value, partition=0, on_delivery=self._done)
                break
            except BufferError:
                self.producer.poll(0.05)
        self.sent += 1
        if self.sent % 10_000 == 0:
            self.producer.poll(0)

    def flush(self) -> None:
        if self.producer.flush(120) != 0 or self.failed:
            raise RuntimeError(f"producer: {self.failed} records failed, {len(self.producer)} undelivered")


def create_topics(bootstrap: str, topics: Topics) -> None:
    client = admin(bootstrap)  # keep a reference: the futures fail if the client is collected
    futures = client.create_topics(
        [NewTopic(t, num_partitions=1, replication_factor=1, config=TOPIC_CONFIG) for t in (topics.jobs, topics.runs)])
    for f in futures.values():
        f.result(30)


def delete_topics(bootstrap: str, topics: Topics) -> None:
    client = admin(bootstrap)
    futures = client.delete_topics([topics.jobs, topics.runs], operation_timeout=30)
    for topic, f in futures.items():
        try:
            f.result(60)
        except KafkaException as exc:
            print(f"  could not delete {topic}: {exc}", flush=True)


def broker_cleaner_config(bootstrap: str) -> dict[str, str]:
    client = admin(bootstrap)
    broker = next(iter(client.list_topics(timeout=10).brokers))
    res = ConfigResource(ConfigResource.Type.BROKER, str(broker))
    entries = client.describe_configs([res])[res].result(30)
    return {k: entries[k].value for k in BROKER_KEYS if k in entries}


def scan(bootstrap: str, topic: str) -> tuple[int, int, int]:
    """(records, tombstones, distinct keys) in partition 0 now."""
    records = tombstones = 0
    keys: set[bytes | None] = set()
    for msg in read_partition_to_end(bootstrap, topic, 0, RESTORE_TIMEOUT_S):
        records += 1
        tombstones += msg.value is None
        keys.add(msg.key)
    return records, tombstones, len(keys)


# ---- one case ------------------------------------------------------------------------


def produce_case(bootstrap: str, topics: Topics, n: int) -> list[tuple[str, bytes]]:
    """Jobs, then the purged runs and their tombstones, then the live runs. Returns the
    live runs (the filler rewrites them unchanged)."""
    started = time.monotonic()
    sender = Sender(bootstrap)
    for key, value in jobs(n):
        sender.send(topics.jobs, key, value)
    for k, (key, run) in enumerate(purged_records(n), 1):
        sender.send(topics.runs, key, run)
        if k % 100_000 == 0:
            el = time.monotonic() - started
            print(f"  produced {k:>9,} of {2 * n:,} purged-run records ({k / el:,.0f}/s)", flush=True)
    live = live_runs(n)
    for key, value in live:
        sender.send(topics.runs, key, value)
    sender.flush()
    print(f"  produced {sender.sent:,} records ({JOBS} jobs, {n:,} finished runs + {n:,} tombstones, "
          f"{LIVE_RUNS:,} live runs) in {time.monotonic() - started:.1f} s", flush=True)
    return live


def wait_for_cleaner(bootstrap: str, topics: Topics, live: list[tuple[str, bytes]], cap_s: float) -> bool:
    """Rewrite the live runs (unchanged values) every segment.ms so the tombstones sit in a
    closed segment and later passes have dirty data, until the runs partition holds no
    tombstone and only live keys. False if the cap was hit first."""
    started = last_fill = time.monotonic()
    sender = Sender(bootstrap)
    while True:
        records, tombstones, keys = scan(bootstrap, topics.runs)
        el = time.monotonic() - started
        print(f"  cleaner wait {el:5.0f} s: runs partition holds {records:,} records, "
              f"{tombstones:,} tombstones, {keys:,} keys", flush=True)
        if tombstones == 0 and keys == LIVE_RUNS:
            return True
        if el >= cap_s:
            return False
        if time.monotonic() - last_fill >= SEGMENT_MS / 1000:
            for key, value in live:
                sender.send(topics.runs, key, value)
            sender.flush()
            last_fill = time.monotonic()
        time.sleep(3)


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def rebuild_once(bootstrap: str, topics: Topics, path: Path) -> Rebuild:
    """What Processor._restore does without a checkpoint, timed."""
    topo, directory = load_topology(), WorkerDirectory()
    started = time.monotonic()
    task = PartitionTask(0, RocksKV(path, fresh=True), topo, directory=directory)
    latest: dict[str, dict[str, bytes | None]] = {topics.jobs: {}, topics.runs: {}}
    n = 0
    for topic, table in latest.items():
        for msg in read_partition_to_end(bootstrap, topic, 0, RESTORE_TIMEOUT_S):
            key = msg.key
            table[key.decode() if key else ""] = msg.value
            n += 1
    read_done = time.monotonic()
    loaded = task.bulk_load(latest[topics.jobs], latest[topics.runs])
    done = time.monotonic()
    keys, size = task.kv.size()
    task.kv.close()
    return Rebuild(done - started, read_done - started, done - read_done, n, loaded, keys, size, dir_bytes(path))


def measure(bootstrap: str, topics: Topics, n: int) -> float:
    rebuilds: list[Rebuild] = []
    with tempfile.TemporaryDirectory(prefix="gnomon-bench-rebuild-") as tmp:
        for k in range(REPEATS):
            r = rebuild_once(bootstrap, topics, Path(tmp) / f"p000-{k}")
            rebuilds.append(r)
            print(f"  rebuild {k + 1}: {r.seconds:.3f} s (read {r.read_s:.3f} s, bulk_load {r.load_s:.3f} s), "
                  f"{r.records:,} records read, {r.loaded:,} live keys loaded; kv.size() = {r.kv_keys:,} keys, "
                  f"{r.kv_bytes:,} bytes; on disk after close {r.disk_bytes:,} bytes", flush=True)
    med = statistics.median(r.seconds for r in rebuilds)
    last = rebuilds[-1]
    print(f"runs={n:,}: rebuild median {med:.3f} s of {REPEATS} "
          f"({', '.join(f'{r.seconds:.3f}' for r in rebuilds)}); records read {last.records:,}; "
          f"live keys {last.loaded:,}; kv.size() {last.kv_keys:,} keys / {last.kv_bytes:,} bytes", flush=True)
    return med


def run_case(args: argparse.Namespace, n: int) -> float:
    pid = os.getpid()
    topics = Topics(f"bench.rebuild.jobs.{n}.{pid}", f"bench.rebuild.runs.{n}.{pid}")
    print(f"case runs={n:,}: topics {topics.jobs}, {topics.runs}", flush=True)
    try:
        create_topics(args.bootstrap, topics)
        live = produce_case(args.bootstrap, topics, n)
        if not wait_for_cleaner(args.bootstrap, topics, live, args.wait_cap_s):
            print(f"  CLEANER WAIT CAP HIT after {args.wait_cap_s:.0f} s: tombstones or purged runs remain; "
                  "the rebuild below reads them", flush=True)
        return measure(args.bootstrap, topics, n)
    finally:
        if args.keep_topics:
            print(f"  kept topics {topics.jobs}, {topics.runs}", flush=True)
        else:
            delete_topics(args.bootstrap, topics)


def parse_runs(text: str) -> list[int]:
    return [int(x.replace("_", "")) for x in text.split(",") if x.strip()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--runs", type=parse_runs, default=[1000, 1_000_000],
                    help="comma-separated finished-run counts (default 1000,1000000)")
    ap.add_argument("--keep-topics", action="store_true")
    ap.add_argument("--bootstrap", default=load().kafka_bootstrap)
    ap.add_argument("--wait-cap-s", type=float, default=300.0, help="longest wait for the cleaner, per case")
    args = ap.parse_args()
    print(f"bootstrap={args.bootstrap} jobs={JOBS} live_runs={LIVE_RUNS} "
        f"(finished {LIVE_FINISHED} + scheduled {JOBS}) tombstone lag={TOMBSTONE_LAG:,} runs")
    print(f"topic config: {TOPIC_CONFIG}")
    print(f"broker cleaner config: {broker_cleaner_config(args.bootstrap)}")
    print("records produced by a plain idempotent producer (no transactions; the processor writes "
        "its changelogs in transactions)")
    medians = {n: run_case(args, n) for n in args.runs}
    lo, hi = min(medians), max(medians)
    if lo != hi:
        ratio = medians[hi] / medians[lo]
        print(f"rebuild({hi:,})/rebuild({lo:,}) = {medians[hi]:.3f} s / {medians[lo]:.3f} s = {ratio:.2f}x: "
            f"{'within' if ratio <= 2 else 'NOT within'} 2x")


if __name__ == "__main__":
    main()
