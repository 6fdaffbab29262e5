"""A finished run as one flat record for exports (Kafka Connect -> PostgreSQL, JSON lines).

``RunExport`` is what the run-exports topic carries (keyed by ``run_id``): the facts a
person queries about a run that ended, without the job spec or the live fields of a
``RunState``. It is written by the history projector once the run's final state is in
the history store (``gnomon.history.export``); delivery is at-least-once, so a sink
must upsert by ``run_id`` (the JDBC sink does; a JSON-lines file keeps the last line).

Pure: :func:`export_of` maps a ``RunState`` to its export, or None while it is live.
"""

from __future__ import annotations

from dataclasses import dataclass

from gnomon.core.clock import ms_to_iso
from gnomon.core.model import Priority
from gnomon.core.runs import RunState, RunStatus


@dataclass(frozen=True)
class RunExport:
    run_id: str
    job_id: str
    tenant: str
    pool: str
    priority: Priority
    slot_ms: int  # the scheduled slot, epoch ms
    slot: str  # the same instant, UTC ISO-8601 (gnomon.core.clock.ms_to_iso)
    status: RunStatus  # always a final one: succeeded, failed, cancelled, skipped
    attempts: int  # attempts granted (0 for a run skipped or cancelled before it started)
    manual: bool
    updated_at_ms: int  # of the final RunState: the later of two exports of a run wins
    start_lag_ms: int | None = None  # started_at_ms - not_before_ms (the API's startLagS, in ms)
    started_at_ms: int | None = None
    finished_at_ms: int | None = None
    exit_code: int | None = None
    reason: str | None = None


def export_of(run: RunState) -> RunExport | None:
    """The export of ``run`` if it reached a final status, else None."""
    if not run.status.terminal:
        return None
    return RunExport(
        run_id=run.run_id,
        job_id=run.job_id,
        tenant=run.tenant,
        pool=run.spec.pool,
        priority=run.spec.priority,
        slot_ms=run.slot_ms,
        slot=ms_to_iso(run.slot_ms),
        status=run.status,
        attempts=run.attempt,
        manual=run.manual,
        updated_at_ms=run.updated_at_ms,
        start_lag_ms=None if run.started_at_ms is None else run.started_at_ms - run.not_before_ms,
        started_at_ms=run.started_at_ms,
        finished_at_ms=run.finished_at_ms,
        exit_code=run.exit_code,
        reason=run.reason,
    )

