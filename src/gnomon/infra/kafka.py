"""Apache Kafka in KRaft mode (combined broker+controller), one node, or three nodes as
three hosts on one machine.

Addresses (issue 26, the way Cassandra's ccm does it): node ``i`` (1-based) is host
127.0.0.<i> (the whole 127/8 is loopback on Linux), each on ``kafka_port`` (clients)
and ``kafka_controller_port`` (the controller quorum), bound to its own address only:
9092/9093 on 127.0.0.1, 127.0.0.2 and 127.0.0.3 with the defaults. Node 1 is always
127.0.0.1:``kafka_port``, so ``Settings.kafka_bootstrap`` reaches either layout.

Files: ``<state_dir>/kafka/<n>-node/`` holds the cluster id and one ``node-<i>/`` per node
(``server.properties`` rendered from ``infra/kafka/server.properties.template`` and the
``data/`` log dir). The single-node and three-node layouts keep separate data, so switching
between them (after ``down``) loses nothing.

Authentication (docs/adr/0006-kafka-auth-and-tenant-proof.md): both listeners are
SASL_PLAINTEXT on loopback. Clients and inter-broker traffic use SCRAM-SHA-512; the
controller quorum uses SASL/PLAIN with a static user. ``prepare`` formats the storage
with the SCRAM users ``admin`` and ``broker`` (``--add-scram``) and records that in
``<layout>/auth.json``; a layout formatted before authentication existed (no
``auth.json``) is development data and is re-formatted, with a message.
:func:`sync_users` (every ``up``) upserts the role users from the credential files, and
``gnomon.infra.acls.apply`` their ACLs. ``server.properties`` holds the servers' own
passwords and is written 0600.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from string import Template
from typing import Any

from gnomon import credentials
from gnomon.config import Settings
from gnomon.infra import fetch, jvm, placement, procs, sites, tls
from gnomon.infra.errors import InfraError
from gnomon.infra.net import port_open
from gnomon.infra.progress import say
from gnomon.infra.readiness import wait_until_serving

COMPONENT = "kafka"
LABEL = "Kafka"
JAVA_VERSIONS = (17, 21, 11)
HEAP = ("-Xms256m", "-Xmx512m")
GC = ("-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-XX:+ExitOnOutOfMemoryError")
CONF_DIR = fetch.INFRA_DIR / "kafka"
SCRAM_MECHANISM = "SCRAM-SHA-512"
SCRAM_ITERATIONS = 8192
FORMAT_USERS = ("admin", credentials.KAFKA_BROKER)  # SCRAM users written at format time

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
    host: str = "127.0.0.1"

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
        return f"{self.host}:{self.port}"


def host_address(i: int) -> str:
    """Host ``i``'s address (1-based): 127.0.0.i."""
    assert 1 <= i <= 254, i
    return f"127.0.0.{i}"


def layout_dir(settings: Settings, count: int) -> Path:
    return settings.state_dir / "kafka" / f"{count}-node"


