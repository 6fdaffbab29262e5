"""``up``, ``down`` and ``status`` for the whole local stack (idempotent).

``up`` starts every JVM first and only then waits, so Kafka (seconds) and Cassandra
(tens of seconds on first boot) start concurrently; then it creates the topics declared in
``Settings.topology_path``, for the default namespace and each ``$GNOMON_REGIONS`` region's
(gnomon.region), and sets the declared configs that differ on existing ones
(:func:`gnomon.infra.topics.sync_topics`), upserts the Kafka role users and their ACLs
(docs/adr/0006, every namespace's) and sets up Cassandra's roles; credentials are generated into
``Settings.credentials_dir`` (0700, files 0600). Then it starts the schema registry
(a Python process, gnomon.infra.registry), which needs Kafka's topics and users. A lock
file serialises concurrent ``up``/``down`` calls.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from gnomon.adapters.kafka import kafka_stack
from gnomon.config import Settings
from gnomon.infra import (
    cassandra,
    connect,
    fetch,
    jvm,
    kafka,
    perms,
    placement,
    postgres,
    procs,
    registry,
    sites,
)
from gnomon.infra import tls as tls_
from gnomon.infra.errors import InfraError
from gnomon.infra.progress import say
from gnomon.infra.topics import TopicSpec, ensure_topics, namespace_label, namespace_specs
from gnomon.topology import SHARED_ROLES, load_topology

if TYPE_CHECKING:
    from gnomon.infra import coordinators

COMPONENTS: tuple[str, ...] = ("kafka", "cassandra", "registry")  # what `up` starts by default
# Kafka Connect is opt-in (`up --only connect`, after Kafka; it starts PostgreSQL, its JDBC
# sink's database, too); PostgreSQL alone with `up --only postgres`; `down` stops them too.
ALL_COMPONENTS: tuple[str, ...] = (*COMPONENTS, "connect", "postgres")
JVM_MODULES = {"kafka": kafka, "cassandra": cassandra, "connect": connect}  # fetched, need Java
STOP_TIMEOUT_S = 60.0


def _check(components: Sequence[str], kafka_nodes: int) -> None:
    unknown = [c for c in components if c not in ALL_COMPONENTS]
    if unknown:
        raise InfraError(
            f"unknown component {unknown[0]!r}; choose from {', '.join(ALL_COMPONENTS)}"
        )
    if kafka_nodes not in (1, 3):
        raise InfraError(f"kafka_nodes must be 1 or 3, not {kafka_nodes}")


def _namespace_specs(settings: Settings) -> list[tuple[str | None, list[TopicSpec]]]:
    try:
        return namespace_specs(settings.topology_path, sites.names(settings.state_dir))
    except ValueError as exc:  # a bad $GNOMON_REGIONS
        raise InfraError(str(exc)) from None


def leaders(namespace: str | None, specs: list[TopicSpec],
            layout: sites.Regions | None) -> list[tuple[list[TopicSpec], int | None]]:
    """``specs`` of ``namespace`` grouped by the broker their partitions prefer as leader
    (None: Kafka's choice). In a regions layout (ADR 0013) a region's topics are led from
    its own site, and the topics the regions share (who runs which namespace) from the
    witness's, so that losing either region never stalls the other's heartbeats behind a
    leader change."""
    if layout is None:
        return [(specs, None)]
    if namespace is not None:
        return [(specs, layout.host(namespace) if namespace in layout.names else None)]
    shared = {str(getattr(load_topology(region=None), role)) for role in SHARED_ROLES}
    return [([s for s in specs if s.name not in shared], None),
            ([s for s in specs if s.name in shared], sites.WITNESS_HOST)]


def _place_coordinators(settings: Settings, kafka_nodes: int, layout: sites.Regions) -> None:
    """Each region's consumer groups and processors' transactions coordinated from its own
    site (gnomon.infra.coordinators)."""
    from gnomon.infra import coordinators
    from gnomon.infra.topics import create_with_assignment

    hosts = {r: layout.host(r) for r in layout.names}
    _, min_isr = kafka.replication(kafka_nodes)
    for topic, plan, partitions, config, what, kind in (
            (coordinators.OFFSETS_TOPIC, coordinators.plan(hosts), coordinators.OFFSETS_PARTITIONS,
             coordinators.OFFSETS_CONFIG, "consumer groups", "group "),
            (coordinators.TXN_TOPIC, coordinators.txn_plan(hosts), coordinators.TXN_PARTITIONS,
             coordinators.txn_config(min_isr), "processors' transactions", "")):
        bootstrap = kafka.bootstrap(settings, kafka_nodes)
        made = create_with_assignment(bootstrap, topic, coordinators.assignment(plan, kafka_nodes, partitions),
                                      config, credentials_dir=settings.credentials_dir)
        if made:
            say(f"{topic}: each region's {what} coordinated from its own site")
        else:
            _check_placement(settings, bootstrap, topic, plan, what, {h: r for r, h in hosts.items()})
        for clash in plan.clashes:
            say(f"warning: {kind}{clash}: a cut of that site stalls it until its coordinator moves")


def _check_placement(settings: Settings, bootstrap: str, topic: str, plan: coordinators.Plan, what: str,
                     region_of: dict[int, str]) -> None:
    """An existing coordinators' topic (made by Kafka on first use, or by an ``infra up``
    older than its placement) led from the wrong sites: say which partitions, what it
    risks, and write the reassignment that fixes it (docs/runbooks.md)."""
    import json

    from gnomon.infra import coordinators
    from gnomon.infra.topics import replicas_of

    replicas = replicas_of(bootstrap, topic, credentials_dir=settings.credentials_dir)
    wrong = coordinators.misplaced(plan, replicas)
    if not wrong:
        return
    path = settings.state_dir / f"reassign-{topic.strip('_')}.json"
    path.write_text(json.dumps(coordinators.reassignment(plan, replicas, topic), indent=2) + "\n")
    where = ", ".join(f"partition {i} (region {region_of.get(h, '?')}'s, led from host {replicas[i][0] if replicas[i] else '?'})"
                      for i, h in wrong.items())
    say(f"warning: {topic} existed before gnomon placed it: {where}; a cut of that host stalls those "
        f"{what} until their coordinator moves. To place them: kafka-reassign-partitions.sh --execute "
        f"--reassignment-json-file {path}, then kafka-leader-election.sh --election-type preferred "
        "(docs/runbooks.md, 'A region lost')")


def _operator_key(settings: Settings) -> None:
    """The operator's command key, which signs a moved job's adoption between regions
    (ADR 0013) and the origin of a command a processor forwards after a grow (issue 50):
    made here if missing, since every processor needs the same file."""
    from gnomon import command_keys

    path = command_keys.keys_dir(settings) / command_keys.OPERATOR_FILE
    if not path.exists():
        command_keys.operator_key(settings)
        say(f"made the operator's command key {path}: every processor needs this file (they sign a moved "
            "job's adoption and a forwarded command's origin with it)")


@contextmanager
def _lock(settings: Settings) -> Iterator[None]:
    path = settings.state_dir / "run" / "infra.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say("another `gnomon infra` command is running; waiting for it…")
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def up(
    settings: Settings, kafka_nodes: int = 1, components: Sequence[str] = COMPONENTS, tls: bool | None = None,
    cassandra_nodes: int = 1,
) -> dict[str, Any]:
    """Fetch (first run), start and wait until each component serves; create topics.

    Already-running components are only health-checked. ``tls``: Kafka's listeners and
    Cassandra speak TLS (gnomon.infra.tls), remembered in the state directory; None: as
    last time. ``kafka_nodes``/``cassandra_nodes`` 3: three hosts, 127.0.0.1-3.
    Returns :func:`status`.
    """
    _check(components, kafka_nodes)
    if tls is not None and tls != tls_.is_enabled(settings.state_dir):
        if kafka.running_names(settings) or cassandra.running_names(settings):
            raise InfraError(f"the stack runs with TLS {'off' if tls else 'on'}; run `gnomon infra down` before "
                             f"starting it with TLS {'on' if tls else 'off'}")
        tls_.enable(settings.state_dir, tls)
        say(f"TLS {'on' if tls else 'off'} for Kafka's listeners and Cassandra (gnomon.infra.tls)")
    with kafka_stack(settings.state_dir):
        return _up(settings, kafka_nodes, components, cassandra_nodes)


def fetch_jars(settings: Settings, components: Sequence[str] = tuple(JVM_MODULES)) -> None:
    """Check Java and fetch the jars of ``components`` (first run), starting nothing: for
    clusters of their own that run from this state directory's jars (the chaos tests)."""
    with _lock(settings):
        _fetch(settings, components)


