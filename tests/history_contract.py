"""The HistoryStore contract as a pytest suite, for every implementation to run.

Subclass ``HistoryStoreContract`` in a test module and provide a ``make_store`` fixture:
a factory ``make_store(status_scan_max=...) -> ProjectionStore``; all stores it returns
must share the same data. Tests isolate themselves with fresh random ids, so one store
(one keyspace) can serve the whole suite. ``tests/conftest.py`` puts this directory on
``sys.path`` and has pytest rewrite its asserts: ``from history_contract import ...``.
"""

from __future__ import annotations

import secrets
from dataclasses import replace
from typing import Any

import pytest

from gnomon.core.errors import ValidationError
from gnomon.core.jobs import JobState, JobStatus
from gnomon.core.messages import LogLine, LogStream
from gnomon.core.model import (
    CatchUp,
    JobSpec,
    Priority,
    RetryPolicy,
    Schedule,
    Target,
    TargetType,
    manual_run_id,
    slot_run_id,
)
from gnomon.core.runs import RunState, RunStatus
from gnomon.history.base import HistoryBatch

T0 = 1_795_939_200_000  # 2026-11-29T08:00:00Z
MINUTE = 60_000

SPEC = JobSpec(
    name="nightly report \u2603",
    schedule=Schedule(cron="* * * * *", tz="Europe/Zurich"),
    target=Target(TargetType.COMMAND, argv=("python", "-c", "print('hi')")),
    payload_json='{"a":[1,2,{"b":null}]}',
    priority=Priority.HIGH,
    timeout_s=60,
    retry=RetryPolicy(max_attempts=2, backoff_base_s=0.5, backoff_cap_s=10.0),
    catch_up=CatchUp.ALL,
    pool="batch",
)


def uid(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(6)}"


def job(job_id: str, tenant: str, version: int = 1, status: JobStatus = JobStatus.ACTIVE) -> JobState:
    return JobState(job_id, tenant, SPEC, status, T0 + MINUTE, version, T0, T0 + version)


def run(
    job_id: str,
    slot_ms: int,
    status: RunStatus = RunStatus.SUCCEEDED,
    tenant: str = "acme",
    *,
    manual_key: str | None = None,
    **changes: Any,
) -> RunState:
    run_id = manual_run_id(job_id, manual_key) if manual_key else slot_run_id(job_id, slot_ms)
    base = RunState(
        run_id=run_id, job_id=job_id, tenant=tenant, spec=SPEC, slot_ms=slot_ms, not_before_ms=slot_ms,
        manual=manual_key is not None, status=status, created_at_ms=slot_ms - 5_000, updated_at_ms=slot_ms + 1_000,
    )
    return replace(base, **changes)


def failed(job_id: str, slot_ms: int, tenant: str = "acme") -> RunState:
    return run(job_id, slot_ms, RunStatus.FAILED, tenant, attempt=2, token=2, finished_at_ms=slot_ms + 9_000,
               exit_code=3, error="boom", reason="failed")


def line(run_id: str, attempt: int, seq: int, text: str = "", stream: LogStream = LogStream.STDOUT) -> LogLine:
    job_id = run_id.partition("@")[0]
    return LogLine(run_id, job_id, "acme", attempt, seq, stream, text or f"line {attempt}.{seq}", T0 + seq)


def all_pages(fetch: Any, limit: int, pages_max: int = 1000) -> tuple[list[Any], list[Any]]:
    """Follow cursors to the end: (every item, every page)."""
    items: list[Any] = []
    pages: list[Any] = []
    cursor = None
    for _ in range(pages_max):
        page = fetch(limit, cursor)
        pages.append(page)
        items.extend(page.items)
        cursor = page.cursor
        if cursor is None:
            return items, pages
    raise AssertionError(f"more than {pages_max} pages")


