"""``CassandraHistoryStore``: the HistoryStore on Cassandra (schema: ``schemas/cql``).

* Every table stores the whole JobState / RunState as a ``state`` blob encoded with
  ``gnomon.codec`` (rows round-trip exactly) next to the columns it is queried by.
* All statements are prepared once, on first use; the connection is made lazily (the
  API can start before Cassandra and answers 503 until it is there) or by ``connect()``.
* Consistency LOCAL_QUORUM for reads and writes; token-aware routing.
* Writes are idempotent upserts (the projector replays after a crash).
* ``write_batch`` sends few requests: its statements are grouped by the replicas that
  own their partition into UNLOGGED batches, each small enough that Cassandra does not
  warn (see ``_WriteGroup``); a state's blob is the bytes of its Kafka record when the
  projector passes them and they carry the schema id ``encode`` writes (no re-encode).
* Paging uses clustering-key cursors (``gnomon.history._paging``), not driver paging
  state: stable across nodes and releases, and resumable in the middle of a scan.
* ``list_runs(status=...)`` filters on the ``status`` column client-side while scanning
  the job's runs newest first, at most ``status_scan_max`` rows per call; a page can
  then be short (even empty) yet carry a cursor.
* Dead letters: ``put_run`` of a FAILED run also writes ``dead_letters_by_tenant``. A
  non-failed state of the same run written later (a replay) makes the row stale; it is
  not deleted on write (a blind delete per run update would fill the tenant's partition
  with tombstones) but by ``list_dead_letters``, which checks each row against
  ``runs_by_id``, drops stale rows from the page and deletes them with the write time of
  the newer state (so a FAILED state written meanwhile survives).
* Every driver exception becomes ``HistoryStoreError`` with a one-line message.
* Reads for the API's hot path (``get_job_async``, ``list_runs_async``) use the driver's
  ``execute_async`` and resolve an asyncio future from the driver's I/O thread, so an
  event loop never blocks on Cassandra and no thread-pool thread waits for it.
* Decoded states are cached by their blob (``decode_cache_max`` entries, oldest first
  out): a row read again with the same bytes is the same object, decoded once. The
  cache is keyed by content, so it can never serve a stale state.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from gnomon.core.errors import HistoryStoreError, ValidationError
from gnomon.core.jobs import JobState, JobStatus
from gnomon.core.messages import LogLine, LogStream
from gnomon.core.runs import RunState, RunStatus
from gnomon.history import _paging as P
from gnomon.history.base import STATUS_SCAN_MAX, HistoryBatch, parse_status
from gnomon.history.migrate import check_keyspace_name, migrate
from gnomon.history.session import client_credentials, connect, translate_errors
from gnomon.history.session import one_line as _one_line
from gnomon.ports import Page

# connect, translate_errors and client_credentials live in gnomon.history.session (shared
# with the migrator); re-exported here.
__all__ = [
    "CassandraHistoryStore", "DecodeCache", "client_credentials", "connect", "execute_on_loop", "translate_errors",
]

log = logging.getLogger(__name__)

HEADER_LEN = 5  # gnomon.codec's magic byte + schema id (gnomon.codec.HEADER_LEN; not imported at module level)

# One UNLOGGED batch of write_batch holds statements whose partitions live on the same
# replicas (token-aware routing picks a replica of the first as coordinator, which then
# owns them all: no extra hop for the others), and stays below
# Cassandra's warning thresholds for multi-partition batches, which would otherwise log
# on the server and in the driver for every request: unlogged_batch_across_partitions_
# warn_threshold (10 partitions) and batch_size_warn_threshold (5 KiB; our estimate of
# the data size keeps 1 KiB of margin). The statement bound caps the work of one request.
WRITE_BATCH_PARTITIONS_MAX = 10
WRITE_BATCH_BYTES_MAX = 4096
WRITE_BATCH_STATEMENTS_MAX = 50
_CELL_OVERHEAD_BYTES = 16  # a cell's timestamp, TTL and deletion time in Cassandra's data size


def _encode(obj: Any) -> bytes:
    from gnomon.codec import encode

    return encode(obj)


_HEADERS: dict[type, bytes | None] = {}  # by state type: what encode() starts with


def _header(cls: type) -> bytes | None:
    if cls not in _HEADERS:
        from gnomon.codec import default_codec

        _HEADERS[cls] = default_codec.header(cls)
    return _HEADERS[cls]


def _blob(state: Any, raw: bytes | None) -> bytes:
    """``state``'s blob: ``raw`` (the codec bytes it was decoded from) when they carry
    the schema id ``encode`` would write -- the same schema, so the same bytes, and
    ``_decode`` reads them as ``state`` either way -- else ``state`` encoded afresh (a
    record written with an older schema version is stored with the latest)."""
    if raw is not None and raw[:HEADER_LEN] == _header(type(state)):
        return raw
    return _encode(state)


def _decode(blob: bytes | None, cls: type, where: str) -> Any:
    from gnomon.codec import DecodeError, decode

    if blob is None:
        raise HistoryStoreError(f"cassandra {where}: row without state")
    try:
        obj = decode(blob)
    except DecodeError as exc:
        raise HistoryStoreError(f"cassandra {where}: undecodable state ({exc.message})") from exc
    if not isinstance(obj, cls):
        raise HistoryStoreError(f"cassandra {where}: state is a {type(obj).__name__}, not a {cls.__name__}")
    return obj


class DecodeCache:
    """Decoded states by their encoded bytes, at most ``max_entries`` (the oldest entry
    goes first). Keyed by content: a hit is exactly what decoding would return, shared
    (states are frozen). Thread-safe."""

    def __init__(self, max_entries: int = 4096) -> None:
        self.max_entries = max_entries
        self._d: dict[bytes, Any] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._d)

    def decode(self, blob: bytes | None, cls: type, where: str) -> Any:
        if blob is None or self.max_entries <= 0:
            return _decode(blob, cls, where)
        key = bytes(blob)
        obj = self._d.get(key)
        if obj is not None and isinstance(obj, cls):
            return obj
        obj = _decode(key, cls, where)
        with self._lock:
            while len(self._d) >= self.max_entries:
                del self._d[next(iter(self._d))]
            self._d[key] = obj
        return obj


def _settle(fut: asyncio.Future[list[Any]], rows: list[Any] | None, exc: BaseException | None) -> None:
    """Resolve ``fut`` (on its loop); a future already cancelled (the client left) is left alone."""
    if fut.done():
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(rows if rows is not None else [])


def execute_on_loop(session: Any, stmt: Any, params: Sequence[Any],
                    loop: asyncio.AbstractEventLoop) -> asyncio.Future[list[Any]]:
    """``session.execute_async`` as an asyncio future of all the rows (every page).

    The driver calls back on its I/O thread; the future is resolved on ``loop`` with
    ``call_soon_threadsafe``. Raises at once what ``execute_async`` raises at once (e.g.
    ``NoHostAvailable``); driver errors after that are the future's exception."""
    fut: asyncio.Future[list[Any]] = loop.create_future()
    rows: list[Any] = []
    rf = session.execute_async(stmt, params)

    def post(result: list[Any] | None, exc: BaseException | None) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits for this any more
            loop.call_soon_threadsafe(_settle, fut, result, exc)

    def on_page(page: Any) -> None:
        try:
            rows.extend(page)
            if rf.has_more_pages:
                rf.start_fetching_next_page()  # calls on_page (or on_error) again
                return
        except Exception as exc:
            post(None, exc)
            return
        post(rows, None)

    def on_error(exc: BaseException) -> None:
        post(None, exc)

    rf.add_callbacks(on_page, on_error)
    return fut


