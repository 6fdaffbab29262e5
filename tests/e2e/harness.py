"""The real stack as separate processes: processor, worker, projector and API, on the
Kafka and Cassandra that `gnomon infra up` started. Shared by the e2e tests."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from gnomon import command_keys
from gnomon.client import Client
from gnomon.command_keys import operator_headers
from topic_reading import end_offsets, read_messages

API_PORT = int(os.environ.get("GNOMON_TEST_API_PORT", "18787"))
# /metrics of the session stack's processor, projector and worker (tests/e2e/test_metrics.py);
# other processes a test starts inherit them, find the port taken and run without metrics
METRICS_PORTS = {"processor": 19470, "projector": 19480, "worker": 19490}
TOKEN, OTHER_TOKEN = "test-token-acme", "test-token-other"
ADMIN_TOKEN = "test-token-admin"  # tenant ops, admin role: sets tenants' limits
QUOTA_TOKEN = "test-token-quota"  # tenant quota: only tests/e2e/test_quota.py uses it
KAFKA_ROLES = {"api": "api", "processor": "processor", "worker": "worker", "projector": "projector"}


@dataclass
class Stack:
    api_url: str
    client: Client
    procs: dict[str, subprocess.Popen[bytes]]
    logs: Path
    env: dict[str, str] = field(default_factory=dict)

    def start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        out = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 - lives as long as the process
        # each service authenticates to Kafka as its own role (docs/adr/0006); the API reads it
        # from the environment, the others set theirs in code
        env = {**self.env, "GNOMON_KAFKA_ROLE": KAFKA_ROLES[args[0]]} if args and args[0] in KAFKA_ROLES else self.env
        p = subprocess.Popen([sys.executable, "-m", "gnomon.cli.main", *args], env=env, stdout=out,
                             stderr=subprocess.STDOUT, start_new_session=True)
        self.procs[name] = p
        return p

    def stop(self, name: str, sig: int = signal.SIGTERM) -> None:
        p = self.procs.pop(name)
        if p.poll() is None:
            os.killpg(p.pid, sig)
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def outside_producer_env(tenant: str = "acme") -> dict[str, str]:
    """What an operator hands a producer outside gnomon, beside the ``producer`` Kafka
    credential: the tenant's command key file (docs/job-events.md, "Signing a command"),
    the schema registry's read-only user and the tenant's API token (for the answers)."""
    from gnomon.config import load
    from gnomon.infra import registry
    from gnomon.registry.auth import user_info

    settings = load()
    return {"GNOMON_COMMAND_KEY_FILE": str(command_keys.tenant_file(command_keys.keys_dir(settings), tenant)),
            "GNOMON_REGISTRY_USER_INFO": user_info(registry.reader(settings)),
            # the tenant's API token: a team's service reads its answers from the REST API
            "GNOMON_API_TOKEN": {"acme": TOKEN, "other": OTHER_TOKEN}[tenant]}


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    from gnomon.config import load
    from gnomon.infra import manager

    manager.up(load())
    # the operator issues acme's command key (`gnomon tenants command-key acme`): the
    # tests' own producers (gnomon.events, the outside producers) sign acme's commands
    command_keys.ensure(command_keys.keys_dir(load()), "acme")
    logs = tmp_path_factory.mktemp("stack-logs")
    env = dict(os.environ)
    env.update({"GNOMON_API_TOKENS": f"{TOKEN}:acme,{OTHER_TOKEN}:other,{ADMIN_TOKEN}:ops:admin,{QUOTA_TOKEN}:quota", "GNOMON_API_PORT": str(API_PORT),
                "PYTHONUNBUFFERED": "1",
                **{f"GNOMON_{kind.upper()}_METRICS_PORT": str(port) for kind, port in METRICS_PORTS.items()},
                # PUT /v1/alerts accepts a test receiver on this host (tests/e2e/test_alerts.py)
                "GNOMON_ALERT_ALLOWED_CIDRS": "127.0.0.1/32", "GNOMON_ALERT_ALLOW_PLAIN_HTTP": "1",
                "GNOMON_ALERT_ALLOWED_PORTS": "1024-65535"})
    url = f"http://127.0.0.1:{API_PORT}"
    st = Stack(url, Client(url, TOKEN), {}, logs, env)
    st.start("processor", "processor", "--instance-id", "e2e-0")
    st.start("worker", "worker", "--worker-id", "e2e-w1", "--concurrency", "16", "--tenant", "acme",
             "--policy", str(Path(__file__).parent / "worker-policy.toml"))
    st.start("projector", "projector")
    st.start("api", "api", "--port", str(API_PORT))
    wait_healthy(st, url, "the API")
    yield st
    for name in list(st.procs):
        st.stop(name)
    print(f"\nstack logs in {logs}")


class Recorder(BaseHTTPRequestHandler):
    calls: list[dict[str, Any]] = []

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(length).decode()
        Recorder.calls.append({"path": self.path, "headers": dict(self.headers), "body": body})
        # /fail...: always 500; /flaky-<name>: 500 the first time, then 200
        flaky = self.path.startswith("/flaky") and sum(c["path"] == self.path for c in Recorder.calls) == 1
        status = 500 if self.path.startswith("/fail") or flaky else 200
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        self.wfile.write(b"recorded")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="session", autouse=True)
def no_jobs_left_behind() -> Iterator[None]:
    """Whatever jobs the session's tests (and the demo) leave active or paused are deleted
    when it ends (``delete_jobs_since``)."""
    from gnomon.config import load
    from gnomon.infra import manager
    from gnomon.topology import load_topology

    manager.up(load())
    start = end_offsets(load().kafka_bootstrap, load_topology().jobs)
    yield
    print(f"\ndeleted {delete_jobs_since(start)} job(s) the e2e tests left behind")


@pytest.fixture(scope="session")
def callback_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _never_due() -> str:
    """A yearly cron whose slot is half a year away: a job that must not run by schedule
    during a test (a fixed "0 0 1 1 *" fires in a test run at the turn of the year)."""
    d = datetime.now(UTC).date() + timedelta(days=182)
    return f"0 0 {d.day} {d.month} *"


NEVER_DUE = _never_due()


def job_runs(stack: Stack, job_id: str, limit: int = 200) -> list[dict[str, Any]]:
    """The job's runs, newest first; none while history has not seen the job yet (404)."""
    from gnomon.client import ApiError

    try:
        return list(stack.client.list_runs(job_id, limit=limit)["items"])
    except ApiError as exc:
        if exc.status == 404:
            return []
        raise


