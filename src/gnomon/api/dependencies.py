"""The API's checks of a job's ``after`` (core.dependencies; docs/adr/0011 decision 4):
every upstream a job of the tenant, no cycle, the limits on fan-in, fan-out, depth and
size. Read from history (the tenant's jobs, at most ``JOBS_SCANNED_MAX``), so a job
registered a moment ago may not be there yet: the 422 says so. The processors do not
check cycles (one partition sees one job): two registrations racing to close one are
caught by the wait bound, recorded skipped with the reason (docs/schedules.md)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gnomon.api.calendars import JOBS_SCANNED_MAX
from gnomon.core.dependencies import check_dag
from gnomon.core.errors import ValidationError
from gnomon.core.jobs import JobState
from gnomon.core.model import Upstream
from gnomon.ports import HistoryStore


def tenant_edges(history: HistoryStore, tenant: str) -> dict[str, tuple[str, ...]]:
    """The tenant's jobs (not deleted) -> the job ids each waits for."""
    edges: dict[str, tuple[str, ...]] = {}
    cursor: str | None = None
    while len(edges) < JOBS_SCANNED_MAX:
        page = history.list_jobs(tenant, 500, cursor)
        for job in page.items:
            edges[job.job_id] = tuple(u.job_id for u in job.spec.after)
        cursor = page.cursor
        if not cursor:
            break
    return edges


def check_after(history: HistoryStore, tenant: str, job_id: str, after: Sequence[Upstream],
                recent: Callable[[str], JobState | None] = lambda _job_id: None) -> None:
    """ValidationError naming ``after[i].job`` (or ``after``) if ``job_id`` may not wait
    for ``after``. ``recent``: a job this API process registered a moment ago, which
    history may not have yet."""
    if not after:
        return
    edges = tenant_edges(history, tenant)
    for up in after:
        fresh = recent(up.job_id) if up.job_id not in edges else None
        if fresh is not None and fresh.tenant == tenant:
            edges[up.job_id] = tuple(u.job_id for u in fresh.spec.after)
    for i, up in enumerate(after):
        if up.job_id != job_id and up.job_id not in edges:
            raise ValidationError(f"after[{i}].job", f"no job {up.job_id!r} of this tenant (register the upstream "
                                                     "first; a job registered a moment ago may take a second)")
    check_dag(job_id, after, edges)