def nodes(settings: Settings, count: int) -> list[KafkaNode]:
    if count not in (1, 3):
        raise InfraError(f"kafka_nodes must be 1 or 3, not {count}")
    home = layout_dir(settings, count)
    return [
        KafkaNode(
            node_id=i,
            port=settings.kafka_port,
            controller_port=settings.kafka_controller_port,
            home=home / f"node-{i}",
            logs=settings.state_dir / "logs" / f"kafka-{i}",
            host=host_address(i),
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


def server_credentials(settings: Settings) -> dict[str, credentials.Credential]:
    """Every Kafka credential (generated on first use): the roles, broker, controller."""
    d = settings.credentials_dir
    credentials.ensure_dir(d)
    names = (*credentials.KAFKA_ROLES, credentials.KAFKA_BROKER, credentials.KAFKA_CONTROLLER)
    return {n: credentials.ensure(d, n) for n in names}


def render_config(
    settings: Settings, count: int, node: KafkaNode, creds: dict[str, credentials.Credential] | None = None
) -> str:
    creds = creds or server_credentials(settings)
    rf, min_isr = replication(count)
    voters = ",".join(f"{n.node_id}@{n.host}:{n.controller_port}" for n in nodes(settings, count))
    template = Template((CONF_DIR / "server.properties.template").read_text())
    broker, controller = creds[credentials.KAFKA_BROKER], creds[credentials.KAFKA_CONTROLLER]
    on = tls.is_enabled(settings.state_dir)
    protocol = "SASL_SSL" if on else "SASL_PLAINTEXT"
    jaas = (f'org.apache.kafka.common.security.scram.ScramLoginModule required username="{broker.username}" '
            f'password="{broker.password}";')
    regions = sites.load(settings.state_dir) if count == 3 else None
    if regions is None:
        lst = sites.Listeners(
            listeners=f"CLIENT://{node.host}:{node.port},CONTROLLER://{node.host}:{node.controller_port}",
            advertised=f"CLIENT://{node.host}:{node.port}", inter_broker="CLIENT",
            protocol_map=f"CONTROLLER:{protocol},CLIENT:{protocol}", extra="# no regions (gnomon infra up --regions)")
    else:
        lst = sites.kafka_listeners(regions, node.node_id, node.host, node.port, node.controller_port, protocol, jaas)
        voters = sites.voters([n.host for n in nodes(settings, count)], node.controller_port)
    return template.substitute(
        protocol=protocol,
        tls_config=_tls_config(settings, node) if on else "# TLS off (gnomon infra up --tls turns it on)",
        listeners=lst.listeners,
        advertised_listeners=lst.advertised,
        inter_broker=lst.inter_broker,
        protocol_map=lst.protocol_map,
        regions_config=lst.extra,
        node_id=node.node_id,
        host=node.host,
        quorum_voters=voters,
        port=node.port,
        controller_port=node.controller_port,
        log_dirs=node.data,
        replication_factor=rf,
        min_insync_replicas=min_isr,
        admin_username=creds["admin"].username,
        broker_username=broker.username,
        broker_password=broker.password,
        controller_username=controller.username,
        controller_password=controller.password,
    )


def _tls_config(settings: Settings, node: KafkaNode) -> str:
    """Every listener (clients, inter-broker, the controller quorum) speaks TLS with the
    node's certificate (gnomon.infra.tls), a PEM keystore of its key and chain."""
    cert = tls.ensure_host(settings.state_dir, node.name, [node.host])
    keystore = tls.tls_dir(settings.state_dir) / f"{node.name}.keystore.pem"
    credentials.write_secret(keystore, cert.key.read_text() + cert.cert.read_text())
    return "\n".join([
        "# TLS on every listener (gnomon.infra.tls): the node's key and chain, the stack's CA",
        "ssl.keystore.type=PEM",
        f"ssl.keystore.location={keystore}",
        "ssl.truststore.type=PEM",
        f"ssl.truststore.location={cert.ca}",
        "ssl.client.auth=none",
        "ssl.endpoint.identification.algorithm=https",
    ])


def _fingerprint(cred: credentials.Credential) -> str:
    return hashlib.sha256(f"{cred.username}\0{cred.password}".encode()).hexdigest()[:16]


def _auth_file(settings: Settings, count: int) -> Path:
    return layout_dir(settings, count) / "auth.json"


def _check_formatted_auth(settings: Settings, count: int, creds: dict[str, credentials.Credential]) -> None:
    """Re-format a layout formatted without SCRAM users (dev data from before auth); refuse
    credentials that differ from the ones the storage was formatted with."""
    ns = nodes(settings, count)
    formatted = [n for n in ns if (n.data / "meta.properties").exists()]
    auth_file = _auth_file(settings, count)
    if not auth_file.exists():
        if not formatted:
            return
        if any(procs.is_running(settings.state_dir, n.name) for n in ns):
            raise InfraError(
                "Kafka runs without authentication (formatted before SCRAM users existed); "
                "run `python -m gnomon.infra down` first, then `up` re-formats it"
            )
        say(
            f"Kafka data in {layout_dir(settings, count)} was formatted without SCRAM users "
            "(before authentication); re-formatting it: its topics and records are DELETED "
            "(development data), and the processors' local state with them"
        )
        for n in ns:
            shutil.rmtree(n.data, ignore_errors=True)
        shutil.rmtree(settings.state_dir / "processor", ignore_errors=True)
        return
    recorded = json.loads(auth_file.read_text()).get("fingerprints", {})
    for name in FORMAT_USERS:
        if name in recorded and recorded[name] != _fingerprint(creds[name]):
            raise InfraError(
                f"the Kafka credential {credentials.path(settings.credentials_dir, name)} is not the "
                f"one {layout_dir(settings, count)} was formatted with; restore it, or delete that "
                "directory to re-format (development data is lost)"
            )


def _scram_arg(cred: credentials.Credential) -> str:
    return f"{SCRAM_MECHANISM}=[name={cred.username},iterations={SCRAM_ITERATIONS},password={cred.password}]"


def prepare(settings: Settings, count: int) -> tuple[str, Path]:
    """Fetch jars, render configs, format storage (once). Returns (java, lib dir)."""
    java = jvm.find_java(JAVA_VERSIONS, LABEL)
    lib = fetch.fetch(settings.state_dir, COMPONENT, LABEL)
    creds = server_credentials(settings)
    _check_formatted_auth(settings, count, creds)
    cluster_id = _cluster_id(settings, count, java, lib)
    scram = [arg for name in FORMAT_USERS for arg in ("--add-scram", _scram_arg(creds[name]))]
    for node in nodes(settings, count):
        node.home.mkdir(parents=True, exist_ok=True)
        node.logs.mkdir(parents=True, exist_ok=True)
        credentials.write_secret(node.config, render_config(settings, count, node, creds))
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
            *scram,
            "--ignore-formatted",
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise InfraError(
                f"formatting Kafka storage for node {node.node_id} failed:\n"
                f"{proc.stdout}{proc.stderr}".strip()
            )
    auth = {"mechanism": SCRAM_MECHANISM, "fingerprints": {n: _fingerprint(creds[n]) for n in FORMAT_USERS}}
    _auth_file(settings, count).write_text(json.dumps(auth, indent=2) + "\n")
    return java, lib


# --- running ------------------------------------------------------------------------


def start(settings: Settings, count: int, only: int | None = None) -> list[int]:
    """Start every node that is not running yet (detached), or node ``only`` alone (one
    host of three: ``gnomon infra host start``). Returns the pids."""
    current = running_layout(settings)
    if current is not None and current != count:
        raise InfraError(
            f"Kafka is running with {current} node(s); run `python -m gnomon.infra down` "
            f"before starting {count}"
        )
    java, lib = prepare(settings, count)
    pids = []
    regions = sites.load(settings.state_dir) if count == 3 else None
    if regions is not None:
        pids.append(_start_latency(settings, regions, count))
    for node in nodes(settings, count):
        if only is not None and node.node_id != only:
            continue
        if not procs.is_running(settings.state_dir, node.name):
            for port in (node.port, node.controller_port):
                if port_open(node.host, port):
                    raise InfraError(
                        f"{node.host}:{port} is already in use by another process; stop it or "
                        f"choose other ports (GNOMON_KAFKA_PORT, GNOMON_KAFKA_CONTROLLER_PORT)"
                    )
        argv = [
            *_java_cmd(java, lib, node, *HEAP, *GC, procs.marker(node.name)),
            "kafka.Kafka",
            str(node.config),
        ]
        group = placement.host_group(settings.state_dir, node.node_id) if count > 1 and placement.enabled() else None
        pids.append(procs.start(settings.state_dir, node.name, placement.wrap(argv, group), cwd=node.home))
    _layout_file(settings).write_text(f"{count}\n")
    return pids


def _start_latency(settings: Settings, regions: sites.Regions, count: int) -> int:
    """The proxy that delays every link between sites (gnomon.infra.sites), in no host's
    cgroup, so a cut of a host also cuts its proxied links."""
    ns = nodes(settings, count)
    routes = sites.proxy_routes(regions, [n.host for n in ns], settings.kafka_port, settings.kafka_controller_port)
    if not procs.is_running(settings.state_dir, sites.LATENCY_PROCESS):
        for route in routes:
            host, _, port = route.split("=")[0].rpartition(":")
            if port_open(host, int(port)):
                raise InfraError(f"{host}:{port} (the latency proxy's) is already in use by another process")
    argv = [sys.executable, "-m", "gnomon.infra.latency", procs.marker(sites.LATENCY_PROCESS),
            "--delay-ms", str(regions.latency_ms), *(a for r in routes for a in ("--route", r))]
    pid = procs.start(settings.state_dir, sites.LATENCY_PROCESS, argv)
    say(f"regions {regions.names[0]} (host 1), {regions.names[1]} (host 2) and the witness (host 3): "
        f"{regions.latency_ms:g} ms each way between them ({len(routes)} proxied listeners)")
    return pid


def admin(
    bootstrap_servers: str, *, role: str = "admin", credentials_dir: Path | None = None, **extra: Any
) -> Any:
    """A confluent_kafka AdminClient (as ``role``, default the super user ``admin``; see
    :func:`gnomon.adapters.kafka.security_config`) whose librdkafka chatter is silenced."""
    from confluent_kafka.admin import AdminClient

    from gnomon.adapters.kafka import security_config

    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap_servers,
        "logger": _quiet,
        **security_config(role, credentials_dir=credentials_dir),
        **extra,
    }
    return AdminClient(config)


def _brokers_seen(nodes_: list[KafkaNode], credentials_dir: Path) -> int:
    """The fewest brokers any node reports (each asked through its own fresh client)."""
    return min(
        len(admin(n.address, credentials_dir=credentials_dir).list_topics(timeout=5).brokers)
        for n in nodes_
    )


def sync_users(settings: Settings, count: int, timeout_s: float = 30.0) -> list[str]:
    """Upsert the SCRAM user of every role but admin from its credential file (idempotent:
    a rotated file takes effect here). Returns the user names."""
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        ScramMechanism,
        UserScramCredentialUpsertion,
    )

    creds = server_credentials(settings)
    client = admin(bootstrap(settings, count), credentials_dir=settings.credentials_dir)
    mechanism = getattr(ScramMechanism, SCRAM_MECHANISM.replace("-", "_"))
    from confluent_kafka.admin import ScramCredentialInfo  # type: ignore[attr-defined]

    upserts = [
        UserScramCredentialUpsertion(
            creds[r].username, ScramCredentialInfo(mechanism, SCRAM_ITERATIONS), creds[r].password.encode()
        )
        for r in credentials.KAFKA_ROLES
        if r != "admin"
    ]
    for user, future in client.alter_user_scram_credentials(upserts, request_timeout=timeout_s).items():
        try:
            future.result()
        except Exception as exc:
            raise InfraError(f"cannot set the Kafka SCRAM credential of {user}: {exc}") from exc
    return [u.user for u in upserts]


