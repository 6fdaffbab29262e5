"""Three hosts on one machine with TLS everywhere (issue 26; `gnomon infra up --hosts 3
--tls`): host i is 127.0.0.i with a KRaft broker+controller and a Cassandra node (one
cluster, replication 3, LOCAL_QUORUM), each bound to its own address; every Kafka
listener SASL_SSL, Cassandra's clients and nodes encrypted, the API on HTTPS.

* The core path runs on it: jobs registered through the API, runs started by a processor
  and a worker, their history written by the projector and read back through the API,
  and the job's page of the web UI.
* A host lost: kill -9 of every process of host 3 (its broker, its Cassandra node, its
  processor and its worker) under per-second jobs, restarted later (20 s in CI, the
  issue's 2 minutes with ``GNOMON_CHAOS_LONG=1``): the history checker accounts for
  every slot once, the start lag from the fault is reported for the jobs whose
  partitions lived on host 3 and for the others, the API on host 1 answers throughout,
  and every run the ledger finished is in history afterwards.
* A host cut off: host 2 (its broker, Cassandra node, processor and worker, each in host
  2's cgroup) partitioned from the others both ways for 30 s in CI, the issue's 60 s with
  ``GNOMON_CHAOS_LONG=1``, by an nftables table of the test's own (``netcut.py``), then
  healed with nothing restarted. Probes prove the cut each way and that host 2 still
  reaches itself; the same checker, history, API and start-lag accounting as above."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx
import netcut
import pytest
from chaoslib import LOAD_TARGET, LONG, Scenario, log, missing_from_history

from gnomon.adapters.kafka import partition_for
from gnomon.checker import CheckReport
from gnomon.client import ApiError, ApiUnavailable, Client
from gnomon.config import Settings, load
from gnomon.core.jobs import PauseJob, RegisterJob
from gnomon.core.model import JobSpec, RetryPolicy, Schedule
from gnomon.core.runs import RunState, RunStatus
from gnomon.history.cassandra import CassandraHistoryStore
from gnomon.infra import cassandra, fetch, kafka, manager, placement, procs, tls
from gnomon.topology import load_topology

pytestmark = [pytest.mark.integration, pytest.mark.chaos, pytest.mark.own_brokers]

# (inside the ephemeral range, 32768-60999: the fresh-clone run of 295d933 found 127.0.0.1:49142
# held by some connection when Cassandra node 1 bound it. Ports below it, 31100-31787, made
# the API answer 503 to most reads in the run of 796b9e8, not understood yet: these stay.)
KAFKA_PORT, CONTROLLER_PORT, CQL_PORT, STORAGE_PORT, API_PORT = 49192, 49193, 49142, 47100, 48787
HOSTS = ("127.0.0.1", "127.0.0.2", "127.0.0.3")
HOST_DOWN_S = 120 if LONG else 20  # host 3 away before its processes are started again
AFTER_S = 60 if LONG else 20  # running after it is back (or healed)
CUT_S = 60 if LONG else 30  # host 2 cut off from the others (the 60 s with GNOMON_CHAOS_LONG=1)


@dataclass
class Cluster:
    settings: Settings
    ca: Path
    token: str
    cert: tls.HostCert


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("hosts")
    settings = Settings(state_dir=tmp / "hosts3", kafka_port=KAFKA_PORT, kafka_controller_port=CONTROLLER_PORT,
                        cassandra_port=CQL_PORT, cassandra_storage_port=STORAGE_PORT,
                        credentials_path=load().credentials_dir)
    (settings.state_dir / "lib").mkdir(parents=True)
    for component in ("kafka", "cassandra"):
        (settings.state_dir / "lib" / component).symlink_to(fetch.lib_dir(load().state_dir, component))
    began = time.monotonic()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(placement.ENV, "1")  # each host's servers in its cgroup (the cut-off test tells hosts apart by it)
        try:
            manager.up(settings, kafka_nodes=3, components=("kafka", "cassandra"), tls=True, cassandra_nodes=3)
            log(f"three hosts with TLS up in {time.monotonic() - began:.0f} s")
            ca = tls.ca_file(settings.state_dir)
            cert = tls.ensure_host(settings.state_dir, "api-1", ["127.0.0.1"])
            token = secrets.token_hex(16)
            mp.setenv("GNOMON_KAFKA_BOOTSTRAP", kafka.bootstrap(settings, 3))
            mp.setenv("GNOMON_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
            mp.setenv("GNOMON_KAFKA_CA_FILE", str(ca))
            mp.setenv("GNOMON_CASSANDRA_HOSTS", ",".join(HOSTS))
            mp.setenv("GNOMON_CASSANDRA_PORT", str(CQL_PORT))
            mp.setenv("GNOMON_CASSANDRA_TLS", "1")
            mp.setenv("GNOMON_CASSANDRA_CA_FILE", str(ca))
            mp.setenv("GNOMON_API_TOKENS", f"{token}:chaos")
            mp.setenv("GNOMON_API_CA_FILE", str(ca))
            yield Cluster(settings, ca, token, cert)
        finally:
            manager.down(settings)


def _start_api(sc: Scenario, cl: Cluster, group: Path | None = None, env: Mapping[str, str] | None = None) -> str:
    sc.start("api", "api", "--port", str(API_PORT), "--workers", "1", "--tls-cert", str(cl.cert.cert),
             "--tls-key", str(cl.cert.key), group=group, env=env)
    return f"https://127.0.0.1:{API_PORT}"


def _wait_history_ready(url: str, ca: Path, timeout_s: float = 90) -> None:
    """Until the API's /readyz says it can read history (its Cassandra connection made and
    the schema applied: on three fresh TLS nodes that took over 10 s in CI, and a read sent
    before it answered 503 "still connecting")."""
    began = time.monotonic()
    last = ""
    while time.monotonic() - began < timeout_s:
        with contextlib.suppress(httpx.HTTPError):
            resp = httpx.get(url + "/readyz", verify=str(ca), timeout=5)
            if resp.status_code == 200:
                log(f"API ready to read history {time.monotonic() - began:.1f} s after it served")
                return
            last = resp.text[:200]
        time.sleep(0.5)
    raise AssertionError(f"the API was not ready to read history in {timeout_s:.0f} s: {last}")


def test_three_hosts_with_tls_run_the_core_path(tmp_path: Path, cluster: Cluster) -> None:
    settings, ca, token = cluster.settings, cluster.ca, cluster.token
    # each host's servers bound to its own address, TLS only
    for i, node in enumerate(kafka.nodes(settings, 3)):
        props = node.config.read_text()
        assert f"listeners=CLIENT://{HOSTS[i]}:{KAFKA_PORT},CONTROLLER://{HOSTS[i]}:{CONTROLLER_PORT}" in props
        assert "listener.security.protocol.map=CONTROLLER:SASL_SSL,CLIENT:SASL_SSL" in props
    for i, cnode in enumerate(cassandra.nodes(settings, 3)):
        conf = (cnode.home / "cassandra.yaml").read_text()
        assert f"listen_address: {HOSTS[i]}" in conf and f"rpc_address: {HOSTS[i]}" in conf
        assert re.search(r"client_encryption_options:\n  enabled: true\n  optional: false", conf), conf[-800:]
    # the default superuser is off on every node (its row is written at one replica first)
    assert cassandra._login(settings, cassandra.DEFAULT_SUPERUSER) is None, "cassandra/cassandra still logs in"
    # every node owns its own tokens, and each sees the other two with theirs (three nodes
    # started together once chose the same tokens: one dropped another, data on two of three)
    views = cassandra.ring_views(settings)
    assert set(views) == set(HOSTS)
    for host, view in views.items():
        assert view == views[HOSTS[0]], (host, view)
        assert set(view) == set(HOSTS) and all(len(t) == cassandra.NUM_TOKENS for t in view.values()), view
        assert len(frozenset().union(*view.values())) == 3 * cassandra.NUM_TOKENS, view

    tag = "hosts" + secrets.token_hex(3)
    sc = Scenario(tag, tmp_path)
    client = None
    try:
        sc.processor("p1")
        sc.worker("w1")
        sc.start("projector", "projector")
        url = _start_api(sc, cluster)
        sc.wait_ready("p1", "w1", "projector", "api", timeout_s=120)
        _wait_history_ready(url, ca)
        client = Client(url, token)
        ids = [client.create_job({"name": f"{tag}-{i}", "schedule": "*/2 * * * * *", "timeoutS": 20,
                                  "target": {"type": "command", "argv": ["true"]}})["id"] for i in range(3)]
        deadline = time.monotonic() + 90
        while True:  # history read back through the API: the projector wrote it over TLS
            done = {j: [r for r in client.list_runs(j, status="succeeded")["items"]] for j in ids}
            if all(len(rs) >= 2 for rs in done.values()):
                break
            assert time.monotonic() < deadline, {j: len(rs) for j, rs in done.items()}
            time.sleep(1)
        log(f"history over three hosts: {sum(len(rs) for rs in done.values())} succeeded runs read back")
        # the web UI's job page, signed in with the token, over HTTPS
        with httpx.Client(base_url=url, verify=str(ca), timeout=10) as ui:
            signed = ui.post("/ui/login", data={"token": token}, headers={"Origin": url})
            assert signed.status_code in (200, 303), signed.text[:300]
            page = ui.get(f"/ui/jobs/{ids[0]}")
            assert page.status_code == 200 and ids[0] in page.text and "succeeded" in page.text, page.text[:300]
        for j in ids:
            client.delete(j)
    finally:
        if client is not None:
            client.close()
        sc.stop_all()


def _owned_partitions(sc: Scenario, name: str) -> set[int]:
    """The partitions processor ``name`` was last assigned (its log says)."""
    text = (sc.logs / f"{name}.log").read_text(errors="replace")
    found = re.findall(r"assigned partitions \[([0-9, ]*)\]", text)
    return {int(p) for p in found[-1].split(",") if p.strip()} if found else set()


def _led_by(settings: Settings, topic: str, broker: int) -> set[int]:
    md = kafka.admin(kafka.bootstrap(settings, 3)).list_topics(topic, timeout=10)
    return {p.id for p in md.topics[topic].partitions.values() if p.leader == broker}


def _p99(xs: list[float]) -> float:
    return statistics.quantiles(xs, n=100)[98] if len(xs) >= 2 else (xs[0] if xs else 0.0)


def _group(cl: Cluster, host: int) -> Path | None:
    return placement.host_group(cl.settings.state_dir, host)


class ApiPoller:
    """The API on host 1, read once a second all through a fault: answers by status."""

    def __init__(self, url: str, token: str, job_id: str, api_pid: int | None = None) -> None:
        self.statuses: dict[str, int] = {}
        self._api_pid = api_pid
        self._asked_at: float | None = None  # when the read in flight was sent
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, args=(url, token, job_id), daemon=True)
        self._thread.start()

    SLOW_S = 5.0

    def _poll(self, url: str, token: str, job_id: str) -> None:
        api = Client(url, token)
        threading.Thread(target=self._dump_when_slow, daemon=True).start()
        try:
            while not self._stop.is_set():
                self._asked_at = time.monotonic()
                why = ""
                try:
                    api.get_job(job_id)
                    key = "200"
                except ApiError as exc:  # (a refusal counted under its status and reason: the assertion names them)
                    key, why = f"{exc.status} {str(exc)[:120]}", str(exc)
                except (ApiUnavailable, httpx.HTTPError) as exc:  # (the API restarting, or gone)
                    key, why = type(exc).__name__, str(exc)
                took = time.monotonic() - self._asked_at
                self._asked_at = None
                if took > self.SLOW_S or why:  # every refusal with its reason: what a 503 waited on
                    log(f"API read took {took:.1f} s ({key}{': ' + why[:300] if why else ''})")
                self.statuses[key] = self.statuses.get(key, 0) + 1
                self._stop.wait(1.0)
        finally:
            api.close()

    def _dump_when_slow(self) -> None:
        """A read waiting over SLOW_S: the API's threads' stacks into its log (SIGUSR1),
        once per read, so a hang shows where it waits."""
        dumped_for: float | None = None
        while not self._stop.wait(0.5):
            asked = self._asked_at
            if asked is not None and asked != dumped_for and time.monotonic() - asked > self.SLOW_S \
                    and self._api_pid is not None:
                dumped_for = asked
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self._api_pid, signal.SIGUSR1)
                log(f"API read waiting over {self.SLOW_S:.0f} s: its stacks are in api.log")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(15)


def _spread_ids(tag: str, n: int) -> list[str]:
    """``n`` job ids of the scenario's with every partition of gnomon.runs among them (so
    the jobs on the faulty host and the others are both there, whichever it owned)."""
    partitions = load_topology().partitions
    ids: list[str] = []
    seen: set[int] = set()
    i = 0
    while len(seen) < min(n, partitions):
        job_id = f"{tag}-{i:02d}"
        if partition_for(job_id, partitions) not in seen:
            seen.add(partition_for(job_id, partitions))
            ids.append(job_id)
        i += 1
    ids += [f"{tag}-x{j:02d}" for j in range(n - len(ids))]
    return ids


def _load(sc: Scenario, cl: Cluster, tag: str, env: Mapping[str, str] | None = None) -> tuple[str, list[str]]:
    """Each host's processor and worker in its host's group, the projector and the API on
    host 1, and 12 per-second jobs running: the API's address and the jobs' ids. ``env``:
    more environment for every process (another version's code)."""
    for h in (1, 2, 3):
        sc.processor(f"p{h}", group=_group(cl, h), env=env)
        sc.worker(f"w{h}", group=_group(cl, h), env=env)
    sc.start("projector", "projector", group=_group(cl, 1), env=env)
    url = _start_api(sc, cl, group=_group(cl, 1), env=env)
    sc.wait_ready("p1", "p2", "p3", "w1", "w2", "w3", "projector", "api", timeout_s=150)
    _wait_history_ready(url, cl.ca)
    # (registered as signed commands, with ids of the scenario's: the checker reads them by prefix)
    spec = JobSpec(name=tag, schedule=Schedule(cron="* * * * * *"), target=LOAD_TARGET,
                   timeout_s=20, retry=RetryPolicy(max_attempts=5, backoff_base_s=0.5, backoff_cap_s=2))
    ids = _spread_ids(tag, 12)
    for job_id in ids:
        sc.send(RegisterJob(job_id, "chaos", spec, int(time.time() * 1000)))
    sc.flush()
    sc.wait_runs(succeeded=3 * len(ids), timeout_s=90)
    _wait_api_serves(url, cl.token, ids[0])
    time.sleep(5)  # steady load before the fault
    return url, ids


def _wait_api_serves(url: str, token: str, job_id: str, timeout_s: float = 60) -> None:
    """Until the API answers ``job_id`` from history: its history store connected (the
    API connects on a thread of its own after it starts listening) and the projector has
    written the job. The fault comes to a system that was whole: an API whose first
    connection to Cassandra is made during a cut queues its reads behind it, and a job the
    projector has not written yet is a 404 (CI of af4ba3b, and a run here: api.log)."""
    api = Client(url, token)
    deadline = time.monotonic() + timeout_s
    last = ""
    try:
        while time.monotonic() < deadline:
            try:
                api.get_job(job_id)
                return
            except (ApiError, ApiUnavailable, httpx.HTTPError) as exc:
                last = str(exc)
            time.sleep(1)
    finally:
        api.close()
    raise AssertionError(f"the API did not serve job {job_id} within {timeout_s:.0f} s before the fault: {last}")


@dataclass
class Outcome:
    report: CheckReport
    final: dict[str, RunState]
    done: dict[str, RunState]
    missing: list[str]
    ledger: list[RunState]  # every ledger record of the scenario, in offset order per partition
    launched: dict[str, int]  # run id -> its first handler start (Scenario.handler_starts)

    def start_ms(self, r: RunState) -> int | None:
        """When ``r``'s handler first started: its launch if known, else the ledger's instant
        (the start report's send, which the launch follows by Kafka's acknowledgement)."""
        return self.launched.get(r.run_id, r.started_at_ms)


def _pause_and_check(sc: Scenario, ids: list[str], poller: ApiPoller) -> Outcome:
    """The API's poller stopped, the jobs paused, the ledger checked, and every run it
    finished read back from Cassandra at LOCAL_QUORUM (history complete)."""
    poller.stop()
    for j in ids:
        sc.send(PauseJob(j, "chaos", int(time.time() * 1000)))
    sc.flush()
    sc.settle(ids)
    report, runs, _ = sc.check(int(time.time() * 1000))
    final = {r.run_id: r for r in runs}
    done = {rid: r for rid, r in final.items() if r.status is RunStatus.SUCCEEDED}
    store = CassandraHistoryStore(list(HOSTS), CQL_PORT)
    try:
        missing = missing_from_history(store, list(done))
    finally:
        store.close()
    return Outcome(report, final, done, missing, runs, sc.handler_starts(runs))


def _report(settings: Settings, host: int, partitions_there: set[int], ids: list[str], fault_at: int,
            out: Outcome, statuses: dict[str, int]) -> dict[bool, list[float]]:
    """Print start lag from the fault for the jobs whose partitions lived on ``host`` and for
    the others, the worst lag per 10 s, the latest starts and the skips; return the lags."""
    topo = load_topology()
    partitions = len(kafka.admin(kafka.bootstrap(settings, 3)).list_topics(topo.runs, timeout=10)
                     .topics[topo.runs].partitions)
    there = {j for j in ids if partition_for(j, partitions) in partitions_there}
    lags: dict[bool, list[float]] = {True: [], False: []}
    behind: list[float] = []  # how far each handler start trails the ledger's instant
    for r in out.done.values():
        start_ms = out.start_ms(r)
        if r.slot_ms >= fault_at and start_ms is not None and not r.manual:
            lags[r.job_id in there].append((start_ms - r.slot_ms) / 1000)
            if r.started_at_ms is not None and r.run_id in out.launched:
                behind.append((start_ms - r.started_at_ms) / 1000)
    log(f"checker: {out.report.summary()}")
    if behind:
        log(f"handler starts (the launch, after Kafka took the start report) trail the ledger's instant by "
            f"p50 {statistics.median(behind):.3f} s, p99 {_p99(behind):.3f} s, max {max(behind):.3f} s "
            f"({len(behind)} of the runs measured; the others: the ledger's instant)")
    for where, xs in ((f"on host {host}", lags[True]), ("elsewhere", lags[False])):
        if xs:
            log(f"start lag from the fault, jobs {where}: {len(xs)} runs, p50 {statistics.median(xs):.2f} s, "
                f"p99 {_p99(xs):.2f} s, max {max(xs):.2f} s")
    windows: dict[int, float] = {}  # the worst start lag per 10 s of slots, from the fault
    for r in out.done.values():
        start_ms = out.start_ms(r)
        if r.slot_ms >= fault_at - 10_000 and start_ms is not None:
            w = (r.slot_ms - fault_at) // 10_000 * 10
            windows[w] = max(windows.get(w, 0.0), (start_ms - r.slot_ms) / 1000)
    log("worst start lag per 10 s of slots from the fault: "
        + ", ".join(f"+{w}s {lag:.1f}" for w, lag in sorted(windows.items())))
    late = sorted((r for r in out.done.values() if out.start_ms(r) is not None and r.slot_ms >= fault_at - 10_000),
                  key=lambda r: (out.start_ms(r) or 0) - r.slot_ms)[-8:]
    for r in late:  # the latest starts: which partition, which attempt, which worker
        start_ms = out.start_ms(r)
        assert start_ms is not None
        log(f"  late: {r.run_id} partition {partition_for(r.job_id, partitions)} slot +{(r.slot_ms - fault_at) / 1000:.0f} s "
            f"started +{(start_ms - fault_at) / 1000:.0f} s attempt {r.attempt} on {r.worker_id}")
    for r in late[-3:]:  # how the latest ones got there: every ledger record of each
        log(f"  {_timeline(out, r.run_id, fault_at)}")
    reasons: dict[str, int] = {}
    for r in out.final.values():
        if r.status is RunStatus.SKIPPED:
            key = (r.reason or "")[:40]
            reasons[key] = reasons.get(key, 0) + r.skipped_count
    log(f"skipped slots by reason: {reasons}")
    log(f"API on host 1 during the fault: {statuses}; history: {len(out.done) - len(out.missing)} of "
        f"{len(out.done)} finished runs read back")
    return lags


def _timeline(out: Outcome, run_id: str, origin_ms: int) -> str:
    """Every ledger record of one run, in log order, its times from ``origin_ms``."""

    def at(ms: int | None) -> str:
        return "-" if ms is None else f"+{(ms - origin_ms) / 1000:.1f}"

    return f"{run_id}: " + "; ".join(
        f"{at(s.updated_at_ms)} {s.status.value} token {s.token} {s.worker_id or ''}"
        f"{' staged' if s.staged else ''} lease {at(s.lease_until_ms)}"
        for s in out.ledger if s.run_id == run_id)


def _assert_whole(out: Outcome, lags: dict[bool, list[float]], statuses: dict[str, int], job_slots_min: int, *,
                  kinds: tuple[bool, ...] = (True, False), answers_min: int = 10, answered: float = 0.9) -> None:
    """Every slot accounted for once (each job: at least ``job_slots_min``), history complete,
    runs of each of ``kinds`` (on the
    faulty host, elsewhere) started after the fault, and the API answered ``answered`` of
    at least ``answers_min`` reads."""
    if not out.report.ok:  # the first runs in trouble, record by record, from the check's time
        named = list(dict.fromkeys(p.split()[0].rstrip(":") for p in out.report.problems))[:2]
        at = max((s.updated_at_ms for s in out.ledger), default=0)
        raise AssertionError(" | ".join([out.report.verdict(), *(_timeline(out, r, at) for r in named)]))
    assert out.report.jobs and not out.report.jobs_short_of(job_slots_min), out.report.jobs_short_of(job_slots_min)
    assert not out.missing, f"history lost {len(out.missing)} runs, e.g. {out.missing[:3]}"
    assert all(lags[kind] for kind in kinds), "runs of each kind of job started after the fault"
    total = sum(statuses.values())
    assert total >= answers_min and statuses.get("200", 0) >= answered * total, statuses


def test_a_host_lost_and_back_misses_and_doubles_nothing(tmp_path: Path, cluster: Cluster) -> None:
    """kill -9 of host 3's broker, Cassandra node, processor and worker under load; its
    servers and processes started again ``HOST_DOWN_S`` later."""
    settings = cluster.settings
    topo = load_topology()
    tag = "lost" + secrets.token_hex(3)
    sc = Scenario(tag, tmp_path)
    poller: ApiPoller | None = None
    try:
        url, ids = _load(sc, cluster, tag)
        poller = ApiPoller(url, cluster.token, ids[0], sc.procs["api"].pid)
        owned3 = _owned_partitions(sc, "p3")
        led3 = _led_by(settings, topo.runs, 3)
        kill_at = int(time.time() * 1000)
        for name in ("kafka-3", cassandra.nodes(settings, 3)[2].name):
            pid = procs.running_pid(settings.state_dir, name)
            assert pid is not None, name
            os.kill(pid, signal.SIGKILL)
        sc.signal("p3", signal.SIGKILL)
        sc.signal("w3", signal.SIGKILL)
        log(f"host 3 lost: its broker, Cassandra node, processor (partitions {sorted(owned3)}) and worker "
            f"killed; its broker led partitions {sorted(led3)} of {topo.runs}")
        deadline = time.monotonic() + 10  # (the killed JVMs gone)
        while True:  # `gnomon infra status` names the lost host's nodes
            st = manager.status(settings)
            if all([m["state"] for m in st[c]["members"]][2] == "down" for c in ("kafka", "cassandra")):
                break
            assert time.monotonic() < deadline, st
            time.sleep(0.2)
        assert st["kafka"]["state"] == st["cassandra"]["state"] == "degraded", st
        time.sleep(HOST_DOWN_S)
        began = time.monotonic()
        # host 3's Cassandra node starts beside its broker (`gnomon infra host start 3`);
        # the test waits for the broker (its processes need it), and for the node only
        # before the next test: history is written and read at LOCAL_QUORUM, which the
        # other two nodes answer meanwhile
        manager.start_host(settings, 3, wait_cassandra=False)
        sc.processor("p3", group=_group(cluster, 3))
        sc.worker("w3", group=_group(cluster, 3))
        back_at = int(time.time() * 1000)
        log(f"host 3 back: its broker up in {time.monotonic() - began:.0f} s, at +{(back_at - kill_at) / 1000:.0f} s")
        time.sleep(AFTER_S)
        out = _pause_and_check(sc, ids, poller)
    finally:
        if poller is not None:
            poller.stop()
        sc.stop_all()
        waited = time.monotonic()
        manager.up(settings, kafka_nodes=3, components=("cassandra",), tls=True, cassandra_nodes=3)
        log(f"Cassandra serves on all three hosts (waited {time.monotonic() - waited:.0f} s more for it)")
    log(f"host 3 away {HOST_DOWN_S} s")
    lags = _report(settings, 3, owned3 | led3, ids, kill_at, out, poller.statuses)
    _assert_whole(out, lags, poller.statuses, HOST_DOWN_S + AFTER_S)  # (per-second jobs)


def test_a_host_cut_off_and_healed_misses_and_doubles_nothing(tmp_path: Path, cluster: Cluster) -> None:
    """Host 2 cut off from the others, both ways, for ``CUT_S`` under load, then healed:
    nothing of it is killed; its processes find their way back by themselves."""
    why = netcut.available()
    assert why is None, f"the cut-off test cannot run here: {why}"
    settings = cluster.settings
    topo = load_topology()
    g1, g2 = _group(cluster, 1), _group(cluster, 2)
    assert g2 is not None
    for name in ("kafka-2", cassandra.nodes(settings, 3)[1].name):  # host 2's servers are in its group
        pid = procs.running_pid(settings.state_dir, name)
        assert pid is not None and placement.group_of(pid) == g2, (name, pid and placement.group_of(pid))
    tag = "cut" + secrets.token_hex(3)
    sc = Scenario(tag, tmp_path)
    poller: ApiPoller | None = None
    try:
        url, ids = _load(sc, cluster, tag)
        for name in ("p2", "w2"):
            assert placement.group_of(sc.procs[name].pid) == g2, name
        poller = ApiPoller(url, cluster.token, ids[0], sc.procs["api"].pid)
        owned2 = _owned_partitions(sc, "p2")
        led2 = _led_by(settings, topo.runs, 2)
        assert netcut.reaches(g2, HOSTS[0], KAFKA_PORT) and netcut.reaches(g1, HOSTS[1], KAFKA_PORT)
        cut_at = int(time.time() * 1000)
        with netcut.cut_off(g2, tag) as table:
            log(f"host 2 cut off (nft table {table}): its processor had partitions {sorted(owned2)}, "
                f"its broker led partitions {sorted(led2)} of {topo.runs}")
            # the cut is real, each way, and only between host 2 and the others
            assert netcut.dropped(g2, HOSTS[0], KAFKA_PORT), "host 2 still reaches host 1's broker"
            assert netcut.dropped(g2, HOSTS[2], CQL_PORT), "host 2 still reaches host 3's Cassandra"
            assert netcut.dropped(g1, HOSTS[1], KAFKA_PORT), "host 1 still reaches host 2's broker"
            assert netcut.dropped(None, HOSTS[1], CQL_PORT), "this test still reaches host 2's Cassandra"
            assert netcut.reaches(g2, HOSTS[1], KAFKA_PORT), "host 2 no longer reaches its own broker"
            assert netcut.reaches(g1, HOSTS[2], KAFKA_PORT), "host 1 no longer reaches host 3's broker"
            time.sleep(max(0.0, CUT_S - (time.time() * 1000 - cut_at) / 1000))
        healed_at = int(time.time() * 1000)
        assert not netcut.table_exists(table)
        assert netcut.reaches(g2, HOSTS[0], KAFKA_PORT) and netcut.reaches(g1, HOSTS[1], KAFKA_PORT)
        log(f"healed at +{(healed_at - cut_at) / 1000:.0f} s")
        time.sleep(AFTER_S)
        exited = {name: p.returncode for name, p in sc.procs.items() if p.poll() is not None}
        out = _pause_and_check(sc, ids, poller)
    finally:
        if poller is not None:
            poller.stop()
        sc.stop_all()
    log(f"host 2 cut off {CUT_S} s")
    lags = _report(settings, 2, owned2 | led2, ids, cut_at, out, poller.statuses)
    assert not exited, f"processes exited during the cut: {exited}"
    _assert_whole(out, lags, poller.statuses, CUT_S + AFTER_S)  # (per-second jobs)


GROW_TO = 16
GROW_AFTER_S = 40 if LONG else 20  # running on 16 partitions before the jobs are paused and checked


def test_a_live_system_grows_from_8_to_16_partitions(tmp_path: Path, cluster: Cluster) -> None:
    """`gnomon infra grow --to 16` under per-second jobs on the three hosts: the processors
    hand every moving job to its new partition themselves (ADR 0012); the history checker
    accounts for every slot once, every job runs on its new partition afterwards, and the
    start lag from the grow is reported for the jobs that moved and those that stayed.
    Last in this module: the cluster keeps its 16 partitions."""
    topo = load_topology()
    tag = "grow" + secrets.token_hex(3)
    sc = Scenario(tag, tmp_path)
    try:
        for h in (1, 2, 3):
            sc.processor(f"p{h}", group=_group(cluster, h))
            sc.worker(f"w{h}", group=_group(cluster, h))
        sc.wait_ready("p1", "p2", "p3", "w1", "w2", "w3", timeout_s=150)
        spec = JobSpec(name=tag, schedule=Schedule(cron="* * * * * *"),
                       target=LOAD_TARGET, timeout_s=20,
                       retry=RetryPolicy(max_attempts=5, backoff_base_s=0.5, backoff_cap_s=2))
        ids = _spread_ids(tag, 24)
        for job_id in ids:
            sc.send(RegisterJob(job_id, "chaos", spec, int(time.time() * 1000)))
        sc.flush()
        sc.wait_runs(succeeded=3 * len(ids), timeout_s=90)
        time.sleep(5)
        grown_at = int(time.time() * 1000)
        began = time.monotonic()
        grow = subprocess.run([sys.executable, "-m", "gnomon.cli.main", "infra", "grow", "--to", str(GROW_TO),
                               "--timeout-s", "120"], env=sc.env, capture_output=True, text=True, timeout=240)
        log(f"gnomon infra grow (exit {grow.returncode}, {time.monotonic() - began:.1f} s):\n{grow.stderr.strip()}")
        assert grow.returncode == 0, grow.stderr[-2000:]
        assert f"grown to {GROW_TO} partitions" in grow.stderr
        for topic in (topo.runs, topo.jobs):
            sc.tap.grow(topic, GROW_TO)
        again = subprocess.run([sys.executable, "-m", "gnomon.cli.main", "infra", "grow", "--to", str(GROW_TO),
                                "--timeout-s", "60"], env=sc.env, capture_output=True, text=True, timeout=120)
        assert again.returncode == 0 and "already" in again.stderr, again.stderr[-2000:]  # idempotent
        refused = subprocess.run([sys.executable, "-m", "gnomon.cli.main", "infra", "grow", "--to", "24"],
                                 env=sc.env, capture_output=True, text=True, timeout=60)
        assert refused.returncode == 2 and "--to" in refused.stderr and "multiple" in refused.stderr, refused.stderr
        time.sleep(GROW_AFTER_S)
        for j in ids:
            sc.send(PauseJob(j, "chaos", int(time.time() * 1000)))
        sc.flush()
        sc.settle(ids)
        report, runs, _ = sc.check(int(time.time() * 1000))
        # (a partition whose handover's transaction failed logs it again when it is redone)
        handed = {int(p) for h in (1, 2, 3) for p in re.findall(rf"partition (\d+) grown from 8 to {GROW_TO} partitions",
                                                             (sc.logs / f"p{h}.log").read_text(errors="replace"))}
        moved = {j for j in ids if partition_for(j, GROW_TO) != partition_for(j, topo.partitions)}
        lags: dict[bool, list[float]] = {True: [], False: []}
        ran_after: dict[str, int] = {}
        for r in {r.run_id: r for r in runs}.values():
            if r.slot_ms >= grown_at and r.started_at_ms is not None and not r.manual:
                lags[r.job_id in moved].append((r.started_at_ms - r.slot_ms) / 1000)
                if r.slot_ms >= grown_at + 15_000:
                    ran_after[r.job_id] = ran_after.get(r.job_id, 0) + 1
        for kind, xs in (("moved", lags[True]), ("stayed", lags[False])):
            if xs:
                log(f"start lag from the grow, jobs that {kind}: {len(xs)} runs, p50 {statistics.median(xs):.2f} s, "
                    f"p99 {_p99(xs):.2f} s, max {max(xs):.2f} s")
        windows: dict[int, float] = {}  # the worst start lag per 10 s of slots, from the grow
        for r in {r.run_id: r for r in runs}.values():
            if r.slot_ms >= grown_at - 10_000 and r.started_at_ms is not None:
                w = (r.slot_ms - grown_at) // 10_000 * 10
                windows[w] = max(windows.get(w, 0.0), (r.started_at_ms - r.slot_ms) / 1000)
        log("worst start lag per 10 s of slots from the grow: "
            + ", ".join(f"+{w}s {lag:.1f}" for w, lag in sorted(windows.items())))
        log(f"partitions handed over: {sorted(handed)}; jobs moved: {len(moved)} of {len(ids)}")
        assert report.ok, report.verdict()
        assert set(report.jobs) == set(ids) and not report.jobs_short_of(20), report.jobs_short_of(20)
        assert handed == set(range(topo.partitions)), handed
        assert moved and lags[True] and lags[False]
        assert set(ran_after) == set(ids), f"jobs that did not run after the grow: {sorted(set(ids) - set(ran_after))}"
        # every job's state was written on the partition 16 places it on
        on: dict[str, set[int]] = {}
        for p, k in _keys_by_partition(sc, topo.jobs):
            on.setdefault((k or b"").decode(), set()).add(p)
        assert all(partition_for(j, GROW_TO) in on.get(j, set()) for j in ids), {j: on.get(j) for j in ids}
    finally:
        sc.stop_all()


def _keys_by_partition(sc: Scenario, topic: str) -> list[tuple[int, bytes | None]]:
    """(partition, key) of every record of ``topic`` from the scenario's start, in offset order."""
    from confluent_kafka import TopicPartition

    from topic_reading import read_messages

    start = [TopicPartition(topic, p, 0) for p in range(GROW_TO)]
    return [(m.partition(), m.key()) for m in read_messages(sc.settings.kafka_bootstrap, start)
            if m.value() is not None]
