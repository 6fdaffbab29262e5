"""Apache Kafka in KRaft mode (combined broker+controller), one or three nodes on 127.0.0.1.

Ports: node ``i`` (1-based) listens on ``kafka_port + 10*(i-1)`` (clients) and
``kafka_controller_port + 10*(i-1)`` (controller quorum); with the defaults that is
9092/9093, 9102/9103, 9112/9113. Node 1 is always on ``kafka_port``, so
``Settings.kafka_bootstrap`` reaches either layout.

Files: ``<state_dir>/kafka/<n>-node/`` holds the cluster id and one ``node-<i>/`` per node
(``server.properties`` rendered from ``infra/kafka/server.properties.template`` and the
``data/`` log dir). The single-node and three-node layouts keep separate data, so switching
between them (after ``down``) loses nothing.
"""

from __future__ import annotations

import logging
import subprocess
from dataclasses import dataclass
from pathlib import Path
from string import Template
from typing import Any

from gnomon.config import Settings
from gnomon.infra import fetch, jvm, procs
from gnomon.infra.errors import InfraError
from gnomon.infra.net import port_open
from gnomon.infra.readiness import wait_until_serving

COMPONENT = "kafka"
LABEL = "Kafka"
JAVA_VERSIONS = (17, 21, 11)
HEAP = ("-Xms256m", "-Xmx512m")
GC = ("-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-XX:+ExitOnOutOfMemoryError")
PORT_STEP = 10
CONF_DIR = fetch.INFRA_DIR / "kafka"

_quiet = logging.getLogger("gnomon.infra.librdkafka")
_quiet.addHandler(logging.NullHandler())
_quiet.propagate = False


@dataclass(frozen=True)
class KafkaNode:
    node_id: int
    port: int
    controller_port: int
    home: Path
    logs: Path

    @property
    def name(self) -> str:
        return f"kafka-{self.node_id}"

    @property
    def config(self) -> Path:
        return self.home / "server.properties"

    @property
    def data(self) -> Path:
        return self.home / "data"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


def layout_dir(settings: Settings, count: int) -> Path:
    return settings.state_dir / "kafka" / f"{count}-node"


def nodes(settings: Settings, count: int) -> list[KafkaNode]:
    if count not in (1, 3):
        raise InfraError(f"kafka_nodes must be 1 or 3, not {count}")
    home = layout_dir(settings, count)
    return [
        KafkaNode(
            node_id=i,
            port=settings.kafka_port + PORT_STEP * (i - 1),
            controller_port=settings.kafka_controller_port + PORT_STEP * (i - 1),
            home=home / f"node-{i}",
            logs=settings.state_dir / "logs" / f"kafka-{i}",
        )
        for i in range(1, count + 1)
    ]


def bootstrap(settings: Settings, count: int) -> str:
    """Bootstrap servers for clients: every node of the layout."""
    if count == 1:
        return settings.kafka_bootstrap
    return ",".join(n.address for n in nodes(settings, count))


def replication(count: int) -> tuple[int, int]:
    """(replication factor, min.insync.replicas) for a cluster of ``count`` nodes."""
    return (3, 2) if count >= 3 else (count, 1)


# --- layout bookkeeping -------------------------------------------------------------


def _layout_file(settings: Settings) -> Path:
    return settings.state_dir / "run" / "kafka.nodes"


def running_layout(settings: Settings) -> int | None:
    """Node count of the Kafka that runs now (None if no node runs)."""
    running = [
        n.node_id for n in nodes(settings, 3) if procs.is_running(settings.state_dir, n.name)
    ]
    if not running:
        _layout_file(settings).unlink(missing_ok=True)
        return None
    try:
        return int(_layout_file(settings).read_text().strip())
    except (FileNotFoundError, ValueError):
        return 3 if max(running) > 1 else 1


# --- preparing ----------------------------------------------------------------------


def _java_cmd(java: str, lib: Path, node: KafkaNode, *opts: str) -> list[str]:
    return [
        java,
        *opts,
        "-Djava.awt.headless=true",
        f"-Dkafka.logs.dir={node.logs}",
        f"-Dlog4j.configuration=file:{CONF_DIR / 'log4j.properties'}",
        "-cp",
        jvm.classpath(lib),
    ]


