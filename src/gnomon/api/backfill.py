"""``POST /v1/jobs/{job_id}:backfill``: run the past slots of a job's schedule in a range.

Every slot of the schedule in [from, to] gets its run (run id ``job@slot``, as the
scheduler would have made it). A slot whose run exists and was not skipped is left
alone: it is never run twice. A slot recorded skipped (overlap, catch-up, paused...) is
reopened, and the run says so (``note``: "reopened by backfill (was skipped: ...)").

The processor purges finished runs from its state after their retention (docs/adr/0005),
and would then not know that a slot already ran. So this handler reads history (which
has every purged run: a run leaves processor state only once history has it) and sends
the processor only the slots history shows as not run or skipped: one ``BackfillJob``
with at most ``BACKFILL_SLOTS_MAX`` slots. A larger range is refused (422 naming ``to``).

The processor decides (one decider): with ``decide`` (``create_app``'s, which waits for
the processor's answer on the command-results topic) the answer is 200 with the plan
once the processor accepted, its own problem if it refused (a job paused or deleted
meanwhile: 409/404), or 202 with the plan and a Location to poll when its answer did not
come within the API's bound. A range with nothing to send answers 200 at once.

Wire it in ``create_app`` with ``add_backfill_route(app, history=..., commands=..., clock=..., decide=...)``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Literal, Protocol

from fastapi import Depends, FastAPI, Request, Security
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from fastapi.security import HTTPBearer
from pydantic import BaseModel, ConfigDict, Field

from gnomon.api.openapi import REF, problem_responses, request_body
from gnomon.core.calendars import Calendar, excluded_by
from gnomon.core.clock import Clock, SystemClock, iso_to_ms, ms_to_iso
from gnomon.core.errors import Conflict, NotFound, ValidationError
from gnomon.core.jobs import BACKFILL_SLOTS_MAX, BackfillJob, JobState, JobStatus, slots_between
from gnomon.core.model import slot_run_id
from gnomon.core.runs import RunState, RunStatus
from gnomon.ports import HistoryStore
from gnomon.web.body import BODY_MAX_BYTES, closed_object, parse_json, read_bounded
from gnomon.web.problems import Pending, pending_answer

__all__ = ["BackfillAck", "BackfillBody", "BackfillPending", "add_backfill_route", "plan_backfill"]

_FIELDS = ("from", "to")


class BackfillBody(BaseModel):
    """The range of slots to backfill, both ends included."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    from_: str = Field(alias="from", description="UTC ISO-8601 instant with offset, e.g. 2026-11-30T00:00:00Z")
    to: str = Field(description=f"UTC ISO-8601 instant, not in the future; at most {BACKFILL_SLOTS_MAX} slots "
                                "from 'from'")


