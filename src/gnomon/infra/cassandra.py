"""Apache Cassandra 5.0, one node on 127.0.0.1 or three nodes as three hosts on one
machine (node i on 127.0.0.i, all seeds, one datacenter), from Maven Central jars on
Java 17 (or 11).

Files: ``<state_dir>/cassandra/`` holds ``cassandra.yaml`` (rendered from
``infra/cassandra/cassandra.yaml.template``) and ``data/`` (data, commitlog, hints, caches);
the full log is ``<state_dir>/logs/cassandra/system.log``. JVM options come from
``infra/cassandra/jvm17.options`` plus heap (1 GiB), the jamm agent and config paths.

Authentication: PasswordAuthenticator + CassandraAuthorizer. :func:`ensure_auth` (every
``up``) logs in as ``gnomon_admin`` (``credentials/cassandra-admin.json``), or on the first
run as the default ``cassandra/cassandra`` to create it; then creates/updates the
application role ``gnomon`` (``credentials/cassandra.json``: LOGIN, CREATE on all
keyspaces so it can create its own keyspaces, ALL on the ``gnomon`` keyspace) and
disables the default superuser (random password, no LOGIN, no SUPERUSER).
"""

from __future__ import annotations

import logging
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
    "-Dcassandra.superuser_setup_delay_ms=0",  # create cassandra/cassandra at once (auth setup)
)
# One node only: system tables skip the commit log (faster start; dev data only). Not on
# three hosts: a node killed -9 lost the schema it had been told (the lost-host chaos
# test), rejected every write of the history tables until a schema pull, and answered
# "keyspace gnomon does not exist".
SINGLE_NODE_PROPERTIES = ("-Dcassandra.unsafesystem=true",)
KEYSPACE = "gnomon"
RF3 = "{'class': 'NetworkTopologyStrategy', 'datacenter1': 3}"  # three hosts: every row on each
DEFAULT_SUPERUSER = credentials.Credential("cassandra", "cassandra")

for _name in ("cassandra", "cassandra.cluster", "cassandra.connection", "cassandra.pool"):
    logging.getLogger(_name).addHandler(logging.NullHandler())
    logging.getLogger(_name).propagate = False


@dataclass(frozen=True)
class Node:
    index: int  # 1-based
    host: str
    name: str  # its pid file's name
    home: Path  # cassandra.yaml and data/
    logs: Path


def nodes(settings: Settings, count: int = 1) -> list[Node]:
    """The layout of ``count`` nodes (1 or 3): one node keeps the paths it always had."""
    if count == 1:
        return [Node(1, HOST, NAME, settings.state_dir / "cassandra", settings.state_dir / "logs" / "cassandra")]
    if count != 3:
        raise InfraError(f"cassandra nodes must be 1 or 3, not {count}")
    # the regions layout has a datacenter per site, which a node's data may never change: data of its own
    dirname = "3-node" if sites.load(settings.state_dir) is None else "regions"
    return [Node(i, f"127.0.0.{i}", f"{NAME}-{i}", settings.state_dir / "cassandra" / dirname / f"node-{i}",
                 settings.state_dir / "logs" / f"cassandra-{i}") for i in range(1, 4)]


def replication(settings: Settings) -> str:
    """The replication of system_auth and the history keyspace on three hosts."""
    regions = sites.load(settings.state_dir)
    return RF3 if regions is None else sites.cassandra_replication(regions)


def _sited(settings: Settings, node: Node) -> sites.Regions | None:
    """The regions layout, if ``node`` is a site's node of one (None otherwise)."""
    regions = sites.load(settings.state_dir)
    return None if regions is None or node.name == NAME else regions


def _rackdc(settings: Settings, node: Node) -> Path | None:
    """Write the node's ``cassandra-rackdc.properties`` in the regions layout (None otherwise)."""
    regions = _sited(settings, node)
    if regions is None:
        return None
    path = node.home / "cassandra-rackdc.properties"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(sites.rackdc(regions, node.index))
    return path


def _layout_file(settings: Settings) -> Path:
    return settings.state_dir / "run" / "cassandra-layout"