def wait_users(settings: Settings, count: int, timeout_s: float = 60.0) -> float:
    """Block until every role's SCRAM credential authenticates on every node (a node
    applies an upsert when it reads it from the metadata log: a busy node may lag, and
    a client would then fail authentication there). Returns seconds waited."""
    roles = [r for r in credentials.KAFKA_ROLES if r != "admin"]
    pending = [(n, r) for n in nodes(settings, count) for r in roles]
    started = time.monotonic()
    last = ""
    while pending:
        still: list[tuple[KafkaNode, str]] = []
        for node, role in pending:
            try:
                admin(node.address, role=role, credentials_dir=settings.credentials_dir).list_topics(timeout=5)
            except Exception as exc:  # authentication failure, or the node not answering yet
                still.append((node, role))
                last = f"role {role} on {node.address}: {exc}"
        pending = still
        if pending:
            if time.monotonic() - started > timeout_s:
                raise InfraError(f"Kafka credentials not usable after {timeout_s:.0f} s ({len(pending)} "
                                 f"role/node pair(s) failing), e.g. {last}")
            time.sleep(0.5)
    return time.monotonic() - started


def apply_acls(settings: Settings, count: int) -> tuple[int, int]:
    """The role ACLs of ``gnomon.infra.acls`` on the running cluster: (created, deleted)."""
    from gnomon.infra import acls
    from gnomon.topology import namespaces

    roles = tuple(r for r in credentials.KAFKA_ROLES if r != "admin")
    client = admin(bootstrap(settings, count), credentials_dir=settings.credentials_dir)
    try:
        return acls.apply(client, namespaces(settings.topology_path, sites.names(settings.state_dir)),
                          roles)  # every region's too
    except Exception as exc:
        raise InfraError(f"cannot apply the Kafka ACLs: {exc}") from exc


