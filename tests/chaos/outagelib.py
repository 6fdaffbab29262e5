"""Whole-cluster broker outages under load, on a Kafka cluster of the scenario's own
(ports apart from the shared stack's, so the other tests are not disturbed).

``run_outages`` starts one processor and one worker on it, registers per-second jobs
(catch-up ``once``), stops every broker for each outage in turn and starts them again,
optionally freezes the processor past its session (SIGSTOP, then SIGCONT; ``thawed_s`` of
load after the thaw), and returns what happened: per outage, when runs started again and
the start lag after that; the history checker's report; whether every process is alive
and says so on /healthz.
Used by tests/chaos/test_broker_outage.py and bench/broker_outage.py (a long outage)."""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import socket
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from chaoslib import LOAD_TARGET, Scenario, log

from gnomon.checker import CheckReport
from gnomon.config import Settings, load
from gnomon.core.jobs import PauseJob, RegisterJob
from gnomon.core.model import CatchUp, JobSpec, Schedule
from gnomon.core.runs import RunState, RunStatus
from gnomon.infra import fetch, kafka, manager


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def own_cluster(state_dir: Path, nodes: int, port: int) -> Iterator[Settings]:
    """A Kafka cluster of ``nodes`` brokers under ``state_dir`` from ``port`` on; its
    bootstrap in $GNOMON_KAFKA_BOOTSTRAP while it runs (the processes started inherit it)."""
    settings = Settings(state_dir=state_dir, kafka_port=port, kafka_controller_port=port + 1,
                        credentials_path=load().credentials_dir)  # the processes' credentials work there
    (state_dir / "lib").mkdir(parents=True, exist_ok=True)
    link = state_dir / "lib" / "kafka"
    if not link.exists():  # the shared stack's jars (fetched first on a fresh checkout)
        link.symlink_to(fetch.fetch(load().state_dir, "kafka", "Kafka"))
    old = os.environ.get("GNOMON_KAFKA_BOOTSTRAP")
    bootstrap = ",".join(n.address for n in kafka.nodes(settings, nodes))
    os.environ["GNOMON_KAFKA_BOOTSTRAP"] = bootstrap
    try:
        manager.up(settings, kafka_nodes=nodes, components=("kafka",))
        yield settings
    finally:
        manager.down(settings, components=("kafka",))
        if old is None:
            os.environ.pop("GNOMON_KAFKA_BOOTSTRAP", None)
        else:
            os.environ["GNOMON_KAFKA_BOOTSTRAP"] = old


def pct(xs: Sequence[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(p / 100 * len(s)))] if s else float("nan")


@dataclass
class Outage:
    down_s: float
    down_at_ms: int = 0
    back_at_ms: int = 0  # every broker answers again
    until_ms: int = 0  # the end of the window judged after it
    resumed_s: float | None = None  # first run started after the return, seconds after it
    lags_s: list[float] = field(default_factory=list)  # start lag of the slots from 30 s after the return
    not_started: int = 0  # of those slots, runs that never started

    def summary(self) -> str:
        return (f"outage {self.down_s:.0f} s: runs again {self.resumed_s if self.resumed_s is None else round(self.resumed_s, 1)} s "
                f"after the return; start lag from 30 s after it p50={pct(self.lags_s, 50):.3f} "
                f"p99={pct(self.lags_s, 99):.3f} max={max(self.lags_s, default=float('nan')):.3f} s "
                f"(n={len(self.lags_s)}, not started={self.not_started})")


