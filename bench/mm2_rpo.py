"""Two regions as two independent Kafka clusters replicated by MirrorMaker 2: what it loses.

The alternative to the stretched cluster (bench/regions_write.py): region A has its own
cluster, region B has another, and MirrorMaker 2 (dedicated mode, in region B, next to the
target) copies A's topics to B. This sets everything up from scratch in its own state dir
(default /tmp/g/mm2), measures, and tears everything down (also on error)::

    .venv/bin/python bench/mm2_rpo.py [--seconds 60] [--rate 100] [--delay-ms 30]

What runs (all on this box, nothing of a running gnomon stack is touched):

* source cluster "src" (region A): one KRaft node (broker+controller), PLAINTEXT, on
  127.0.0.21; listener LOCAL :29092 for A's own clients, listener REMOTE :29094 advertised
  as 127.0.0.21:39094, the latency proxy (gnomon.infra.latency, ``--delay-ms`` each way),
  which is how region B (MirrorMaker) reaches it; controller :29093;
* target cluster "dst" (region B): one KRaft node on 127.0.0.22:29092 (controller :29093);
* MirrorMaker 2 (org.apache.kafka.connect.mirror.MirrorMaker, ``--clusters dst``) with
  src->dst enabled for the topics ``bench.mm2.*`` (remote topics ``src.bench.mm2.*``).

Jars: infra/kafka/pom.xml and infra/mirror/pom.xml, Kafka 3.9.2 (gnomon.infra.fetch).

What it measures, in order:

1. replication lag (the RPO window in time): ``--rate`` records/s of 200 bytes, acks=all,
   for ``--seconds``; per record, the time a consumer on dst receives it minus the time it
   was handed to the producer on src (one clock: same machine); p50/p90/p99/max;
2. the local write, for reference: acks=all produce latency on src (handed to the producer
   -> delivery report) during 1; MM2 is not on that path;
3. MM2 and transactions, once per MM2 configuration (restarting MM2 in between and
   waiting, in MM2's log, for the replication task that runs with the new client configs):
   on src, a committed transaction (50 records), an ABORTED one (100 records), a committed
   one of ``--big`` records, a committed end marker. On dst, a read_committed consumer
   counts the aborted records that arrived, and a sampler asks dst every few ms for the
   stable end of the remote topic (ListOffsets latest, READ_COMMITTED: the LSO); a stable
   end strictly inside the big transaction's records means a read_committed reader could
   see part of that committed transaction without the rest (printed: how many of them).
   Configurations: ``default`` (Kafka 3.9's defaults: MirrorSourceConfig.sourceConsumerConfig
   sets only enable.auto.commit=false and auto.offset.reset=earliest, so the source
   consumer is read_uncommitted), ``read_committed``
   (``src.consumer.isolation.level = read_committed``) and ``eos`` (that plus
   ``dst.exactly.once.source.support = enabled``, KIP-618, with the internal REST server
   dedicated mode needs for it, KIP-710: ``dedicated.mode.enable.internal.rest = true``);
4. region loss: producing at ``--rate`` on src (acks=all), SIGKILL the src broker at a
   random moment, give MM2 ``--grace`` s (30), then count the records src acknowledged
   that never arrived on dst and the span of produce times they cover. Runs with the last
   MM2 configuration of 3 (``eos`` unless ``--configs`` says otherwise).

Limits: one partition, one MM2 task, single-node clusters (RF 1, no fsync: acks=all means
"in src's page cache", which a SIGKILL of the JVM does not lose, so the loss counted is
what had not crossed to B, not what A lost on disk); a fixed delay without jitter, loss or
bandwidth limits; a 2-CPU box that also runs the measuring clients, so tails include
scheduling noise. The loss figure is one sample of a random kill moment, not a
distribution: run it several times. The partial-transaction check samples the LSO every
few ms, so it can miss a short partial state ("not observed" is not a proof). MM2's own metrics (replication-latency-ms) are not
used; the figures are end to end, client to client.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, IsolationLevel, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec  # type: ignore[attr-defined]

from gnomon.config import REPO_ROOT
from gnomon.infra import fetch, jvm

JAVA_VERSIONS = (17, 21, 11)
SRC_HOST, DST_HOST = "127.0.0.21", "127.0.0.22"
PORT, CONTROLLER_PORT, REMOTE_PORT, PROXY_PORT, MM2_REST_PORT = 29092, 29093, 29094, 39094, 28083
SRC_LOCAL = f"{SRC_HOST}:{PORT}"  # region A's clients
SRC_REMOTE = f"{SRC_HOST}:{PROXY_PORT}"  # region B's path to src (through the latency proxy)
DST = f"{DST_HOST}:{PORT}"
LAG_TOPIC, TXN_TOPIC = "bench.mm2.lag", "bench.mm2.txn"
REMOTE = "src."  # DefaultReplicationPolicy: <source alias>.<topic>
VALUE_BYTES = 200
HEAP = ("-Xms128m", "-Xmx384m", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-XX:+ExitOnOutOfMemoryError")
CONFIGS = {
    "default": {},
    "read_committed": {"src.consumer.isolation.level": "read_committed"},
    "eos": {
        "src.consumer.isolation.level": "read_committed",
        "dst.exactly.once.source.support": "enabled",
        "dedicated.mode.enable.internal.rest": "true",
        "listeners": f"http://{DST_HOST}:{MM2_REST_PORT}",
    },
}


QUIET = logging.getLogger("bench.mm2.librdkafka")  # librdkafka's connection chatter (src is killed)
QUIET.addHandler(logging.NullHandler())
QUIET.propagate = False


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def pct(xs: list[float], q: float) -> float:
    ys = sorted(xs)
    return ys[min(len(ys) - 1, int(q * len(ys)))]


def line(name: str, xs: list[float]) -> str:
    if not xs:
        return f"{name:<34} n=   0"
    return (f"{name:<34} n={len(xs):>5}  p50 {pct(xs, .5):7.1f}  p90 {pct(xs, .9):7.1f}  "
            f"p99 {pct(xs, .99):7.1f}  max {max(xs):7.1f} ms")


def value(tag: str, seq: int) -> bytes:
    head = f"{tag}:{seq}:{time.time_ns()}:".encode()
    return head + b"x" * (VALUE_BYTES - len(head))


def parse(v: bytes) -> tuple[str, int, float]:
    tag, seq, ns = v.split(b":", 3)[:3]
    return tag.decode(), int(seq), int(ns) / 1e9


# --- processes ----------------------------------------------------------------------


@dataclass
class Stack:
    state: Path
    java: str = ""
    kafka_lib: Path = Path()
    mirror_lib: Path = Path()
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def logs(self) -> Path:
        return self.state / "logs"

    def spawn(self, name: str, argv: list[str]) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        out = (self.logs / f"{name}.out").open("ab")
        self.procs[name] = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True)
        out.close()

    def stop(self, name: str, sig: int = signal.SIGTERM, wait: float = 20.0) -> None:
        p = self.procs.pop(name, None)
        if p is None or p.poll() is not None:
            return
        p.send_signal(sig)
        try:
            p.wait(wait)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)

    def stop_all(self) -> None:
        for name in ("mm2", "proxy", "dst", "src"):
            with contextlib.suppress(Exception):
                self.stop(name)
        for name in list(self.procs):
            with contextlib.suppress(Exception):
                self.stop(name)

    def check_alive(self, *names: str) -> None:
        for n in names:
            p = self.procs.get(n)
            if p is None or p.poll() is not None:
                raise RuntimeError(f"{n} is not running (exit {p and p.returncode}); see {self.logs}/{n}.out")


def kafka_props(home: Path, host: str, with_remote: bool) -> str:
    if with_remote:
        listeners = (f"LOCAL://{host}:{PORT},REMOTE://{host}:{REMOTE_PORT},"
                     f"CONTROLLER://{host}:{CONTROLLER_PORT}")
        advertised = f"LOCAL://{host}:{PORT},REMOTE://{SRC_REMOTE}"
        pmap = "LOCAL:PLAINTEXT,REMOTE:PLAINTEXT,CONTROLLER:PLAINTEXT"
    else:
        listeners = f"LOCAL://{host}:{PORT},CONTROLLER://{host}:{CONTROLLER_PORT}"
        advertised = f"LOCAL://{host}:{PORT}"
        pmap = "LOCAL:PLAINTEXT,CONTROLLER:PLAINTEXT"
    return "\n".join([
        "process.roles=broker,controller",
        "node.id=1",
        f"controller.quorum.voters=1@{host}:{CONTROLLER_PORT}",
        f"listeners={listeners}",
        f"advertised.listeners={advertised}",
        f"listener.security.protocol.map={pmap}",
        "inter.broker.listener.name=LOCAL",
        "controller.listener.names=CONTROLLER",
        f"log.dirs={home / 'data'}",
        "num.partitions=1",
        "default.replication.factor=1",
        "min.insync.replicas=1",
        "offsets.topic.replication.factor=1",
        "transaction.state.log.replication.factor=1",
        "transaction.state.log.min.isr=1",
        "group.initial.rebalance.delay.ms=0",
        "auto.create.topics.enable=false",
        "num.network.threads=2",
        "num.io.threads=2",
        "log.cleaner.threads=1",
        "",
    ])


def java_base(stack: Stack, lib: Path, logs: Path, log4j: Path) -> list[str]:
    return [stack.java, "-Djava.awt.headless=true", f"-Dkafka.logs.dir={logs}",
            f"-Dlog4j.configuration=file:{log4j}", "-cp", jvm.classpath(lib)]


def start_broker(stack: Stack, name: str, host: str, *, fmt: bool) -> None:
    home = stack.state / name
    logs = stack.logs / name
    log4j = REPO_ROOT / "infra" / "kafka" / "log4j.properties"
    base = java_base(stack, stack.kafka_lib, logs, log4j)
    if fmt:
        home.mkdir(parents=True)
        logs.mkdir(parents=True, exist_ok=True)
        (home / "server.properties").write_text(kafka_props(home, host, with_remote=name == "src"))
        uuid = subprocess.run([*base, "kafka.tools.StorageTool", "random-uuid"], capture_output=True,
                              text=True, check=True).stdout.strip().splitlines()[-1]
        subprocess.run([*base, "kafka.tools.StorageTool", "format", "-t", uuid, "-c",
                        str(home / "server.properties")], capture_output=True, text=True, check=True)
    stack.spawn(name, [*base[:1], *HEAP, *base[1:], "kafka.Kafka", str(home / "server.properties")])


def wait_serving(stack: Stack, name: str, bootstrap: str, timeout: float = 90.0) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap, "logger": QUIET})
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stack.check_alive(name)
        try:
            md = admin.list_topics(timeout=3)
            if md.brokers:
                return
        except Exception:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{name} ({bootstrap}) not serving after {timeout:.0f}s")


def create_topics(bootstrap: str, names: list[str]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap, "logger": QUIET})
    have = admin.list_topics(timeout=10).topics
    new = [NewTopic(t, num_partitions=1, replication_factor=1) for t in names if t not in have]
    for f in (admin.create_topics(new).values() if new else []):
        f.result()


def mm2_properties(config: dict[str, str]) -> str:
    props = {
        "clusters": "src, dst",
        "src.bootstrap.servers": SRC_REMOTE,
        "dst.bootstrap.servers": DST,
        "src->dst.enabled": "true",
        "dst->src.enabled": "false",
        "src->dst.topics": r"bench\.mm2\..*",
        "tasks.max": "1",
        "replication.factor": "1",
        "checkpoints.topic.replication.factor": "1",
        "heartbeats.topic.replication.factor": "1",
        "offset-syncs.topic.replication.factor": "1",
        "offset.storage.replication.factor": "1",
        "status.storage.replication.factor": "1",
        "config.storage.replication.factor": "1",
        "sync.topic.acls.enabled": "false",
        "sync.group.offsets.enabled": "false",
        "emit.checkpoints.interval.seconds": "5",
        "emit.heartbeats.interval.seconds": "5",
        "refresh.topics.interval.seconds": "5",
        "refresh.groups.interval.seconds": "5",
        "offset.lag.max": "10",
        **config,
    }
    return "".join(f"{k} = {v}\n" for k, v in props.items())


def start_mm2(stack: Stack, label: str) -> Path:
    conf = stack.state / f"mm2-{label}.properties"
    conf.write_text(mm2_properties(CONFIGS[label]))
    logs = stack.logs / "mm2"
    logs.mkdir(parents=True, exist_ok=True)
    # infra/connect's logging, plus the configs of MM2's consumers and producers (to check
    # which isolation.level / transactional.id they really got)
    log4j = stack.state / "mm2-log4j.properties"
    log4j.write_text((REPO_ROOT / "infra" / "connect" / "log4j.properties").read_text()
                     + "log4j.logger.org.apache.kafka.clients.consumer.ConsumerConfig=INFO\n"
                     + "log4j.logger.org.apache.kafka.clients.producer.ProducerConfig=INFO\n")
    base = java_base(stack, stack.mirror_lib, logs, log4j)
    stack.spawn("mm2", [*base[:1], *HEAP, *base[1:], "org.apache.kafka.connect.mirror.MirrorMaker",
                        str(conf), "--clusters", "dst"])
    return conf


def start_proxy(stack: Stack, delay_ms: float) -> None:
    stack.spawn("proxy", [sys.executable, "-m", "gnomon.infra.latency", "--delay-ms", f"{delay_ms:g}",
                          "--route", f"{SRC_REMOTE}={SRC_HOST}:{REMOTE_PORT}"])


# --- clients ------------------------------------------------------------------------


class Collector:
    """A consumer on dst (read_committed) in a thread: arrival time of every record of the
    remote topics, by (tag, seq), and its offset on dst."""

    def __init__(self, topics: list[str]) -> None:
        self.arrivals: dict[tuple[str, int], float] = {}
        self.produced_at: dict[tuple[str, int], float] = {}
        self.offsets: dict[tuple[str, int], int] = {}
        self.counts: dict[str, int] = {}
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._topics = topics
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        c = Consumer({"bootstrap.servers": DST, "logger": QUIET, "group.id": f"bench-mm2-{os.getpid()}",
                      "isolation.level": "read_committed", "enable.auto.commit": False,
                      "fetch.wait.max.ms": 100,
                      "topic.metadata.refresh.interval.ms": 2000})
        assigned: set[str] = set()
        try:
            while not self._stop.is_set():
                have = c.list_topics(timeout=5).topics if len(assigned) < len(self._topics) else {}
                new = [t for t in self._topics if t in have and t not in assigned]
                if new:
                    assigned.update(new)
                    c.assign([TopicPartition(t, 0, OFFSET_BEGINNING) for t in sorted(assigned)])
                if not assigned:
                    time.sleep(0.5)
                    continue
                for m in c.consume(500, 0.05):
                    now = time.time()
                    if m.error() is not None:
                        continue
                    tag, seq, at = parse(m.value())
                    with self.lock:
                        if (tag, seq) not in self.arrivals:
                            self.arrivals[(tag, seq)] = now
                            self.produced_at[(tag, seq)] = at
                            self.offsets[(tag, seq)] = m.offset()
                            self.counts[tag] = self.counts.get(tag, 0) + 1
        finally:
            c.close()

    def count(self, tag: str) -> int:
        with self.lock:
            return self.counts.get(tag, 0)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


class Ledger:
    """acks=all producer on src's local listener, with a poller thread so that delivery
    reports are timed when they arrive."""

    def __init__(self, **extra: Any) -> None:
        self.p = Producer({"bootstrap.servers": SRC_LOCAL, "logger": QUIET, "acks": "all", "linger.ms": 0,
                           "enable.idempotence": True, "message.timeout.ms": 60_000, **extra})
        self.acked: dict[tuple[str, int], float] = {}  # (tag, seq) -> produce time
        self.ack_ms: list[float] = []
        self.failed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.p.poll(0.05)

    def send(self, topic: str, tag: str, seq: int) -> None:
        v = value(tag, seq)
        t0 = time.perf_counter()

        def done(err: Any, msg: Any) -> None:
            if err is not None:
                self.failed += 1
                return
            self.ack_ms.append((time.perf_counter() - t0) * 1000)
            _, s, at = parse(msg.value())
            self.acked[(tag, s)] = at

        self.p.produce(topic, v, key=tag.encode(), on_delivery=done)

    def paced(self, topic: str, tag: str, rate: float, seconds: float,
              stop: threading.Event | None = None) -> int:
        start = time.monotonic()
        seq = 0
        while time.monotonic() - start < seconds and not (stop and stop.is_set()):
            self.send(topic, tag, seq)
            seq += 1
            delay = start + seq / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        return seq

    def close(self, timeout: float = 15.0) -> None:
        self.p.flush(timeout)
        self._stop.set()
        self._thread.join(5)


def wait_for(pred: Any, timeout: float, what: str, stack: Stack | None = None) -> float:
    t0 = time.monotonic()
    while not pred():
        if time.monotonic() - t0 > timeout:
            raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}")
        if stack is not None:
            stack.check_alive(*stack.procs)
        time.sleep(0.2)
    return time.monotonic() - t0


def wait_replicating(stack: Stack, col: Collector, tag: str, timeout: float = 180.0) -> float:
    """Probe records on the lag topic until one arrives on dst (MM2 is up and copying)."""
    led = Ledger()
    t0 = time.monotonic()
    seq = 0
    try:
        while col.count(tag) == 0:
            if time.monotonic() - t0 > timeout:
                raise RuntimeError(f"MM2 copied nothing in {timeout:.0f}s; see {stack.logs}/mm2/connect.log")
            stack.check_alive("src", "dst", "proxy", "mm2")
            led.send(LAG_TOPIC, tag, seq)
            seq += 1
            time.sleep(0.5)
    finally:
        led.close(5)
    return time.monotonic() - t0


@contextlib.contextmanager
def txn_producer(tid: str) -> Iterator[Producer]:
    p = Producer({"bootstrap.servers": SRC_LOCAL, "logger": QUIET, "transactional.id": tid, "linger.ms": 5,
                  "transaction.timeout.ms": 30_000})
    p.init_transactions(30)
    try:
        yield p
    finally:
        p.flush(10)


# --- phases -------------------------------------------------------------------------


def phase_lag(col: Collector, rate: float, seconds: float) -> tuple[list[float], list[float]]:
    led = Ledger()
    n = led.paced(LAG_TOPIC, "lag", rate, seconds)
    led.close()
    wait_for(lambda: col.count("lag") >= len(led.acked), 60, "the lag records on dst")
    with col.lock:
        lags = [(col.arrivals[k] - col.produced_at[k]) * 1000 for k in led.acked if k in col.arrivals]
    say(f"lag phase: {n} produced, {len(led.acked)} acked, {len(lags)} arrived on dst")
    return lags, led.ack_ms


class StableEnd:
    """Samples, every few ms, the end of the remote txn topic as a read_committed reader
    sees it (ListOffsets latest with READ_COMMITTED: the last stable offset) on dst."""

    def __init__(self) -> None:
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        admin = AdminClient({"bootstrap.servers": DST, "logger": QUIET})
        tp = TopicPartition(REMOTE + TXN_TOPIC, 0)
        while not self._stop.is_set():
            try:
                fut = admin.list_offsets({tp: OffsetSpec.latest()},
                                         isolation_level=IsolationLevel.READ_COMMITTED, request_timeout=5)
                self.samples.append(fut[tp].result().offset)
            except Exception:
                time.sleep(0.05)
            time.sleep(0.002)

    def stop(self) -> list[int]:
        self._stop.set()
        self._thread.join(10)
        return self.samples


def phase_txn(col: Collector, label: str, big: int) -> dict[str, Any]:
    tags = {k: f"{k}-{label}" for k in ("c1", "aborted", "big", "end")}
    watch = StableEnd()
    with txn_producer(f"bench-mm2-{label}") as p:
        for kind, n, commit in (("c1", 50, True), ("aborted", 100, False), ("big", big, True),
                                ("end", 10, True)):
            p.begin_transaction()
            for i in range(n):
                p.produce(TXN_TOPIC, value(tags[kind], i), key=tags[kind].encode())
                if i % 1000 == 999:
                    p.poll(0)
            if commit:
                p.commit_transaction(30)
            else:
                p.flush(10)  # the records are in src's log before the abort marker
                p.abort_transaction(30)
    try:
        wait_for(lambda: col.count(tags["end"]) >= 10, 90, f"the end marker of {label} on dst")
        time.sleep(0.5)
    finally:
        samples = watch.stop()
    with col.lock:
        big_arr = sorted(t for (tag, _), t in col.arrivals.items() if tag == tags["big"])
        offs = sorted(o for (tag, _), o in col.offsets.items() if tag == tags["big"])
    # a stable end strictly inside the big transaction's records on dst: a read_committed
    # reader at that moment sees (end - first) of them and not the rest
    partial = sorted({o - offs[0] for o in samples if offs and offs[0] < o <= offs[-1]})
    return {
        "c1": col.count(tags["c1"]),
        "aborted": col.count(tags["aborted"]),
        "big": col.count(tags["big"]),
        "partial": partial,
        "samples": len(samples),
        "big_span_ms": (big_arr[-1] - big_arr[0]) * 1000 if big_arr else 0.0,
    }


def phase_kill(stack: Stack, col: Collector, rate: float, grace: float) -> dict[str, Any]:
    led = Ledger(**{"message.timeout.ms": 5000})
    stop = threading.Event()
    run_for = random.uniform(5.0, 15.0)
    t = threading.Thread(target=led.paced, args=(LAG_TOPIC, "kill", rate, run_for + 30, stop), daemon=True)
    t.start()
    time.sleep(run_for)
    killed_at = time.time()
    stack.procs["src"].send_signal(signal.SIGKILL)
    stop.set()
    t.join(5)
    stack.procs["src"].wait(10)
    led.close(8)
    say(f"SIGKILLed src after {run_for:.1f}s of producing; waiting {grace:.0f}s for MM2")
    time.sleep(grace)
    with col.lock:
        arrived = {k for k in col.arrivals if k[0] == "kill"}
    lost = sorted(led.acked[k] for k in led.acked if k not in arrived)
    last_arrived = max((led.acked[k] for k in led.acked if k in arrived), default=None)
    return {
        "run_for": run_for,
        "acked": len(led.acked),
        "arrived": len(arrived & set(led.acked)),
        "lost": len(lost),
        "lost_span_ms": (lost[-1] - lost[0]) * 1000 if lost else 0.0,
        "lost_before_kill_ms": (killed_at - lost[0]) * 1000 if lost else 0.0,
        "last_arrived_before_kill_ms": (killed_at - last_arrived) * 1000 if last_arrived else None,
        "unacked": led.failed,
    }


def log_size(stack: Stack) -> int:
    log = stack.logs / "mm2" / "connect.log"
    return log.stat().st_size if log.exists() else 0


def wait_task_config(stack: Stack, label: str, mark: int, timeout: float = 120.0) -> float:
    """Wait until MM2's log (from ``mark`` on) shows the replication task's consumer with
    the isolation level of ``label`` (and, for eos, a transactional task producer).

    On a restart with a changed configuration, dedicated mode first resumes the task with
    the task configs stored in its config topic (the old ones) and only later, once the
    leader has written the new connector config, restarts it with the new ones; records
    copied in between are copied the old way. This waits for the new task."""
    want = "read_committed" if "src.consumer.isolation.level" in CONFIGS[label] else "read_uncommitted"
    eos = "dst.exactly.once.source.support" in CONFIGS[label]
    log = stack.logs / "mm2" / "connect.log"

    def ready() -> bool:
        if not log.exists():
            return False
        with log.open("rb") as f:
            f.seek(mark)
            text = f.read().decode(errors="replace")
        blocks = text.split("ConsumerConfig values:")[1:]
        last = [b for b in blocks if "MirrorSourceConnector-0|replication-consumer" in b.split(" (org.apache", 1)[0]]
        if not last or f"isolation.level = {want}" not in last[-1].split(" (org.apache", 1)[0]:
            return False
        return not eos or re.search(r"transactional\.id = \S*MirrorSourceConnector-0", text) is not None

    return wait_for(ready, timeout, f"MM2's replication task with the {label!r} configuration", stack)


def mm2_errors(stack: Stack) -> list[str]:
    log = stack.logs / "mm2" / "connect.log"
    if not log.exists():
        return [f"(no {log})"]
    return [ln for ln in log.read_text(errors="replace").splitlines() if "] ERROR " in ln]


# --- main ---------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="length of the lag phase")
    ap.add_argument("--rate", type=float, default=100.0, help="records/s")
    ap.add_argument("--delay-ms", type=float, default=30.0, help="one-way delay between the regions")
    ap.add_argument("--grace", type=float, default=30.0, help="time MM2 gets after the source's loss")
    ap.add_argument("--big", type=int, default=2000, help="records in the big committed transaction")
    ap.add_argument("--configs", default="default,read_committed,eos",
                    help="MM2 configurations for the transaction phase, in order (the first also "
                         "runs the lag phase, the last the loss phase)")
    ap.add_argument("--state-dir", type=Path, default=Path("/tmp/g/mm2"))
    args = ap.parse_args()
    labels = [c.strip() for c in args.configs.split(",") if c.strip()]
    if not labels or any(c not in CONFIGS for c in labels):
        raise SystemExit(f"--configs: choose from {', '.join(CONFIGS)}")

    stack = Stack(args.state_dir)
    stack.state.mkdir(parents=True, exist_ok=True)
    for d in ("src", "dst", "logs"):
        shutil.rmtree(stack.state / d, ignore_errors=True)
    stack.java = jvm.find_java(JAVA_VERSIONS, "Kafka")
    stack.kafka_lib = fetch.fetch(stack.state, "kafka", "Kafka")
    stack.mirror_lib = fetch.fetch(stack.state, "mirror", "MirrorMaker 2")
    col: Collector | None = None
    results: dict[str, Any] = {}
    try:
        say(f"formatting and starting src ({SRC_LOCAL}, remote {SRC_REMOTE}) and dst ({DST})")
        start_broker(stack, "src", SRC_HOST, fmt=True)
        start_broker(stack, "dst", DST_HOST, fmt=True)
        start_proxy(stack, args.delay_ms)
        wait_serving(stack, "src", SRC_LOCAL)
        wait_serving(stack, "dst", DST)
        wait_serving(stack, "src", SRC_REMOTE)
        create_topics(SRC_LOCAL, [LAG_TOPIC, TXN_TOPIC])
        col = Collector([REMOTE + LAG_TOPIC, REMOTE + TXN_TOPIC])
        col.start()

        for i, label in enumerate(labels):
            if i:
                say(f"restarting MM2 with configuration {label!r}")
                stack.stop("mm2")
            mark = log_size(stack)
            conf = start_mm2(stack, label)
            took = wait_task_config(stack, label, mark)
            say(f"MM2 ({label}): replication task running with the {label!r} client configs "
                f"after {took:.0f}s")
            took = wait_replicating(stack, col, f"probe{i}")
            say(f"MM2 ({label}, {conf}) replicating after {took:.0f}s")
            if i == 0:
                say(f"lag phase: {args.rate:g} records/s of {VALUE_BYTES} B for {args.seconds:g}s")
                results["lag"], results["ack"] = phase_lag(col, args.rate, args.seconds)
            say(f"transaction phase ({label})")
            results[f"txn:{label}"] = phase_txn(col, label, args.big)
        say("region-loss phase")
        results["kill"] = phase_kill(stack, col, args.rate, args.grace)
        errors = mm2_errors(stack)
    finally:
        if col is not None:
            col.stop()
        stack.stop_all()

    print()
    print(f"== MirrorMaker 2 (Kafka 3.9.2, dedicated mode, 1 task), src -> dst, "
          f"{args.delay_ms:g} ms each way, {os.cpu_count()} CPUs; state {stack.state}")
    print(f"-- 1. replication lag: dst consumer receipt - src produce() call, {args.rate:g} rec/s, "
          f"{VALUE_BYTES} B, {args.seconds:g}s, MM2 config {labels[0]!r}")
    print("   " + line("src -> dst (end to end)", results["lag"]))
    print("-- 2. local write for reference (MM2 not on the path): produce() -> delivery report")
    print("   " + line("src acks=all produce", results["ack"]))
    print(f"-- 3. transactions (on src: 50 committed, 100 ABORTED, {args.big} committed in one txn, "
          "10 committed; dst consumer read_committed)")
    for label in labels:
        r = results[f"txn:{label}"]
        partial = (f"YES, stable end inside it {len(r['partial'])} times, e.g. {r['partial'][:6]} "
                   f"of {args.big} visible" if r["partial"] else "not observed")
        print(f"   {label:<15} aborted records on dst: {r['aborted']:>4}/100   committed: {r['c1']}/50; "
              f"big txn {r['big']}/{args.big} arrived over {r['big_span_ms']:.0f} ms; "
              f"partial txn visible to read_committed: {partial} ({r['samples']} LSO samples)")
    k = results["kill"]
    print(f"-- 4. source-region loss (SIGKILL src after {k['run_for']:.1f}s of {args.rate:g} rec/s, "
          f"{args.grace:g}s grace, MM2 config {labels[-1]!r})")
    print(f"   acked by src {k['acked']}, arrived on dst {k['arrived']}, LOST {k['lost']} "
          f"(covering {k['lost_span_ms']:.0f} ms of produce times; the oldest lost was produced "
          f"{k['lost_before_kill_ms']:.0f} ms before the kill); newest record on dst produced "
          f"{k['last_arrived_before_kill_ms'] or float('nan'):.0f} ms before the kill; "
          f"{k['unacked']} not acked (failed)")
    print(f"-- MM2 log ({stack.logs / 'mm2' / 'connect.log'}): {len(errors)} ERROR lines "
          "(after the kill, connection errors to src are expected)")
    for ln in errors[:8]:
        print("   " + ln[:240])


if __name__ == "__main__":
    main()