def layout(settings: Settings) -> int:
    """The node count of the layout last started (1 by default)."""
    try:
        return int(_layout_file(settings).read_text().strip())
    except (OSError, ValueError):
        return 1


def hosts(settings: Settings) -> list[str]:
    return [n.host for n in nodes(settings, layout(settings))]


def home(settings: Settings) -> Path:
    return nodes(settings, layout(settings))[0].home


def log_dir(settings: Settings) -> Path:
    return nodes(settings, layout(settings))[0].logs


def address(settings: Settings) -> str:
    return ",".join(f"{h}:{settings.cassandra_port}" for h in hosts(settings))


NUM_TOKENS = 16  # vnodes per node: the template's num_tokens
_TOKEN_MIN, _TOKEN_SPAN = -(2**63), 2**64  # Murmur3Partitioner's ring


def initial_tokens(index: int, count: int, per_node: int = NUM_TOKENS) -> list[int]:
    """Node ``index``'s (1-based) vnode tokens of ``count`` nodes: the ring cut into
    ``count * per_node`` equal arcs, dealt round the nodes in turn, so every node owns its
    own tokens and an equal share. Three nodes started together left to choose for
    themselves once chose the same ones (node 1 logged "have the same token ... Ignoring
    /127.0.0.2": three nodes held data on two, and with one host down LOCAL_QUORUM failed)."""
    if not 1 <= index <= count:
        raise InfraError(f"cassandra node {index} is not one of {count}")
    step = _TOKEN_SPAN // (count * per_node)
    # the middle of each arc: never the partitioner's minimum token, which no node may hold
    return [_TOKEN_MIN + step // 2 + (k * count + index - 1) * step for k in range(per_node)]


def _tokens_config(node: Node, count: int) -> str:
    if count == 1:  # one node: nobody to collide with; Cassandra chooses
        return "allocate_tokens_for_local_replication_factor: 1"
    # (read once, when the node first starts: a node with saved tokens keeps them)
    return "initial_token: " + ",".join(str(t) for t in initial_tokens(node.index, count))


def render_config(settings: Settings, node: Node | None = None, count: int = 1) -> str:
    node = node or nodes(settings, count)[0]
    data = node.home / "data"
    template = Template((CONF_DIR / "cassandra.yaml.template").read_text())
    seeds = ",".join(f"{n.host}:{settings.cassandra_storage_port}" for n in nodes(settings, count))
    return template.substitute(
        encryption=_encryption(settings, node) if tls.is_enabled(settings.state_dir) else "# TLS off (gnomon infra up --tls)",
        host=node.host,
        seeds=seeds,
        tokens=_tokens_config(node, count),
        snitch="SimpleSnitch" if _sited(settings, node) is None else "GossipingPropertyFileSnitch",
        storage_port=settings.cassandra_storage_port,
        native_port=settings.cassandra_port,
        data_dir=data / "data",
        commitlog_dir=data / "commitlog",
        saved_caches_dir=data / "saved_caches",
        hints_dir=data / "hints",
        cdc_raw_dir=data / "cdc_raw",
    )


def _encryption(settings: Settings, node: Node) -> str:
    """Client and internode encryption with the node's certificate (gnomon.infra.tls): a
    plaintext client is refused (``optional: false``)."""
    cert = tls.ensure_host(settings.state_dir, node.name, [node.host])
    keystore = tls.tls_dir(settings.state_dir) / f"{node.name}.keystore.pem"
    credentials.write_secret(keystore, cert.key.read_text() + cert.cert.read_text())
    block = ("  enabled: true\n  optional: false\n  ssl_context_factory:\n"
             "    class_name: org.apache.cassandra.security.PEMBasedSslContextFactory\n"
             f"  keystore: {keystore}\n  truststore: {cert.ca}\n")
    return ("# TLS on (gnomon.infra.tls): clients and the other nodes\n"
            "client_encryption_options:\n" + block + "  require_client_auth: false\n"
            "server_encryption_options:\n  internode_encryption: all\n" + block.replace("  enabled: true\n", ""))


def jvm_options() -> list[str]:
    lines = (CONF_DIR / "jvm17.options").read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith("#")]