@dataclass(frozen=True)
class _Statements:
    put_job_by_id: Any
    put_job_by_tenant: Any
    del_job_by_id: Any
    del_job_by_tenant: Any
    get_job: Any
    get_job_tenant: Any
    list_jobs_first: Any
    list_jobs_after: Any
    put_run_by_id: Any
    put_run_by_job: Any
    put_dead: Any
    get_run: Any
    get_run_check: Any
    list_runs_first: Any
    list_runs_after: Any
    list_dead_first: Any
    list_dead_after: Any
    del_dead_at: Any
    put_log: Any
    logs_first: Any
    logs_after: Any


def _prepare(session: Any, ks: str) -> _Statements:
    def p(cql: str) -> Any:
        stmt = session.prepare(cql.replace("{ks}", ks))
        stmt.is_idempotent = cql.startswith("SELECT")  # reads may be speculated (session.py)
        return stmt

    return _Statements(
        put_job_by_id=p("INSERT INTO {ks}.jobs_by_id (job_id, tenant, status, version, updated_at_ms, state) "
                        "VALUES (?, ?, ?, ?, ?, ?)"),
        put_job_by_tenant=p("INSERT INTO {ks}.jobs_by_tenant (tenant, job_id, status, updated_at_ms, state) "
                            "VALUES (?, ?, ?, ?, ?)"),
        del_job_by_id=p("DELETE FROM {ks}.jobs_by_id WHERE job_id = ?"),
        del_job_by_tenant=p("DELETE FROM {ks}.jobs_by_tenant WHERE tenant = ? AND job_id = ?"),
        get_job=p("SELECT state FROM {ks}.jobs_by_id WHERE job_id = ?"),
        get_job_tenant=p("SELECT tenant FROM {ks}.jobs_by_id WHERE job_id = ?"),
        list_jobs_first=p("SELECT job_id, state FROM {ks}.jobs_by_tenant WHERE tenant = ? LIMIT ?"),
        list_jobs_after=p("SELECT job_id, state FROM {ks}.jobs_by_tenant WHERE tenant = ? AND job_id > ? LIMIT ?"),
        put_run_by_id=p("INSERT INTO {ks}.runs_by_id (run_id, job_id, tenant, slot_ms, status, updated_at_ms, state) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?)"),
        put_run_by_job=p("INSERT INTO {ks}.runs_by_job (job_id, slot_ms, run_id, status, attempt, updated_at_ms, "
                         "state) VALUES (?, ?, ?, ?, ?, ?, ?)"),
        put_dead=p("INSERT INTO {ks}.dead_letters_by_tenant (tenant, slot_ms, run_id, job_id, failed_at_ms, state) "
                   "VALUES (?, ?, ?, ?, ?, ?)"),
        get_run=p("SELECT state FROM {ks}.runs_by_id WHERE run_id = ?"),
        get_run_check=p("SELECT status, state, WRITETIME(state) AS written FROM {ks}.runs_by_id WHERE run_id = ?"),
        list_runs_first=p("SELECT slot_ms, run_id, status, state FROM {ks}.runs_by_job WHERE job_id = ? LIMIT ?"),
        list_runs_after=p("SELECT slot_ms, run_id, status, state FROM {ks}.runs_by_job "
                          "WHERE job_id = ? AND (slot_ms, run_id) < (?, ?) LIMIT ?"),
        list_dead_first=p("SELECT slot_ms, run_id, state FROM {ks}.dead_letters_by_tenant WHERE tenant = ? LIMIT ?"),
        list_dead_after=p("SELECT slot_ms, run_id, state FROM {ks}.dead_letters_by_tenant "
                          "WHERE tenant = ? AND (slot_ms, run_id) < (?, ?) LIMIT ?"),
        del_dead_at=p("DELETE FROM {ks}.dead_letters_by_tenant USING TIMESTAMP ? "
                      "WHERE tenant = ? AND slot_ms = ? AND run_id = ?"),
        put_log=p("INSERT INTO {ks}.logs_by_run (run_id, attempt, seq, job_id, tenant, stream, line, at_ms) "
                  "VALUES (?, ?, ?, ?, ?, ?, ?, ?)"),
        logs_first=p("SELECT attempt, seq, job_id, tenant, stream, line, at_ms FROM {ks}.logs_by_run "
                     "WHERE run_id = ? LIMIT ?"),
        logs_after=p("SELECT attempt, seq, job_id, tenant, stream, line, at_ms FROM {ks}.logs_by_run "
                     "WHERE run_id = ? AND (attempt, seq) > (?, ?) LIMIT ?"),
    )


