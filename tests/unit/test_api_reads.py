"""The fast read path of GET /v1/jobs/{id}/runs, without the stack: async paging, the
Cassandra store's execute_async bridge (fake driver), decoded-state and rendered-run
caches, the handler's order of checks, and `gnomon api --workers`."""

from __future__ import annotations

import asyncio
import json
import threading
import warnings
from collections import namedtuple
from typing import Any

import pytest
from fastapi.responses import JSONResponse
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from gnomon.api.app import AsyncReads, CommandSink, create_app
from gnomon.api.views import RunViews, page_json, run_view
from gnomon.codec import encode
from gnomon.core.clock import FakeClock
from gnomon.core.errors import HistoryStoreError, ValidationError
from gnomon.core.jobs import JobState, JobStatus
from gnomon.core.model import JobSpec, Schedule, Target, TargetType
from gnomon.core.runs import RunState, RunStatus
from gnomon.history import _paging as P
from gnomon.history.cassandra import CassandraHistoryStore, DecodeCache, _prepare, execute_on_loop
from gnomon.history.memory import InMemoryHistoryStore
from gnomon.topology import load_topology
from gnomon.web.auth import Authenticator

T0 = 1_790_000_000_000
SPEC = JobSpec(name="n", schedule=Schedule(cron="* * * * * *", tz="UTC"),
               target=Target(TargetType.HANDLER, handler="noop"))
AUTH = {"Authorization": "Bearer tok-a"}
STATUSES = (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.RUNNING)


def job(job_id: str, tenant: str = "acme", status: JobStatus = JobStatus.ACTIVE) -> JobState:
    return JobState(job_id, tenant, SPEC, status, T0, 1, T0, T0)


def run(job_id: str, i: int, status: RunStatus | None = None) -> RunState:
    slot = T0 + i * 1000
    return RunState(f"{job_id}@{i:04d}", job_id, "acme", SPEC, slot, slot, False, status or STATUSES[i % 3],
                    slot, slot + 5, attempt=1, worker_id="w1", started_at_ms=slot + 2, granted_at_ms=slot - 100)


# ---- paging: async and sync drive the same algorithm -------------------------------------------


ROWS = [((T0 - i, f"r{i:03d}"), i) for i in range(57)]  # newest first


def fetch(after: P.Key | None, n: int) -> list[tuple[P.Key, int]]:
    start = 0 if after is None else next(i for i, (k, _) in enumerate(ROWS) if k == after) + 1
    return ROWS[start:start + n]


async def afetch(after: P.Key | None, n: int) -> list[tuple[P.Key, int]]:
    await asyncio.sleep(0)
    return fetch(after, n)


def all_pages(limit: int, keep: Any, scan_max: int, sync: bool) -> list[tuple[list[int], str | None]]:
    pages, cursor = [], None
    while True:
        if sync:
            items, cursor = P.page(P.RUNS, fetch, limit, cursor, keep, scan_max)
        else:
            items, cursor = asyncio.run(P.apage(P.RUNS, afetch, limit, cursor, keep, scan_max))
        pages.append((items, cursor))
        if cursor is None:
            return pages


@pytest.mark.parametrize("limit", [1, 5, 20, 57, 100])
@pytest.mark.parametrize(("keep", "scan_max"), [(None, 5000), (lambda i: i % 3 == 0, 5000), (lambda i: i % 7 == 0, 10)])
def test_apage_pages_exactly_like_page(limit: int, keep: Any, scan_max: int) -> None:
    sync = all_pages(limit, keep, scan_max, sync=True)
    assert all_pages(limit, keep, scan_max, sync=False) == sync
    assert [i for items, _ in sync for i in items] == [i for _, i in ROWS if keep is None or keep(i)]


def test_apage_checks_its_arguments_like_page() -> None:
    with pytest.raises(ValidationError, match="cursor"):
        asyncio.run(P.apage(P.RUNS, afetch, 5, "garbage"))
    with pytest.raises(ValidationError, match="limit"):
        asyncio.run(P.apage(P.RUNS, afetch, 0, None))


# ---- rendering ---------------------------------------------------------------------------------


def test_run_views_render_what_jsonresponse_would() -> None:
    runs = [run("job_a", i) for i in range(3)]
    views = RunViews()
    expected = JSONResponse({"items": [run_view(r) for r in runs], "cursor": "c\u00e9"}).body
    assert views.page(runs, "c\u00e9") == expected
    assert page_json([], None) == JSONResponse({"items": [], "cursor": None}).body