def wait_ready(settings: Settings, count: int, timeout_s: float = 120.0) -> float:
    """Block until all ``count`` brokers serve metadata; returns seconds waited."""
    ns = nodes(settings, count)
    servers = ",".join(n.address for n in ns)
    by_name = {n.name: n for n in ns}

    def probe() -> str | None:
        seen = _brokers_seen(ns, settings.credentials_dir)
        return None if seen >= count else f"a node sees {seen}/{count} brokers"

    return wait_until_serving(
        state_dir=settings.state_dir,
        processes=[(n.name, f"Kafka node {n.node_id}") for n in ns],
        ports=[(n.host, n.port) for n in ns],
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
    """Process names of the Kafka nodes that run now (and the regions' latency proxy)."""
    names = [n.name for n in nodes(settings, 3) if procs.is_running(settings.state_dir, n.name)]
    if procs.is_running(settings.state_dir, sites.LATENCY_PROCESS):
        names.append(sites.LATENCY_PROCESS)
    return names


def status(settings: Settings) -> dict[str, Any]:
    count = running_layout(settings)
    if count is None:
        return {"state": "down"}
    ns = nodes(settings, count)
    pids = [procs.running_pid(settings.state_dir, n.name) for n in ns]
    serving = [
        pid is not None and port_open(n.host, n.port) for n, pid in zip(ns, pids, strict=True)
    ]
    state = "up" if all(serving) else ("degraded" if any(serving) else "starting")
    return {
        "state": state,
        "nodes": count,
        "members": [procs.member_state(n.name, n.host, pid, up) for n, pid, up in zip(ns, pids, serving, strict=True)],
        "pids": [p for p in pids if p is not None],
        "bootstrap": bootstrap(settings, count),
        "version": kafka_version(settings),
    }


def kafka_version(settings: Settings) -> str | None:
    jars = sorted(fetch.lib_dir(settings.state_dir, COMPONENT).glob("kafka_2.13-*.jar"))
    return jars[-1].name.removeprefix("kafka_2.13-").removesuffix(".jar") if jars else None
