"""Kafka Connect in standalone mode, one worker on 127.0.0.1, exporting gnomon topics.

Not started by default: ``python -m gnomon.infra up --only connect`` (after Kafka is up).
The worker runs ``org.apache.kafka.connect.cli.ConnectStandalone worker.properties
<connector>.properties...`` from the jars of ``infra/connect/pom.xml``.

Files: ``connectors/worker.properties`` and every other ``connectors/*.properties`` are
templates (``$name`` placeholders, lower case only, so Java names like ``Cast$Value``
stay as they are); they are rendered to ``<state_dir>/connect/``. The standalone offsets
file is ``<state_dir>/connect/connect.offsets``, exports go to ``<state_dir>/exports/``
and the full log to ``<state_dir>/logs/connect/connect.log``.

Authentication: the worker connects to Kafka as the role ``connect`` (SCRAM; read
``gnomon.run-exports``, groups ``connect-*``: ``gnomon.infra.acls``); its credentials are
rendered into ``worker.properties`` (``sasl.jaas.config`` and the ``producer.``/
``consumer.``/``admin.`` copies), which is therefore written 0600.

REST port: ``$GNOMON_CONNECT_PORT`` (default 8083), bound to 127.0.0.1, behind HTTP basic
authentication (Kafka's ``BasicAuthSecurityRestExtension``): one user, ``gnomon``, whose
password ``start`` makes once and keeps in ``<state_dir>/connect/rest-users.properties``
(0600; the JAAS file beside it names it). Without it any local process, or a web page in
a local browser through DNS rebinding, could read, change or delete the connectors
(``rest_auth`` gives gnomon's own calls the credential). Healthy means
``GET /connectors?expand=status`` lists every configured connector with the connector
and all its tasks RUNNING.

Plugins: ``plugin.path`` is ``<state_dir>/connect-plugins`` (gnomon's registry converter,
built with Maven, and the Debezium JDBC sink; ``gnomon.infra.connect_plugins``). The run
exports (``gnomon.run-exports``) go to PostgreSQL (``runs-postgres-sink``, the server of
``gnomon.infra.postgres``) and to ``<state_dir>/exports/runs.jsonl``, both decoded by the
registry converter against ``Settings.registry_url`` (``$GNOMON_REGISTRY_URL``, default
http://127.0.0.1:8081, the registry ``gnomon infra up`` starts).

(The older export of ``gnomon.run-history`` as base64 lines, and its ``decode`` command,
were removed with that topic on 2026-12-04.) See ``connectors/README.md``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from string import Template
from typing import Any

from gnomon.config import REPO_ROOT, Settings
from gnomon.infra import connect_plugins, fetch, jvm, kafka, postgres, procs
from gnomon.infra.errors import InfraError
from gnomon.infra.net import port_open
from gnomon.infra.readiness import wait_until_serving

COMPONENT = "connect"
LABEL = "Kafka Connect"
NAME = "connect"
JAVA_VERSIONS = (17, 21, 11)
HEAP = ("-Xms128m", "-Xmx512m")
GC = ("-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-XX:+ExitOnOutOfMemoryError")
HOST = "127.0.0.1"
DEFAULT_PORT = 8083
PORT_ENV = "GNOMON_CONNECT_PORT"
CONF_DIR = fetch.INFRA_DIR / "connect"
CONNECTORS_DIR = REPO_ROOT / "connectors"
WORKER_TEMPLATE = CONNECTORS_DIR / "worker.properties"
MAIN_CLASS = "org.apache.kafka.connect.cli.ConnectStandalone"


def rest_port() -> int:
    """``$GNOMON_CONNECT_PORT`` or 8083."""
    raw = os.environ.get(PORT_ENV, "")
    try:
        return int(raw) if raw else DEFAULT_PORT
    except ValueError as exc:
        raise InfraError(f"environment variable {PORT_ENV}={raw!r} is not an integer") from exc


@dataclass(frozen=True)
class Worker:
    """Where one Connect worker keeps its files and listens."""

    state_dir: Path
    port: int

    @property
    def home(self) -> Path:
        return self.state_dir / "connect"

    @property
    def config(self) -> Path:
        return self.home / "worker.properties"

    @property
    def connectors_dir(self) -> Path:
        return self.home / "connectors"

    @property
    def offsets_file(self) -> Path:
        return self.home / "connect.offsets"

    @property
    def exports_dir(self) -> Path:
        return self.state_dir / "exports"

    @property
    def logs(self) -> Path:
        return self.state_dir / "logs" / "connect"

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def rest_users(self) -> Path:
        """The 0600 ``user=password`` file of the REST API's basic authentication."""
        return self.home / "rest-users.properties"

    @property
    def rest_jaas(self) -> Path:
        """The JAAS file naming ``rest_users`` for the worker's ``KafkaConnect`` login."""
        return self.home / "rest-jaas.conf"


