"""gnomon as a package people install (issue 10): a wheel built from this tree installs
into clean venvs outside the clone, and works there.

* ``gnomon[worker]``: no FastAPI and no Cassandra driver; the codec reads the schemas
  packaged in the wheel; ``gnomon worker --app usermod:worker`` runs a plain and an
  ``async def`` handler of a module written outside the clone, for jobs registered on
  the running stack (a processor, a projector and an API of this test, from the
  project's venv, stage the runs on it and serve their history), and the installed
  ``gnomon runs get`` shows each handler's return value as the run's output.
* ``gnomon[server]``: ``gnomon processor --help`` and ``import gnomon.api.app`` work.

The venvs install the wheel's dependencies from the package index (pip's cache makes a
second run quick); the wheel is built once per session, from a copy of the sources that
go into it (so the clone gets no ``build/`` directory).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Producer

from gnomon import codec
from gnomon.adapters.kafka import producer_config
from gnomon.command_keys import operator_headers
from gnomon.config import REPO_ROOT, Settings
from gnomon.core.jobs import DeleteJob, RegisterJob
from gnomon.core.model import JobSpec, RetryPolicy, Schedule, Target, TargetType
from gnomon.topology import load_topology

pytestmark = pytest.mark.integration

PIP_TIMEOUT_S = 300
RUN_TIMEOUT_S = 90
API_PORT = int(os.environ.get("GNOMON_TEST_WHEEL_API_PORT", "18797"))
# What goes into the wheel: the package (whose _data/ symlinks point into schemas/ and
# streams/) and the project's metadata.
SOURCES = ("pyproject.toml", "README.md", "src", "schemas", "streams")


def _clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without anything that points Python at the clone or at
    the project's venv."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP", "PYTHONSAFEPATH")}
    venv_bin = str(Path(sys.prefix) / "bin")
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != venv_bin)
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def _run(argv: list[str], cwd: Path, timeout_s: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, cwd=cwd, env=_clean_env(**env), capture_output=True, text=True, timeout=timeout_s)
    assert done.returncode == 0, f"{' '.join(argv)} exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel of this tree, built once per session."""
    root = tmp_path_factory.mktemp("wheel-build")
    src = root / "gnomon"
    src.mkdir()
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build", "dist")
    for name in SOURCES:
        if (REPO_ROOT / name).is_dir():
            shutil.copytree(REPO_ROOT / name, src / name, symlinks=True, ignore=skip)
        else:
            shutil.copy2(REPO_ROOT / name, src / name)
    out = root / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(src)], root,
         timeout_s=PIP_TIMEOUT_S)
    (built,) = out.glob("gnomon-*.whl")
    return built


def _venv(where: Path, requirement: str) -> Path:
    """A new venv at ``where`` with ``requirement`` installed; its bin directory."""
    _run([sys.executable, "-m", "venv", str(where)], where.parent)
    _run([str(where / "bin" / "python"), "-m", "pip", "install", "-q", requirement], where.parent,
         timeout_s=PIP_TIMEOUT_S)
    return where / "bin"


@dataclass
class Install:
    """A venv being created and installed into in the background."""

    venv: Path
    proc: subprocess.Popen[str]

    def wait(self) -> Path:
        """Its bin directory, once the install succeeded."""
        output, _ = self.proc.communicate(timeout=PIP_TIMEOUT_S)
        assert self.proc.returncode == 0, f"installing into {self.venv} failed:\n{output[-3000:]}"
        return self.venv / "bin"


