"""`gnomon infra up` sets up Cassandra roles; on three nodes just started, a node may
not yet see the others up (CI: CREATE ROLE at LOCAL_QUORUM, "alive_replicas 1").
Those errors are retried until the deadline; refused logins and other errors are not."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from cassandra import AuthenticationFailed, ConsistencyLevel, Unavailable
from cassandra.cluster import NoHostAvailable

from gnomon.config import Settings
from gnomon.infra import cassandra
from gnomon.infra.errors import InfraError


def _unavailable() -> NoHostAvailable:
    return NoHostAvailable("Unable to complete the operation against any hosts",
                           {"127.0.0.1:9042": Unavailable("Cannot achieve consistency level LOCAL_QUORUM",
                                                          ConsistencyLevel.LOCAL_QUORUM, 2, 1)})


def _wrapped(cause: BaseException) -> InfraError:
    try:
        raise InfraError(f"cannot log in to Cassandra as gnomon_admin: {cause}") from cause
    except InfraError as exc:
        return exc


def test_unavailable_tells_too_few_replicas_from_a_refused_login() -> None:
    assert cassandra.unavailable(_unavailable())
    assert cassandra.unavailable(_wrapped(_unavailable()))
    refused = NoHostAvailable("x", {"127.0.0.1:9042": AuthenticationFailed("Bad credentials")})
    assert not cassandra.unavailable(refused)
    assert not cassandra.unavailable(_wrapped(refused))
    assert not cassandra.unavailable(InfraError("Cassandra refuses both"))
    mixed = NoHostAvailable("x", {"a": Unavailable("u"), "b": AuthenticationFailed("b")})
    assert not cassandra.unavailable(mixed)


def _settings(tmp_path: Path) -> Settings:
    return Settings(state_dir=tmp_path)


def test_ensure_auth_retries_while_replicas_are_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    def once(settings: Any, timeout_s: float) -> None:
        calls.append(1)
        if len(calls) < 3:
            raise _wrapped(_unavailable())

    monkeypatch.setattr(cassandra, "_ensure_auth_once", once)
    monkeypatch.setattr(cassandra.time, "sleep", lambda s: None)
    cassandra.ensure_auth(_settings(tmp_path), timeout_s=60.0)
    assert len(calls) == 3


def test_ensure_auth_gives_up_at_its_deadline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    now = [0.0]
    monkeypatch.setattr(cassandra.time, "monotonic", lambda: now[0])

    def sleep(s: float) -> None:
        now[0] += s

    def once(settings: Any, timeout_s: float) -> None:
        raise _wrapped(_unavailable())

    monkeypatch.setattr(cassandra.time, "sleep", sleep)
    monkeypatch.setattr(cassandra, "_ensure_auth_once", once)
    with pytest.raises(InfraError, match="LOCAL_QUORUM"):
        cassandra.ensure_auth(_settings(tmp_path), timeout_s=10.0)
    assert now[0] <= 10.0


def test_ensure_auth_does_not_retry_a_refused_login(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    def once(settings: Any, timeout_s: float) -> None:
        calls.append(1)
        raise InfraError("Cassandra refuses both gnomon_admin and the default superuser")

    monkeypatch.setattr(cassandra, "_ensure_auth_once", once)
    with pytest.raises(InfraError, match="refuses"):
        cassandra.ensure_auth(_settings(tmp_path), timeout_s=60.0)
    assert calls == [1]


def test_the_default_superuser_refused_on_a_node_that_lacks_its_row_is_retried(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # three fresh nodes: the default superuser logs in, but a node without its role row yet
    # refuses it as a superuser (seen here: "User cassandra does not have sufficient
    # privileges"); the next try, a few seconds later, creates the admin role
    from cassandra import Unauthorized

    executed: list[str] = []

    class Session:
        def execute(self, cql: str) -> None:
            if cql.startswith("CREATE ROLE") and not any(c.startswith("CREATE ROLE") for c in executed):
                executed.append(cql)
                raise Unauthorized("User cassandra does not have sufficient privileges")
            executed.append(cql)

    class Cluster:
        def shutdown(self) -> None:
            pass

    admin_logins = iter([None, None, ("admin-cluster", "admin-session")])

    def login(settings: Any, cred: Any) -> Any:
        return next(admin_logins) if cred is not cassandra.DEFAULT_SUPERUSER else (Cluster(), Session())

    monkeypatch.setattr(cassandra, "_login", login)
    monkeypatch.setattr(cassandra, "layout", lambda s: 1)
    monkeypatch.setattr(cassandra.time, "sleep", lambda s: None)
    admin = cassandra.credentials.Credential("gnomon_admin", "pw")
    assert cassandra._admin_session(_settings(tmp_path), admin, 60.0) == ("admin-cluster", "admin-session")
    assert [c.split(" ")[0] for c in executed] == ["CREATE", "CREATE"]
