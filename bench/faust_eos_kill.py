"""Does Faust's processing_guarantee="exactly_once" survive kill -9?  (ADR 0001)

    .venv/bin/python bench/faust_eos_kill.py [--records 10000] [--kills 3] [--budget 420]

Needs the broker from `python -m gnomon.infra up`. Three modes, one after the other:

* exactly_once       the Faust app as one would write it (agent reads the input topic,
                     updates a table, sends one record to the output topic);
* exactly_once+sink  the same app plus a no-op agent on the output topic: in
                     faust-streaming 0.15.3 a send to a topic the app does not consume
                     bypasses the transaction (see stack_apps/faust_relay.py);
* at_least_once      the same app as the first mode, without transactions (comparison).

For each mode:

1. create ``stackproof.eos-in-<tag>`` / ``stackproof.eos-out-<tag>`` (4 partitions) and the
   table's changelog ``stackproof.eos-changelog-<tag>`` (compacted);
2. pre-produce N records (unique ids, 64 keys, uncompressed: aiokafka has no lz4 here);
3. start the Faust app tests/integration/stack_apps/faust_relay.py (aiokafka driver,
   rocksdb:// store, a table counting records per key, one output record per input) as
   a subprocess, and SIGKILL it K times at random points *while it is producing output*
   (the kill points are random fractions of N of committed output), restarting it each
   time with the same app id and the same datadir (as a supervisor restarting a crashed
   process on the same host would; --fresh-datadir to start from an empty one);
4. after the last restart, wait until the committed output stops growing, stop the app
   with SIGTERM, and read the output with a read_committed confluent-kafka consumer, the
   same topic read_uncommitted, and the table's changelog read_committed.

Columns: outputs = committed output records; dupes = outputs - distinct ids; missing =
inputs without an output; aborted = records visible read_uncommitted but not
read_committed (work of killed transactions); lag = input records past the app group's
committed offsets when the app was stopped (missing > 0 with lag 0 = lost); table_bad = keys whose final committed
table count differs from the number of inputs with that key; table_over = sum of the
final committed counts minus N (> 0: increments counted twice); seq_bad = keys whose
committed outputs do not carry the counts 1..n exactly once.

The whole script stops itself after --budget seconds (default 420) plus a margin.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    ConsumerGroupTopicPartitions,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic

from gnomon.adapters.kafka import partition_for, producer_config, security_config
from gnomon.config import load

APP = Path(__file__).resolve().parents[1] / "tests" / "integration" / "stack_apps" / "faust_relay.py"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Reader:
    """Reads a topic from the beginning without a group (assign), incrementally."""

    def __init__(self, bootstrap: str, topic: str, isolation: str = "read_committed") -> None:
        self.c = Consumer(
            {
                "bootstrap.servers": bootstrap,
                **security_config(),
                "group.id": f"stackproof-eosread-{uuid.uuid4().hex[:8]}",  # never commits
                "enable.auto.commit": False,
                "isolation.level": isolation,
            }
        )
        md = self.c.list_topics(topic, timeout=10).topics[topic]
        self.topic = topic
        self.partitions = sorted(md.partitions)
        self.c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in self.partitions])
        self.records: list[tuple[bytes | None, bytes | None]] = []

    def pump(self, seconds: float) -> int:
        """Consume for up to ``seconds``; return how many records arrived."""
        got = 0
        end = time.monotonic() + seconds
        while True:
            left = end - time.monotonic()
            if left <= 0:
                return got
            for m in self.c.consume(1000, min(left, 0.2)):
                if m.error() is None:
                    self.records.append((m.key(), m.value()))
                    got += 1

    def drain(self, idle_s: float = 3.0, give_up_idle_s: float = 10.0) -> None:
        """Read until ``idle_s`` quiet and at the end of every partition (or long quiet)."""
        quiet = 0.0
        while True:
            if self.pump(1.0):
                quiet = 0.0
                continue
            quiet += 1.0
            if (quiet >= idle_s and self.at_end()) or quiet >= give_up_idle_s:
                return

    def at_end(self) -> bool:
        positions = self.c.position([TopicPartition(self.topic, p) for p in self.partitions])
        for tp in positions:
            lo, hi = self.c.get_watermark_offsets(TopicPartition(self.topic, tp.partition), 5)
            if hi <= lo:
                continue
            # A read_committed consumer stops before the trailing commit marker.
            if tp.offset < 0 or tp.offset < hi - 1:
                return False
        return True

    def close(self) -> None:
        self.c.close()


@dataclass
class Result:
    mode: str
    inputs: int
    outputs: int = 0
    distinct: int = 0
    dupes: int = 0
    missing: int = 0
    aborted: int = 0
    kills: int = 0
    crashes: int = 0
    table_bad: int = 0
    table_over: int = 0
    lag: int = 0
    seq_bad: int = 0
    wall_s: float = 0.0
    errors: list[str] = field(default_factory=list)
    dupe_pairs: Counter[str] = field(default_factory=Counter)
    missing_by_partition: Counter[int] = field(default_factory=Counter)
    kill_points: list[int] = field(default_factory=list)
    note: str = ""


def decode_key(k: bytes) -> str:
    """Faust writes str table keys raw (app key_serializer) or as JSON, by version."""
    try:
        v = json.loads(k)
        return v if isinstance(v, str) else k.decode()
    except ValueError:
        return k.decode()


def create_topics(admin: AdminClient, names: dict[str, str], partitions: int) -> None:
    new = [
        NewTopic(
            t,
            num_partitions=partitions,
            replication_factor=1,
            config={"cleanup.policy": "compact"} if role == "changelog" else {},
        )
        for role, t in names.items()
    ]
    for fut in admin.create_topics(new, operation_timeout=15).values():
        fut.result(timeout=20)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        md = admin.list_topics(timeout=5).topics
        if all(
            t in md and len(md[t].partitions) == partitions
            and all(p.leader >= 0 for p in md[t].partitions.values())
            for t in names.values()
        ):
            return
        time.sleep(0.2)
    raise RuntimeError("topics have no leaders after 15 s")


def cleanup(admin: AdminClient, topics: list[str], group: str) -> None:
    try:
        for fut in admin.delete_consumer_groups([group], request_timeout=10).values():
            fut.result(timeout=15)
    except Exception as exc:
        log(f"(could not delete group {group}: {exc})")
    for name, fut in admin.delete_topics(topics, operation_timeout=15).items():
        try:
            fut.result(timeout=20)
        except Exception as exc:
            log(f"(could not delete topic {name}: {exc})")


def input_lag(admin: AdminClient, group: str, topic: str, ends: dict[int, int]) -> int | None:
    """Input records not yet covered by the group's committed offsets (None: unknown)."""
    try:
        fut = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group]
        committed = {
            tp.partition: tp.offset for tp in fut.result(timeout=10).topic_partitions
            if tp.topic == topic
        }
    except Exception:
        return None
    return sum(end - max(committed.get(p, 0), 0) for p, end in ends.items())


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "stackproof-eos-ends", **security_config()})
    try:
        md = c.list_topics(topic, timeout=10).topics[topic]
        return {
            p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in md.partitions
        }
    finally:
        c.close()