def command(settings: Settings, java: str, lib: Path, node: Node | None = None) -> list[str]:
    node = node or nodes(settings)[0]
    config = node.home / "cassandra.yaml"
    return [
        java,
        *HEAP,
        *jvm_options(),
        f"-javaagent:{jvm.find_jar(lib, 'jamm-')}",
        procs.marker(node.name),
        "-Dcassandra-foreground=yes",
        f"-Dcassandra.config=file://{config}",
        f"-Dcassandra.logdir={node.logs}",
        f"-Dcassandra.storagedir={node.home / 'data'}",
        f"-Dlogback.configurationFile={CONF_DIR / 'logback.xml'}",
        *DEV_PROPERTIES,
        *(SINGLE_NODE_PROPERTIES if node.name == NAME else ()),
        *((f"-Dcassandra-rackdc.properties=file://{rackdc}",) if (rackdc := _rackdc(settings, node)) else ()),
        "-cp",
        jvm.classpath(lib),
        "org.apache.cassandra.service.CassandraDaemon",
    ]


def start(settings: Settings, count: int = 1, only: int | None = None) -> list[int]:
    """Fetch, render the configs and start every node of the layout that does not run
    yet, or node ``only`` alone (one host of three). Returns the pids."""
    if count != layout(settings) and running_names(settings):
        raise InfraError(f"Cassandra runs with {layout(settings)} node(s); run `gnomon infra down` before "
                         f"starting {count}")
    java = jvm.find_java(JAVA_VERSIONS, LABEL)
    lib = fetch.fetch(settings.state_dir, COMPONENT, LABEL)
    pids = []
    for node in nodes(settings, count):
        if only is not None and node.index != only:
            continue
        pid = procs.running_pid(settings.state_dir, node.name)
        if pid is not None:
            pids.append(pid)
            continue
        for port in (settings.cassandra_port, settings.cassandra_storage_port):
            if port_open(node.host, port):
                raise InfraError(
                    f"{node.host}:{port} is already in use by another process; stop it or choose other "
                    f"ports (GNOMON_CASSANDRA_PORT, GNOMON_CASSANDRA_STORAGE_PORT)"
                )
        node.home.mkdir(parents=True, exist_ok=True)
        node.logs.mkdir(parents=True, exist_ok=True)
        (node.home / "cassandra.yaml").write_text(render_config(settings, node, count))
        group = (placement.host_group(settings.state_dir, placement.host_of(node.host))
                 if count > 1 and placement.enabled() else None)
        argv = placement.wrap(command(settings, java, lib, node), group)
        pids.append(procs.start(settings.state_dir, node.name, argv, cwd=node.home))
    _layout_file(settings).parent.mkdir(parents=True, exist_ok=True)
    _layout_file(settings).write_text(f"{count}\n")
    return pids


def _cluster(settings: Settings, cred: credentials.Credential | None, only: str | None = None) -> Any:
    """A driver Cluster for the layout's nodes (or the node on host ``only`` alone)."""
    from cassandra.auth import PlainTextAuthProvider
    from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
    from cassandra.policies import WhiteListRoundRobinPolicy

    contact = hosts(settings) if only is None else [only]
    profile = ExecutionProfile(
        load_balancing_policy=WhiteListRoundRobinPolicy(contact), request_timeout=10
    )
    return Cluster(
        contact,
        port=settings.cassandra_port,
        execution_profiles={EXEC_PROFILE_DEFAULT: profile},
        connect_timeout=5,
        control_connection_timeout=5,
        auth_provider=PlainTextAuthProvider(cred.username, cred.password) if cred else None,
        ssl_context=credentials.cassandra_ssl_context(settings.state_dir),
    )


def auth_failed(exc: BaseException) -> bool:
    """True if ``exc`` (NoHostAvailable or AuthenticationFailed) is a refused login."""
    from cassandra import AuthenticationFailed
    from cassandra.cluster import NoHostAvailable

    if isinstance(exc, AuthenticationFailed):
        return True
    if isinstance(exc, NoHostAvailable):
        errors = list(exc.errors.values())
        return bool(errors) and all(
            isinstance(e, AuthenticationFailed) or "authentication" in str(e).lower() for e in errors
        )
    return False