@dataclass(frozen=True)
class _Dead:
    """A dead-letter row with the run's current state (None: stale, not listed)."""

    state: RunState | None


def _param_bytes(params: Sequence[Any]) -> int:
    """Estimated data size of a row written with ``params`` (as Cassandra counts a batch)."""
    n = 0
    for v in params:
        if isinstance(v, str):
            n += len(v) if v.isascii() else len(v.encode())
        elif isinstance(v, bytes | bytearray | memoryview):
            n += len(v)
        else:
            n += 8
        n += _CELL_OVERHEAD_BYTES
    return n


def _by_partition(writes: Sequence[tuple[Any, Sequence[Any]]]) -> list[tuple[bytes, int, Any]]:
    """(partition key, estimated size, bound statement) of each write, by partition key:
    the statements of a partition (a job's row in jobs_by_id and its run in runs_by_job,
    a run and its log lines, a tenant's jobs) then share a request and count once
    against ``WRITE_BATCH_PARTITIONS_MAX``."""
    out = []
    for stmt, params in writes:
        bound = stmt.bind(params)
        out.append((bound.routing_key or b"", _param_bytes(params), bound))
    out.sort(key=lambda x: x[0])
    return out


@dataclass
class _WriteGroup:
    """Bound statements for one replica set, to be sent as one request."""

    statements: list[Any] = field(default_factory=list)
    partitions: set[bytes] = field(default_factory=set)
    size_bytes: int = 0

    def fits(self, partition: bytes, size_bytes: int) -> bool:
        if not self.statements:
            return True
        new_partitions = len(self.partitions) + (partition not in self.partitions)
        return (len(self.statements) < WRITE_BATCH_STATEMENTS_MAX and new_partitions <= WRITE_BATCH_PARTITIONS_MAX
                and self.size_bytes + size_bytes <= WRITE_BATCH_BYTES_MAX)

    def add(self, bound: Any, partition: bytes, size_bytes: int) -> None:
        self.statements.append(bound)
        self.partitions.add(partition)
        self.size_bytes += size_bytes

    def request(self) -> Any:
        """A lone statement as itself, several as an UNLOGGED batch (not atomic, which
        write_batch does not need: a failed batch is written again as a whole)."""
        if len(self.statements) == 1:
            return self.statements[0]
        from cassandra.query import BatchStatement, BatchType

        batch = BatchStatement(batch_type=BatchType.UNLOGGED)
        for bound in self.statements:
            batch.add(bound)
        return batch