@dataclass
class Result:
    outages: list[Outage]
    report: CheckReport
    runs: list[RunState]
    alive: dict[str, bool]  # process -> still running at the end
    healthy: dict[str, dict[str, object]]  # process -> its /healthz answer at the end
    freeze: dict[str, object] = field(default_factory=dict)
    logs: Path = Path()

    def log_text(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")

    def log_after(self, name: str, after_ms: int) -> list[str]:
        """The process's own log lines (``logging``'s, timestamped) from ``after_ms`` on."""
        out = []
        for line in self.log_text(name).splitlines():
            m = re.match(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) ", line)
            if m:
                at = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")  # (logging: local time)
                if int(at.timestamp() * 1000) + int(m.group(2)) >= after_ms:
                    out.append(line)
        return out


def healthz(port: int) -> dict[str, object]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
            body: dict[str, object] = json.loads(r.read())
            body["status_code"] = r.status
            return body
    except urllib.error.HTTPError as exc:
        return {"status_code": exc.code, **json.loads(exc.read() or b"{}")}
    except (OSError, ValueError) as exc:
        return {"status_code": None, "error": str(exc)}


def _lags(runs: list[RunState], jobs: set[str], frm: int, until: int) -> tuple[list[float], int]:
    final = {r.run_id: r for r in runs}
    window = [r for r in final.values() if r.job_id in jobs and frm <= r.slot_ms < until
              and r.status is not RunStatus.SKIPPED and not r.manual]
    lags = [(r.started_at_ms - r.slot_ms) / 1000 for r in window if r.started_at_ms is not None]
    return lags, sum(1 for r in window if r.started_at_ms is None)


def run_outages(logs: Path, settings: Settings, nodes: int, outages_s: Sequence[float], *, jobs_n: int = 20,
                after_s: float = 45.0, freeze_s: float | None = None, thawed_s: float | None = None,
                misfire_grace_s: int = 60) -> Result:
    tag = "out" + secrets.token_hex(3)
    sc = Scenario(tag, logs, lease_s=8, lookahead_s=10)
    ports = {"p1": free_port(), "w1": free_port()}
    sc.processor_args = ("--metrics-port", str(ports["p1"]), "--misfire-grace-s", str(misfire_grace_s))
    outages = [Outage(s) for s in outages_s]
    jobs = {f"{tag}-{i:02d}" for i in range(jobs_n)}
    freeze: dict[str, object] = {}
    try:
        sc.processor("p1")
        sc.start("w1", "worker", "--worker-id", f"{tag}-w1", "--concurrency", "64", "--tenant", "chaos",
                 "--policy", str(Path(__file__).parent / "worker-policy.toml"), "--metrics-port", str(ports["w1"]))
        sc.wait_ready("p1", "w1")
        now = int(time.time() * 1000)
        spec = JobSpec(name="out", schedule=Schedule(cron="* * * * * *"), target=LOAD_TARGET,
                       timeout_s=20, catch_up=CatchUp.ONCE)
        for job_id in sorted(jobs):
            sc.send(RegisterJob(job_id, "chaos", spec, now))
        sc.flush()
        sc.wait_runs(succeeded=3 * jobs_n)
        time.sleep(3)  # steady load before the fault
        for o in outages:
            o.down_at_ms = int(time.time() * 1000)
            manager.down(settings, components=("kafka",))
            log(f"every broker ({nodes}) stopped for {o.down_s:.0f} s")
            time.sleep(max(0.0, o.down_s - (time.time() * 1000 - o.down_at_ms) / 1000))
            manager.up(settings, kafka_nodes=nodes, components=("kafka",))
            o.back_at_ms = int(time.time() * 1000)
            log(f"the brokers are back after {(o.back_at_ms - o.down_at_ms) / 1000:.0f} s")
            time.sleep(after_s)
            o.until_ms = int(time.time() * 1000)
        if freeze_s is not None:
            sc.signal("p1", signal.SIGSTOP)
            frozen_at = int(time.time() * 1000)
            time.sleep(freeze_s)
            freeze["thawed_at_ms"] = thawed = int(time.time() * 1000)  # (before: it acts at once)
            sc.signal("p1", signal.SIGCONT)
            freeze["frozen_s"] = (thawed - frozen_at) / 1000
            time.sleep(after_s if thawed_s is None else thawed_s)
            freeze["until_ms"] = int(time.time() * 1000)
        alive = {n: p.poll() is None for n, p in sc.procs.items()}
        healthy = {n: healthz(port) for n, port in ports.items()}
        now = int(time.time() * 1000)
        for job_id in sorted(jobs):
            sc.send(PauseJob(job_id, "chaos", now))
        sc.flush()
        sc.settle(list(jobs))
        report, runs, _ = sc.check(int(time.time() * 1000))
        sc.dump_stacks()  # (a process that went silent shows where it waits)
    finally:
        sc.stop_all()
        sc.close_producer()
    for o in outages:
        started = sorted(r.started_at_ms for r in runs if r.job_id in jobs and r.started_at_ms is not None
                         and r.started_at_ms >= o.back_at_ms)
        o.resumed_s = (started[0] - o.back_at_ms) / 1000 if started and started[0] < o.until_ms else None
        o.lags_s, o.not_started = _lags(runs, jobs, o.back_at_ms + 30_000, o.until_ms)
        log(o.summary())
    if freeze:
        lags, missing = _lags(runs, jobs, int(freeze["thawed_at_ms"]) + 15_000, int(freeze["until_ms"]))  # type: ignore[call-overload]
        freeze["lags_s"], freeze["not_started"] = lags, missing
        log(f"frozen {freeze['frozen_s']} s: start lag from 15 s after the thaw p99={pct(lags, 99):.3f} s "
            f"(n={len(lags)}, not started={missing})")
    return Result(outages, report, runs, alive, healthy, freeze, logs)
