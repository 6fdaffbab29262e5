"""Credentials of gnomon's principals: one JSON file per principal, mode 0600.

A module of its own (not under ``gnomon.infra``) because both sides use it: the local
stack's runner writes the files, and the Kafka and Cassandra clients read them
(``gnomon.adapters.kafka``, ``gnomon.history.session``) without importing the runner.

``<credentials_dir>/<name>.json`` holds ``{"username": ..., "password": ...}``; the
directory (``Settings.credentials_dir``, default ``<state_dir>/credentials``) is 0700.
``gnomon infra up`` creates what is missing and never changes an existing file, so an
operator may put their own credentials there first (infra/README.md).

Names: the Kafka roles of :data:`KAFKA_ROLES` (SCRAM users of the same name),
``kafka-broker`` (the brokers' inter-broker SCRAM user), ``kafka-controller`` (SASL/PLAIN
on the controller listener, servers only), ``cassandra`` (the application role
``gnomon``), ``cassandra-admin`` (the superuser that replaces ``cassandra/cassandra``),
``registry-admin`` and ``registry-reader`` (the schema registry's two HTTP Basic users).

Files are written atomically: a new file is created with ``O_CREAT|O_EXCL`` and mode
0600 in the same directory, then renamed over the old one, so a secret is never
readable by others, not even for a moment. Nothing here touches ``os.environ``.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gnomon.core.errors import InfraError

KAFKA_ROLES: tuple[str, ...] = ("admin", "api", "processor", "worker", "projector", "connect", "registry", "alerter",
                                 "producer")
"""Kafka principals (``User:<role>``); admin is the super user. ACLs: gnomon.infra.acls. ``producer`` is
the credential an operator hands a team's own service (docs/job-events.md); ``api`` stays the API's own."""
KAFKA_BROKER = "kafka-broker"
KAFKA_CONTROLLER = "kafka-controller"
CASSANDRA = "cassandra"
CASSANDRA_ADMIN = "cassandra-admin"
REGISTRY_ADMIN = "registry-admin"  # the schema registry's writer (HTTP Basic; gnomon.registry.auth)
REGISTRY_READER = "registry-reader"  # its read-only user: producers, Connect's converter

USERNAMES = {KAFKA_BROKER: "broker", KAFKA_CONTROLLER: "controller", CASSANDRA: "gnomon",
             CASSANDRA_ADMIN: "gnomon_admin"}
"""Default user names where they differ from the file name."""

DIR_MODE = 0o700
FILE_MODE = 0o600


@dataclass(frozen=True)
class Credential:
    username: str
    password: str = field(repr=False)


class CredentialError(InfraError):
    """A credentials file exists but cannot be used (unreadable, malformed)."""


def path(directory: Path, name: str) -> Path:
    return directory / f"{name}.json"


def read(directory: Path, name: str) -> Credential | None:
    """The credential ``name`` from ``directory``; None if there is no such file."""
    p = path(directory, name)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise CredentialError(f"cannot read credentials {p}: {exc}") from exc
    if not isinstance(data, dict) or not data.get("username") or not data.get("password"):
        raise CredentialError(f"{p} must hold a JSON object with non-empty username and password")
    return Credential(str(data["username"]), str(data["password"]))


def ensure_dir(directory: Path) -> None:
    directory.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    os.chmod(directory, DIR_MODE)


def write_secret(target: Path, text: str) -> None:
    """Write ``text`` to ``target`` atomically with mode 0600 (never briefly wider)."""
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write(directory: Path, name: str, cred: Credential) -> Path:
    ensure_dir(directory)
    p = path(directory, name)
    write_secret(p, json.dumps({"username": cred.username, "password": cred.password}, indent=2) + "\n")
    return p


def generate_password() -> str:
    """192 random bits, hex: safe in JAAS strings, CQL literals and .properties files."""
    return secrets.token_hex(24)


def ensure(directory: Path, name: str, username: str | None = None) -> Credential:
    """The credential ``name``; generated (and written) if the file does not exist yet."""
    existing = read(directory, name)
    if existing is not None:
        return existing
    cred = Credential(username or USERNAMES.get(name, name), generate_password())
    write(directory, name, cred)
    return cred


def ensure_all(directory: Path) -> dict[str, Credential]:
    """Every credential the local stack uses, generating the missing ones."""
    names = (*KAFKA_ROLES, KAFKA_BROKER, KAFKA_CONTROLLER, CASSANDRA, CASSANDRA_ADMIN, REGISTRY_ADMIN, REGISTRY_READER)
    ensure_dir(directory)
    return {n: ensure(directory, n) for n in names}


# ---- TLS of the local stack (gnomon.infra.tls writes these; the clients read them) -------

TLS_DIR = "tls"
TLS_MARKER = "enabled"
CA_FILE_ENV = "GNOMON_KAFKA_CA_FILE"


def tls_enabled(state_dir: Path) -> bool:
    """Does the stack of ``state_dir`` run with TLS (``gnomon infra up --tls``)?"""
    return (state_dir / TLS_DIR / TLS_MARKER).exists()


def tls_ca_file(state_dir: Path) -> Path | None:
    """The CA certificate a client trusts: ``$GNOMON_KAFKA_CA_FILE``, else the local
    stack's (when it runs with TLS), else None (the system's CAs)."""
    if os.environ.get(CA_FILE_ENV):
        return Path(os.environ[CA_FILE_ENV])
    ca = state_dir / TLS_DIR / "ca.pem"
    return ca if tls_enabled(state_dir) and ca.exists() else None


CASSANDRA_TLS_ENV = "GNOMON_CASSANDRA_TLS"
CASSANDRA_CA_FILE_ENV = "GNOMON_CASSANDRA_CA_FILE"


def cassandra_ssl_context(state_dir: Path) -> Any:
    """The TLS context of a Cassandra client (an ``ssl.SSLContext`` that checks the
    node's certificate and name), or None for plaintext: TLS when
    ``$GNOMON_CASSANDRA_TLS`` is 1 (trusting ``$GNOMON_CASSANDRA_CA_FILE``, else the
    system's CAs) or when the local stack of ``state_dir`` runs with TLS (its CA)."""
    import ssl

    on = os.environ.get(CASSANDRA_TLS_ENV)
    if on is not None and on.strip() not in ("", "1", "0", "true", "false"):
        raise InfraError(f"{CASSANDRA_TLS_ENV}={on!r}: use 1 or 0")
    wanted = on.strip() in ("1", "true") if on is not None and on.strip() else tls_enabled(state_dir)
    if not wanted:
        return None
    ca = os.environ.get(CASSANDRA_CA_FILE_ENV) or (str(state_dir / TLS_DIR / "ca.pem")
                                                   if tls_enabled(state_dir) else None)
    ctx = ssl.create_default_context(cafile=ca)  # verifies the chain and the node's address
    return ctx