def test_run_views_render_each_state_once_and_stay_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    import gnomon.api.views as V

    calls: list[str] = []
    real = V.run_view
    monkeypatch.setattr(V, "run_view", lambda r: calls.append(r.run_id) or real(r))
    views = RunViews(max_entries=4)
    a, b = run("job_a", 1), run("job_a", 2)
    first = views.json(a)
    assert views.json(a) == first and calls == [a.run_id]
    changed = RunState(**{**a.__dict__, "status": RunStatus.SUCCEEDED})  # a new state of the same run
    assert views.json(changed) != first and len(calls) == 2
    for i in range(10):
        views.json(run("job_b", i))
    assert len(views) == 4
    assert json.loads(views.json(b)) == run_view(b)


def test_decode_cache_hands_out_one_object_per_blob_and_is_bounded() -> None:
    cache = DecodeCache(max_entries=3)
    blob = encode(run("job_a", 1))
    first = cache.decode(blob, RunState, "here")
    assert cache.decode(bytes(blob), RunState, "here") is first and first == run("job_a", 1)
    for i in range(5):
        cache.decode(encode(run("job_a", 10 + i)), RunState, "here")
    assert len(cache) == 3
    with pytest.raises(HistoryStoreError, match="not a JobState"):
        cache.decode(blob, JobState, "here")
    with pytest.raises(HistoryStoreError, match="row without state"):
        cache.decode(None, RunState, "here")


# ---- execute_on_loop: the driver's callbacks resolve an asyncio future ------------------------


class FakeResponseFuture:
    """cassandra.cluster.ResponseFuture's callback API; pages are delivered on another
    thread, as the driver's I/O thread would."""

    def __init__(self, pages: list[list[Any]], error: BaseException | None = None, delay_s: float = 0.0) -> None:
        self._pages, self._error, self._delay_s = pages, error, delay_s
        self._at = 0
        self.has_more_pages = len(pages) > 1

    def add_callbacks(self, callback: Any, errback: Any) -> None:
        self._cb, self._eb = callback, errback
        self._deliver()

    def start_fetching_next_page(self) -> None:
        self._at += 1
        self.has_more_pages = self._at < len(self._pages) - 1
        self._deliver()

    def _deliver(self) -> None:
        def go() -> None:
            if self._error is not None:
                self._eb(self._error)
            else:
                self._cb(self._pages[self._at])

        threading.Timer(self._delay_s, go).start()


class FakeSession:
    def __init__(self, rf: FakeResponseFuture) -> None:
        self.rf = rf

    def execute_async(self, _stmt: Any, _params: Any) -> FakeResponseFuture:
        return self.rf


def test_execute_on_loop_collects_every_page() -> None:
    async def main() -> list[Any]:
        loop = asyncio.get_running_loop()
        return await execute_on_loop(FakeSession(FakeResponseFuture([[1, 2], [3], [4, 5]])), "q", (), loop)

    assert asyncio.run(main()) == [1, 2, 3, 4, 5]


def test_execute_on_loop_raises_the_driver_error() -> None:
    async def main() -> list[Any]:
        loop = asyncio.get_running_loop()
        return await execute_on_loop(FakeSession(FakeResponseFuture([[]], error=OSError("gone"))), "q", (), loop)

    with pytest.raises(OSError, match="gone"):
        asyncio.run(main())


def test_execute_on_loop_tolerates_an_answer_nobody_waits_for() -> None:
    rf = FakeResponseFuture([[1]], delay_s=0.2)

    async def main() -> None:
        fut = execute_on_loop(FakeSession(rf), "q", (), asyncio.get_running_loop())
        fut.cancel()  # the client went away
        await asyncio.sleep(0.3)  # the answer arrives for a cancelled future: ignored

    asyncio.run(main())
    late = FakeResponseFuture([[1]], delay_s=0.2)

    async def leave() -> None:
        execute_on_loop(FakeSession(late), "q", (), asyncio.get_running_loop())

    asyncio.run(leave())  # the loop closes before the answer: no error on the driver's thread
    errors: list[Any] = []
    threading.excepthook, old = (lambda a: errors.append(a)), threading.excepthook
    try:
        import time

        time.sleep(0.3)
    finally:
        threading.excepthook = old
    assert errors == []


# ---- CassandraHistoryStore's async reads on a fake session --------------------------------------