_APP: Any = object()


def release_version(settings: Settings, cred: credentials.Credential | None = _APP) -> str:
    """``SELECT release_version FROM system.local`` over CQL (raises if it cannot), logged
    in as ``cred`` (default: the application role from the credentials dir; None: no login)."""
    if cred is _APP:
        cred = credentials.read(settings.credentials_dir, credentials.CASSANDRA)
    cluster = _cluster(settings, cred)
    try:
        session = cluster.connect()
        row = session.execute("SELECT release_version FROM system.local").one()
        peers = len(list(session.execute("SELECT peer FROM system.peers_v2")))
        if peers < layout(settings) - 1:
            raise RuntimeError(f"node sees {peers + 1} of {layout(settings)} nodes")
        return str(row.release_version)
    finally:
        cluster.shutdown()


def ring_views(settings: Settings) -> dict[str, dict[str, frozenset[int]]]:
    """Each node's view of the ring, asked of that node alone as the admin role: its host ->
    {a node's address -> that node's tokens} (itself from system.local, the others from
    system.peers_v2). Three nodes that agree see the same three entries, none sharing a token."""
    admin = credentials.read(settings.credentials_dir, credentials.CASSANDRA_ADMIN)
    views: dict[str, dict[str, frozenset[int]]] = {}
    for host in hosts(settings):
        cluster = _cluster(settings, admin, only=host)
        try:
            session = cluster.connect()
            local = session.execute("SELECT tokens FROM system.local").one()
            view = {host: frozenset(int(t) for t in local.tokens or ())}
            for peer in session.execute("SELECT peer, tokens FROM system.peers_v2"):
                view[str(peer.peer)] = frozenset(int(t) for t in peer.tokens or ())
            views[host] = view
        finally:
            cluster.shutdown()
    return views


def wait_ready(settings: Settings, timeout_s: float = 180.0) -> float:
    """Block until CQL answers (a refused login counts: the node serves); seconds waited."""
    admin_cred = credentials.read(settings.credentials_dir, credentials.CASSANDRA_ADMIN)

    def probe() -> str | None:
        try:
            release_version(settings, admin_cred or DEFAULT_SUPERUSER)
        except Exception as exc:  # NoHostAvailable, OperationTimedOut while starting
            if not auth_failed(exc):
                raise
        return None

    ns = nodes(settings, layout(settings))
    return wait_until_serving(
        state_dir=settings.state_dir,
        processes=[(n.name, f"Cassandra node {n.index}") for n in ns],
        ports=[(n.host, settings.cassandra_port) for n in ns],
        probe=probe,
        waiting_for=f"Cassandra on {address(settings)}",
        not_ready=f"Cassandra did not answer CQL on {address(settings)}",
        excerpt=lambda name: _excerpt(settings, name),
        timeout_s=timeout_s,
        interval_s=1.0,
        last="native port closed",
    )