def worker(settings: Settings, port: int | None = None) -> Worker:
    """The worker of ``settings.state_dir`` on ``port``, else ``$GNOMON_CONNECT_PORT``/8083."""
    return Worker(settings.state_dir, rest_port() if port is None else port)


def running_worker(settings: Settings) -> Worker:
    """The worker as last started: its port comes from the rendered worker.properties
    (so ``status`` finds a worker started with an explicit port)."""
    w = worker(settings)
    try:
        port = parse_properties(w.config.read_text()).get("rest.advertised.port", "")
    except FileNotFoundError:
        return w
    return Worker(settings.state_dir, int(port)) if port.isdigit() else w


# --- templates ----------------------------------------------------------------------


class _Template(Template):
    """``$name`` / ``${name}`` with lower-case names only: ``Cast$Value`` is left alone."""

    flags = re.RegexFlag(0)
    idpattern = r"[a-z][a-z0-9_]*"


# a placeholder left unfilled: ``$name`` or ``${name}``; not a config provider's
# ``${file:path:key}`` (Connect resolves those when it starts the connector)
_LEFTOVER = re.compile(r"\$(?:\{([a-z][a-z0-9_]*)\}|([a-z][a-z0-9_]*))")


def render_properties(
    template: str, variables: Mapping[str, object], overrides: Mapping[str, str] | None = None
) -> str:
    """Fill ``$name`` placeholders, then set each key of ``overrides`` (replacing its line,
    or appending it). Raises InfraError for a placeholder without a value."""
    text = _Template(template).safe_substitute({k: str(v) for k, v in variables.items()})
    for line in text.splitlines():
        leftover = _LEFTOVER.search(line)
        if leftover and not line.lstrip().startswith(("#", "!")):  # comments may say `$name`
            raise InfraError(f"no value for ${leftover.group(1) or leftover.group(2)} in a Connect properties "
                             "template")
    for key, value in (overrides or {}).items():
        line = f"{key}={value}"
        pattern = re.compile(rf"^{re.escape(key)}\s*[=:].*$", re.MULTILINE)
        text, n = pattern.subn(line.replace("\\", "\\\\"), text)
        if n == 0:
            text = text.rstrip("\n") + f"\n{line}\n"
    return text


def parse_properties(text: str) -> dict[str, str]:
    """The ``key=value`` pairs of a simple .properties text (no continuation lines)."""
    props: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        key, _, value = line.partition("=")
        props[key.strip()] = value.strip()
    return props


ROLE = "connect"  # the Kafka principal User:connect (gnomon.infra.acls)


def security_variables(settings: Settings, role: str = ROLE) -> dict[str, str]:
    """``security_protocol``, ``sasl_mechanism``, ``sasl_jaas_config`` for the worker
    template, from the role's credentials (see gnomon.adapters.kafka.security_config)."""
    from gnomon.adapters.kafka import security_config

    sec = security_config(role, credentials_dir=settings.credentials_dir)
    if "sasl.username" not in sec:
        raise InfraError(
            f"no Kafka credentials for the Connect worker (role {role}); run "
            "`python -m gnomon.infra up` first, or set GNOMON_KAFKA_USERNAME/GNOMON_KAFKA_PASSWORD"
        )
    for value in (sec["sasl.username"], sec["sasl.password"]):
        if any(ch in value for ch in '"\\\n'):
            raise InfraError("Kafka credentials for Connect must not contain quotes, backslashes or newlines")
    module = (
        "org.apache.kafka.common.security.plain.PlainLoginModule"
        if sec["sasl.mechanism"] == "PLAIN"
        else "org.apache.kafka.common.security.scram.ScramLoginModule"
    )
    ca = sec.get("ssl.ca.location")
    tls_config = "# TLS off" if ca is None else "\n".join(
        f"{prefix}ssl.truststore.{key}={value}"
        for prefix in ("", "producer.", "consumer.", "admin.") for key, value in (("type", "PEM"), ("location", ca)))
    return {
        "tls_config": tls_config,
        "security_protocol": sec["security.protocol"],
        "sasl_mechanism": sec["sasl.mechanism"],
        "sasl_jaas_config": f'{module} required username="{sec["sasl.username"]}" '
        f'password="{sec["sasl.password"]}";',
    }


