"""Connecting to Cassandra: gnomon's driver settings and credentials, and the
translation of driver exceptions into ``HistoryStoreError``.

Shared by the store (``gnomon.history.cassandra``) and the migrator
(``gnomon.history.migrate``), which therefore do not import each other's module for it.
Nothing here imports cassandra-driver at module level.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

from gnomon.core.errors import HistoryStoreError, InfraError

__all__ = ["PASSWORD_ENV", "USERNAME_ENV", "client_credentials", "connect", "one_line", "translate_errors"]

_MESSAGE_MAX = 300
# A node that stops answering without closing its connections (cut off, not killed) is
# found by the driver's idle heartbeat: one unanswered within this long marks it down.
HEARTBEAT_S = 5.0
HEARTBEAT_TIMEOUT_S = 5.0
# A read (an idempotent statement) not answered within this long is also sent to the next
# node of its plan, and the first answer wins: a read routed to a silent node answers
# from another replica instead of waiting out the request timeout (the API stays up
# while one host of three is cut off). Writes are not speculated.
SPECULATIVE_DELAY_S = 1.0
SPECULATIVE_ATTEMPTS_MAX = 2


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or "(no message)"
    if len(text) > _MESSAGE_MAX:
        text = text[: _MESSAGE_MAX - 3] + "..."
    return f"{type(exc).__name__}: {text}"


def _driver_errors() -> tuple[type[BaseException], ...]:
    from cassandra import DriverException
    from cassandra.cluster import NoHostAvailable
    from cassandra.connection import ConnectionException

    return (DriverException, NoHostAvailable, ConnectionException, OSError)


@contextlib.contextmanager
def translate_errors(op: str) -> Iterator[None]:
    """Turn cassandra-driver (and socket) exceptions into ``HistoryStoreError``."""
    try:
        yield
    except HistoryStoreError:
        raise
    except _driver_errors() as exc:
        raise HistoryStoreError(f"cassandra {op}: {one_line(exc)}") from exc


USERNAME_ENV, PASSWORD_ENV = "GNOMON_CASSANDRA_USERNAME", "GNOMON_CASSANDRA_PASSWORD"
_DEFAULT: Any = object()


def client_credentials() -> tuple[str, str] | None:
    """(username, password) for Cassandra: ``$GNOMON_CASSANDRA_USERNAME``/``_PASSWORD``, else
    the role ``gnomon infra up`` created (``<credentials_dir>/cassandra.json``), else None
    (a Cassandra without authentication). Never put into ``os.environ`` by gnomon."""
    import os

    username, password = os.environ.get(USERNAME_ENV), os.environ.get(PASSWORD_ENV)
    if username and password:
        return username, password
    from gnomon import credentials
    from gnomon.config import load

    try:
        cred = credentials.read(load().credentials_dir, credentials.CASSANDRA)
    except credentials.CredentialError as exc:
        raise HistoryStoreError(str(exc)) from exc
    return (cred.username, cred.password) if cred else None


def connect(
    hosts: Sequence[str],
    port: int = 9042,
    *,
    connect_timeout_s: float = 5.0,
    request_timeout_s: float = 10.0,
    auth: tuple[str, str] | None = _DEFAULT,
) -> tuple[Any, Any]:
    """A (Cluster, Session) with gnomon's settings; the caller shuts the cluster down.
    ``auth`` (username, password) defaults to :func:`client_credentials`; None connects
    without credentials. Raises ``HistoryStoreError``."""
    from cassandra import ConsistencyLevel
    from cassandra.auth import PlainTextAuthProvider
    from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
    from cassandra.policies import (
        ConstantSpeculativeExecutionPolicy,
        DCAwareRoundRobinPolicy,
        ExponentialReconnectionPolicy,
        TokenAwarePolicy,
    )

    profile = ExecutionProfile(
        load_balancing_policy=TokenAwarePolicy(DCAwareRoundRobinPolicy()),
        consistency_level=ConsistencyLevel.LOCAL_QUORUM,
        request_timeout=request_timeout_s,
        speculative_execution_policy=ConstantSpeculativeExecutionPolicy(SPECULATIVE_DELAY_S,
                                                                        SPECULATIVE_ATTEMPTS_MAX - 1),
    )
    from gnomon import credentials
    from gnomon.config import load

    where = ",".join(hosts) + f":{port}"
    creds = client_credentials() if auth is _DEFAULT else auth
    try:
        ssl_context = credentials.cassandra_ssl_context(load().state_dir)
    except (OSError, InfraError, ValueError) as exc:
        raise HistoryStoreError(f"cassandra TLS: {one_line(exc)}") from exc
    with translate_errors(f"connect to {where}"):
        cluster = Cluster(
            contact_points=list(hosts),
            port=port,
            execution_profiles={EXEC_PROFILE_DEFAULT: profile},
            connect_timeout=connect_timeout_s,
            control_connection_timeout=connect_timeout_s,
            reconnection_policy=ExponentialReconnectionPolicy(0.5, 10.0),
            idle_heartbeat_interval=HEARTBEAT_S,
            idle_heartbeat_timeout=HEARTBEAT_TIMEOUT_S,
            auth_provider=PlainTextAuthProvider(*creds) if creds else None,
            ssl_context=ssl_context,
        )
        try:
            session = cluster.connect()
        except BaseException:
            cluster.shutdown()
            raise
    return cluster, session
