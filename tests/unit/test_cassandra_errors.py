"""The Cassandra adapter turns every driver failure into HistoryStoreError, even the
ones cassandra-driver's own helpers raise by accident when no host is reachable (a
fake session: no Cassandra needed)."""

from __future__ import annotations

from typing import Any

import pytest
from cassandra.cluster import NoHostAvailable

from gnomon.core.errors import HistoryStoreError
from gnomon.history.cassandra import CassandraHistoryStore


class _Future:
    def __init__(self, rows: list[Any] | None = None, exc: BaseException | None = None) -> None:
        self.rows, self.exc = rows, exc

    def result(self) -> list[Any]:
        if self.exc is not None:
            raise self.exc
        return self.rows or []


class _Session:
    def __init__(self, script: list[Any]) -> None:
        self.script = script
        self.sent = 0

    def execute_async(self, stmt: Any, params: Any) -> _Future:
        self.sent += 1
        item = self.script[(self.sent - 1) % len(self.script)]
        if isinstance(item, BaseException) and getattr(item, "sync", False):
            raise item
        return _Future(exc=item) if isinstance(item, BaseException) else _Future(rows=item)


def store_with(session: _Session, concurrency: int = 4) -> CassandraHistoryStore:
    store = CassandraHistoryStore(["127.0.0.1"], concurrency=concurrency)
    store._session, store._st = session, object()  # type: ignore[assignment]
    return store


def test_rows_come_back_in_statement_order() -> None:
    session = _Session([[1], [2], [3]])
    assert store_with(session, concurrency=2)._run_all("read", [("s", ())] * 5) == [[1], [2], [3], [1], [2]]


@pytest.mark.parametrize("failure", [
    NoHostAvailable("all hosts down", {}),
    TypeError("'<' not supported between instances of 'RecursionError' and 'NoHostAvailable'"),
    RecursionError("maximum recursion depth exceeded"),
])
def test_any_failure_is_one_history_store_error(failure: BaseException) -> None:
    session = _Session([[1], failure])
    with pytest.raises(HistoryStoreError, match="statements failed"):
        store_with(session)._run_all("write batch", [("s", ())] * 10)


def test_a_synchronous_refusal_stops_sending_the_batch() -> None:
    refusal = NoHostAvailable("no host", {})
    refusal.sync = True  # type: ignore[attr-defined]
    session = _Session([refusal])
    with pytest.raises(HistoryStoreError, match="1 of 1000 statements failed"):
        store_with(session)._run_all("write batch", [("s", ())] * 1000)
    assert session.sent == 1


def test_a_caller_waits_for_another_ones_connect_at_most_a_request_time(monkeypatch: pytest.MonkeyPatch) -> None:
    # the API's early connect hangs (a node cut off mid-handshake): a request must not
    # queue behind it for longer than a request's time; it fails as unavailable (503)
    import threading
    import time

    import gnomon.history.cassandra as mod

    release = threading.Event()

    def hanging_connect(*_a: Any, **_k: Any) -> tuple[Any, Any]:
        release.wait(10)
        raise HistoryStoreError("cut off")

    monkeypatch.setattr(mod, "connect", hanging_connect)
    store = CassandraHistoryStore(["127.0.0.1"], request_timeout_s=0.3)
    failed: list[BaseException] = []

    def connect_early() -> None:
        try:
            store.connect()
        except HistoryStoreError as exc:
            failed.append(exc)

    early = threading.Thread(target=connect_early, daemon=True)
    early.start()
    time.sleep(0.1)  # the early connect holds the store
    began = time.monotonic()
    with pytest.raises(HistoryStoreError, match="still connecting after 0 s"):
        store.get_job("j")
    assert time.monotonic() - began < 2
    release.set()
    early.join(5)
    assert [str(e) for e in failed] == ["cut off"]
    # once the connect gave up, the next caller connects itself (and fails here: no Cassandra)
    with pytest.raises(HistoryStoreError, match="cut off"):
        store.get_job("j")