def job_or_none(client: Client, job_id: str) -> dict[str, Any] | None:
    """The job as ``client``'s tenant sees it, or None where the API answers 404."""
    from gnomon.client import ApiError

    try:
        job: dict[str, Any] = client.get_job(job_id)
    except ApiError as exc:
        if exc.status == 404:
            return None
        raise
    return job


def wait_for(predicate: Any, timeout_s: float, what: str, interval_s: float = 0.25) -> Any:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}; last={last!r}")


def wait_healthy(st: Stack, url: str, what: str, timeout_s: float = 60) -> None:
    """Until ``url``/healthz answers 200; a process of ``st`` that exits first fails the
    test with the tail of its log."""
    def up() -> bool:
        for name, proc in st.procs.items():
            if proc.poll() is not None:
                pytest.fail(f"{name} exited early:\n" + (st.logs / f"{name}.log").read_text()[-3000:])
        try:
            return httpx.get(url + "/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(up, timeout_s, what)


# ---- a stack of one's own, and the run ledger read back (tests that must not share) ----------


def own_stack(logs: Path, env: dict[str, str] | None = None) -> Stack:
    """A ``Stack`` with no process started yet and no API, for a test that starts its own
    processes with ids of its own (``stack.start(...)``) and so does not disturb, nor is
    disturbed by, the session stack or another session's on the same broker."""
    full = dict(os.environ)
    full.update({"PYTHONUNBUFFERED": "1", **(env or {})})
    return Stack("", Client("http://127.0.0.1:9", TOKEN), {}, logs, full)


@contextmanager
def own_services(logs: Path, token: str, tenant: str = "acme", *processor_args: str) -> Iterator[Stack]:
    """A processor, a projector and an API of the test's own (the API on a free port,
    ``token`` for ``tenant``, the client its), up until the context ends: for a test that
    kills and starts workers of its own beside them. Only while nothing else runs a
    processor (the session stack's would share the partitions)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    st = own_stack(logs, {"GNOMON_API_TOKENS": f"{token}:{tenant}", "GNOMON_API_PORT": str(port)})
    st.api_url, st.client = f"http://127.0.0.1:{port}", Client(f"http://127.0.0.1:{port}", token)
    try:
        st.start("processor", "processor", "--instance-id", f"own-{secrets.token_hex(3)}", *processor_args)
        st.start("projector", "projector")
        st.start("api", "api", "--port", str(port))
        wait_healthy(st, st.api_url, "the API")
        yield st
    finally:
        for name in list(st.procs):
            st.stop(name)
        print(f"\nlogs in {logs}")


def delete_jobs_since(start: list[Any], timeout_s: float = 60) -> int:
    """Delete every job whose state was written from ``start`` (offsets of gnomon.jobs) on
    and is not deleted or done: the jobs the session's tests (and the demo) left behind.
    Left active on the shared stack, their runs would pile up for workers that are gone and
    load the processors of whatever runs next (the chaos suite). Returns how many."""
    from confluent_kafka import Producer

    from gnomon import codec
    from gnomon.adapters.kafka import producer_config
    from gnomon.codec import DecodeError
    from gnomon.config import load
    from gnomon.core.jobs import DeleteJob, JobState, JobStatus
    from gnomon.topology import load_topology

    bootstrap, topo = load().kafka_bootstrap, load_topology()
    last: dict[str, JobState] = {}
    for msg in read_messages(bootstrap, start, timeout_s, group="e2e-leftovers"):
        if msg.value() is None:  # a deleted job's tombstone
            last.pop((msg.key() or b"").decode(), None)
            continue
        try:
            state = codec.decode(msg.value())
        except DecodeError:
            continue
        if isinstance(state, JobState):
            last[state.job_id] = state
    left = [j for j in last.values() if j.status in (JobStatus.ACTIVE, JobStatus.PAUSED)]
    for j in left:
        print(f"left behind: {j.job_id} ({j.tenant}, {j.status.value}, {j.spec.name})")
    producer = Producer(producer_config(bootstrap))
    now = int(time.time() * 1000)
    for j in left:
        key, value = j.job_id.encode(), codec.encode(DeleteJob(j.job_id, j.tenant, now))
        producer.produce(topo.job_commands, key=key, value=value, headers=operator_headers(topo.job_commands, key, value))
    producer.flush(30)
    return len(left)


class LedgerWatch:
    """Reads the run ledger (gnomon.runs) from its end at creation, in a thread, and keeps
    the latest ``RunState`` of every run whose job id starts with ``prefix``. Committed
    records only (read_committed), as history sees them."""

    def __init__(self, prefix: str) -> None:
        from confluent_kafka import Consumer

        from gnomon.adapters.kafka import consumer_config
        from gnomon.config import load
        from gnomon.topology import load_topology

        bootstrap = load().kafka_bootstrap
        self.prefix = prefix
        self.runs: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._consumer = Consumer(consumer_config(bootstrap, "e2e-ledger-watch"))
        self._consumer.assign(end_offsets(bootstrap, load_topology().runs))
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        from gnomon import codec
        from gnomon.codec import DecodeError

        key_prefix = self.prefix.encode()
        while not self._stop.is_set():
            for msg in self._consumer.consume(1000, 0.2):
                if msg.error() or msg.value() is None or not (msg.key() or b"").startswith(key_prefix):
                    continue
                try:
                    run = codec.decode(msg.value())
                except DecodeError:
                    continue
                with self._lock:
                    self.runs[run.run_id] = run
        self._consumer.close()

    def snapshot(self) -> list[Any]:
        with self._lock:
            return list(self.runs.values())

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