def _cluster_id(settings: Settings, count: int, java: str, lib: Path) -> str:
    path = layout_dir(settings, count) / "cluster.id"
    if path.exists():
        return path.read_text().strip()
    node = nodes(settings, count)[0]
    cmd = [*_java_cmd(java, lib, node), "kafka.tools.StorageTool", "random-uuid"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise InfraError(f"kafka StorageTool random-uuid failed:\n{proc.stdout}{proc.stderr}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(lines[-1].strip() + "\n")
    return lines[-1].strip()


def render_config(settings: Settings, count: int, node: KafkaNode) -> str:
    rf, min_isr = replication(count)
    voters = ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in nodes(settings, count))
    template = Template((CONF_DIR / "server.properties.template").read_text())
    return template.substitute(
        node_id=node.node_id,
        quorum_voters=voters,
        port=node.port,
        controller_port=node.controller_port,
        log_dirs=node.data,
        replication_factor=rf,
        min_insync_replicas=min_isr,
    )


def prepare(settings: Settings, count: int) -> tuple[str, Path]:
    """Fetch jars, render configs, format storage (once). Returns (java, lib dir)."""
    java = jvm.find_java(JAVA_VERSIONS, LABEL)
    lib = fetch.fetch(settings.state_dir, COMPONENT, LABEL)
    cluster_id = _cluster_id(settings, count, java, lib)
    for node in nodes(settings, count):
        node.home.mkdir(parents=True, exist_ok=True)
        node.logs.mkdir(parents=True, exist_ok=True)
        node.config.write_text(render_config(settings, count, node))
        if (node.data / "meta.properties").exists():
            continue
        cmd = [
            *_java_cmd(java, lib, node),
            "kafka.tools.StorageTool",
            "format",
            "-t",
            cluster_id,
            "-c",
            str(node.config),
            "--ignore-formatted",
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise InfraError(
                f"formatting Kafka storage for node {node.node_id} failed:\n"
                f"{proc.stdout}{proc.stderr}".strip()
            )
    return java, lib


# --- running ------------------------------------------------------------------------


def start(settings: Settings, count: int) -> list[int]:
    """Start every node that is not running yet (detached). Returns the pids."""
    current = running_layout(settings)
    if current is not None and current != count:
        raise InfraError(
            f"Kafka is running with {current} node(s); run `python -m gnomon.infra down` "
            f"before starting {count}"
        )
    java, lib = prepare(settings, count)
    pids = []
    for node in nodes(settings, count):
        if not procs.is_running(settings.state_dir, node.name):
            for port in (node.port, node.controller_port):
                if port_open("127.0.0.1", port):
                    raise InfraError(
                        f"127.0.0.1:{port} is already in use by another process; stop it or "
                        f"choose other ports (GNOMON_KAFKA_PORT, GNOMON_KAFKA_CONTROLLER_PORT)"
                    )
        argv = [
            *_java_cmd(java, lib, node, *HEAP, *GC, procs.marker(node.name)),
            "kafka.Kafka",
            str(node.config),
        ]
        pids.append(procs.start(settings.state_dir, node.name, argv, cwd=node.home))
    _layout_file(settings).write_text(f"{count}\n")
    return pids


def admin(bootstrap_servers: str, **extra: Any) -> Any:
    """A confluent_kafka AdminClient whose librdkafka chatter is silenced."""
    from confluent_kafka.admin import AdminClient

    config: dict[str, Any] = {"bootstrap.servers": bootstrap_servers, "logger": _quiet, **extra}
    return AdminClient(config)


def _brokers_seen(nodes_: list[KafkaNode]) -> int:
    """The fewest brokers any node reports (each asked through its own fresh client)."""
    return min(len(admin(n.address).list_topics(timeout=5).brokers) for n in nodes_)


def wait_ready(settings: Settings, count: int, timeout_s: float = 120.0) -> float:
    """Block until all ``count`` brokers serve metadata; returns seconds waited."""
    ns = nodes(settings, count)
    servers = ",".join(n.address for n in ns)
    by_name = {n.name: n for n in ns}

    def probe() -> str | None:
        seen = _brokers_seen(ns)
        return None if seen >= count else f"a node sees {seen}/{count} brokers"

    return wait_until_serving(
        state_dir=settings.state_dir,
        processes=[(n.name, f"Kafka node {n.node_id}") for n in ns],
        ports=[n.port for n in ns],
        probe=probe,
        waiting_for=f"Kafka on {servers}",
        not_ready=f"Kafka did not serve on {servers}",
        excerpt=lambda name: _excerpt(settings, by_name[name]),
        timeout_s=timeout_s,
    )


def _excerpt(settings: Settings, node: KafkaNode) -> str:
    return procs.log_excerpt(
        procs.out_file(settings.state_dir, node.name), node.logs / "server.log"
    )


def running_names(settings: Settings) -> list[str]:
    """Process names of the Kafka nodes that run now."""
    return [n.name for n in nodes(settings, 3) if procs.is_running(settings.state_dir, n.name)]


def status(settings: Settings) -> dict[str, Any]:
    count = running_layout(settings)
    if count is None:
        return {"state": "down"}
    ns = nodes(settings, count)
    pids = [procs.running_pid(settings.state_dir, n.name) for n in ns]
    serving = [
        pid is not None and port_open("127.0.0.1", n.port) for n, pid in zip(ns, pids, strict=True)
    ]
    state = "up" if all(serving) else ("degraded" if any(serving) else "starting")
    return {
        "state": state,
        "nodes": count,
        "pids": [p for p in pids if p is not None],
        "bootstrap": bootstrap(settings, count),
        "version": kafka_version(settings),
    }


def kafka_version(settings: Settings) -> str | None:
    jars = sorted(fetch.lib_dir(settings.state_dir, COMPONENT).glob("kafka_2.13-*.jar"))
    return jars[-1].name.removeprefix("kafka_2.13-").removesuffix(".jar") if jars else None
