"""Apache Cassandra 5.0, one node on 127.0.0.1, from Maven Central jars on Java 17 (or 11).

Files: ``<state_dir>/cassandra/`` holds ``cassandra.yaml`` (rendered from
``infra/cassandra/cassandra.yaml.template``) and ``data/`` (data, commitlog, hints, caches);
the full log is ``<state_dir>/logs/cassandra/system.log``. JVM options come from
``infra/cassandra/jvm17.options`` plus heap (1 GiB), the jamm agent and config paths.
"""

from __future__ import annotations

import logging
from pathlib import Path
from string import Template
from typing import Any

from gnomon.config import Settings
from gnomon.infra import fetch, jvm, procs
from gnomon.infra.errors import InfraError
from gnomon.infra.net import port_open
from gnomon.infra.readiness import wait_until_serving

COMPONENT = "cassandra"
LABEL = "Cassandra"
NAME = "cassandra"
JAVA_VERSIONS = (17, 11)
HEAP = ("-Xms1G", "-Xmx1G")
CONF_DIR = fetch.INFRA_DIR / "cassandra"
HOST = "127.0.0.1"

# Faster single-node start for development (see Cassandra's CassandraRelevantProperties).
DEV_PROPERTIES = (
    "-Dcassandra.skip_wait_for_gossip_to_settle=0",
    "-Dcassandra.ring_delay_ms=1000",  # single seed node: nobody to wait for
    "-Dcassandra.unsafesystem=true",  # no fsync of system tables: dev data only
)

for _name in ("cassandra", "cassandra.cluster", "cassandra.connection", "cassandra.pool"):
    logging.getLogger(_name).addHandler(logging.NullHandler())
    logging.getLogger(_name).propagate = False


def home(settings: Settings) -> Path:
    return settings.state_dir / "cassandra"


def log_dir(settings: Settings) -> Path:
    return settings.state_dir / "logs" / "cassandra"


def address(settings: Settings) -> str:
    return f"{HOST}:{settings.cassandra_port}"


def render_config(settings: Settings) -> str:
    data = home(settings) / "data"
    template = Template((CONF_DIR / "cassandra.yaml.template").read_text())
    return template.substitute(
        storage_port=settings.cassandra_storage_port,
        native_port=settings.cassandra_port,
        data_dir=data / "data",
        commitlog_dir=data / "commitlog",
        saved_caches_dir=data / "saved_caches",
        hints_dir=data / "hints",
        cdc_raw_dir=data / "cdc_raw",
    )


def jvm_options() -> list[str]:
    lines = (CONF_DIR / "jvm17.options").read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith("#")]


def command(settings: Settings, java: str, lib: Path) -> list[str]:
    config = home(settings) / "cassandra.yaml"
    return [
        java,
        *HEAP,
        *jvm_options(),
        f"-javaagent:{jvm.find_jar(lib, 'jamm-')}",
        procs.marker(NAME),
        "-Dcassandra-foreground=yes",
        f"-Dcassandra.config=file://{config}",
        f"-Dcassandra.logdir={log_dir(settings)}",
        f"-Dcassandra.storagedir={home(settings) / 'data'}",
        f"-Dlogback.configurationFile={CONF_DIR / 'logback.xml'}",
        *DEV_PROPERTIES,
        "-cp",
        jvm.classpath(lib),
        "org.apache.cassandra.service.CassandraDaemon",
    ]


def start(settings: Settings) -> int:
    """Fetch, render the config and start the node unless it runs. Returns the pid."""
    pid = procs.running_pid(settings.state_dir, NAME)
    if pid is not None:
        return pid
    java = jvm.find_java(JAVA_VERSIONS, LABEL)
    lib = fetch.fetch(settings.state_dir, COMPONENT, LABEL)
    for port in (settings.cassandra_port, settings.cassandra_storage_port):
        if port_open(HOST, port):
            raise InfraError(
                f"{HOST}:{port} is already in use by another process; stop it or choose other "
                f"ports (GNOMON_CASSANDRA_PORT, GNOMON_CASSANDRA_STORAGE_PORT)"
            )
    home(settings).mkdir(parents=True, exist_ok=True)
    log_dir(settings).mkdir(parents=True, exist_ok=True)
    (home(settings) / "cassandra.yaml").write_text(render_config(settings))
    return procs.start(settings.state_dir, NAME, command(settings, java, lib), cwd=home(settings))


def release_version(settings: Settings) -> str:
    """``SELECT release_version FROM system.local`` over CQL (raises if it cannot)."""
    from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
    from cassandra.policies import WhiteListRoundRobinPolicy

    profile = ExecutionProfile(
        load_balancing_policy=WhiteListRoundRobinPolicy([HOST]), request_timeout=5
    )
    cluster = Cluster(
        [HOST],
        port=settings.cassandra_port,
        execution_profiles={EXEC_PROFILE_DEFAULT: profile},
        connect_timeout=5,
        control_connection_timeout=5,
    )
    try:
        row = cluster.connect().execute("SELECT release_version FROM system.local").one()
        return str(row.release_version)
    finally:
        cluster.shutdown()


def wait_ready(settings: Settings, timeout_s: float = 180.0) -> float:
    """Block until CQL answers ``SELECT release_version FROM system.local``; seconds waited."""

    def probe() -> str | None:
        release_version(settings)  # NoHostAvailable, OperationTimedOut while starting
        return None

    return wait_until_serving(
        state_dir=settings.state_dir,
        processes=[(NAME, "Cassandra")],
        ports=[settings.cassandra_port],
        probe=probe,
        waiting_for=f"Cassandra on {address(settings)}",
        not_ready=f"Cassandra did not answer CQL on {address(settings)}",
        excerpt=lambda _name: _excerpt(settings),
        timeout_s=timeout_s,
        interval_s=1.0,
        last="native port closed",
    )


def _excerpt(settings: Settings) -> str:
    return procs.log_excerpt(
        procs.out_file(settings.state_dir, NAME), log_dir(settings) / "system.log"
    )


def running_names(settings: Settings) -> list[str]:
    return [NAME] if procs.is_running(settings.state_dir, NAME) else []


def status(settings: Settings) -> dict[str, Any]:
    pid = procs.running_pid(settings.state_dir, NAME)
    if pid is None:
        return {"state": "down"}
    serving = port_open(HOST, settings.cassandra_port)
    jars = sorted(fetch.lib_dir(settings.state_dir, COMPONENT).glob("cassandra-all-*.jar"))
    return {
        "state": "up" if serving else "starting",
        "pid": pid,
        "address": address(settings),
        "version": jars[-1].name.removeprefix("cassandra-all-").removesuffix(".jar")
        if jars
        else None,
    }
