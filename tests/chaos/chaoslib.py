"""Chaos harness: real gnomon processes on the real broker, killed on purpose, and a
tap that records every ledger/job/inbox record of the scenario as it is committed, for
the history checker.

The tap reads while the scenario runs (Jepsen's way: record the history as it happens).
Reading the compacted ledger back at the end is not enough: once a segment rolls
(``segment.ms``), the log cleaner drops every record a later one with its key supersedes,
the states of a purged run and a job's first states among them, so the checker would see
a shortened history."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from gnomon import codec
from gnomon.adapters.kafka import consumer_config, producer_config
from gnomon.checker import CheckReport, HistoryChecker
from gnomon.codec import DecodeError
from gnomon.command_keys import operator_headers
from gnomon.config import load
from gnomon.core.jobs import DeleteJob, JobState, JobStatus, PauseJob, RegisterJob
from gnomon.core.model import Target, TargetType
from gnomon.core.runs import AttemptStarted, CompleteAttempt, RunState, RunStatus
from gnomon.infra import placement
from gnomon.topology import load_topology
from topic_reading import end_offsets, read_messages

LONG = os.environ.get("GNOMON_CHAOS_LONG") == "1"
"""``make test-long``: the faults at their full length (processors, Cassandra and the broker
down for 2 minutes), outside CI; CI runs the same scenarios with shorter outages."""

# The longest a scenario waits, after pausing its jobs, for every run the lookahead
# triggered to end (``Scenario.settle`` returns as soon as they have: 2-20 s on a quiet
# box). The CI of 6e639f0, on a box about 1.5 times slower than its last one, still had
# 573 runs of the kill -9 test waiting for a worker when a 28 s budget ran out: a
# backlog the catch-up policy ``all`` keeps drains at the workers' pace, and an attempt
# may take 12 s plus retries.
DRAIN_MAX_S = 90.0


# The target of the load jobs in the fault scenarios (a broker, a host, Cassandra away):
# the default worker's in-process ``noop`` handler. Those scenarios measure how the
# scheduler rides a fault out; a sandboxed command costs ~15 ms of CPU per attempt (bwrap
# starts 50-65 a second on this 2-core box, bench/sandbox_starts.py), so 20 per-second
# command jobs held a worker's 64 slots full whenever the box was busy, and the start
# lag measured the sandbox's share of the CPU instead (CI of 6e639f0: none of the slots
# measured ran; here, beside one busy loop: p50 37 s with every slot busy). Sandboxed
# commands under kill -9 stay in test_chaos.py (and the TLS scenario); sandboxes
# themselves in tests/security.
LOAD_TARGET = Target(TargetType.HANDLER, handler="noop")


def log(msg: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def missing_from_history(store: Any, run_ids: list[str], timeout_s: float = 120) -> list[str]:
    """The runs of ``run_ids`` (each finished as succeeded in the ledger) that the history
    ``store`` does not show succeeded, after waiting up to ``timeout_s`` for it to catch up."""
    deadline = time.monotonic() + timeout_s
    missing = list(run_ids)
    while missing and time.monotonic() < deadline:
        missing = [rid for rid in missing
                   if (got := store.get_run(rid)) is None or got.status is not RunStatus.SUCCEEDED]
        if missing:
            log(f"history still misses {len(missing)} of {len(run_ids)} runs")
            time.sleep(2)
    return missing


def read_range(bootstrap: str, start: list[TopicPartition], timeout_s: float = 90) -> list[Any]:
    """Every committed record from ``start`` to the current end, decoded, in partition order."""
    return _decoded([(msg.key(), msg.value()) for msg in read_messages(bootstrap, start, timeout_s)])


OPEN_TAPS: list[Tap] = []
TAP_STALL_S = 15.0  # closed after each test (conftest)
STOP_WAIT_S = 30.0  # for the scenario's processes to stop on SIGTERM, all together


class Tap:
    """A consumer thread copying every committed record of ``start``'s partitions, from
    those offsets on, into memory (tombstones too): the scenario's history as it happened."""

    def __init__(self, bootstrap: str, start: list[TopicPartition]) -> None:
        self._bootstrap = bootstrap
        self._lock = threading.Lock()
        self._records: list[tuple[str, bytes | None, bytes | None]] = []  # topic, key, value
        self._position = {(tp.topic, tp.partition): tp.offset for tp in start}
        self._stop = threading.Event()
        self._rebuild = threading.Event()  # a consumer that stopped fetching is replaced (``records``)
        self.rebuilds = 0
        # records delivered again at an offset already read (a consumer that went back on
        # its own): not recorded twice, counted, and said by ``records``
        self.redelivered = 0
        self._error: BaseException | None = None
        self._consumer = self._new_consumer(start)
        self._thread = threading.Thread(target=self._run, name="chaos-tap", daemon=True)
        self._thread.start()
        OPEN_TAPS.append(self)

    def _new_consumer(self, start: list[TopicPartition]) -> Consumer:
        consumer = Consumer(consumer_config(self._bootstrap, "chaos-tap", **{"enable.partition.eof": True}))
        consumer.assign(start)
        return consumer

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if self._rebuild.is_set():  # from where it got: nothing read twice, nothing skipped
                    self._rebuild.clear()
                    self._consumer.close()
                    with self._lock:
                        at = [TopicPartition(t, p, off) for (t, p), off in self._position.items()]
                    self._consumer = self._new_consumer(at)
                    self.rebuilds += 1
                msg = self._consumer.poll(0.2)
                if msg is None:
                    continue
                tp = (msg.topic() or "", msg.partition() or 0)
                err = msg.error()
                if err is not None:
                    # EOF comes at the last stable offset: past the records and markers before it
                    if err.code() == KafkaError._PARTITION_EOF:
                        with self._lock:
                            self._position[tp] = max(self._position[tp], msg.offset() or 0)
                    continue
                with self._lock:
                    if (msg.offset() or 0) < self._position[tp]:
                        self.redelivered += 1
                        continue
                    self._records.append((tp[0], msg.key(), msg.value()))
                    self._position[tp] = (msg.offset() or 0) + 1
        except BaseException as e:  # reported by records()
            self._error = e
        finally:
            self._consumer.close()

    def grow(self, topic: str, partitions: int) -> None:
        """Tap ``topic``'s partitions added by a grow too, from their first record."""
        with self._lock:
            for p in range(partitions):
                self._position.setdefault((topic, p), 0)
        self._rebuild.set()

    def records(self, topic: str, timeout_s: float = 90) -> list[tuple[bytes | None, bytes | None]]:
        """Every (key, value) of ``topic`` recorded, once the tap has read past every record
        written before this call: up to the high watermark of this moment, so every
        transaction then open must have been decided first (a killed processor's is aborted
        by the broker after its timeout). The last stable offset would not do: while a killed
        processor's transaction is open, it stops before the records its successor committed."""
        ends = {(topic, tp.partition): tp.offset for tp in end_offsets(self._bootstrap, topic, committed=False)}
        deadline = time.monotonic() + timeout_s
        seen, moved_at = -1, time.monotonic()
        while True:
            if self._error is not None:
                raise AssertionError(f"the chaos tap failed: {self._error!r}")
            with self._lock:
                behind = {tp: end for tp, end in ends.items() if self._position.get(tp, 0) < end}
                if not behind:
                    if self.redelivered:
                        log(f"the tap's consumer delivered {self.redelivered} records again (offsets already "
                            "read; recorded once)")
                    return [(k, v) for t, k, v in self._records if t == topic]
                at = sum(self._position.values())
            if at != seen:
                seen, moved_at = at, time.monotonic()
            elif time.monotonic() - moved_at > TAP_STALL_S:
                # librdkafka's consumer sometimes stops fetching after a broker came back; a
                # new one from the same positions tells that apart from a transaction left
                # open (which would stop it too, and fail below)
                log(f"the tap read nothing for {TAP_STALL_S:.0f} s, behind on {sorted(behind)}: new consumer")
                self._rebuild.set()
                moved_at = time.monotonic()
            if time.monotonic() > deadline:
                raise AssertionError(f"the chaos tap did not reach the end of {topic} in {timeout_s:.0f} s: "
                                     f"behind on {sorted(behind)} (its consumer rebuilt {self.rebuilds} times)")
            time.sleep(0.2)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        with contextlib.suppress(ValueError):
            OPEN_TAPS.remove(self)