@pytest.fixture(scope="module")
def server_install(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Install]:
    """``gnomon[server]`` into a clean venv, started at once and left to install in the
    background (the worker test runs meanwhile: the two installs take most of the time)."""
    venv = tmp_path_factory.mktemp("server-venv") / "venv"
    script = f"{sys.executable} -m venv {venv} && {venv}/bin/python -m pip install -q '{wheel}[server]'"
    proc = subprocess.Popen(["bash", "-c", script], cwd=venv.parent, env=_clean_env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    yield Install(venv, proc)
    if proc.poll() is None:
        proc.kill()
        proc.wait()


USER_MODULE = '''\
"""A pool owner's handlers, in a module of their own outside gnomon's clone."""
from pathlib import Path

from gnomon.worker import Worker

OUT = Path({out!r})
worker = Worker(pool="default", tenants=[{tenant!r}])


@worker.handler("touch")
def touch(ctx):
    ctx.log("stdout", f"touching for {{ctx.run_id}}")
    (OUT / "touch.json").write_text(__import__("json").dumps(
        {{"run_id": ctx.run_id, "tenant": ctx.tenant, "payload": ctx.payload}}))
    return {{"rows": 3, "by": "sync", "attempt": ctx.attempt}}


@worker.handler("later")
async def later(ctx):
    import asyncio
    await asyncio.sleep(0.05)
    (OUT / "later.json").write_text(__import__("json").dumps(
        {{"run_id": ctx.run_id, "slot": ctx.slot.isoformat(), "deadline": ctx.deadline is not None}}))
    return ["async", ctx.payload["from"]]
'''

CODEC_CHECK = '''\
import json, sys
import gnomon, gnomon.codec as codec
from gnomon.codec.registry import default_schema_dir
from gnomon.core.jobs import RegisterJob
from gnomon.core.model import JobSpec, Schedule, Target, TargetType
cmd = RegisterJob("wheel-job", "acme", JobSpec(name="n", schedule=Schedule(cron="*/5 * * * *"),
                  target=Target(TargetType.HANDLER, handler="h")), 1)
assert codec.decode(codec.encode(cmd)) == cmd
print(json.dumps({"gnomon": gnomon.__file__, "schemas": str(default_schema_dir()),
                  "servers": sorted(m for m in sys.modules
                                    if m.split(".")[0] in ("fastapi", "cassandra", "rocksdict", "uvicorn"))}))
'''


def _send(settings: Settings, *commands: RegisterJob | DeleteJob) -> None:
    producer = Producer(producer_config(settings.kafka_bootstrap))
    for cmd in commands:
        topic, key, value = load_topology().job_commands, cmd.job_id.encode(), codec.encode(cmd)
        producer.produce(topic, key=key, value=value, headers=operator_headers(topic, key, value, settings))
    assert producer.flush(30) == 0, "job commands not delivered"


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_worker_extra_installs_and_runs_a_handler(
    infra: Settings, wheel: Path, server_install: Install, tmp_path: Path
) -> None:
    bin_ = _venv(tmp_path / "venv", f"{wheel}[worker]")
    py = str(bin_ / "python")

    # No server dependency came with it, and gnomon is the installed copy, not the clone.
    missing = subprocess.run([py, "-c", "import fastapi"], cwd=tmp_path, env=_clean_env(),
                             capture_output=True, text=True)
    assert missing.returncode != 0 and "No module named 'fastapi'" in missing.stderr
    for module in ("cassandra", "rocksdict", "uvicorn", "faust", "aiokafka"):
        assert subprocess.run([py, "-c", f"import {module}"], cwd=tmp_path, env=_clean_env(),
                              capture_output=True).returncode != 0, f"{module} installed by gnomon[worker]"
    _run([py, "-c", "import gnomon.worker, gnomon.client, gnomon.tenants_client, gnomon.cli.main"], tmp_path)
    checked = json.loads(_run([py, "-c", CODEC_CHECK], tmp_path).stdout)
    site = str(tmp_path / "venv")
    assert checked["gnomon"].startswith(site) and checked["schemas"].startswith(site), checked
    assert checked["servers"] == [], checked
    assert "--app" in _run([str(bin_ / "gnomon"), "worker", "--help"], tmp_path, COLUMNS="200").stdout
    # The processor needs the server extra: refused at once (a port where no broker is,
    # should it start all the same).
    refused = subprocess.run([str(bin_ / "gnomon"), "processor"], cwd=tmp_path,
                             env=_clean_env(GNOMON_KAFKA_BOOTSTRAP="127.0.0.1:9", GNOMON_STATE_DIR=str(tmp_path / "s")),
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "gnomon[server]" in refused.stderr, refused.stderr

    # A handler module outside the clone, served by the installed `gnomon worker`.
    tag = "wheel" + secrets.token_hex(3)  # a tenant of this test alone
    app_dir, out = tmp_path / "app", tmp_path / "out"
    app_dir.mkdir()
    out.mkdir()
    (app_dir / "usermod.py").write_text(USER_MODULE.format(out=str(out), tenant=tag))
    logs = infra.state_dir / "test-logs" / tag
    logs.mkdir(parents=True, exist_ok=True)
    state = {"GNOMON_STATE_DIR": str(infra.state_dir)}  # its credentials/ hold the Kafka roles'
    procs: dict[str, subprocess.Popen[bytes]] = {}
    jobs = {"touch": f"{tag}-sync", "later": f"{tag}-async"}
    token = f"{tag}-token"
    api_url = f"http://127.0.0.1:{API_PORT}"
    try:
        for name, args, role in (("processor", ["processor", "--instance-id", f"{tag}-p"], "processor"),
                                 ("projector", ["projector"], "projector"),
                                 ("api", ["api", "--port", str(API_PORT)], "api")):
            with open(logs / f"{name}.log", "ab") as out_log:
                procs[name] = subprocess.Popen(
                    [sys.executable, "-m", "gnomon.cli.main", *args], cwd=REPO_ROOT,
                    env={**os.environ, "PYTHONUNBUFFERED": "1", "GNOMON_KAFKA_ROLE": role,
                         "GNOMON_API_TOKENS": f"{token}:{tag}"},
                    stdout=out_log, stderr=subprocess.STDOUT, start_new_session=True)
        with open(logs / "worker.log", "ab") as wlog:
            procs["worker"] = subprocess.Popen(
                [str(bin_ / "gnomon"), "worker", "--app", "usermod:worker", "--worker-id", f"{tag}-w",
                 "--concurrency", "2"],
                cwd=tmp_path, env=_clean_env(PYTHONPATH=str(app_dir), GNOMON_KAFKA_ROLE="worker", **state),
                stdout=wlog, stderr=subprocess.STDOUT, start_new_session=True)
        now_ms = int(time.time() * 1000)
        _send(infra, *(RegisterJob(job_id, tag, JobSpec(
            name=f"wheel {handler}", schedule=Schedule(run_at_ms=now_ms + 3000),
            target=Target(TargetType.HANDLER, handler=handler), payload_json=json.dumps({"from": "wheel"}),
            timeout_s=60, retry=RetryPolicy(max_attempts=3)), now_ms) for handler, job_id in jobs.items()))
        cli_env = {"GNOMON_API_URL": api_url, "GNOMON_TOKEN": token, **state}

        def alive() -> None:
            for name, p in procs.items():
                if p.poll() is not None:
                    pytest.fail(f"{name} exited {p.returncode}:\n{(logs / f'{name}.log').read_text()[-3000:]}")

        def run_as_shown(run_id: str) -> dict[str, object] | None:
            """The run as the installed CLI shows it, once it has succeeded (None before)."""
            shown = subprocess.run([str(bin_ / "gnomon"), "runs", "get", run_id, "--json"], cwd=tmp_path,
                                   env=_clean_env(**cli_env), capture_output=True, text=True, timeout=60)
            if shown.returncode != 0:
                return None  # not in history yet (404), or the API still starting
            run: dict[str, object] = json.loads(shown.stdout)
            return run if run.get("status") == "succeeded" else None

        deadline = time.monotonic() + RUN_TIMEOUT_S
        ran: dict[str, dict[str, object]] = {}
        shown: dict[str, dict[str, object]] = {}
        while len(shown) < len(jobs):
            alive()
            for handler in jobs:
                if handler not in ran and (out / f"{handler}.json").exists():
                    ran[handler] = json.loads((out / f"{handler}.json").read_text())
                if handler in ran and handler not in shown and (run := run_as_shown(str(ran[handler]["run_id"]))):
                    shown[handler] = run
            if time.monotonic() > deadline:
                pytest.fail(f"ran {sorted(ran)}, shown {sorted(shown)} after {RUN_TIMEOUT_S} s; worker log:\n"
                            f"{(logs / 'worker.log').read_text()[-3000:]}")
            time.sleep(0.5)
        touch, later = ran["touch"], ran["later"]
        assert str(touch["run_id"]).startswith(jobs["touch"]) and touch["tenant"] == tag
        assert touch["payload"] == {"from": "wheel"}
        assert str(later["run_id"]).startswith(jobs["later"]) and later["deadline"] is True
        # the handlers' return values, recorded as the runs' output and read back through the API
        assert shown["touch"]["output"] == {"rows": 3, "by": "sync", "attempt": 1}, shown["touch"]
        assert shown["later"]["output"] == ["async", "wheel"], shown["later"]
        plain = _run([str(bin_ / "gnomon"), "runs", "get", str(later["run_id"])], tmp_path, **cli_env).stdout
        assert 'output: ["async", "wheel"]' in plain, plain
    finally:
        for p in reversed(list(procs.values())):
            _stop(p)
        _send(infra, *(DeleteJob(job_id, tag, int(time.time() * 1000)) for job_id in jobs.values()))
    assert "Traceback" not in (logs / "worker.log").read_text()


def test_server_extra_installs_processor_and_api(server_install: Install, tmp_path: Path) -> None:
    bin_ = server_install.wait()
    assert "--instance-id" in _run([str(bin_ / "gnomon"), "processor", "--help"], tmp_path, COLUMNS="200").stdout
    _run([str(bin_ / "python"), "-c", textwrap.dedent(f"""\
        import gnomon.api.app, gnomon.processor.runtime, gnomon.history.projector
        from gnomon.history.migrate import DEFAULT_CQL_DIR, load_migrations
        assert str(DEFAULT_CQL_DIR).startswith({str(server_install.venv)!r}), DEFAULT_CQL_DIR
        assert load_migrations()
        """)], tmp_path)
    no_test_deps = subprocess.run([str(bin_ / "python"), "-c", "import faust"], cwd=tmp_path, env=_clean_env(),
                                  capture_output=True)
    assert no_test_deps.returncode != 0, "faust-streaming installed by gnomon[server]"