Row = namedtuple("Row", "slot_ms run_id status state")
JobRow = namedtuple("JobRow", "state")


class _Prepared(str):
    """A prepared statement's stand-in: its CQL text, with the attributes the store sets."""

    is_idempotent = False


class FakeCassandra:
    """Answers the store's prepared statements (their CQL text) from lists, in pages of
    ``page_size`` rows through the callback API; the sync API answers too."""

    def __init__(self, runs: list[RunState], jobs: list[JobState], page_size: int = 7) -> None:
        self.runs = sorted(runs, key=lambda r: (r.slot_ms, r.run_id), reverse=True)
        self.jobs = {j.job_id: j for j in jobs}
        self.page_size = page_size
        self.async_calls = 0

    def prepare(self, cql: str) -> str:
        return _Prepared(cql)

    def _rows(self, cql: str, params: tuple[Any, ...]) -> list[Any]:
        if "FROM ks.jobs_by_id" in cql:
            j = self.jobs.get(params[0])
            return [JobRow(encode(j))] if j else []
        assert "FROM ks.runs_by_job" in cql, cql
        rows = [r for r in self.runs if r.job_id == params[0]]
        if "(slot_ms, run_id) <" in cql:
            rows = [r for r in rows if (r.slot_ms, r.run_id) < (params[1], params[2])]
        return [Row(r.slot_ms, r.run_id, r.status.value, encode(r)) for r in rows[:params[-1]]]

    def execute(self, cql: str, params: tuple[Any, ...]) -> list[Any]:
        return self._rows(cql, params)

    def execute_async(self, cql: str, params: tuple[Any, ...]) -> FakeResponseFuture:
        self.async_calls += 1
        rows = self._rows(cql, params)
        pages = [rows[i:i + self.page_size] for i in range(0, len(rows), self.page_size)] or [[]]
        return FakeResponseFuture(pages)


def fake_store(session: FakeCassandra) -> CassandraHistoryStore:
    store = CassandraHistoryStore(["127.0.0.1"], keyspace="ks", status_scan_max=40)
    store._session, store._st = session, _prepare(session, "ks")
    return store


def test_cassandra_async_reads_equal_the_blocking_ones() -> None:
    runs = [run("job_a", i) for i in range(90)] + [run("job_b", i) for i in range(5)]
    session = FakeCassandra(runs, [job("job_a")])
    store = fake_store(session)
    for status in (None, "failed", "running"):
        for limit in (1, 20, 200):
            cursor: str | None = None
            while True:
                want = store.list_runs("job_a", status, limit, cursor)
                got = asyncio.run(store.list_runs_async("job_a", status, limit, cursor))
                assert got == want
                cursor = want.cursor
                if cursor is None:
                    break
    assert session.async_calls > 0
    assert asyncio.run(store.get_job_async("job_a")) == job("job_a")
    assert asyncio.run(store.get_job_async("nope")) is None
    with pytest.raises(ValidationError, match="status"):
        asyncio.run(store.list_runs_async("job_a", "bogus", 5, None))
    again = asyncio.run(store.list_runs_async("job_a", None, 5, None))
    assert all(a is b for a, b in zip(again.items, store.list_runs("job_a", None, 5, None).items, strict=True))


def test_cassandra_async_read_errors_become_history_store_errors() -> None:
    class Down(FakeCassandra):
        def execute_async(self, cql: str, params: tuple[Any, ...]) -> FakeResponseFuture:
            from cassandra import OperationTimedOut

            return FakeResponseFuture([[]], error=OperationTimedOut("no answer"))

    store = fake_store(Down([], []))
    with pytest.raises(HistoryStoreError, match="cassandra list runs: OperationTimedOut"):
        asyncio.run(store.list_runs_async("job_a", None, 5, None))


# ---- the handler -------------------------------------------------------------------------------