def _status_filter(wanted: RunStatus | None) -> Callable[[Any], bool] | None:
    if wanted is None:
        return None
    value = wanted.value
    return lambda row: bool(row.status == value)


@contextlib.contextmanager
def _held(lock: threading.Lock) -> Iterator[None]:
    """Release ``lock`` (acquired by the caller) when the block ends."""
    try:
        yield
    finally:
        lock.release()


class CassandraHistoryStore:
    """HistoryStore on Cassandra. Thread-safe. Connects on first use (or ``connect()``);
    ``ensure_schema=True`` applies the ``schemas/cql`` migrations when connecting."""

    def __init__(
        self,
        hosts: Sequence[str],
        port: int = 9042,
        keyspace: str = "gnomon",
        *,
        ensure_schema: bool = False,
        replication: str | None = None,
        status_scan_max: int = STATUS_SCAN_MAX,
        concurrency: int = 32,
        connect_timeout_s: float = 5.0,
        request_timeout_s: float = 10.0,
        decode_cache_max: int = 4096,
    ) -> None:
        if isinstance(hosts, str):
            hosts = [h for h in hosts.split(",") if h]
        if not hosts:
            raise ValidationError("hosts", "at least one Cassandra contact point is needed")
        if status_scan_max < 1 or concurrency < 1:
            raise ValidationError("status_scan_max", "status_scan_max and concurrency must be >= 1")
        self.hosts = list(hosts)
        self.port = port
        self.keyspace = check_keyspace_name(keyspace)
        self.ensure_schema = ensure_schema
        self.replication = replication
        self.status_scan_max = status_scan_max
        self.concurrency = concurrency
        self.connect_timeout_s = connect_timeout_s
        self.request_timeout_s = request_timeout_s
        self._lock = threading.Lock()
        self._cluster: Any = None
        self._session: Any = None
        self._st: _Statements | None = None
        self._closed = False
        self._states = DecodeCache(decode_cache_max)

    # ---- connection ----------------------------------------------------------------------

    def connect(self) -> CassandraHistoryStore:
        """Connect, apply the schema if asked, prepare statements. Idempotent."""
        self._ready()
        return self

    @property
    def connected(self) -> bool:
        """Connected, schema applied and statements prepared: reads need no connect first."""
        return self._st is not None

    def _ready(self) -> tuple[Any, _Statements]:
        st = self._st
        if st is not None:
            return self._session, st
        # another thread connecting (the API's early connect, or a request's): wait for it
        # at most a request's time, then fail like a request would, rather than queue
        # every caller behind a connection that a slow or cut-off node keeps waiting
        if not self._lock.acquire(timeout=self.request_timeout_s):
            raise HistoryStoreError(f"cassandra at {','.join(self.hosts)}:{self.port}: still connecting "
                                    f"after {self.request_timeout_s:.0f} s (another caller is connecting)")
        with _held(self._lock):
            if self._closed:
                raise HistoryStoreError("cassandra history store is closed")
            if self._st is None:
                cluster, session = connect(self.hosts, self.port, connect_timeout_s=self.connect_timeout_s,
                                           request_timeout_s=self.request_timeout_s)
                try:
                    if self.ensure_schema:
                        migrate(session, self.keyspace, replication=self.replication)
                    with translate_errors(f"prepare statements in keyspace {self.keyspace}"):
                        try:
                            st = _prepare(session, self.keyspace)
                        except Exception as exc:
                            from cassandra import InvalidRequest

                            if isinstance(exc, InvalidRequest):
                                raise HistoryStoreError(
                                    f"cassandra keyspace {self.keyspace} lacks the history schema "
                                    f"(python -m gnomon.history.migrate --keyspace {self.keyspace}): "
                                    f"{_one_line(exc)}"
                                ) from exc
                            raise
                except BaseException:
                    cluster.shutdown()
                    raise
                self._cluster, self._session, self._st = cluster, session, st
            return self._session, self._st

    def close(self) -> None:
        with self._lock:
            self._closed = True
            cluster, self._cluster, self._session, self._st = self._cluster, None, None, None
        if cluster is not None:
            cluster.shutdown()

    def _run(self, op: str, stmt: Any, params: Sequence[Any]) -> list[Any]:
        session, _ = self._ready()
        with translate_errors(op):
            return list(session.execute(stmt, params))

    async def _aready(self) -> tuple[Any, _Statements]:
        """``_ready`` without blocking the event loop: connecting (first use, or after
        ``close``) happens on a worker thread."""
        st = self._st
        if st is not None:
            return self._session, st
        return await asyncio.to_thread(self._ready)

    async def _arun(self, op: str, stmt: Any, params: Sequence[Any]) -> list[Any]:
        session, _ = await self._aready()
        with translate_errors(op):
            return await execute_on_loop(session, stmt, params, asyncio.get_running_loop())

    def _run_all(self, op: str, stmts: Sequence[tuple[Any, Sequence[Any] | None]]) -> list[list[Any]]:
        """Execute with at most ``concurrency`` statements in flight; all rows, in order.

        Not ``cassandra.concurrent.execute_concurrent``: with every host down its
        callbacks run synchronously and recurse, and it died with ``TypeError: '<' not
        supported between instances of 'RecursionError' and 'NoHostAvailable'`` (seen in
        a Cassandra outage), which no caller could expect. Here every failure, whatever
        the driver raises, becomes one ``HistoryStoreError``."""
        if not stmts:
            return []
        session, _ = self._ready()
        out: list[list[Any]] = [[] for _ in stmts]
        failures: list[BaseException] = []
        window: deque[tuple[int, Any]] = deque()

        def settle(index: int, future: Any) -> None:
            try:
                out[index] = list(future.result())
            except Exception as exc:  # any driver error (or driver bug) fails this statement
                failures.append(exc)

        with translate_errors(op):
            for index, (stmt, params) in enumerate(stmts):
                if len(window) >= self.concurrency:
                    settle(*window.popleft())
                try:
                    window.append((index, session.execute_async(stmt, params)))
                except Exception as exc:  # e.g. NoHostAvailable raised at once: the batch fails anyway
                    failures.append(exc)
                    break
            while window:
                settle(*window.popleft())
        if failures:
            raise HistoryStoreError(
                f"cassandra {op}: {len(failures)} of {len(stmts)} statements failed; first: {_one_line(failures[0])}"
            )
        return out

    # ---- statements per change -----------------------------------------------------------

    def _job_writes(self, st: _Statements, s: JobState, raw: bytes | None = None) -> list[tuple[Any, Sequence[Any]]]:
        blob = _blob(s, raw)
        out: list[tuple[Any, Sequence[Any]]] = [
            (st.put_job_by_id, (s.job_id, s.tenant, s.status.value, s.version, s.updated_at_ms, blob))
        ]
        if s.status is JobStatus.DELETED:
            out.append((st.del_job_by_tenant, (s.tenant, s.job_id)))
        else:
            out.append((st.put_job_by_tenant, (s.tenant, s.job_id, s.status.value, s.updated_at_ms, blob)))
        return out

    @staticmethod
    def _run_writes(st: _Statements, r: RunState, raw: bytes | None = None) -> list[tuple[Any, Sequence[Any]]]:
        blob = _blob(r, raw)
        out: list[tuple[Any, Sequence[Any]]] = [
            (st.put_run_by_id, (r.run_id, r.job_id, r.tenant, r.slot_ms, r.status.value, r.updated_at_ms, blob)),
            (st.put_run_by_job, (r.job_id, r.slot_ms, r.run_id, r.status.value, r.attempt, r.updated_at_ms, blob)),
        ]
        if r.status is RunStatus.FAILED:
            failed_at = r.finished_at_ms if r.finished_at_ms is not None else r.updated_at_ms
            out.append((st.put_dead, (r.tenant, r.slot_ms, r.run_id, r.job_id, failed_at, blob)))
        return out

    @staticmethod
    def _log_write(st: _Statements, x: LogLine) -> tuple[Any, Sequence[Any]]:
        return (st.put_log, (x.run_id, x.attempt, x.seq, x.job_id, x.tenant, x.stream.value, x.line, x.at_ms))

    # ---- jobs ----------------------------------------------------------------------------

    def put_job(self, state: JobState) -> None:
        _, st = self._ready()
        self._run_all(f"put job {state.job_id}", self._job_writes(st, state))

    def delete_job(self, tenant: str, job_id: str) -> None:
        _, st = self._ready()
        rows = self._run(f"delete job {job_id}", st.get_job_tenant, (job_id,))
        writes: list[tuple[Any, Sequence[Any]]] = [(st.del_job_by_tenant, (tenant, job_id))]
        if rows and rows[0].tenant == tenant:
            writes.append((st.del_job_by_id, (job_id,)))
        self._run_all(f"delete job {job_id}", writes)

    def forget_job(self, job_id: str) -> None:
        """Delete a job knowing only its id (a ``gnomon.jobs`` tombstone)."""
        _, st = self._ready()
        rows = self._run(f"delete job {job_id}", st.get_job_tenant, (job_id,))
        if rows:
            self.delete_job(rows[0].tenant, job_id)

    def get_job(self, job_id: str) -> JobState | None:
        _, st = self._ready()
        rows = self._run(f"get job {job_id}", st.get_job, (job_id,))
        return self._states.decode(rows[0].state, JobState, f"jobs_by_id {job_id}") if rows else None

    async def get_job_async(self, job_id: str) -> JobState | None:
        """``get_job`` for an event loop (never blocks it)."""
        _, st = await self._aready()
        rows = await self._arun(f"get job {job_id}", st.get_job, (job_id,))
        return self._states.decode(rows[0].state, JobState, f"jobs_by_id {job_id}") if rows else None

    def list_jobs(self, tenant: str, limit: int, cursor: str | None) -> Page:
        _, st = self._ready()

        def fetch(after: P.Key | None, n: int) -> list[tuple[P.Key, Any]]:
            if after is None:
                rows = self._run("list jobs", st.list_jobs_first, (tenant, n))
            else:
                rows = self._run("list jobs", st.list_jobs_after, (tenant, after[0], n))
            return [((r.job_id,), r) for r in rows]

        items, nxt = P.page(P.JOBS, fetch, limit, cursor)
        return Page([_decode(r.state, JobState, f"jobs_by_tenant {r.job_id}") for r in items], nxt)

    # ---- runs ----------------------------------------------------------------------------

    def put_run(self, state: RunState) -> None:
        _, st = self._ready()
        self._run_all(f"put run {state.run_id}", self._run_writes(st, state))

    def get_run(self, run_id: str) -> RunState | None:
        _, st = self._ready()
        rows = self._run(f"get run {run_id}", st.get_run, (run_id,))
        return self._states.decode(rows[0].state, RunState, f"runs_by_id {run_id}") if rows else None

    @staticmethod
    def _runs_query(st: _Statements, job_id: str, after: P.Key | None, n: int) -> tuple[Any, tuple[Any, ...]]:
        if after is None:
            return st.list_runs_first, (job_id, n)
        return st.list_runs_after, (job_id, after[0], after[1], n)

    def _runs_page(self, rows: Sequence[Any], cursor: str | None) -> Page:
        return Page([self._states.decode(r.state, RunState, f"runs_by_job {r.run_id}") for r in rows], cursor)

    def list_runs(self, job_id: str, status: str | None, limit: int, cursor: str | None) -> Page:
        wanted = parse_status(status)
        _, st = self._ready()

        def fetch(after: P.Key | None, n: int) -> list[tuple[P.Key, Any]]:
            rows = self._run("list runs", *self._runs_query(st, job_id, after, n))
            return [((r.slot_ms, r.run_id), r) for r in rows]

        items, nxt = P.page(P.RUNS, fetch, limit, cursor, _status_filter(wanted), self.status_scan_max)
        return self._runs_page(items, nxt)

    async def list_runs_async(self, job_id: str, status: str | None, limit: int, cursor: str | None) -> Page:
        """``list_runs`` for an event loop (never blocks it): the same pages and cursors."""
        wanted = parse_status(status)
        _, st = await self._aready()

        async def fetch(after: P.Key | None, n: int) -> list[tuple[P.Key, Any]]:
            rows = await self._arun("list runs", *self._runs_query(st, job_id, after, n))
            return [((r.slot_ms, r.run_id), r) for r in rows]

        items, nxt = await P.apage(P.RUNS, fetch, limit, cursor, _status_filter(wanted), self.status_scan_max)
        return self._runs_page(items, nxt)

    def list_dead_letters(self, tenant: str, limit: int, cursor: str | None) -> Page:
        _, st = self._ready()

        def fetch(after: P.Key | None, n: int) -> list[tuple[P.Key, _Dead]]:
            if after is None:
                rows = self._run("list dead letters", st.list_dead_first, (tenant, n))
            else:
                rows = self._run("list dead letters", st.list_dead_after, (tenant, after[0], after[1], n))
            checks = self._run_all("list dead letters", [(st.get_run_check, (r.run_id,)) for r in rows])
            out: list[tuple[P.Key, _Dead]] = []
            stale: list[tuple[Any, Sequence[Any]]] = []
            for r, found in zip(rows, checks, strict=True):
                key = (r.slot_ms, r.run_id)
                if not found:  # runs_by_id expired first: the dead letter stands on its own
                    out.append((key, _Dead(_decode(r.state, RunState, f"dead_letters_by_tenant {r.run_id}"))))
                elif found[0].status == RunStatus.FAILED.value:
                    out.append((key, _Dead(_decode(found[0].state, RunState, f"runs_by_id {r.run_id}"))))
                else:  # a newer non-failed state: stale; delete what was written before it
                    out.append((key, _Dead(None)))
                    stale.append((st.del_dead_at, (found[0].written, tenant, r.slot_ms, r.run_id)))
            if stale:
                try:
                    self._run_all("delete stale dead letters", stale)
                except HistoryStoreError as exc:  # harmless: retried by the next listing
                    log.warning("%s", exc)
            return out

        items, nxt = P.page(P.DEAD, fetch, limit, cursor, lambda d: d.state is not None, self.status_scan_max)
        return Page([d.state for d in items], nxt)

    # ---- logs ----------------------------------------------------------------------------

    def put_log(self, line: LogLine) -> None:
        _, st = self._ready()
        self._run_all(f"put log of {line.run_id}", [self._log_write(st, line)])

    def get_logs(self, run_id: str, limit: int, cursor: str | None) -> Page:
        _, st = self._ready()

        def fetch(after: P.Key | None, n: int) -> list[tuple[P.Key, LogLine]]:
            if after is None:
                rows = self._run("get logs", st.logs_first, (run_id, n))
            else:
                rows = self._run("get logs", st.logs_after, (run_id, after[0], after[1], n))
            return [((r.attempt, r.seq), self._line(run_id, r)) for r in rows]

        return Page(*P.page(P.LOGS, fetch, limit, cursor))

    @staticmethod
    def _line(run_id: str, r: Any) -> LogLine:
        try:
            stream = LogStream(r.stream)
        except ValueError:
            raise HistoryStoreError(f"cassandra logs_by_run {run_id}: unknown stream {r.stream!r}") from None
        return LogLine(run_id, r.job_id, r.tenant, r.attempt, r.seq, stream, r.line or "", r.at_ms)

    # ---- batches -------------------------------------------------------------------------

    def write_batch(self, batch: HistoryBatch) -> None:
        """All writes of ``batch``, grouped into few requests (``_write_groups``) sent
        concurrently (at most ``concurrency`` in flight). Raises ``HistoryStoreError`` if
        any failed (some may have been applied: retry the whole batch; every write is
        idempotent)."""
        session, st = self._ready()
        writes: list[tuple[Any, Sequence[Any]]] = []
        if batch.deleted_jobs:
            found = self._run_all("look up deleted jobs", [(st.get_job_tenant, (j,)) for j in batch.deleted_jobs])
            for job_id, rows in zip(batch.deleted_jobs, found, strict=True):
                if rows:
                    writes += [(st.del_job_by_tenant, (rows[0].tenant, job_id)), (st.del_job_by_id, (job_id,))]
        job_blobs, run_blobs = batch.job_blobs, batch.run_blobs
        for job in batch.jobs:
            writes += self._job_writes(st, job, job_blobs.get(job.job_id))
        for run in batch.runs:
            writes += self._run_writes(st, run, run_blobs.get(run.run_id))
        writes += [self._log_write(st, x) for x in batch.logs]
        op = f"write batch of {len(batch)}"
        try:
            requests = [g.request() for g in self._write_groups(session, writes)]
        except Exception as exc:  # a value the driver cannot serialize (or no ring yet): fail like a refused statement
            raise HistoryStoreError(f"cassandra {op}: cannot bind or group its statements: {_one_line(exc)}") from exc
        self._run_all(op, [(r, None) for r in requests])

    def _write_groups(self, session: Any, writes: Sequence[tuple[Any, Sequence[Any]]]) -> list[_WriteGroup]:
        """``writes`` bound and grouped by the replicas of their partition, each group at
        most ``WRITE_BATCH_*_MAX`` and sent as one request (one request per statement
        before: the cost, in the projector and in Cassandra, was per request)."""
        metadata = session.cluster.metadata
        open_groups: dict[frozenset[Any], _WriteGroup] = {}  # by replica set (in any ring order)
        full: list[_WriteGroup] = []
        last_partition: bytes | None = None
        replicas: frozenset[Any] = frozenset()
        for partition, size_bytes, statement in _by_partition(writes):
            if partition != last_partition:
                last_partition = partition
                replicas = frozenset(metadata.get_replicas(self.keyspace, partition)) if partition else frozenset()
            group = open_groups.get(replicas)
            if group is None or not group.fits(partition, size_bytes):
                if group is not None:
                    full.append(group)
                group = open_groups[replicas] = _WriteGroup()
            group.add(statement, partition, size_bytes)
        return full + list(open_groups.values())