class BackfillAck(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str
    accepted: Literal["backfill"]
    slots: int = Field(description="slots of the schedule in the range")
    sent: int = Field(description="slots sent to run: not run yet, or recorded skipped (reopened)")
    runIds: list[str] = Field(description="the runs of the slots sent")
    alreadyRun: list[str] = Field(description="runs of the range left alone: they ran, run or are due")
    excluded: list[str] = Field(default_factory=list, description="slots of the range on a date of one of the "
                                "job's excludeCalendars: not run (they are recorded skipped by the calendar)")


class BackfillPending(BackfillAck):
    """202: the plan, written, and where to poll for the processor's answer."""

    status: Literal["pending"]
    jobId: str
    command: str
    commandId: str | None = Field(description="poll GET /v1/commands/{commandId} (the Location) for the answer")
    detail: str


class _Sink(Protocol):
    def send(self, job_id: str, command: Any) -> object: ...


def parse_range(body: Any, now_ms: int) -> tuple[int, int]:
    """``{"from": ISO, "to": ISO}`` -> (from_ms, to_ms), or ``ValidationError`` naming the field."""
    body = closed_object(body, _FIELDS, must_be='must be a JSON object such as {"from": "2026-11-30T00:00:00Z", '
                                                 '"to": "2026-11-30T06:00:00Z"}')
    ends: dict[str, int] = {}
    for name in _FIELDS:
        value = body.get(name)
        if not isinstance(value, str):
            raise ValidationError(name, "is required: an ISO-8601 instant with offset, e.g. 2026-11-30T00:00:00Z")
        try:
            ends[name] = iso_to_ms(value)
        except ValueError as exc:
            raise ValidationError(name, f"not an ISO-8601 instant with offset: {exc}") from None
    if ends["to"] < ends["from"]:
        raise ValidationError("to", f"{ms_to_iso(ends['to'])} is before from ({ms_to_iso(ends['from'])})")
    if ends["to"] > now_ms:
        raise ValidationError("to", f"{ms_to_iso(ends['to'])} is in the future (now {ms_to_iso(now_ms)}); "
                                    "a backfill runs slots that have passed")
    return ends["from"], ends["to"]


def plan_backfill(job: JobState, from_ms: int, to_ms: int, history_run: Callable[[str], RunState | None],
                  excluded: Callable[[int], bool] | None = None,
                  ) -> tuple[list[int], list[str], list[str], list[str]]:
    """(slots to send, their run ids, run ids left alone, run ids of slots a calendar
    excludes) for the slots of ``job`` in [from_ms, to_ms] before its schedule position.
    ``history_run`` reads a run from history; ``excluded`` says whether one of the job's
    calendars holds a slot (such a slot is not sent: the calendar says it does not run). A range that starts before the job existed starts at its creation; one that
    ends before it is refused (ValidationError("from")). Raises Conflict for a job that
    cannot be backfilled, ValidationError("to") for a range of more than
    ``BACKFILL_SLOTS_MAX`` slots."""
    if job.spec.schedule.run_at_ms is not None:
        raise Conflict(f"job {job.job_id} is a one-time job: nothing to backfill (trigger it instead)")
    if job.spec.schedule.after_upstreams:
        raise Conflict(f"job {job.job_id} has no schedule of its own (it runs after its upstreams): backfill "
                       "its upstreams instead; their runs stage its runs")
    if job.status is JobStatus.PAUSED:
        raise Conflict(f"job {job.job_id} is paused; resume it before a backfill")
    if job.status is not JobStatus.ACTIVE:
        raise Conflict(f"job {job.job_id} is {job.status.value}; only an active job can be backfilled")
    if to_ms < job.created_at_ms:
        raise ValidationError("from", f"the range ends before the job existed (created {ms_to_iso(job.created_at_ms)}): "
                                      "a backfill covers the job's own slots, from its creation on")
    from_ms = max(from_ms, job.created_at_ms)  # the job's own slots only: none before it existed
    until = to_ms if job.next_run_at_ms is None else min(to_ms, job.next_run_at_ms - 1)
    slots = slots_between(job.spec, from_ms, until, BACKFILL_SLOTS_MAX)
    if len(slots) > BACKFILL_SLOTS_MAX:
        raise ValidationError("to", f"the range holds more than {BACKFILL_SLOTS_MAX} slots of the schedule; "
                                    f"at most {BACKFILL_SLOTS_MAX} per backfill (end this one at "
                                    f"{ms_to_iso(slots[BACKFILL_SLOTS_MAX - 1])} and send the rest after)")
    send: list[int] = []
    left: list[str] = []
    skip: list[str] = []
    for slot in slots:
        if excluded is not None and excluded(slot):
            skip.append(slot_run_id(job.job_id, slot))
            continue
        run = history_run(slot_run_id(job.job_id, slot))
        if run is not None and run.status is not RunStatus.SKIPPED:
            left.append(run.run_id)  # ran, runs or is due: never twice (maybe purged from the processor)
        else:
            send.append(slot)
    return send, [slot_run_id(job.job_id, s) for s in send], left, skip


_bearer = HTTPBearer(auto_error=False, scheme_name="bearerAuth", description="an API token")


def _tenant_of(request: Request, _: Any = Security(_bearer)) -> str:
    return str(request.app.state.auth.tenant_for(request.headers.get("authorization")))


Tenant = Annotated[str, Depends(_tenant_of)]
_EXAMPLE = {"from": "2026-11-30T00:00:00Z", "to": "2026-11-30T06:00:00Z"}


def _document_body(app: FastAPI) -> None:
    """Put ``BackfillBody`` in the document's components, where ``request_body`` points
    (``gnomon.api.openapi.finish`` adds only ``schemas.REQUEST_MODELS``)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        document = build()
        components = document.setdefault("components", {}).setdefault("schemas", {})
        components.setdefault("BackfillBody", BackfillBody.model_json_schema(by_alias=True, ref_template=REF))
        return document

    app.openapi = openapi  # type: ignore[method-assign]


def add_backfill_route(app: FastAPI, *, history: HistoryStore, commands: _Sink, clock: Clock | None = None,
                       decide: Callable[[str, Any], object] | None = None,
                       calendars: Callable[[str, Sequence[str]], Sequence[Calendar]] | None = None) -> None:
    """Add ``POST /v1/jobs/{job_id}:backfill`` to ``app`` (built by ``create_app``, whose
    ``state.auth`` authenticates). ``decide(job_id, command)`` writes the command and
    waits for the processor's answer (raising ``Pending`` or the refusal); without it,
    ``commands`` only produces to gnomon.job-commands (202: written, not decided)."""
    clock = clock or SystemClock()

    def backfill(job_id: str, tenant: str, body: Any) -> JSONResponse:
        now = clock.now_ms()
        from_ms, to_ms = parse_range(body, now)
        job = history.get_job(job_id)
        if job is None or job.tenant != tenant or job.status is JobStatus.DELETED:
            raise NotFound(f"no job {job_id!r}")
        cals = calendars(tenant, job.spec.exclude_calendars) if calendars is not None else ()
        send, run_ids, left, skip = plan_backfill(job, from_ms, to_ms, history.get_run,
                                                  (lambda s: excluded_by(cals, s) is not None) if cals else None)
        ack = {"id": job_id, "accepted": "backfill", "slots": len(send) + len(left) + len(skip), "sent": len(send),
               "runIds": run_ids, "alreadyRun": left, "excluded": skip}
        if not send:
            return JSONResponse(ack)
        command = BackfillJob(job_id, tenant, tuple(send), now)
        if decide is None:
            commands.send(job_id, command)
            return JSONResponse(ack, status_code=202)
        try:
            decide(job_id, command)  # the processor's refusal is raised as its problem
        except Pending as exc:  # written, not answered in time: the plan, and where to poll
            waiting = pending_answer(exc)
            # (only the Location: the pending body's own Content-Length is not this body's)
            return JSONResponse({**ack, **json.loads(bytes(waiting.body))}, status_code=202,
                                headers={"Location": waiting.headers["location"]} if exc.command_id else None)
        return JSONResponse(ack)

    _document_body(app)

    @app.post("/v1/jobs/{job_id}:backfill", status_code=200, response_model=None,
              summary="Run the past slots of a job's schedule in a range",
              description="Creates the run of every slot of the schedule in [from, to] that has none, and reopens "
              "the slots recorded skipped (the run's note says so). Slots that ran (or run, or are due) are left "
              f"alone, even long after: history is checked. At most {BACKFILL_SLOTS_MAX} slots per call; a "
              "paused or one-time job is refused (409).",
              responses={200: {"model": BackfillAck, "description": "the processor accepted it (or nothing to "
                                                                    "send)"},
                         202: {"model": BackfillPending, "description": "written; the processor's answer did not come "
                               "in time: the plan, with commandId and a Location to poll"},
                         **problem_responses(401, 404, 409, 413, 422, 503)},
              openapi_extra=request_body(BackfillBody, example=_EXAMPLE))
    async def backfill_job(job_id: str, request: Request, tenant: Tenant) -> JSONResponse:
        body = parse_json(await read_bounded(request, BODY_MAX_BYTES))
        return await run_in_threadpool(backfill, job_id, tenant, body)
