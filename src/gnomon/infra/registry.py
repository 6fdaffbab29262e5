"""The schema registry (gnomon.registry, docs/adr/0009) as a component of the local stack.

A Python process, not a JVM: ``python -m gnomon.registry`` with the interpreter and the
gnomon package that run ``gnomon infra up``, detached like the JVMs (``gnomon.infra.procs``;
pid ``run/registry.pid``, log ``logs/registry.out``). It listens on 127.0.0.1 port
``Settings.registry_port`` (``$GNOMON_REGISTRY_PORT``, 8081; the port it was started on is
kept in ``run/registry.port`` for ``status``) and reads and writes its store topic as the
Kafka role ``registry``. ``up`` starts it after Kafka; nothing else waits for it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import gnomon
from gnomon import credentials
from gnomon.config import Settings
from gnomon.credentials import Credential
from gnomon.infra import kafka, procs
from gnomon.infra.errors import InfraError
from gnomon.infra.net import port_open
from gnomon.infra.readiness import wait_until_serving

LABEL = "schema registry"
NAME = "registry"
HOST = "127.0.0.1"
ROLE = "registry"  # the Kafka principal User:registry (gnomon.infra.acls)
STOP_TIMEOUT_S = 15.0


def _port_file(settings: Settings) -> Path:
    return settings.state_dir / "run" / f"{NAME}.port"


def running_port(settings: Settings) -> int:
    """The port the running registry was started on, else ``Settings.registry_port``."""
    try:
        return int(_port_file(settings).read_text().strip())
    except (FileNotFoundError, ValueError):
        return settings.registry_port


def url(settings: Settings, port: int | None = None) -> str:
    return f"http://{HOST}:{running_port(settings) if port is None else port}"


def command(port: int) -> list[str]:
    return [sys.executable, "-m", "gnomon.registry", procs.marker(NAME), "--port", str(port), "--host", HOST]


def environment(settings: Settings, port: int) -> dict[str, str]:
    """The registry's environment: this process's, with this very gnomon package first on
    the path and the settings that locate the stack."""
    package_root = str(Path(gnomon.__file__).resolve().parent.parent)
    path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH", "")) if p)
    return {
        **os.environ,
        "PYTHONPATH": path,
        "PYTHONUNBUFFERED": "1",
        "GNOMON_STATE_DIR": str(settings.state_dir),
        "GNOMON_CREDENTIALS_DIR": str(settings.credentials_dir),
        "GNOMON_TOPOLOGY": str(settings.topology_path),
        "GNOMON_REGISTRY_PORT": str(port),
        "GNOMON_KAFKA_BOOTSTRAP": kafka.bootstrap(settings, kafka.running_layout(settings) or 1),
        "GNOMON_KAFKA_ROLE": ROLE,
    }


def start(settings: Settings, port: int | None = None) -> int:
    """Start the registry unless it runs; returns its pid."""
    pid = procs.running_pid(settings.state_dir, NAME)
    if pid is not None:
        return pid
    port = settings.registry_port if port is None else port
    first = kafka.bootstrap(settings, kafka.running_layout(settings) or 1).split(",")[0]
    host, _, kport = first.rpartition(":")
    if not port_open(host, int(kport)):
        raise InfraError(f"the schema registry needs Kafka, but nothing listens on {first}; "
                         "run `python -m gnomon.infra up` first")
    if port_open(HOST, port):
        raise InfraError(f"{HOST}:{port} is already in use by another process; stop it or choose another "
                         "port (GNOMON_REGISTRY_PORT)")
    _port_file(settings).parent.mkdir(parents=True, exist_ok=True)
    _port_file(settings).write_text(f"{port}\n")
    return procs.start(settings.state_dir, NAME, command(port), cwd=settings.state_dir,
                       env=environment(settings, port))


def reader(settings: Settings) -> Credential:
    """The registry's read-only user (``registry.auth``), made if missing."""
    return credentials.ensure(settings.credentials_dir, credentials.REGISTRY_READER)


def admin(settings: Settings) -> Credential:
    """The registry's admin user: it may register schemas and set compatibility levels."""
    return credentials.ensure(settings.credentials_dir, credentials.REGISTRY_ADMIN)


def _get_subjects(base: str, settings: Settings) -> Any:
    """``GET /subjects`` as the read-only user (the httpx response)."""
    import httpx

    cred = reader(settings)
    return httpx.get(f"{base}/subjects", timeout=2.0, auth=(cred.username, cred.password))


def _probe(base: str, settings: Settings) -> str | None:
    response = _get_subjects(base, settings)
    if response.status_code != 200:
        return f"GET /subjects answered {response.status_code}"
    return None


def wait_ready(settings: Settings, timeout_s: float = 60.0) -> float:
    """Block until ``GET /subjects`` answers 200 (the store is read and the checked-in
    schemas imported); fails at once, with its log, if the process exits."""
    base = url(settings)
    return wait_until_serving(
        state_dir=settings.state_dir,
        processes=[(NAME, "the schema registry")],
        ports=[running_port(settings)],
        probe=lambda: _probe(base, settings),
        waiting_for=f"the schema registry on {base}",
        not_ready=f"the schema registry did not serve on {base}",
        excerpt=lambda _name: procs.log_excerpt(procs.out_file(settings.state_dir, NAME)),
        timeout_s=timeout_s,
    )


def stop(settings: Settings, timeout_s: float = STOP_TIMEOUT_S) -> bool:
    return procs.stop(settings.state_dir, NAME, timeout_s)


def running_names(settings: Settings) -> list[str]:
    return [NAME] if procs.is_running(settings.state_dir, NAME) else []


def status(settings: Settings) -> dict[str, Any]:
    pid = procs.running_pid(settings.state_dir, NAME)
    if pid is None:
        return {"state": "down"}
    base = url(settings)
    info: dict[str, Any] = {"pid": pid, "url": base}
    try:
        response = _get_subjects(base, settings)
        response.raise_for_status()
        info["subjects"] = len(response.json())
        info["state"] = "up"
    except Exception:  # not serving yet (reading its store) or wedged
        info["state"] = "starting"
    return info
