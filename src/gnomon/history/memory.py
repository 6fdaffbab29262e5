"""``InMemoryHistoryStore``: the HistoryStore contract in a few dicts (pure tests, the
in-memory runner). Same ordering, paging, cursors, filtering and dead-letter rules as
``CassandraHistoryStore``; no retention TTL. Thread-safe (one lock)."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from gnomon.core.errors import ValidationError
from gnomon.core.jobs import JobState, JobStatus
from gnomon.core.messages import LogLine
from gnomon.core.runs import RunState, RunStatus
from gnomon.history import _paging as P
from gnomon.history.base import STATUS_SCAN_MAX, HistoryBatch, parse_status
from gnomon.ports import Page

__all__ = ["InMemoryHistoryStore"]


class InMemoryHistoryStore:
    def __init__(self, status_scan_max: int = STATUS_SCAN_MAX) -> None:
        if status_scan_max < 1:
            raise ValidationError("status_scan_max", "must be >= 1")
        self.status_scan_max = status_scan_max
        self._lock = threading.RLock()
        self._jobs: dict[str, JobState] = {}
        self._jobs_by_tenant: dict[str, dict[str, JobState]] = {}
        self._runs: dict[str, RunState] = {}
        self._runs_by_job: dict[str, dict[str, RunState]] = {}
        self._logs: dict[str, dict[tuple[int, int], LogLine]] = {}
        self._dead: dict[str, dict[str, RunState]] = {}
        self.closed = False

    # ---- jobs ----------------------------------------------------------------------------

    def put_job(self, state: JobState) -> None:
        with self._lock:
            self._jobs[state.job_id] = state
            listed = self._jobs_by_tenant.setdefault(state.tenant, {})
            if state.status is JobStatus.DELETED:
                listed.pop(state.job_id, None)
            else:
                listed[state.job_id] = state

    def delete_job(self, tenant: str, job_id: str) -> None:
        with self._lock:
            if (old := self._jobs.get(job_id)) is not None and old.tenant == tenant:
                del self._jobs[job_id]
            self._jobs_by_tenant.get(tenant, {}).pop(job_id, None)

    def forget_job(self, job_id: str) -> None:
        """Delete a job knowing only its id (a ``gnomon.jobs`` tombstone)."""
        with self._lock:
            if (old := self._jobs.get(job_id)) is not None:
                self.delete_job(old.tenant, job_id)

    def get_job(self, job_id: str) -> JobState | None:
        with self._lock:
            return self._jobs.get(job_id)

    def list_jobs(self, tenant: str, limit: int, cursor: str | None) -> Page:
        def fetch(after: P.Key | None, n: int) -> list[tuple[P.Key, JobState]]:
            with self._lock:
                rows = self._jobs_by_tenant.get(tenant, {})
                ids = sorted(j for j in rows if after is None or j > after[0])[:n]
                return [((j,), rows[j]) for j in ids]

        return Page(*P.page(P.JOBS, fetch, limit, cursor))

    # ---- runs ----------------------------------------------------------------------------

    def put_run(self, state: RunState) -> None:
        with self._lock:
            self._runs[state.run_id] = state
            self._runs_by_job.setdefault(state.job_id, {})[state.run_id] = state
            dead = self._dead.setdefault(state.tenant, {})
            if state.status is RunStatus.FAILED:
                dead[state.run_id] = state
            else:
                dead.pop(state.run_id, None)

    def get_run(self, run_id: str) -> RunState | None:
        with self._lock:
            return self._runs.get(run_id)

    @staticmethod
    def _newest_first(rows: dict[str, RunState], after: P.Key | None, n: int) -> list[tuple[P.Key, RunState]]:
        keyed = sorted(((r.slot_ms, r.run_id), r) for r in rows.values())
        keyed.reverse()
        return [(k, r) for k, r in keyed if after is None or k < after][:n]

    def list_runs(self, job_id: str, status: str | None, limit: int, cursor: str | None) -> Page:
        wanted = parse_status(status)

        def fetch(after: P.Key | None, n: int) -> list[tuple[P.Key, RunState]]:
            with self._lock:
                return self._newest_first(self._runs_by_job.get(job_id, {}), after, n)

        keep = None if wanted is None else (lambda r: r.status is wanted)
        return Page(*P.page(P.RUNS, fetch, limit, cursor, keep, self.status_scan_max))

    def list_dead_letters(self, tenant: str, limit: int, cursor: str | None) -> Page:
        def fetch(after: P.Key | None, n: int) -> list[tuple[P.Key, RunState]]:
            with self._lock:
                return self._newest_first(self._dead.get(tenant, {}), after, n)

        return Page(*P.page(P.DEAD, fetch, limit, cursor))

    # ---- logs ----------------------------------------------------------------------------

    def put_log(self, line: LogLine) -> None:
        with self._lock:
            self._logs.setdefault(line.run_id, {})[(line.attempt, line.seq)] = line

    def get_logs(self, run_id: str, limit: int, cursor: str | None) -> Page:
        def fetch(after: P.Key | None, n: int) -> list[tuple[P.Key, LogLine]]:
            with self._lock:
                lines = self._logs.get(run_id, {})
                keys = sorted(k for k in lines if after is None or k > after)[:n]
                return [(k, lines[k]) for k in keys]

        return Page(*P.page(P.LOGS, fetch, limit, cursor))

    # ---- batches, lifecycle --------------------------------------------------------------

    def write_batch(self, batch: HistoryBatch) -> None:
        with self._lock:
            for job in batch.jobs:
                self.put_job(job)
            for job_id in batch.deleted_jobs:
                self.forget_job(job_id)
            for run in batch.runs:
                self.put_run(run)
            for line in batch.logs:
                self.put_log(line)

    def runs(self) -> Sequence[RunState]:
        """Every run stored (tests)."""
        with self._lock:
            return list(self._runs.values())

    def close(self) -> None:
        self.closed = True