def _fetch(settings: Settings, components: Sequence[str]) -> None:
    for component in components:
        if component not in JVM_MODULES:
            continue
        module = JVM_MODULES[component]
        jvm.find_java(module.JAVA_VERSIONS, module.LABEL)
        fetch.fetch(settings.state_dir, module.COMPONENT, module.LABEL)


def _up(settings: Settings, kafka_nodes: int, components: Sequence[str], cassandra_nodes: int) -> dict[str, Any]:
    begun = time.monotonic()
    tightened = perms.private_state_dir(settings.state_dir)  # before anything writes tenants' data
    if tightened:
        say(f"made {tightened} file(s) and directories under {settings.state_dir} private to this user")
    with _lock(settings):
        _fetch(settings, components)  # check Java and download first, then start JVMs together
        if "kafka" in components:
            kafka.start(settings, kafka_nodes)
        if "cassandra" in components:
            cassandra.start(settings, cassandra_nodes)
        if "kafka" in components:
            kafka.wait_ready(settings, kafka_nodes)
            rf, _ = kafka.replication(kafka_nodes)
            layout = sites.load(settings.state_dir) if kafka_nodes == 3 else None
            if layout is not None:  # before any group or transaction makes the topics itself
                _place_coordinators(settings, kafka_nodes, layout)
            _operator_key(settings)
            for namespace, specs in _namespace_specs(settings):  # the default one, then each region's
                created = []
                for group, leader in leaders(namespace, specs, layout):
                    created += ensure_topics(
                        kafka.bootstrap(settings, kafka_nodes), group, rf, credentials_dir=settings.credentials_dir,
                        leader=leader,
                    )
                if created:
                    say(f"{namespace_label(namespace)}created {len(created)} topic(s) (replication factor {rf})")
            kafka.sync_users(settings, kafka_nodes)
            kafka.wait_users(settings, kafka_nodes)
            added, removed = kafka.apply_acls(settings, kafka_nodes)
            if added or removed:
                say(f"Kafka ACLs: {added} created, {removed} removed (gnomon.infra.acls)")
            say(f"Kafka is up on {kafka.bootstrap(settings, kafka_nodes)} ({kafka_nodes} node(s))")
        if "cassandra" in components:
            cassandra.wait_ready(settings)
            cassandra.ensure_auth(settings)
            say(f"Cassandra is up on {cassandra.address(settings)}")
        if "registry" in components:  # needs Kafka, its store topic and its Kafka user
            registry.start(settings)
            registry.wait_ready(settings)
            say(f"the schema registry is up on {registry.url(settings)}")
        if "postgres" in components or "connect" in components:  # the JDBC sink writes into it
            postgres.start(settings)
            say(f"PostgreSQL is up on {postgres.address(settings)} (database {postgres.DATABASE})")
        if "connect" in components:  # needs Kafka (and its topics) up
            connect.start(settings)
            connect.wait_ready(settings)
            say(f"Kafka Connect is up on {connect.running_worker(settings).url}")
    say(f"ready in {time.monotonic() - begun:.0f}s")
    return status(settings)


