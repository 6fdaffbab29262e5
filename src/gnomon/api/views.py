"""JSON shapes of jobs and runs as the API returns them, and their rendering to bytes
for the hot read path (``RunViews``, ``page_json``), byte for byte what FastAPI's
``JSONResponse`` would send for the same dict."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from typing import Any

from gnomon.core.calendars import Calendar
from gnomon.core.clock import ms_to_iso
from gnomon.core.fires import Preview, preview
from gnomon.core.jobs import JobState, describe_schedule, ended_because, runs_left
from gnomon.core.messages import LogLine
from gnomon.core.runs import RunState
from gnomon.core.validation import job_spec_to_json


def _iso(ms: int | None) -> str | None:
    return None if ms is None else ms_to_iso(ms)


def job_view(state: JobState) -> dict[str, Any]:
    return {
        "id": state.job_id,
        "tenant": state.tenant,
        "status": state.status.value,
        "nextRunAt": _iso(state.next_run_at_ms),
        "version": state.version,
        "createdAt": _iso(state.created_at_ms),
        "updatedAt": _iso(state.updated_at_ms),
        # runs the schedule triggered so far (what maxRuns counts), and why a job with no
        # slot left ended (status done)
        "scheduledRuns": state.scheduled_runs,
        "endedBecause": ended_because(state),
        **job_spec_to_json(state.spec),
        **({"downstreams": list(state.downstreams)} if state.downstreams else {}),
        **({"movedTo": state.moved_to} if state.moved_to is not None else {}),
    }


FIRES_SHOWN = 10


def _done_preview(state: JobState, ended: str, after_ms: int, count: int, calendars: Sequence[Calendar]) -> Preview:
    """A done job's preview: the slots after ``after_ms`` its schedule triggered before it
    ended (its last ones, in the lookahead: runs still ahead), with the end the preview
    gave while it was active; none, and why it ended, once they are past. None for a job
    moved away either (runs staged here before the move still run here, but its slots
    are the new region's)."""
    last = state.last_slot_ms
    if state.moved_to is not None or last is None or last <= after_ms:
        return Preview((), ended)
    ahead = preview(state.spec.schedule, after_ms=after_ms, count=count, job_id=state.job_id,
                    jitter_s=state.spec.jitter_s, runs_left=0, counted_before_ms=last + 1, calendars=calendars)
    fires = tuple(f for f in ahead.fires if f.slot_ms <= last)
    return Preview(fires, ahead.ends or ended) if fires else Preview((), ended)


def fires_view(state: JobState, after_ms: int, count: int, calendars: Sequence[Calendar] = ()) -> dict[str, Any]:
    """``GET /v1/jobs/{id}/fires``: the job's next ``count`` slots after ``after_ms``."""
    spec = state.spec
    ended = ended_because(state)
    if ended is not None:  # done: endedBecause says why (not a preview's guess); no slot follows
        shown = _done_preview(state, ended, after_ms, count, calendars)
    elif spec.schedule.after_upstreams:  # its slots come when its upstreams' runs end
        shown = Preview((), "no schedule of its own: a run after each run of its upstreams")
    else:
        shown = preview(spec.schedule, after_ms=after_ms, count=count, job_id=state.job_id,
                        jitter_s=spec.jitter_s, runs_left=runs_left(state), counted_before_ms=state.next_run_at_ms,
                        calendars=calendars)
    return {
        "jobId": state.job_id,
        "timezone": spec.schedule.tz,
        "schedule": describe_schedule(spec),
        "status": state.status.value,
        "after": ms_to_iso(after_ms),
        "fires": [{"slot": ms_to_iso(f.slot_ms), "start": ms_to_iso(f.start_ms), "local": f.local(spec.schedule.tz),
                   "excludedBy": f.excluded_by} for f in shown.fires],
        "ends": shown.ends,
        "endedBecause": ended,
    }


def run_view(run: RunState) -> dict[str, Any]:
    return {
        "id": run.run_id,
        "jobId": run.job_id,
        "status": run.status.value,
        "staged": run.staged,  # running, but granted ahead and waiting for its slot on the worker
        "slot": _iso(run.slot_ms),
        "manual": run.manual,
        # attempt: attempts granted so far (counting every replay); maxAttempts: where the
        # current retry budget ends (a replay gives a fresh one on top of the attempts spent).
        "attempt": run.attempt,
        "maxAttempts": run.attempts_before_replay + run.spec.retry.max_attempts,
        "replays": run.replays,
        "worker": run.worker_id,
        "createdAt": _iso(run.created_at_ms),
        # grantedAt: when the processor staged it on a worker (processor clock), usually
        # before the slot; startAt: when it is due to start (the slot, plus the job's
        # jitter); startedAt: when the worker started the first attempt (worker clock);
        # startLagS = startedAt - startAt.
        "grantedAt": _iso(run.granted_at_ms),
        "startAt": _iso(run.not_before_ms),
        "startedAt": _iso(run.started_at_ms),
        "startLagS": None if run.started_at_ms is None else round((run.started_at_ms - run.not_before_ms) / 1000, 3),
        "finishedAt": _iso(run.finished_at_ms),
        "nextAttemptAt": _iso(run.next_attempt_at_ms),  # set in retry_wait: when the next attempt is released
        "exitCode": run.exit_code,
        "error": run.error,
        "reason": run.reason,
        # a skipped range: every slot of the schedule from skippedFrom to slot, skippedCount of them
        "skippedFrom": _iso(run.skipped_from_ms),
        "skippedCount": run.skipped_count if run.status.value == "skipped" else None,
        "backfill": run.backfill,
        "reopens": run.reopens,
        "note": run.note,  # kept when it finishes, unlike reason (then the outcome)
        # the latest ended attempt's output: a handler's return value, a command's last lines
        "output": _output(run.output),
    }


def _output(text: str | None) -> Any:
    """Recorded output as a JSON value; text that is not JSON (a worker that did not use
    the SDK) is shown as a string rather than failing the page."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


def log_view(line: LogLine) -> dict[str, Any]:
    return {"attempt": line.attempt, "seq": line.seq, "stream": line.stream.value, "at": _iso(line.at_ms),
            "line": line.line}


def dumps(value: Any) -> bytes:
    """JSON as Starlette's ``JSONResponse`` renders it (compact, UTF-8, no NaN)."""
    return json.dumps(value, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")).encode("utf-8")


def page_json(items: Sequence[bytes], cursor: str | None) -> bytes:
    """``{"items": [...], "cursor": ...}`` from items already rendered by ``dumps``."""
    return b'{"items":[' + b",".join(items) + b'],"cursor":' + dumps(cursor) + b"}"


class RunViews:
    """``dumps(run_view(run))`` per run state object, remembered for the last
    ``max_entries`` states rendered (oldest first out).

    Keyed by the object itself (identity): states are frozen, and the history stores
    hand out the same object for the same stored row (the Cassandra store's decode
    cache; the in-memory store's dicts), so a run listed again unchanged costs a dict
    lookup, and a changed run is a new object, rendered afresh. The entry holds the
    state, so its id cannot be reused while it is cached. Thread-safe."""

    def __init__(self, max_entries: int = 4096) -> None:
        self.max_entries = max_entries
        self._d: dict[int, tuple[RunState, bytes]] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._d)

    def json(self, run: RunState) -> bytes:
        hit = self._d.get(id(run))
        if hit is not None and hit[0] is run:
            return hit[1]
        data = dumps(run_view(run))
        if self.max_entries > 0:
            with self._lock:
                while len(self._d) >= self.max_entries:
                    del self._d[next(iter(self._d))]
                self._d[id(run)] = (run, data)
        return data

    def page(self, runs: Sequence[RunState], cursor: str | None) -> bytes:
        return page_json([self.json(r) for r in runs], cursor)