def _cql_string(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _login(settings: Settings, cred: credentials.Credential) -> tuple[Any, Any] | None:
    """(cluster, session) logged in as ``cred``, or None if the login is refused."""
    cluster = _cluster(settings, cred)
    try:
        return cluster, cluster.connect()
    except Exception as exc:
        cluster.shutdown()
        if auth_failed(exc):
            return None
        raise


def _admin_session(settings: Settings, admin: credentials.Credential, timeout_s: float) -> tuple[Any, Any]:
    """Log in as ``admin``; on a fresh (or pre-authentication) node create it first as
    cassandra/cassandra, waiting for Cassandra to create that default superuser."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = _login(settings, admin)
        if got is not None:
            return got
        default = _login(settings, DEFAULT_SUPERUSER)
        if default is not None:
            from cassandra import Unauthorized

            cluster, session = default
            try:
                if layout(settings) >= 3:  # (see ensure_auth: first, before the role is written)
                    session.execute(f"ALTER KEYSPACE system_auth WITH replication = {replication(settings)}")
                pw = _cql_string(admin.password)
                session.execute(
                    f'CREATE ROLE IF NOT EXISTS "{admin.username}" '
                    f"WITH SUPERUSER = true AND LOGIN = true AND PASSWORD = {pw}"
                )
                say(f"Cassandra: created superuser {admin.username} (credentials/{credentials.CASSANDRA_ADMIN}.json)")
            except Unauthorized as exc:
                # three fresh nodes: the default superuser is made by one of them, in a
                # system_auth of one replica, so a node that has not got its row yet logs
                # it in but refuses it as a superuser (seen: "User cassandra does not
                # have sufficient privileges"); it learns it within seconds
                if time.monotonic() > deadline:
                    raise
                say(f"Cassandra: the default superuser is not known on every node yet; retrying ({exc})")
                time.sleep(AUTH_RETRY_INTERVAL_S)
            finally:
                cluster.shutdown()
            time.sleep(0.5)  # let the role caches see it
            continue
        if time.monotonic() > deadline:
            raise InfraError(
                f"Cassandra refuses both {admin.username} "
                f"({credentials.path(settings.credentials_dir, credentials.CASSANDRA_ADMIN)}) and the "
                "default superuser cassandra/cassandra; restore that file (or re-create "
                f"{home(settings)} in development)"
            )
        time.sleep(1.0)  # the default superuser is created shortly after startup


def unavailable(exc: BaseException) -> bool:
    """True if ``exc`` says too few replicas answered (Unavailable, a server or client
    timeout), on every host tried: nodes that have just started, before they see each
    other as up; worth retrying."""
    from cassandra import OperationTimedOut, ReadTimeout, Unavailable, WriteTimeout
    from cassandra.cluster import NoHostAvailable

    kinds = (Unavailable, OperationTimedOut, ReadTimeout, WriteTimeout)
    if isinstance(exc, kinds):
        return True
    if isinstance(exc, InfraError) and exc.__cause__ is not None:
        return unavailable(exc.__cause__)
    if isinstance(exc, NoHostAvailable):
        errors = list(exc.errors.values())
        return bool(errors) and all(isinstance(e, kinds) for e in errors)
    return False


AUTH_RETRY_INTERVAL_S = 2.0


def ensure_auth(settings: Settings, timeout_s: float = 120.0) -> None:
    """Create or update the superuser and the application role; disable cassandra/cassandra.
    Every step is idempotent; on three nodes it is retried (for at most ``timeout_s``)
    while too few replicas are up: a node just started may not yet see the others as up
    (seen in CI: CREATE ROLE at LOCAL_QUORUM, "alive_replicas 1", seconds after all
    three nodes served CQL)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            _ensure_auth_once(settings, timeout_s)
            return
        except InfraError as exc:
            if not unavailable(exc) or time.monotonic() + AUTH_RETRY_INTERVAL_S > deadline:
                raise
            say(f"Cassandra: waiting for the nodes to see each other up ({exc.__cause__})")
            time.sleep(AUTH_RETRY_INTERVAL_S)


def _ensure_auth_once(settings: Settings, timeout_s: float) -> None:
    d = settings.credentials_dir
    credentials.ensure_dir(d)
    admin = credentials.ensure(d, credentials.CASSANDRA_ADMIN)
    app = credentials.ensure(d, credentials.CASSANDRA)
    try:
        cluster, session = _admin_session(settings, admin, timeout_s)
    except InfraError:
        raise
    except Exception as exc:
        raise InfraError(f"cannot log in to Cassandra as {admin.username}: {exc}") from exc
    try:
        if layout(settings) >= 3:  # three hosts: roles and history on all three, LOCAL_QUORUM reads 2
            # before any role is made (the admin's: ``_admin_session``): a row written while
            # system_auth had one replica is on one node only, and a LOCAL_QUORUM read of
            # two then misses it ("Role gnomon doesn't exist", a refused login: seen on
            # fresh clusters)
            session.execute(f"ALTER KEYSPACE system_auth WITH replication = {replication(settings)}")
            session.execute(f"CREATE KEYSPACE IF NOT EXISTS {KEYSPACE} WITH replication = {replication(settings)}")
        pw = _cql_string(app.password)
        session.execute(f'CREATE ROLE IF NOT EXISTS "{app.username}" WITH LOGIN = true AND PASSWORD = {pw}')
        probe = _login(settings, app)
        if probe is None:  # the file was replaced (rotation): Cassandra takes its password
            session.execute(f'ALTER ROLE "{app.username}" WITH PASSWORD = {pw} AND LOGIN = true')
            say(f"Cassandra: set the password of role {app.username} from its credentials file")
        else:
            probe[0].shutdown()
        # creates its own keyspaces (migrations, tests); a creator gets ALL on what it creates
        session.execute(f'GRANT CREATE ON ALL KEYSPACES TO "{app.username}"')
        if session.execute(
            "SELECT keyspace_name FROM system_schema.keyspaces WHERE keyspace_name = %s", (KEYSPACE,)
        ).one():  # created before authentication existed (or by another role)
            session.execute(f'GRANT ALL PERMISSIONS ON KEYSPACE {KEYSPACE} TO "{app.username}"')
        from cassandra import ConsistencyLevel
        from cassandra.query import SimpleStatement

        # Cassandra writes cassandra/cassandra while system_auth has one replica, on one
        # node: on three, a read at ONE misses it two times in three and it stayed enabled
        # (found in review); ALL finds it wherever it is (and repairs it on the others)
        # (ALL needs every node up: a node just restarted may not be seen as up yet; QUORUM
        # then, as good as it gets without it)
        levels = ((ConsistencyLevel.ALL, ConsistencyLevel.QUORUM) if layout(settings) >= 3
                  else (ConsistencyLevel.ONE,))
        query = "SELECT can_login, is_superuser FROM system_auth.roles WHERE role = %s"
        for i, level in enumerate(levels):
            try:
                default = session.execute(SimpleStatement(query, consistency_level=level),
                                          (DEFAULT_SUPERUSER.username,)).one()
                break
            except Exception:
                if i == len(levels) - 1:
                    raise
        if default is not None and (default.can_login or default.is_superuser):
            session.execute(
                f'ALTER ROLE "{DEFAULT_SUPERUSER.username}" WITH PASSWORD = '
                f"{_cql_string(credentials.generate_password())} AND LOGIN = false AND SUPERUSER = false"
            )
            say("Cassandra: disabled the default superuser cassandra/cassandra")
    except Exception as exc:
        raise InfraError(f"cannot set up Cassandra roles: {exc}") from exc
    finally:
        cluster.shutdown()


def _excerpt(settings: Settings, name: str = NAME) -> str:
    node = next((n for c in (1, 3) for n in nodes(settings, c) if n.name == name), nodes(settings)[0])
    return procs.log_excerpt(procs.out_file(settings.state_dir, node.name), node.logs / "system.log")


def running_names(settings: Settings) -> list[str]:
    return [n.name for c in (1, 3) for n in nodes(settings, c) if procs.is_running(settings.state_dir, n.name)]


def status(settings: Settings) -> dict[str, Any]:
    ns = nodes(settings, layout(settings))
    pids = [procs.running_pid(settings.state_dir, n.name) for n in ns]
    pid = pids[0]
    if all(p is None for p in pids):
        return {"state": "down"}
    serving = [p is not None and port_open(n.host, settings.cassandra_port) for n, p in zip(ns, pids, strict=True)]
    jars = sorted(fetch.lib_dir(settings.state_dir, COMPONENT).glob("cassandra-all-*.jar"))
    return {
        "state": "up" if all(serving) else ("degraded" if any(serving) else "starting"),
        "pid": pid,
        "members": [procs.member_state(n.name, n.host, p, up) for n, p, up in zip(ns, pids, serving, strict=True)],
        "address": address(settings),
        "version": jars[-1].name.removeprefix("cassandra-all-").removesuffix(".jar")
        if jars
        else None,
    }
