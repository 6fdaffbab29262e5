"""confluent-kafka configuration, in one place (the clients themselves are built in
``gnomon.eventlog.kafka``, the one module that imports confluent_kafka).

Every producer uses acks=all, idempotence and the ``murmur2_random`` partitioner so
that keys land on the same partitions as Java and aiokafka clients would put them.

Authentication (docs/adr/0006-kafka-auth-and-tenant-proof.md): every config carries the
SASL settings of a *role* (a Kafka principal ``User:<role>``, its ACLs in
``gnomon.infra.acls``). The role is the ``role=`` argument, else the one of an enclosing
``with kafka_role(...)``, else ``$GNOMON_KAFKA_ROLE``, else ``admin`` (development:
tests, benches, tools). Its credentials come from ``$GNOMON_KAFKA_USERNAME`` /
``$GNOMON_KAFKA_PASSWORD`` (production) or from the file ``gnomon infra up`` wrote,
``<credentials_dir>/<role>.json``. Without either, no SASL settings are added (a Kafka
without authentication, e.g. docker-compose.yml). Credentials only ever go into client
configs, never into ``os.environ``.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from gnomon.core.errors import EventLogError

log = logging.getLogger("gnomon.kafka")

ROLE_ENV = "GNOMON_KAFKA_ROLE"
USERNAME_ENV = "GNOMON_KAFKA_USERNAME"
PASSWORD_ENV = "GNOMON_KAFKA_PASSWORD"
PROTOCOL_ENV = "GNOMON_KAFKA_SECURITY_PROTOCOL"  # SASL_SSL in production; default SASL_PLAINTEXT
MECHANISM_ENV = "GNOMON_KAFKA_SASL_MECHANISM"
DEFAULT_ROLE = "admin"
DEFAULT_MECHANISM = "SCRAM-SHA-512"

_role: ContextVar[str | None] = ContextVar("gnomon_kafka_role", default=None)
_stack: ContextVar[Path | None] = ContextVar("gnomon_kafka_stack", default=None)
_warned: set[str] = set()


@contextlib.contextmanager
def kafka_role(role: str) -> Iterator[None]:
    """Clients configured inside this block (same thread/task) default to ``role``."""
    token = _role.set(role)
    try:
        yield
    finally:
        _role.reset(token)


@contextlib.contextmanager
def kafka_stack(state_dir: Path) -> Iterator[None]:
    """Clients configured inside this block follow the TLS mode of the local stack in
    ``state_dir`` (``gnomon infra`` acting on a stack other than $GNOMON_STATE_DIR's)."""
    token = _stack.set(state_dir)
    try:
        yield
    finally:
        _stack.reset(token)


def current_role(role: str | None = None) -> str:
    return role or _role.get() or os.environ.get(ROLE_ENV) or DEFAULT_ROLE


def security_config(role: str | None = None, *, credentials_dir: Path | None = None) -> dict[str, Any]:
    """The librdkafka security settings of ``role`` (see the module doc); {} without credentials."""
    from gnomon import credentials
    from gnomon.config import load

    settings = load()
    stack = _stack.get() or settings.state_dir
    tls = credentials.tls_enabled(stack)
    protocol = os.environ.get(PROTOCOL_ENV) or ("SASL_SSL" if tls else "SASL_PLAINTEXT")
    mechanism = os.environ.get(MECHANISM_ENV) or DEFAULT_MECHANISM
    ssl: dict[str, Any] = {}
    if protocol.endswith("SSL") and (ca := credentials.tls_ca_file(stack)) is not None:
        ssl["ssl.ca.location"] = str(ca)
    username, password = os.environ.get(USERNAME_ENV), os.environ.get(PASSWORD_ENV)
    if not (username and password):
        who = current_role(role)
        if credentials_dir is None:
            credentials_dir = settings.credentials_dir
        try:
            cred = credentials.read(credentials_dir, who)
        except credentials.CredentialError as exc:
            raise EventLogError(str(exc)) from exc
        if cred is None:
            if who not in _warned:
                _warned.add(who)
                log.warning("no Kafka credentials for role %s (%s, $%s/$%s): connecting without "
                            "authentication", who, credentials.path(credentials_dir, who), USERNAME_ENV,
                            PASSWORD_ENV)
            if os.environ.get(PROTOCOL_ENV):
                return {"security.protocol": os.environ[PROTOCOL_ENV], **ssl}
            return {"security.protocol": "SSL", **ssl} if tls else {}
        username, password = cred.username, cred.password
    return {"security.protocol": protocol, "sasl.mechanism": mechanism,
            "sasl.username": username, "sasl.password": password, **ssl}


METADATA_REFRESH_MS = 5_000  # clients see a topic's new partitions within this (docs/adr/0012)
# A consumer's request unanswered this long fails, and its connection is closed (default
# 60 s). A broker cut off drops packets without closing anything: a metadata request that
# went to it held a standby's group join back 40 s after a region's takeover (the join
# waits for metadata), and a stale connection to its old group coordinator stays "up"
# until some request on it times out (ADR 0013, region loss)
CONSUMER_SOCKET_TIMEOUT_MS = 6_000


def producer_config(bootstrap: str, *, role: str | None = None, **extra: Any) -> dict[str, Any]:
    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "enable.idempotence": True,
        "partitioner": "murmur2_random",
        "linger.ms": 5,
        "compression.type": "lz4",
        "message.timeout.ms": 30_000,
        "topic.metadata.refresh.interval.ms": METADATA_REFRESH_MS,
        **security_config(role),
    }
    conf.update(extra)
    return conf