def template_variables(settings: Settings, w: Worker, role: str = ROLE,
                       plugins: Path | None = None) -> dict[str, object]:
    layout = kafka.running_layout(settings) or 1
    pg = postgres.export_credential(settings)
    return {
        **security_variables(settings, role),
        "bootstrap": kafka.bootstrap(settings, layout),
        "rest_port": w.port,
        "offsets_file": w.offsets_file,
        "exports_dir": w.exports_dir,
        "state_dir": w.state_dir,
        "plugin_path": plugins or connect_plugins.plugin_path(w.state_dir),
        "registry_url": settings.registry_url,  # the schema registry `gnomon infra up` starts
        "postgres_url": postgres.jdbc_url(settings),
        "postgres_user": pg.username,
        # resolved by the worker's FileConfigProvider when it starts the connector: Connect's
        # REST API shows this reference, never the password (KIP-297)
        "postgres_password": "${file:" + str(secrets_file(w)) + ":" + POSTGRES_PASSWORD_KEY + "}",
        # the registry's read-only user (gnomon.registry.auth), resolved the same way
        "registry_user_info": "${file:" + str(secrets_file(w)) + ":" + REGISTRY_USER_INFO_KEY + "}",
    }


POSTGRES_PASSWORD_KEY = "postgres.password"
REGISTRY_USER_INFO_KEY = "registry.user.info"


def secrets_file(w: Worker) -> Path:
    """The 0600 properties file of the connectors' secrets (FileConfigProvider reads it)."""
    return w.home / "secrets.properties"


REST_USER = "gnomon"
REST_LOGIN_MODULE = "org.apache.kafka.connect.rest.basic.auth.extension.PropertyFileLoginModule"


def rest_auth(w: Worker) -> tuple[str, str]:
    """(user, password) of the worker's REST API, made once (``ensure_rest_credential``)."""
    try:
        text = w.rest_users.read_text()
    except FileNotFoundError as exc:
        raise InfraError(f"no REST credential for Kafka Connect at {w.rest_users}; start it with "
                         "`python -m gnomon.infra up --only connect`") from exc
    users = parse_properties(text)
    if REST_USER not in users:
        raise InfraError(f"{w.rest_users} has no `{REST_USER}=` line")
    return REST_USER, users[REST_USER]


def ensure_rest_credential(w: Worker) -> None:
    """The REST user's password file (kept across restarts: made only if missing) and
    the JAAS file that points the worker's ``KafkaConnect`` login at it, both 0600."""
    import secrets

    from gnomon.credentials import write_secret

    w.home.mkdir(parents=True, exist_ok=True)
    if not w.rest_users.exists():
        write_secret(w.rest_users, f"{REST_USER}={secrets.token_urlsafe(24)}\n")
    path = str(w.rest_users)
    if any(ch in path for ch in '"\\\n'):
        raise InfraError(f"the state directory's path must not hold quotes or backslashes: {path}")
    write_secret(w.rest_jaas, f'KafkaConnect {{\n  {REST_LOGIN_MODULE} required\n  file="{path}";\n}};\n')


def connector_templates() -> list[Path]:
    """``connectors/*.properties`` except the worker's."""
    return sorted(p for p in CONNECTORS_DIR.glob("*.properties") if p != WORKER_TEMPLATE)