def produce_inputs(bootstrap: str, topic: str, n: int, keys: int) -> Counter[str]:
    p = Producer(producer_config(bootstrap, **{"compression.type": "none", "linger.ms": 20}))
    per_key: Counter[str] = Counter()
    for i in range(n):
        key = f"k{i % keys:03d}"
        per_key[key] += 1
        while True:
            try:
                p.produce(topic, key=key.encode(), value=json.dumps({"id": i}).encode())
                break
            except BufferError:
                p.poll(0.1)
        p.poll(0)
    if p.flush(60) != 0:
        raise RuntimeError("input producer did not drain within 60 s")
    return per_key


MODES = {
    # mode: (processing_guarantee, subscribe the sink topic)
    "exactly_once": ("exactly_once", False),
    "exactly_once+sink": ("exactly_once", True),
    "at_least_once": ("at_least_once", False),
}


def run_mode(args: argparse.Namespace, mode: str, budget_s: float, workdir: Path) -> Result:
    bootstrap = args.bootstrap
    admin = AdminClient({"bootstrap.servers": bootstrap, **security_config()})
    guarantee, subscribe_sink = MODES[mode]
    short = {"exactly_once": "eos", "exactly_once+sink": "eoss", "at_least_once": "alo"}[mode]
    tag = f"{short}-{uuid.uuid4().hex[:6]}"
    topics = {
        "in": f"stackproof.eos-in-{tag}",
        "out": f"stackproof.eos-out-{tag}",
        "changelog": f"stackproof.eos-changelog-{tag}",
    }
    app_id = f"stackproof-eos-{tag}"
    rng = random.Random(args.seed if args.seed is not None else None)
    res = Result(mode, args.records)
    mode_deadline = time.monotonic() + budget_s
    create_topics(admin, topics, args.partitions)
    proc: subprocess.Popen[bytes] | None = None
    progress: Reader | None = None
    try:
        log(f"{mode}: producing {args.records} inputs to {topics['in']}")
        per_key = produce_inputs(bootstrap, topics["in"], args.records, args.keys)
        in_ends = end_offsets(bootstrap, topics["in"])

        thresholds = sorted(int(args.records * rng.uniform(0.05, 0.85)) for _ in range(args.kills))
        datadir = workdir / f"{tag}-data"
        logs: list[Path] = []

        def start(incarnation: int) -> subprocess.Popen[bytes]:
            d = workdir / f"{tag}-data-{incarnation}" if args.fresh_datadir else datadir
            path = workdir / f"{tag}-{incarnation}.log"
            logs.append(path)
            env = {
                **os.environ,
                "STACK_BROKER": f"kafka://{bootstrap}",
                "STACK_APP_ID": app_id,
                "STACK_IN": topics["in"],
                "STACK_OUT": topics["out"],
                "STACK_CHANGELOG": topics["changelog"],
                "STACK_PARTITIONS": str(args.partitions),
                "STACK_DATADIR": str(d),
                "STACK_STORE": args.store,
                "STACK_GUARANTEE": guarantee,
                "STACK_TABLE": "1",
                "STACK_INSTANCE": f"run{incarnation}",
                "STACK_SUBSCRIBE_SINK": "1" if subscribe_sink else "0",
            }
            return subprocess.Popen(
                [sys.executable, APP.name, "worker", "--without-web", "-l", "info"],
                cwd=APP.parent,
                env=env,
                stdout=path.open("wb"),
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

        progress = Reader(bootstrap, topics["out"])
        t0 = time.monotonic()
        incarnation = 0
        proc = start(incarnation)
        started_at_count = 0
        for threshold in thresholds:
            # Kill once committed output reached the threshold AND this incarnation has
            # produced something (so every kill lands while the app is processing).
            while time.monotonic() < mode_deadline:
                progress.pump(0.2)
                n = len(progress.records)
                if proc.poll() is not None:
                    res.crashes += 1
                    log(f"{mode}: app exited by itself (rc={proc.returncode}); restarting")
                    incarnation += 1
                    proc = start(incarnation)
                    started_at_count = n
                    continue
                if n >= threshold and n > started_at_count:
                    break
            else:
                res.note = "budget ran out before all kills"
                break
            time.sleep(rng.uniform(0.0, 0.5))
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
            res.kills += 1
            progress.pump(0.1)
            res.kill_points.append(len(progress.records))
            log(f"{mode}: kill -9 #{res.kills} at {len(progress.records)} committed outputs")
            incarnation += 1
            proc = start(incarnation)
            started_at_count = len(progress.records)

        # Let the last incarnation finish: until every id is out and 5 s pass quietly, or
        # the output stops growing for settle_s (a restart waits out the dead member's
        # 10 s session, so settle_s is well above that).
        last_growth = time.monotonic()
        seen: set[int] = set()
        scanned = 0
        while time.monotonic() < mode_deadline:
            if progress.pump(1.0):
                last_growth = time.monotonic()
            seen |= {json.loads(v)["id"] for _, v in progress.records[scanned:] if v}
            scanned = len(progress.records)
            quiet = time.monotonic() - last_growth
            if len(seen) >= args.records and quiet >= 5:
                break
            # Every input offset committed and nothing new for 5 s: the app is done, even
            # if some ids never made it to the output (that is then a loss, not a lag).
            if quiet >= 5 and input_lag(admin, app_id, topics["in"], in_ends) == 0:
                res.note = res.note or "input fully committed with ids missing from the output"
                break
            if quiet >= args.settle:
                res.note = res.note or f"output stopped growing for {args.settle:.0f}s"
                break
            if proc.poll() is not None:
                res.crashes += 1
                log(f"{mode}: app exited by itself (rc={proc.returncode}); restarting")
                incarnation += 1
                proc = start(incarnation)
        else:
            res.note = res.note or "budget ran out while waiting for the output to settle"
        res.wall_s = time.monotonic() - t0
        lag = input_lag(admin, app_id, topics["in"], in_ends)
        res.lag = -1 if lag is None else lag
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
        proc = None

        # Final reads.
        committed = Reader(bootstrap, topics["out"], "read_committed")
        committed.drain()
        raw = Reader(bootstrap, topics["out"], "read_uncommitted")
        raw.drain()
        changelog = Reader(bootstrap, topics["changelog"], "read_committed")
        changelog.drain()
        outs = [json.loads(v) for _, v in committed.records if v]
        ids = Counter(o["id"] for o in outs)
        res.outputs = len(outs)
        res.distinct = len(ids)
        res.dupes = res.outputs - res.distinct
        missing_ids = set(range(args.records)) - set(ids)
        res.missing = len(missing_ids)
        for i in missing_ids:
            res.missing_by_partition[partition_for(f"k{i % args.keys:03d}", args.partitions)] += 1
        by_id: dict[int, list[str]] = defaultdict(list)
        for o in outs:
            by_id[o["id"]].append(o["instance"])
        for insts in by_id.values():
            if len(insts) > 1:
                res.dupe_pairs["+".join(insts)] += 1
        res.aborted = len(raw.records) - len(committed.records)
        final: dict[str, int] = {}
        for k, v in changelog.records:
            if k is not None and v is not None:
                final[decode_key(k)] = json.loads(v)
        res.table_bad = sum(1 for key, n in per_key.items() if final.get(key) != n)
        res.table_over = sum(final.get(key, 0) for key in per_key) - args.records
        counts: dict[str, list[int]] = defaultdict(list)
        for o in outs:
            counts[o["key"]].append(o["count"])
        res.seq_bad = sum(
            1 for key, n in per_key.items() if sorted(counts.get(key, [])) != list(range(1, n + 1))
        )
        for r in (committed, raw, changelog):
            r.close()
        for path in logs:
            for line in path.read_text(errors="replace").splitlines():
                if "[ERROR]" in line or "[CRITICAL]" in line:
                    res.errors.append(f"{path.name}: {line[:240]}")
        return res
    finally:
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
        if progress is not None:
            progress.close()
        cleanup(admin, list(topics.values()), app_id)


def table(results: list[Result], args: argparse.Namespace) -> str:
    cols = [
        ("mode", "mode", 17), ("inputs", "inputs", 7), ("outputs", "outputs", 8),
        ("distinct", "distinct", 8), ("dupes", "dupes", 6), ("missing", "missing", 7),
        ("aborted", "aborted", 7), ("kills", "kills", 5), ("crashes", "crashes", 7),
        ("table_bad", "table_bad", 9), ("table_over", "table_over", 10), ("seq_bad", "seq_bad", 7), ("lag", "lag", 5), ("wall_s", "wall_s", 7),
    ]
    head = " ".join(f"{title:>{w}}" for _, title, w in cols)
    lines = [
        f"Faust kill -9 experiment: records={args.records} partitions={args.partitions} "
        f"keys={args.keys} store={args.store} datadir="
        f"{'fresh per restart' if args.fresh_datadir else 'same across restarts'}",
        head,
        "-" * len(head),
    ]
    for r in results:
        cells = []
        for attr, _, w in cols:
            v = getattr(r, attr)
            cells.append(f"{v:>{w}.1f}" if isinstance(v, float) else f"{v!s:>{w}}")
        lines.append(" ".join(cells))
    for r in results:
        lines.append(f"{r.mode}: kill points (committed outputs) {r.kill_points}"
                     + (f"; note: {r.note}" if r.note else ""))
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--bootstrap", default=load().kafka_bootstrap)
    ap.add_argument("--records", type=int, default=10_000)
    ap.add_argument("--kills", type=int, default=3)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--keys", type=int, default=64)
    ap.add_argument("--store", default="rocksdb://")
    ap.add_argument("--fresh-datadir", action="store_true")
    ap.add_argument("--settle", type=float, default=45.0)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--budget", type=float, default=420.0, help="seconds for the whole run")
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {list(MODES)}")
    ap.add_argument("--keep-logs", default=None, help="directory for the app logs and state")
    args = ap.parse_args()

    def on_alarm(_signum: int, _frame: Any) -> None:
        raise TimeoutError("faust_eos_kill.py exceeded its budget; stopping")

    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(int(args.budget + 30))  # last resort; each mode has its own deadline

    modes = [g.strip() for g in args.modes.split(",") if g.strip()]
    unknown = [g for g in modes if g not in MODES]
    if unknown:
        ap.error(f"unknown mode(s) {unknown}; choose from {list(MODES)}")
    started = time.monotonic()
    results: list[Result] = []
    if args.keep_logs:
        Path(args.keep_logs).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="faust-eos-kill-") as tmp_dir:
        tmp = args.keep_logs or tmp_dir
        for i, g in enumerate(modes):
            remaining = args.budget - (time.monotonic() - started)
            share = remaining / (len(modes) - i)
            log(f"=== {g}: budget {share:.0f}s ===")
            try:
                results.append(run_mode(args, g, share - 15, Path(tmp)))
            except Exception as exc:
                r = Result(g, args.records, note=f"FAILED: {type(exc).__name__}: {exc}")
                results.append(r)
                log(r.note)
    signal.alarm(0)
    print()
    print(table(results, args))
    for r in results:
        if r.dupe_pairs:
            pairs = ", ".join(f"{k}: {v}" for k, v in r.dupe_pairs.most_common(8))
            print(f"{r.mode}: duplicated ids by incarnations that wrote them: {pairs}")
        if r.missing_by_partition:
            print(f"{r.mode}: missing ids by input partition: "
                  f"{dict(sorted(r.missing_by_partition.items()))}")
    for r in results:
        if r.errors:
            distinct: dict[str, str] = {}
            for e in r.errors:
                distinct.setdefault(e.split("] ", 3)[-1][:120], e)
            print(f"\n{r.mode}: {len(r.errors)} ERROR lines in the app logs; distinct:")
            for e in list(distinct.values())[:8]:
                print(f"  {e}")
    print(f"\ntotal wall time {time.monotonic() - started:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