def _decoded(records: list[tuple[bytes | None, bytes | None]]) -> list[Any]:
    out: list[Any] = []
    for _key, value in records:
        if value is not None:
            # poison records (from other tests) are skipped: processors route them to gnomon.poison
            with contextlib.suppress(DecodeError):
                out.append(codec.decode(value))
    return out


@dataclass
class Scenario:
    tag: str
    logs: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    lease_s: int = 8
    lookahead_s: int = 10
    processor_args: tuple[str, ...] = ()  # extra `gnomon processor` options for every processor
    worker_tenants: tuple[str, ...] = ("chaos",)  # the tenants every worker serves (`--tenant`)
    registered: dict[str, str] = field(default_factory=dict)  # job id -> tenant, of the jobs sent
    paused_at: dict[str, int] = field(default_factory=dict)  # job id -> when the scenario sent its pause
    _log_from: dict[str, int] = field(default_factory=dict)  # where each process's latest start begins in its log

    def __post_init__(self) -> None:
        self.settings = load()
        self.topo = load_topology()
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.start_offsets = {t: end_offsets(self.settings.kafka_bootstrap, t)
                              for t in (self.topo.runs, self.topo.jobs, self.topo.worker_inbox, self.topo.run_events)}
        self.tap = Tap(self.settings.kafka_bootstrap, [tp for tps in self.start_offsets.values() for tp in tps])
        self.producer = Producer(producer_config(self.settings.kafka_bootstrap))

    def start(self, name: str, *args: str, group: Path | None = None, env: Mapping[str, str] | None = None) -> None:
        """``gnomon <args>`` as process ``name``; in cgroup ``group`` (a host's, placement.py) if
        given; ``env``: more environment (e.g. ``PYTHONPATH`` to another version's code)."""
        path = self.logs / f"{name}.log"
        self._log_from[name] = path.stat().st_size if path.exists() else 0  # readiness: this start's lines
        out = open(path, "ab")  # noqa: SIM115 - lives with the process
        # the API authenticates to Kafka as role `api` (the other services set their role in code)
        base = {**self.env, **(env or {})}
        env = {**base, "GNOMON_KAFKA_ROLE": "api"} if args[:1] == ("api",) else base
        argv = placement.wrap([sys.executable, "-m", "gnomon.cli.main", *args], group)
        self.procs[name] = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        log(f"started {name} (pid {self.procs[name].pid})")

    def processor(self, name: str, group: Path | None = None, env: Mapping[str, str] | None = None) -> None:
        self.start(name, "processor", "--instance-id", f"{self.tag}-{name}", "--lease-s", str(self.lease_s),
                   "--lookahead-s", str(self.lookahead_s), *self.processor_args, group=group, env=env)

    def worker(self, name: str, concurrency: int = 32, pool: str = "default", group: Path | None = None,
               env: Mapping[str, str] | None = None) -> None:
        tenants = [arg for t in self.worker_tenants for arg in ("--tenant", t)]
        self.start(name, "worker", "--worker-id", f"{self.tag}-{name}", "--concurrency", str(concurrency),
                   "--pool", pool, *tenants, "--policy", str(Path(__file__).parent / "worker-policy.toml"),
                   group=group, env=env)

    def stop(self, name: str, timeout_s: float = 30) -> int | None:
        """Stop process ``name`` as its service manager would (SIGTERM, SIGKILL after
        ``timeout_s``); its exit code."""
        p = self.procs.pop(name)
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
        log(f"stopped {name} (exit {p.returncode})")
        return p.returncode

    def wait_ready(self, *names: str, timeout_s: float = 60) -> None:
        """Until each named process says in its log that it serves: a processor has restored
        every partition of its latest assignment, a worker serves its pool, the projector
        has subscribed, the API answers. Where a fixed sleep guessed, this waits what it
        takes (2-4 s on a quiet box) and fails with the process's log tail if it never does."""
        deadline = time.monotonic() + timeout_s
        pending = list(names)
        while pending:
            pending = [n for n in pending if not self._ready(n)]
            if not pending:
                break
            for n in pending:
                if self.procs[n].poll() is not None:
                    raise AssertionError(f"{n} exited ({self.procs[n].returncode}): {self.log_tail(n)}")
            if time.monotonic() > deadline:
                raise AssertionError(f"not ready in {timeout_s:.0f} s: {pending}; "
                                     + "; ".join(f"{n}: {self.log_tail(n)}" for n in pending))
            time.sleep(0.25)
        log(f"ready: {', '.join(names)}")

    def log_tail(self, name: str, lines: int = 5) -> str:
        path = self.logs / f"{name}.log"
        return " | ".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else "(no log)"

    def _ready(self, name: str) -> bool:
        path = self.logs / f"{name}.log"
        text = path.read_bytes()[self._log_from.get(name, 0):].decode(errors="replace") if path.exists() else ""
        if "Uvicorn running on" in text or "serving pool" in text or "history projector: group" in text:
            return True
        assigned = text.rfind("assigned partitions [")
        if assigned < 0:
            return False
        after = text[assigned:]
        end = after.find("]")
        if end < 0:  # the line is being written
            return False
        wanted = after[len("assigned partitions ["):end]
        return all(f"partition {p.strip()} restored:" in after for p in wanted.split(",") if p.strip())

    def wait_runs(self, succeeded: int, timeout_s: float = 60) -> list[RunState]:
        """Until the tap has seen ``succeeded`` runs of the scenario finish: load is flowing
        end to end (processor, worker, ledger). Returns the finished runs."""
        deadline = time.monotonic() + timeout_s
        prefix = f"{self.tag}-"
        while True:
            runs = _decoded(self.tap.records(self.topo.runs))
            done = {r.run_id: r for r in runs if r.job_id.startswith(prefix) and r.status is RunStatus.SUCCEEDED}
            if len(done) >= succeeded:
                log(f"{len(done)} runs succeeded: load flows")
                return list(done.values())
            if time.monotonic() > deadline:
                raise AssertionError(f"only {len(done)} of {succeeded} runs succeeded in {timeout_s:.0f} s")
            time.sleep(0.5)

    def signal(self, name: str, sig: int) -> None:
        p = self.procs[name]
        os.killpg(p.pid, sig)
        log(f"sent {signal.Signals(sig).name} to {name} (pid {p.pid})")
        if sig == signal.SIGKILL:
            p.wait(10)
            del self.procs[name]

    def dump_stacks(self) -> None:
        """Every live process writes its threads' stacks to its log (SIGUSR1): where each
        one waits, kept for a failure that shows up only in the figures read afterwards."""
        for p in self.procs.values():
            if p.poll() is None:
                os.kill(p.pid, signal.SIGUSR1)  # (not its group: a command it runs would die of it)
        time.sleep(0.5)

    def stop_all(self) -> None:
        """Stop every process, then delete the scenario's jobs: the next processor to start
        applies the deletes first, so a per-second job of this scenario never fills the
        workers of a later one (the chaos tests share tenant and pool)."""
        self._stop_procs()
        now = int(time.time() * 1000)
        for job_id, tenant in self.registered.items():
            self._produce_command(DeleteJob(job_id, tenant, now))
        self.registered.clear()
        self.flush()

    def _stop_procs(self) -> None:
        for p in list(self.procs.values()):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGCONT)
                os.killpg(p.pid, signal.SIGTERM)
        began = time.monotonic()
        for name, p in list(self.procs.items()):
            try:
                p.wait(max(1.0, STOP_WAIT_S - (time.monotonic() - began)))
            except subprocess.TimeoutExpired:
                # where it waits goes to its log (SIGUSR1: every thread's stack), then SIGKILL
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGUSR1)
                time.sleep(0.5)
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
                log(f"{name} (pid {p.pid}) did not stop within {STOP_WAIT_S:.0f} s of SIGTERM: killed; "
                    f"its threads' stacks are at the end of {self.logs / (name + '.log')}")
            del self.procs[name]

    def close_producer(self) -> None:
        """Drop the producer (librdkafka keeps reconnecting to a cluster that is gone)."""
        self.producer.flush(5)
        del self.producer
        import gc

        gc.collect()

    def send(self, command: Any) -> None:
        if isinstance(command, RegisterJob):
            self.registered[command.job_id] = command.tenant
        elif isinstance(command, PauseJob):
            self.paused_at.setdefault(command.job_id, int(time.time() * 1000))
        self._produce_command(command)
        self.producer.poll(0)

    def _produce_command(self, command: Any) -> None:
        """A job command, signed with the operator's command key (ADR 0006)."""
        topic, key, value = self.topo.job_commands, command.job_id.encode(), codec.encode(command)
        self.producer.produce(topic, key=key, value=value, headers=operator_headers(topic, key, value))

    def flush(self) -> None:
        self.producer.flush(30)

    # ---- reading the history back --------------------------------------------------------

    def history(self) -> tuple[list[RunState], list[JobState], list[Any]]:
        """The scenario's ledger, job-state and inbox records so far, as the tap saw them."""
        prefix = f"{self.tag}-"
        runs = [r for r in _decoded(self.tap.records(self.topo.runs)) if r.job_id.startswith(prefix)]
        jobs = [j for j in _decoded(self.tap.records(self.topo.jobs))
                if isinstance(j, JobState) and j.job_id.startswith(prefix)]
        inbox = [m for m in _decoded(self.tap.records(self.topo.worker_inbox))
                 if getattr(m, "worker_id", "").startswith(prefix)]
        return runs, jobs, inbox

    def handler_starts(self, ledger: list[RunState]) -> dict[str, int]:
        """Each run's first handler start, as an outside observer would time it: run id ->
        the instant its worker launched the attempt whose start the ledger records first.
        The ledger's ``started_at_ms`` is when that worker *sent* its start report; it
        launches once Kafka took it, and says when in the attempt's completion
        (``CompleteAttempt.started_at_ms``, on the run-events topic). A run whose first
        reported attempt never completed (its worker killed) is not here: its ledger
        instant is all there is. ``ledger``: the scenario's ledger records, as the caller
        read them already (``history``, ``check``)."""
        prefix = f"{self.tag}-"
        claims: dict[tuple[str, int], int] = {}
        launches: dict[tuple[str, int], int] = {}
        for m in _decoded(self.tap.records(self.topo.run_events)):
            if not getattr(m, "run_id", "").startswith(prefix):
                continue
            if isinstance(m, AttemptStarted):
                claims.setdefault((m.run_id, m.token), m.started_at_ms)
            elif isinstance(m, CompleteAttempt) and m.started_at_ms is not None:
                launches[(m.run_id, m.token)] = m.started_at_ms
        runs = {r.run_id: r for r in ledger}
        out: dict[str, int] = {}
        for (run_id, token), claimed_ms in claims.items():
            r = runs.get(run_id)
            launched = launches.get((run_id, token))
            if r is not None and r.started_at_ms == claimed_ms and launched is not None:
                out[run_id] = launched
        return out

    def tombstones(self, prefix: str) -> set[str]:
        """Run ids starting with ``prefix`` tombstoned on the ledger during the scenario."""
        return {(k or b"").decode() for k, v in self.tap.records(self.topo.runs)
                if v is None and (k or b"").decode().startswith(prefix)}

    def settle(self, job_ids: list[str], max_s: float = DRAIN_MAX_S, poll_s: float = 1.0) -> float:
        """After ``job_ids`` were sent a pause: until the jobs topic shows each one paused
        (or done) and every run of the scenario is terminal, the runs the lookahead
        triggered before the pause included; at most ``max_s`` (then the check names what
        is unfinished). Returns the seconds waited."""
        began = time.monotonic()
        wanted = set(job_ids)
        prefix = f"{self.tag}-"
        read = {self.topo.runs: 0, self.topo.jobs: 0}  # records decoded so far, per topic
        jobs: dict[str, JobStatus] = {}
        runs: dict[str, RunStatus] = {}
        while True:
            for topic, done in read.items():
                records = self.tap.records(topic)
                read[topic] = len(records)
                for rec in _decoded(records[done:]):  # (only the new ones: the tap's lists only grow)
                    if isinstance(rec, JobState) and rec.job_id in wanted:
                        jobs[rec.job_id] = rec.status
                    elif isinstance(rec, RunState) and rec.job_id.startswith(prefix):
                        runs[rec.run_id] = rec.status
            unheld = len(wanted) - sum(s in (JobStatus.PAUSED, JobStatus.DONE) for s in jobs.values())
            open_runs = sum(not s.terminal for s in runs.values())
            waited = time.monotonic() - began
            if not unheld and not open_runs:
                log(f"settled in {waited:.1f} s")
                return waited
            if waited + poll_s > max_s:
                log(f"not settled in {max_s:.0f} s: {unheld} job(s) not shown paused, {open_runs} run(s) not finished")
                return waited
            time.sleep(poll_s)

    def check(self, now_ms: int) -> tuple[CheckReport, list[RunState], dict[str, JobState]]:
        """The history checker over every ledger and inbox record of the scenario, for every
        job it registered (each must have a state), each from its first slot; a job the
        scenario paused has every slot before the pause was sent accounted for, wherever
        its state points."""
        runs, jobs, inbox = self.history()
        checker = HistoryChecker()
        for rec in [*runs, *inbox]:
            checker.observe(rec)
        first: dict[str, int | None] = {}
        last: dict[str, JobState] = {}
        for j in jobs:
            first.setdefault(j.job_id, j.next_run_at_ms)
            last[j.job_id] = j
        report = checker.check(list(last.values()), now_ms, first_slots=first, registered=list(self.registered),
                               due_until=self.paused_at)
        log("checker: " + report.summary())
        for problem in report.problems[:20]:
            log("problem: " + problem)
        return report, runs, last