def consumer_config(bootstrap: str, group_id: str, **extra: Any) -> dict[str, Any]:
    """gnomon's consumer settings, then ``extra`` (librdkafka keys). The keyword ``role``
    (str or None), taken out of ``extra``, picks the Kafka principal (:func:`security_config`).
    (Not a keyword-only parameter: callers pass librdkafka keys as ``**{...}``, which a
    typed ``role`` parameter would make every such call ill-typed.)"""
    role = extra.pop("role", None)
    if role is not None and not isinstance(role, str):
        raise TypeError(f"role must be a str or None, not {type(role).__name__}")
    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": group_id,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
        "session.timeout.ms": 10_000,
        "heartbeat.interval.ms": 1_000,
        "max.poll.interval.ms": 300_000,
        "socket.timeout.ms": CONSUMER_SOCKET_TIMEOUT_MS,
        # partitions added to a topic (``gnomon infra grow``) are seen this soon (default 5 min)
        "topic.metadata.refresh.interval.ms": METADATA_REFRESH_MS,
        **security_config(role),
    }
    conf.update(extra)
    return conf


def aiokafka_security(role: str | None = None) -> dict[str, Any]:
    """:func:`security_config` as aiokafka keyword arguments (Faust: ``SASLCredentials``)."""
    sec = security_config(role)
    if "sasl.username" not in sec:
        return {}
    return {"security_protocol": sec["security.protocol"], "sasl_mechanism": sec["sasl.mechanism"],
            "sasl_plain_username": sec["sasl.username"], "sasl_plain_password": sec["sasl.password"]}


def admin_config(bootstrap: str, *, role: str | None = None, **extra: Any) -> dict[str, Any]:
    """An AdminClient config (default role: as for producers, i.e. admin in development)."""
    return {"bootstrap.servers": bootstrap, **security_config(role), **extra}


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (as in the Java client's Utils.murmur2)."""
    length = len(data)
    seed = 0x9747B28C
    m = 0x5BD1E995
    r = 24
    h = (seed ^ length) & 0xFFFFFFFF
    length4 = length // 4
    for i in range(length4):
        i4 = i * 4
        k = (data[i4] & 0xFF) + ((data[i4 + 1] & 0xFF) << 8) + ((data[i4 + 2] & 0xFF) << 16) + ((data[i4 + 3] & 0xFF) << 24)
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = (h * m) & 0xFFFFFFFF
        h ^= k
    extra = length % 4
    idx = length & ~3
    if extra == 3:
        h ^= (data[idx + 2] & 0xFF) << 16
    if extra >= 2:
        h ^= (data[idx + 1] & 0xFF) << 8
    if extra >= 1:
        h ^= data[idx] & 0xFF
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h


def partition_for(key: str, partitions: int) -> int:
    """The partition Java's default partitioner (and murmur2_random) picks for a key."""
    return (murmur2(key.encode()) & 0x7FFFFFFF) % partitions