class HistoryStoreContract:
    @pytest.fixture
    def store(self, make_store: Any) -> Any:
        return make_store()

    # ---- jobs ----------------------------------------------------------------------------

    def test_job_round_trips_exactly(self, store: Any) -> None:
        j = job(uid("job"), uid("t"))
        assert store.get_job(j.job_id) is None
        store.put_job(j)
        assert store.get_job(j.job_id) == j

    def test_job_upsert_keeps_latest_and_one_row(self, store: Any) -> None:
        tenant, job_id = uid("t"), uid("job")
        for v in (1, 2, 3, 3):
            store.put_job(job(job_id, tenant, v, JobStatus.PAUSED if v == 2 else JobStatus.ACTIVE))
        assert store.get_job(job_id) == job(job_id, tenant, 3)
        page = store.list_jobs(tenant, 10, None)
        assert page.items == [job(job_id, tenant, 3)] and page.cursor is None

    def test_list_jobs_by_tenant_in_id_order_with_exact_paging(self, store: Any) -> None:
        tenant, other = uid("t"), uid("t")
        ids = [f"job_{i:03d}_{secrets.token_hex(2)}" for i in range(7)]
        for job_id in reversed(ids):
            store.put_job(job(job_id, tenant))
        store.put_job(job(uid("job"), other))
        items, pages = all_pages(lambda n, c: store.list_jobs(tenant, n, c), 3)
        assert [j.job_id for j in items] == sorted(ids)
        assert [len(p.items) for p in pages] == [3, 3, 1]
        items, pages = all_pages(lambda n, c: store.list_jobs(tenant, n, c), 7)
        assert len(pages) == 1 and len(items) == 7  # an exact fit: no empty trailing page
        assert store.list_jobs(uid("t"), 5, None).items == []

    def test_deleted_jobs_disappear(self, store: Any) -> None:
        tenant = uid("t")
        a, b, c = (job(uid("job"), tenant) for _ in range(3))
        for j in (a, b, c):
            store.put_job(j)
        store.delete_job(tenant, a.job_id)
        store.forget_job(b.job_id)
        store.forget_job(uid("job"))  # unknown: nothing happens
        dead = replace(c, status=JobStatus.DELETED, version=2)
        store.put_job(dead)
        assert store.get_job(a.job_id) is None and store.get_job(b.job_id) is None
        assert store.get_job(c.job_id) == dead  # kept by id, not listed
        assert store.list_jobs(tenant, 10, None).items == []

    def test_delete_job_of_another_tenant_keeps_the_job(self, store: Any) -> None:
        j = job(uid("job"), uid("t"))
        store.put_job(j)
        store.delete_job(uid("t"), j.job_id)
        assert store.get_job(j.job_id) == j
        assert store.list_jobs(j.tenant, 10, None).items == [j]

    # ---- runs ----------------------------------------------------------------------------

    def test_run_round_trips_exactly(self, store: Any) -> None:
        r = run(uid("job"), T0, RunStatus.RUNNING, attempt=1, token=1, worker_id="w-1", lease_until_ms=T0 + 30_000,
                deadline_ms=T0 + 90_000, dispatched_at_ms=T0, started_at_ms=T0 + 10, error="\u00e9\n\ttab")
        assert store.get_run(r.run_id) is None
        store.put_run(r)
        assert store.get_run(r.run_id) == r

    def test_runs_newest_slot_first_with_paging(self, store: Any) -> None:
        job_id = uid("job")
        runs = [run(job_id, T0 + i * MINUTE) for i in range(10)]
        runs.append(run(job_id, T0 + 3 * MINUTE, manual_key="k1"))  # same slot as a scheduled run
        runs.append(run(job_id, T0 + 3 * MINUTE, manual_key="k2"))
        for r in runs[::2] + runs[1::2]:
            store.put_run(r)
        store.put_run(run(uid("job"), T0 + 99 * MINUTE))  # another job
        expected = sorted(runs, key=lambda r: (r.slot_ms, r.run_id), reverse=True)
        for limit in (1, 3, 4, 12, 50):
            items, pages = all_pages(lambda n, c: store.list_runs(job_id, None, n, c), limit)
            assert items == expected, limit
            assert all(len(p.items) == limit for p in pages[:-1])
            assert 1 <= len(pages[-1].items) <= limit
        assert store.list_runs(uid("job"), None, 10, None).items == []

    def test_run_upserts_keep_one_row_with_the_latest_state(self, store: Any) -> None:
        job_id = uid("job")
        states = [run(job_id, T0, s, updated_at_ms=T0 + i)
                  for i, s in enumerate((RunStatus.SCHEDULED, RunStatus.READY, RunStatus.RUNNING, RunStatus.SUCCEEDED))]
        for s in states + states[-1:]:  # replayed last record
            store.put_run(s)
        assert store.get_run(states[0].run_id) == states[-1]
        assert store.list_runs(job_id, None, 10, None).items == [states[-1]]

    def test_status_filter(self, store: Any) -> None:
        job_id = uid("job")
        statuses = [RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.SKIPPED] * 5
        runs = [run(job_id, T0 + i * MINUTE, s) for i, s in enumerate(statuses)]
        for r in runs:
            store.put_run(r)
        newest = runs[::-1]
        for status in (RunStatus.FAILED, RunStatus.SKIPPED):
            for limit in (1, 2, 5, 6):
                items, pages = all_pages(lambda n, c, s=status: store.list_runs(job_id, s.value, n, c), limit)
                assert items == [r for r in newest if r.status is status]
                assert len(pages) == -(-5 // limit)  # exact: no empty trailing page
        assert store.list_runs(job_id, "running", 10, None) .items == []
        assert store.list_runs(job_id, "running", 10, None).cursor is None

    def test_status_filter_scan_is_bounded_and_resumable(self, make_store: Any) -> None:
        store = make_store(status_scan_max=4)
        job_id = uid("job")
        runs = [run(job_id, T0 + i * MINUTE, RunStatus.FAILED if i in (0, 9) else RunStatus.SUCCEEDED)
                for i in range(12)]
        for r in runs:
            store.put_run(r)
        first = store.list_runs(job_id, "failed", 5, None)
        assert first.items == [runs[9]] and first.cursor is not None  # budget spent after 4 rows
        items, pages = all_pages(lambda n, c: store.list_runs(job_id, "failed", n, c), 5)
        assert items == [runs[9], runs[0]]
        assert len(pages) == 3 and pages[1].items == [] and pages[1].cursor is not None

    def test_bad_arguments_are_validation_errors(self, store: Any) -> None:
        job_id = uid("job")
        for i in range(3):
            store.put_run(run(job_id, T0 + i * MINUTE))
        store.put_log(line(f"{job_id}@x", 1, 1))
        with pytest.raises(ValidationError) as e:
            store.list_runs(job_id, "bogus", 10, None)
        assert e.value.field == "status"
        for bad in ("", "!!!", "bm90IGpzb24", "WyJyIiwxXQ", "WyJqIiwiYSJd"):  # last two: wrong shape / kind
            with pytest.raises(ValidationError) as e:
                store.list_runs(job_id, None, 10, bad)
            assert e.value.field == "cursor"
        runs_cursor = store.list_runs(job_id, None, 1, None).cursor
        with pytest.raises(ValidationError):
            store.get_logs(f"{job_id}@x", 1, runs_cursor)
        with pytest.raises(ValidationError):
            store.list_jobs("acme", 10, runs_cursor)
        with pytest.raises(ValidationError) as e:
            store.list_runs(job_id, None, 0, None)
        assert e.value.field == "limit"

    # ---- dead letters --------------------------------------------------------------------

    def test_failed_runs_are_dead_letters_newest_first(self, store: Any) -> None:
        tenant, other = uid("t"), uid("t")
        a, b = uid("job"), uid("job")
        dead = [failed(a, T0, tenant), failed(b, T0 + MINUTE, tenant), failed(a, T0 + 2 * MINUTE, tenant)]
        for r in dead:
            store.put_run(r)
        store.put_run(run(a, T0 + 3 * MINUTE, RunStatus.SUCCEEDED, tenant))
        store.put_run(run(a, T0 + 4 * MINUTE, RunStatus.RETRY_WAIT, tenant))
        store.put_run(failed(uid("job"), T0, other))
        items, pages = all_pages(lambda n, c: store.list_dead_letters(tenant, n, c), 2)
        assert items == dead[::-1]
        assert [len(p.items) for p in pages] == [2, 1]
        assert store.list_dead_letters(uid("t"), 10, None).items == []

    def test_a_later_non_failed_state_removes_the_dead_letter(self, store: Any) -> None:
        tenant, job_id = uid("t"), uid("job")
        keep, revived = failed(job_id, T0, tenant), failed(job_id, T0 + MINUTE, tenant)
        store.put_run(keep)
        store.put_run(revived)
        again = run(job_id, T0 + MINUTE, RunStatus.RUNNING, tenant, attempt=1, token=1, worker_id="w",
                    lease_until_ms=T0, deadline_ms=T0)
        store.put_run(again)  # e.g. a replay of the ledger from an earlier offset
        assert store.list_dead_letters(tenant, 10, None).items == [keep]
        assert store.list_dead_letters(tenant, 10, None).items == [keep]  # stable after clean-up
        store.put_run(revived)  # ... that then reaches the FAILED state again
        assert store.list_dead_letters(tenant, 10, None).items == [revived, keep]

    # ---- logs ----------------------------------------------------------------------------

    def test_logs_in_attempt_and_seq_order_with_paging(self, store: Any) -> None:
        run_id = slot_run_id(uid("job"), T0)
        lines = [line(run_id, a, s, stream=LogStream.STDERR if s % 2 else LogStream.STDOUT)
                 for a in (1, 2) for s in range(6)]
        lines.append(line(run_id, 1, 100, "x" * 5000 + " \u2603 'quoted' ;", LogStream.SYSTEM))
        expected = sorted(lines, key=lambda x: (x.attempt, x.seq))
        for x in reversed(lines):
            store.put_log(x)
        store.put_log(lines[0])  # replayed
        store.put_log(line(slot_run_id(uid("job"), T0), 1, 1))  # another run
        for limit in (1, 5, 13, 100):
            items, _ = all_pages(lambda n, c: store.get_logs(run_id, n, c), limit)
            assert items == expected
        assert store.get_logs(slot_run_id(uid("job"), T0), 10, None).items == []

    # ---- batches -------------------------------------------------------------------------

    def test_write_batch(self, store: Any) -> None:
        tenant = uid("t")
        gone, kept = job(uid("job"), tenant), job(uid("job"), tenant)
        store.put_job(gone)
        r = failed(kept.job_id, T0, tenant)
        lines = [line(r.run_id, 1, s) for s in range(3)]
        store.write_batch(HistoryBatch(jobs=[kept], deleted_jobs=[gone.job_id, uid("job")], runs=[r], logs=lines))
        assert store.get_job(gone.job_id) is None
        assert store.list_jobs(tenant, 10, None).items == [kept]
        assert store.get_run(r.run_id) == r
        assert store.list_dead_letters(tenant, 10, None).items == [r]
        assert store.get_logs(r.run_id, 10, None).items == lines
        store.write_batch(HistoryBatch())

    def test_replaying_history_converges(self, store: Any) -> None:
        tenant, job_id = uid("t"), uid("job")
        states = [
            run(job_id, T0, RunStatus.SCHEDULED, tenant),
            run(job_id, T0, RunStatus.RUNNING, tenant, attempt=1, token=1, worker_id="w", lease_until_ms=T0,
                deadline_ms=T0),
            failed(job_id, T0, tenant),
        ]
        for _ in range(2):
            for s in states:
                store.put_run(s)
        assert store.get_run(states[0].run_id) == states[-1]
        assert store.list_runs(job_id, None, 10, None).items == [states[-1]]
        assert store.list_dead_letters(tenant, 10, None).items == [states[-1]]