def render(
    settings: Settings,
    w: Worker,
    connectors: Sequence[Path | tuple[Path, Mapping[str, str]]],
    role: str = ROLE,
    plugins: Path | None = None,
) -> list[Path]:
    """Write the worker config and one file per connector (a template, or a template and
    property overrides) under ``w.home``, all 0600 (they may hold passwords). Returns the
    rendered connector files."""
    variables = template_variables(settings, w, role, plugins)
    w.home.mkdir(parents=True, exist_ok=True)
    w.exports_dir.mkdir(parents=True, exist_ok=True)  # FileStreamSink does not create dirs
    w.logs.mkdir(parents=True, exist_ok=True)
    from gnomon.credentials import write_secret

    write_secret(w.config, render_properties(WORKER_TEMPLATE.read_text(), variables))  # holds a password
    ensure_rest_credential(w)
    from gnomon.infra import registry
    from gnomon.registry.auth import user_info

    write_secret(secrets_file(w), f"{POSTGRES_PASSWORD_KEY}={postgres.export_credential(settings).password}\n"
                                  f"{REGISTRY_USER_INFO_KEY}={user_info(registry.reader(settings))}\n")
    _clear_connectors(w.connectors_dir)
    rendered = []
    for item in connectors:
        path, overrides = item if isinstance(item, tuple) else (item, {})
        text = render_properties(path.read_text(), variables, overrides)
        name = parse_properties(text).get("name")
        if not name:
            raise InfraError(f"{path} has no `name=` property")
        out = w.connectors_dir / f"{name}.properties"
        write_secret(out, text)  # (secrets are references to secrets_file, but keep them private)
        rendered.append(out)
    return rendered


def _clear_connectors(directory: Path) -> None:
    """Make ``directory`` exist and hold no files (stale connectors must not linger)."""
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.glob("*.properties"):
        old.unlink()


def connector_names(w: Worker) -> list[str]:
    """Names of the connectors the worker was (last) started with."""
    return sorted(
        parse_properties(p.read_text()).get("name", p.stem)
        for p in w.connectors_dir.glob("*.properties")
    )


# --- running ------------------------------------------------------------------------


def command(w: Worker, java: str, lib: Path, connector_files: Sequence[Path]) -> list[str]:
    return [
        java,
        *HEAP,
        *GC,
        procs.marker(NAME),
        "-Djava.awt.headless=true",
        f"-Dkafka.logs.dir={w.logs}",
        f"-Dlog4j.configuration=file:{CONF_DIR / 'log4j.properties'}",
        f"-Djava.security.auth.login.config={w.rest_jaas}",  # the REST API's basic authentication
        "-cp",
        jvm.classpath(lib),
        MAIN_CLASS,
        str(w.config),
        *(str(p) for p in connector_files),
    ]


def start(
    settings: Settings,
    *,
    port: int | None = None,
    connectors: Sequence[Path | tuple[Path, Mapping[str, str]]] | None = None,
    lib: Path | None = None,
    role: str = ROLE,
    plugins: Path | None = None,
) -> int:
    """Render configs and start the worker unless it runs. Returns the pid.

    ``connectors`` defaults to every template in ``connectors/``; ``lib`` to the jars
    fetched into ``settings.state_dir`` (pass another state dir's to reuse them);
    ``plugins`` (the ``plugin.path``) to the plugins built and fetched into the state dir
    ``lib`` belongs to (``gnomon.infra.connect_plugins``).
    """
    w = worker(settings, port)
    pid = procs.running_pid(settings.state_dir, NAME)
    if pid is not None:
        return pid
    java = jvm.find_java(JAVA_VERSIONS, LABEL)
    if lib is None:
        lib = fetch.fetch(settings.state_dir, COMPONENT, LABEL)
    if plugins is None:
        plugins = connect_plugins.ensure(lib.parent.parent)  # <state_dir>/lib/connect -> <state_dir>
    variables = template_variables(settings, w, role, plugins)
    first = str(variables["bootstrap"]).split(",")[0]
    host, _, kport = first.rpartition(":")
    if not port_open(host, int(kport)):
        raise InfraError(
            f"Kafka Connect needs Kafka, but nothing listens on {first}; "
            f"run `python -m gnomon.infra up` first"
        )
    if port_open(HOST, w.port):
        raise InfraError(
            f"{HOST}:{w.port} is already in use by another process; stop it or choose "
            f"another port ({PORT_ENV})"
        )
    files = render(settings, w, connector_templates() if connectors is None else connectors, role, plugins)
    return procs.start(settings.state_dir, NAME, command(w, java, lib, files), cwd=w.home)