class NativeAsync(InMemoryHistoryStore):
    """A store with its own async reads (as the Cassandra store has)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    async def get_job_async(self, job_id: str) -> JobState | None:
        self.calls.append("get_job")
        return self.get_job(job_id)

    async def list_runs_async(self, job_id: str, status: str | None, limit: int, cursor: str | None) -> Any:
        self.calls.append("list_runs")
        await asyncio.sleep(0.01)
        return self.list_runs(job_id, status, limit, cursor)


def client_for(history: InMemoryHistoryStore) -> TestClient:
    history.put_job(job("job_a"))
    history.put_job(job("job_other", tenant="other"))
    history.put_job(job("job_gone", status=JobStatus.DELETED))
    for i in range(30):
        history.put_run(run("job_a", i))
        history.put_run(run("job_other", i))

    class Sink:
        def send(self, *_a: Any, **_k: Any) -> None: ...

    topo = load_topology()
    app = create_app(history=history, commands=CommandSink(Sink(), topo.job_commands),
                     auth=Authenticator({"tok-a": "acme"}), topology=topo, clock=FakeClock(T0))
    return TestClient(app)


@pytest.mark.parametrize("native", [True, False])
def test_list_runs_answers_as_before(native: bool) -> None:
    history = NativeAsync() if native else InMemoryHistoryStore()
    client = client_for(history)
    assert AsyncReads(history).native is native
    resp = client.get("/v1/jobs/job_a/runs?limit=20", headers=AUTH)
    assert resp.status_code == 200 and resp.headers["content-type"] == "application/json"
    page = history.list_runs("job_a", None, 20, None)
    assert resp.content == JSONResponse({"items": [run_view(r) for r in page.items], "cursor": page.cursor}).body
    nxt = client.get("/v1/jobs/job_a/runs", params={"limit": 20, "cursor": page.cursor}, headers=AUTH).json()
    assert [r["id"] for r in nxt["items"]] == [r.run_id for r in history.list_runs("job_a", None, 20, page.cursor).items]
    assert nxt["cursor"] is None
    failed = client.get("/v1/jobs/job_a/runs?status=failed&limit=50", headers=AUTH).json()["items"]
    assert len(failed) == 10 and {r["status"] for r in failed} == {"failed"}


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize(("path", "status", "field"), [
    ("/v1/jobs/job_other/runs?status=bogus&limit=0", 404, None),  # not yours: 404 before any argument check
    ("/v1/jobs/job_gone/runs", 404, None),
    ("/v1/jobs/nope/runs?cursor=bad", 404, None),
    ("/v1/jobs/job_a/runs?status=bogus&limit=0", 422, "status"),  # then the status, then the limit
    ("/v1/jobs/job_a/runs?limit=0", 422, "limit"),
    ("/v1/jobs/job_a/runs?limit=501", 422, "limit"),
    ("/v1/jobs/job_a/runs?cursor=bad", 422, "cursor"),
])
def test_list_runs_checks_in_the_same_order(native: bool, path: str, status: int, field: str | None) -> None:
    client = client_for(NativeAsync() if native else InMemoryHistoryStore())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        resp = client.get(path, headers=AUTH)
    assert resp.status_code == status, resp.text
    assert resp.json().get("field") == field
    assert client.get(path).status_code == 401


def test_list_runs_reads_the_job_and_the_page_at_once() -> None:
    history = NativeAsync()
    client = client_for(history)
    history.calls.clear()
    assert client.get("/v1/jobs/job_a/runs", headers=AUTH).status_code == 200
    assert sorted(history.calls) == ["get_job", "list_runs"]
    history.calls.clear()
    assert client.get("/v1/jobs/job_a/runs?limit=0", headers=AUTH).status_code == 422
    assert history.calls == ["get_job"]  # a bad argument reads no page


def test_list_runs_history_outage_is_503() -> None:
    class Down(NativeAsync):
        async def list_runs_async(self, *_a: Any) -> Any:
            raise HistoryStoreError("cassandra list runs: NoHostAvailable")

    resp = client_for(Down()).get("/v1/jobs/job_a/runs", headers=AUTH)
    assert resp.status_code == 503 and "NoHostAvailable" in resp.json()["detail"]


# ---- gnomon api --workers -----------------------------------------------------------------------


def test_api_command_serves_with_workers(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    from gnomon.api import wiring
    from gnomon.cli.main import app

    seen: dict[str, Any] = {}
    monkeypatch.setattr(wiring, "serve", lambda **kw: seen.update(kw))
    monkeypatch.setenv("GNOMON_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("GNOMON_API_TOKENS", "tok:acme")
    monkeypatch.setenv(wiring.WORKERS_ENV, "3")
    res = CliRunner().invoke(app, ["api", "--port", "18999", "--no-access-log"])
    assert res.exit_code == 0, res.output
    assert seen == {"host": "127.0.0.1", "port": 18999, "workers": 3, "access_log": False, "tls": None}
    res = CliRunner().invoke(app, ["api", "--workers", "2"])
    assert res.exit_code == 0 and seen["workers"] == 2 and seen["access_log"] is True


def test_serve_one_process_runs_the_factory(monkeypatch: pytest.MonkeyPatch) -> None:
    import uvicorn

    from gnomon.api import wiring

    seen: dict[str, Any] = {}
    monkeypatch.setattr(uvicorn, "run", lambda target, **kw: seen.update(target=target, **kw))
    wiring.serve(host="127.0.0.1", port=18999, workers=1, access_log=False)
    assert seen["target"] == wiring.APP_FACTORY == "gnomon.api.wiring:app_from_env" and seen["factory"] is True
    assert seen["access_log"] is False


def test_workers_share_a_tcp_socket_without_nagle() -> None:
    """uvicorn's own socket for workers has protocol 0, so asyncio never set TCP_NODELAY on
    its connections (every keep-alive response then waited for a delayed ACK)."""
    import pickle
    import socket

    from gnomon.api import wiring

    config = wiring._TcpConfig(wiring.APP_FACTORY, factory=True, host="127.0.0.1", port=0, workers=2)
    sock = config.bind_socket()
    try:
        assert sock.proto == socket.IPPROTO_TCP and sock.get_inheritable()
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        sock.listen()
        with socket.create_connection(sock.getsockname()):
            conn, _ = sock.accept()
            with conn:
                assert conn.proto == socket.IPPROTO_TCP  # what asyncio checks before setting TCP_NODELAY
        assert type(pickle.loads(pickle.dumps(config))) is wiring._TcpConfig  # it goes to the workers
    finally:
        sock.close()


def test_api_command_refuses_without_tokens_before_serving(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    import uvicorn

    from gnomon.cli.main import app

    monkeypatch.setattr(uvicorn, "run", lambda *_a, **_k: pytest.fail("served without tokens"))
    monkeypatch.setenv("GNOMON_STATE_DIR", str(tmp_path))
    monkeypatch.delenv("GNOMON_API_TOKENS", raising=False)
    monkeypatch.delenv("GNOMON_DEV", raising=False)
    res = CliRunner().invoke(app, ["api", "--workers", "2"])
    assert res.exit_code != 0 and "GNOMON_API_TOKENS" in str(res.exception or res.output)


@pytest.mark.parametrize(("raw", "ok"), [("", 1), ("4", 4), ("0", None), ("x", None), ("65", None)])
def test_api_workers_from_the_environment(monkeypatch: pytest.MonkeyPatch, raw: str, ok: int | None) -> None:
    from gnomon.api import wiring

    monkeypatch.setenv(wiring.WORKERS_ENV, raw)
    if ok is None:
        with pytest.raises(SystemExit, match=wiring.WORKERS_ENV):
            wiring.api_workers()
    else:
        assert wiring.api_workers() == ok


def test_reads_may_be_speculated_writes_may_not() -> None:
    """A read routed to a node that stopped answering (cut off) is sent to the next one
    after SPECULATIVE_DELAY_S (history/session.py); a write is never sent twice."""
    st = _prepare(FakeCassandra([], []), "ks")
    statements = vars(st) if hasattr(st, "__dict__") else {f: getattr(st, f) for f in st.__dataclass_fields__}
    reads = {name for name, stmt in statements.items() if str(stmt).startswith("SELECT")}
    assert reads and {"get_run", "get_job", "list_runs_first"} <= reads
    for name, stmt in statements.items():
        assert stmt.is_idempotent is (name in reads), name


def test_readyz_says_when_history_can_be_read() -> None:
    # /healthz is liveness; /readyz waits for the history store's connect (a fresh API's
    # first reads otherwise wait for it, then answer 503, while /healthz says ok)
    class Connecting(InMemoryHistoryStore):
        connected = False

    history = Connecting()
    client = client_for(history)
    assert client.get("/healthz").status_code == 200
    resp = client.get("/readyz")
    assert resp.status_code == 503 and resp.headers["content-type"] == "application/problem+json"
    assert "still connecting" in resp.json()["detail"] and resp.headers["Retry-After"] == "1"
    history.connected = True
    assert client.get("/readyz").json() == {"status": "ready"}
    assert client_for(InMemoryHistoryStore()).get("/readyz").status_code == 200  # nothing to connect


def test_the_cassandra_store_is_connected_once_its_statements_are_prepared() -> None:
    store = CassandraHistoryStore(["127.0.0.1"])
    assert not store.connected
    store._st = object()  # type: ignore[assignment]  # (what a finished connect leaves)
    assert store.connected