def down(settings: Settings, components: Sequence[str] = ALL_COMPONENTS) -> list[str]:
    """Stop what ``up`` started (SIGTERM all at once, SIGKILL after a timeout).

    Returns the names of the processes stopped; nothing running is fine.
    """
    _check(components, 1)
    with _lock(settings):
        names: list[str] = []
        if "connect" in components:
            names += connect.running_names(settings)
        if "registry" in components:
            names += registry.running_names(settings)
        if "cassandra" in components:
            names += cassandra.running_names(settings)
        if "kafka" in components:
            names += kafka.running_names(settings)
        pg = "postgres" in components and postgres.pid(settings) is not None  # not a JVM: pg_ctl stops it
        if not names and not pg:
            say("nothing to stop")
            return []
        say(f"stopping {', '.join([*names, 'postgres'] if pg else names)}…")
        if connect.NAME in names:  # first, while Kafka still takes its final offset commits
            connect.stop(settings)
        if registry.NAME in names:
            registry.stop(settings)
        for name in names:  # signal everyone first: Kafka nodes must not wait for a lost quorum
            procs.signal_term(settings.state_dir, name)
        for name in names:
            procs.stop(settings.state_dir, name, STOP_TIMEOUT_S)
        if pg:  # after Connect, whose JDBC sink writes into it
            postgres.stop(settings)
        placement.remove(settings.state_dir)  # the hosts' cgroups, once empty
        say("stopped")
        return [*names, "postgres"] if pg else names