def connectors_status(w: Worker, timeout_s: float = 5.0) -> dict[str, Any]:
    """``GET /connectors?expand=status``: connector name -> its status document."""
    import httpx

    response = httpx.get(f"{w.url}/connectors", params={"expand": "status"}, auth=rest_auth(w), timeout=timeout_s)
    response.raise_for_status()
    return {name: doc["status"] for name, doc in response.json().items()}


def _states(status: Mapping[str, Any]) -> tuple[str, list[str]]:
    return status["connector"]["state"], [t["state"] for t in status.get("tasks", [])]


def _running(status: Mapping[str, Any]) -> bool:
    conn, tasks = _states(status)
    return conn == "RUNNING" and bool(tasks) and all(t == "RUNNING" for t in tasks)


def _failure(name: str, status: Mapping[str, Any]) -> str | None:
    for part in (status["connector"], *status.get("tasks", [])):
        if part.get("state") == "FAILED":
            trace = str(part.get("trace", "")).strip().splitlines()[:8]
            which = "connector" if part is status["connector"] else f"task {part.get('id')}"
            return f"connector {name}: {which} FAILED\n" + "\n".join(trace)
    return None


def wait_ready(settings: Settings, port: int | None = None, timeout_s: float = 90.0) -> float:
    """Block until the REST API lists every configured connector, all RUNNING (connector
    and tasks). Returns seconds waited; raises at once when one FAILED."""
    w = running_worker(settings) if port is None else worker(settings, port)
    expected = connector_names(w)

    def probe() -> str | None:
        statuses = connectors_status(w)  # httpx errors, 404/503 while the herder starts
        for name, st in statuses.items():
            failure = _failure(name, st)
            if failure:
                raise InfraError(f"Kafka Connect {failure}")
        missing = [n for n in expected if n not in statuses]
        waiting = [n for n in expected if n in statuses and not _running(statuses[n])]
        if not missing and not waiting:
            return None
        return f"missing {', '.join(missing)}" if missing else f"not running: {', '.join(waiting)}"

    return wait_until_serving(
        state_dir=settings.state_dir,
        processes=[(NAME, "Kafka Connect")],
        ports=[w.port],
        probe=probe,
        waiting_for=f"Kafka Connect on {w.url}",
        not_ready=f"Kafka Connect was not ready on {w.url}",
        excerpt=lambda _name: _excerpt(w),
        timeout_s=timeout_s,
        last="REST port closed",
    )


def _excerpt(w: Worker) -> str:
    return procs.log_excerpt(procs.out_file(w.state_dir, NAME), w.logs / "connect.log")


def stop(settings: Settings, timeout_s: float = 30.0) -> bool:
    """Stop the worker (idempotent). True if it was running."""
    return procs.stop(settings.state_dir, NAME, timeout_s)


def running_names(settings: Settings) -> list[str]:
    return [NAME] if procs.is_running(settings.state_dir, NAME) else []


def status(settings: Settings, port: int | None = None) -> dict[str, Any]:
    pid = procs.running_pid(settings.state_dir, NAME)
    if pid is None:
        return {"state": "down"}
    w = running_worker(settings) if port is None else worker(settings, port)
    info: dict[str, Any] = {"pid": pid, "rest": w.url, "version": connect_version(settings)}
    try:
        statuses = connectors_status(w, timeout_s=2.0)
    except Exception:
        return {"state": "starting", **info}
    states = {name: _states(st)[0] for name, st in statuses.items()}
    expected = connector_names(w)
    healthy = all(n in statuses and _running(statuses[n]) for n in expected)
    return {"state": "up" if healthy else "degraded", **info, "connectors": states}


def connect_version(settings: Settings) -> str | None:
    jars = sorted(fetch.lib_dir(settings.state_dir, COMPONENT).glob("connect-runtime-*.jar"))
    return jars[-1].name.removeprefix("connect-runtime-").removesuffix(".jar") if jars else None