HOSTS_MAX = 3  # the three-host layout: host i is 127.0.0.i with Kafka node i and Cassandra node i


def _host_names(settings: Settings, host: int) -> list[str]:
    """The servers of ``host`` (1-3) in the three-host layout that runs now."""
    if not 1 <= host <= HOSTS_MAX:
        raise InfraError(f"host must be 1, 2 or 3, not {host}")
    if kafka.running_layout(settings) not in (None, 3) or cassandra.layout(settings) != 3:
        raise InfraError("the stack is not the three-host layout; `gnomon infra host` acts on one host of "
                         "`gnomon infra up --hosts 3`")
    return [kafka.nodes(settings, 3)[host - 1].name, cassandra.nodes(settings, 3)[host - 1].name]


def stop_host(settings: Settings, host: int) -> list[str]:
    """Stop the Kafka node and the Cassandra node of one host (SIGTERM, SIGKILL after a
    timeout); the other hosts keep serving. Returns the names stopped."""
    with _lock(settings):
        names = [n for n in _host_names(settings, host) if procs.is_running(settings.state_dir, n)]
        if not names:
            say(f"nothing runs on host {host}")
            return []
        say(f"stopping {', '.join(names)} (host {host})…")
        for name in names:
            procs.signal_term(settings.state_dir, name)
        for name in names:
            procs.stop(settings.state_dir, name, STOP_TIMEOUT_S)
        say(f"host {host} stopped")
        return names


def start_host(settings: Settings, host: int, *, wait_cassandra: bool = True) -> dict[str, Any]:
    """Start the Kafka node and the Cassandra node of one host (those not running) and wait
    until Kafka serves on every host (and Cassandra, unless ``wait_cassandra`` is False:
    history is read and written at LOCAL_QUORUM, which two nodes answer meanwhile).
    Returns :func:`status`."""
    began = time.monotonic()
    with _lock(settings):
        _host_names(settings, host)
        kafka.start(settings, 3, only=host)
        cassandra.start(settings, 3, only=host)
        kafka.wait_ready(settings, 3)
        say(f"host {host}: Kafka serves on all three hosts ({time.monotonic() - began:.0f} s)")
        if wait_cassandra:
            cassandra.wait_ready(settings)
            say(f"host {host}: Cassandra serves on all three hosts ({time.monotonic() - began:.0f} s)")
    return status(settings)


def status(settings: Settings) -> dict[str, Any]:
    """``{"kafka": {...}, "cassandra": {...}, "registry": {...}, "connect": {...},
    "postgres": {...}}``; each has ``state`` (up/starting/degraded/down)."""
    return {
        "kafka": kafka.status(settings),
        "cassandra": cassandra.status(settings),
        "registry": registry.status(settings),
        "connect": connect.status(settings),
        "postgres": postgres.status(settings),
    }
