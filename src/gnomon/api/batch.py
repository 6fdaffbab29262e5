"""``POST /v1/jobs:batch``: register up to ``BATCH_ITEMS_MAX`` jobs in one call.

Each item is a job definition (the body of ``POST /v1/jobs``), optionally with an
``idempotencyKey`` member (what the ``Idempotency-Key`` header is for one job). Items are
judged one by one with the same core rules, limits and idempotency as the single create:
a bad item is refused with its own problem (``field`` prefixed ``jobs[i].``) and does not
stop the others. The accepted ones are produced together and Kafka acknowledges them
with one flush, which is where the speed comes from (docs/benchmarks.md, "Bulk
registration"); then each waits for its processor's answer (``api.answers``), all
within one bound: 201 only for what the processor accepted, its problem for what it
refused, 202 with the command's id for what it has not answered yet. The answer is 200
with one result per item, in order.

``plan_batch`` is the pure part: items, the time -> what to send and what to answer.
With a decider wired (``answers``: production) the API answers early only what needs no
state: an invalid item (422) and a key repeated within the batch (the same definition:
the same job; another: 409). Whether a keyed job exists already (200 with the job as
history shows it, or 409 for another definition) and the tenant's limits are the
processor's to decide, as for a single create. Without a decider, it falls back to
judging keys from history and limits from the usage the API sees.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from gnomon.api.answers import ANSWER_TIMEOUT_S_DEFAULT, AnswerSource, refusal
from gnomon.api.backfill import Tenant
from gnomon.api.recent import RecentJobs
from gnomon.api.views import job_view
from gnomon.core import admission
from gnomon.core.errors import Conflict, LimitExceeded, NotFound, ValidationError
from gnomon.core.jobs import JobState, JobStatus, RegisterJob, first_slot_after
from gnomon.core.model import idempotent_job_id, random_job_id
from gnomon.core.replies import ALREADY_REGISTERED, CommandResult
from gnomon.core.tenants import TenantLimits
from gnomon.core.validation import parse_job_spec, validate_idempotency_key
from gnomon.web.body import parse_json, read_bounded
from gnomon.web.problems import OUTCOME_UNKNOWN, PROBLEM_BASE

BATCH_ITEMS_MAX = 1000
BATCH_BODY_MAX_BYTES = 4 * 1024 * 1024  # ~4 KiB a job; a payload near its own 64 KiB cap needs smaller batches
KEY_MEMBER = "idempotencyKey"
READS_IN_FLIGHT_MAX = 64  # concurrent history reads of keyed items


@dataclass(frozen=True)
class Send:
    """A new job: ``command`` is to be produced, then the item answers 201 ``view``
    (``state``) if the processor accepts it."""

    index: int
    job_id: str
    command: RegisterJob
    view: dict[str, Any]
    state: JobState


@dataclass(frozen=True)
class Answer:
    """An item decided without a send: 200 (a retry of a registered job) or a problem."""

    index: int
    status: int
    body: dict[str, Any]


def item_problem(status: int, kind: str, title: str, detail: str, **extra: Any) -> dict[str, Any]:
    return {"type": PROBLEM_BASE + kind, "title": title, "status": status, "detail": detail, **extra}


def _refusal(index: int, exc: Exception) -> Answer:
    prefix = f"jobs[{index}]"
    if isinstance(exc, ValidationError):
        field = f"{prefix}.{exc.field}" if exc.field != "body" else prefix
        return Answer(index, 422, item_problem(422, "validation", "Invalid request", exc.message, field=field,
                                               errors=[{"field": field, "message": exc.message}]))
    if isinstance(exc, LimitExceeded):
        extra: dict[str, Any] = {"limit": exc.limit, "field": f"{prefix}.{exc.field}" if exc.field else prefix}
        status = 422 if exc.retry_after_s is None else 429
        return Answer(index, status, item_problem(status, "limit-exceeded", "Tenant limit exceeded",
                                                  exc.message, **extra))
    if isinstance(exc, NotFound):
        return Answer(index, 404, item_problem(404, "not-found", "Not found", str(exc), field=prefix))
    if isinstance(exc, Conflict):
        return Answer(index, 409, item_problem(409, "conflict", "Conflict", str(exc), field=f"{prefix}.{KEY_MEMBER}"))
    raise exc


def parse_items(body: Any) -> list[Any]:
    """The ``jobs`` array of a batch body; ValidationError naming ``jobs`` otherwise."""
    if not isinstance(body, dict) or set(body) != {"jobs"}:
        raise ValidationError("jobs", 'the body must be {"jobs": [<job>, ...]} and nothing else')
    items = body["jobs"]
    if not isinstance(items, list) or not items:
        raise ValidationError("jobs", "must be a non-empty array of job definitions")
    if len(items) > BATCH_ITEMS_MAX:
        raise ValidationError("jobs", f"holds {len(items)} jobs; at most {BATCH_ITEMS_MAX} per call")
    return items


def item_key(index: int, item: Any) -> str | None:
    """The item's idempotency key, validated (None: it has none)."""
    if not isinstance(item, dict) or KEY_MEMBER not in item:
        return None
    return validate_idempotency_key(item[KEY_MEMBER], KEY_MEMBER)  # the refusal adds jobs[i].


def plan_batch(items: Sequence[Any], *, tenant: str, now_ms: int, pools: frozenset[str],
               existing: Mapping[str, JobState | None], limits: TenantLimits | None, jobs: int, backlog: int,
               new_id: Callable[[], str]) -> list[Send | Answer]:
    """One decision per item, in order. ``existing``: the job of every keyed item's id
    (from history; empty when the processor decides). ``limits`` with ``jobs`` /
    ``backlog``: the tenant's limits and usage before the batch, each accepted item
    counting toward the next item's (None: the processor checks them). Two items with
    one key: the second is a retry of the first when its definition is the same, else 409."""
    out: list[Send | Answer] = []
    planned: dict[str, Send] = {}  # job id -> its send, of this batch's keyed items
    first_slots: dict[Any, int | None] = {}  # schedule -> its first slot after now (a batch often repeats one)
    for index, item in enumerate(items):
        try:
            key = item_key(index, item)
            data = {k: v for k, v in item.items() if k != KEY_MEMBER} if isinstance(item, dict) else item
            if key is None:
                job_id = new_id()
            else:
                job_id = idempotent_job_id(tenant, key)
                before = existing.get(job_id)
                if before is not None or job_id in planned:
                    out.append(_retry_of(index, before, planned.get(job_id), tenant, data, key, now_ms, pools))
                    continue
            spec = parse_job_spec(data, now_ms, pools=pools)
            if spec.after:  # (its upstreams and cycles are checked against history, one job at a time)
                raise ValidationError("after", "a batch does not take jobs with dependencies; register them with "
                                               "POST /v1/jobs, upstreams first")
            if limits is not None:
                admission.check_registration(limits, spec, jobs=jobs, backlog=backlog, now_ms=now_ms)
        except (ValidationError, LimitExceeded, Conflict) as exc:
            out.append(_refusal(index, exc))
            continue
        jobs += 1
        backlog += 1 if spec.schedule.is_one_time else 0
        if spec.schedule not in first_slots:
            first_slots[spec.schedule] = first_slot_after(spec, now_ms - 1)
        state = JobState(job_id, tenant, spec, JobStatus.ACTIVE, first_slots[spec.schedule], 1, now_ms, now_ms)
        send = Send(index, job_id, RegisterJob(job_id, tenant, spec, now_ms, idempotency_key=key), job_view(state),
                    state)
        planned[job_id] = send
        out.append(send)
    return out


def _retry_of(index: int, before: JobState | None, planned: Send | None, tenant: str, data: Any, key: str,
              now_ms: int, pools: frozenset[str]) -> Answer:
    spec = parse_job_spec(data, now_ms, pools=pools, run_at_must_be_future=False)
    if before is not None:
        if before.tenant != tenant or before.status is JobStatus.DELETED:
            raise Conflict(f"{KEY_MEMBER} {key!r} was already used for a job that no longer exists; use a new key")
        if spec != before.spec:
            raise Conflict(f"{KEY_MEMBER} {key!r} was already used for job {before.job_id} with a different "
                           "definition; use a new key for a new job")
        return Answer(index, 200, job_view(before))
    assert planned is not None
    if spec != planned.command.spec:
        raise Conflict(f"{KEY_MEMBER} {key!r} appears twice in this batch with different definitions")
    return Answer(index, 200, planned.view)


def add_batch_route(app: FastAPI, *, reads: Any, commands: Any, tenants: Any, clock: Any,
                    pools: frozenset[str], responses: dict[int | str, dict[str, Any]],
                    openapi_extra: dict[str, Any], answers: AnswerSource | None = None,
                    answer_timeout_s: float = ANSWER_TIMEOUT_S_DEFAULT, recent: RecentJobs | None = None) -> None:
    """Mount ``POST /v1/jobs:batch``. ``reads``: ``AsyncReads`` (``get_job``);
    ``commands``: a ``CommandSink`` (``send_many``); ``tenants``: the ``TenantService``;
    ``answers``: the processor's answers (each written item waits for its own, all
    within one ``answer_timeout_s``; 202 for those that did not come, as for a single
    write); ``recent``: where accepted jobs are kept for read-your-writes."""

    async def existing_jobs(job_ids: Sequence[str]) -> dict[str, JobState | None]:
        gate = asyncio.Semaphore(READS_IN_FLIGHT_MAX)

        async def one(job_id: str) -> JobState | None:
            async with gate:
                job: JobState | None = await reads.get_job(job_id)
                return job

        found = await asyncio.gather(*(one(j) for j in job_ids))
        return dict(zip(job_ids, found, strict=True))

    def send(decisions: list[Send | Answer]) -> list[dict[str, Any]]:
        sends = [d for d in decisions if isinstance(d, Send)]
        positions: list[tuple[int, int] | None] = []
        errors = commands.send_many([(s.job_id, s.command) for s in sends], positions=positions) if sends else []
        failed = {s.index: err for s, err in zip(sends, errors, strict=True) if err is not None}
        where = {s.index: pos for s, pos in zip(sends, positions, strict=True)}
        decided: dict[int, CommandResult] = {}
        if answers is not None:  # the processor decides each one; one deadline for all
            deadline = time.monotonic() + answer_timeout_s
            for s, pos in zip(sends, positions, strict=True):
                res = None if pos is None else answers.wait(pos, max(0.0, deadline - time.monotonic()))
                if res is not None:
                    decided[s.index] = res
        results: list[dict[str, Any]] = []
        for d in decisions:
            if isinstance(d, Answer):
                key = "job" if d.status == 200 else "problem"
                results.append({"index": d.index, "status": d.status, key: d.body})
            elif d.index in failed:
                results.append({"index": d.index, "status": 503, "problem": item_problem(
                    503, "event-log-unavailable", "Event log unavailable",
                    f"{failed[d.index]}. The job may or may not have been registered: send it again with an "
                    f"{KEY_MEMBER} so that a retry cannot register it twice.", outcome=OUTCOME_UNKNOWN,
                    field=f"jobs[{d.index}]")})
            elif (res := decided.get(d.index)) is None:  # written; no answer in time (or no decider)
                pos = where.get(d.index)
                results.append({"index": d.index, "status": 202, "pending": {
                    "jobId": d.job_id, "commandId": None if pos is None else f"{pos[0]}-{pos[1]}"}})
            elif not res.accepted:
                a = _refusal(d.index, refusal(res))
                results.append({"index": a.index, "status": a.status, "problem": a.body})
            elif res.reason == ALREADY_REGISTERED:  # (the view is replaced by history's, below, if it has it)
                results.append({"index": d.index, "status": 200, "job": d.view, "_existing": d.job_id})
            else:
                if recent is not None:
                    recent.put(d.state)
                results.append({"index": d.index, "status": 201, "job": d.view})
        return results

    @app.post("/v1/jobs:batch", status_code=200, summary=f"Register up to {BATCH_ITEMS_MAX} jobs in one call",
              response_model=None, responses=responses, openapi_extra=openapi_extra,
              description="Each item is a job definition as for POST /v1/jobs, optionally with an "
              f"'{KEY_MEMBER}' member (the Idempotency-Key of that job). Items are judged one by one: the "
              "answer is 200 with one result per item, in order: 201 and the job, 200 and the job (a retry "
              "with the same key and definition), or a problem whose 'field' starts with jobs[i]. The "
              f"whole call is refused (422) only when the body is not {{\"jobs\": [...]}} of 1 to "
              f"{BATCH_ITEMS_MAX} items. The body may be at most {BATCH_BODY_MAX_BYTES} bytes.")
    async def create_jobs_batch(request: Request, tenant: Tenant) -> JSONResponse:
        raw = await read_bounded(request, BATCH_BODY_MAX_BYTES)
        items = parse_items(await run_in_threadpool(parse_json, raw))  # up to 4 MiB: off the event loop
        keyed: list[str] = []
        for index, item in enumerate(items):
            try:
                key = item_key(index, item)
            except ValidationError:
                continue  # plan_batch refuses the item with its field
            if key is not None:
                keyed.append(idempotent_job_id(tenant, key))
        now = clock.now_ms()
        if answers is not None:  # the processor decides what needs state: existing keys, limits
            existing: dict[str, JobState | None] = {}
            limits: TenantLimits | None = None
            totals = {"jobs": 0, "backlog": 0}
        else:
            existing = await existing_jobs(sorted(set(keyed)))
            limits, totals = tenants.limits_and_totals(tenant, now)
        decisions = await run_in_threadpool(  # 1,000 validations: off the event loop, as the single create
            lambda: plan_batch(items, tenant=tenant, now_ms=now, pools=pools, existing=existing, limits=limits,
                               jobs=totals["jobs"], backlog=totals["backlog"],
                               new_id=random_job_id))
        results = await run_in_threadpool(send, decisions)
        known = [r for r in results if "_existing" in r]
        if known:  # jobs the processor already had: shown as history has them (else as sent)
            found = await existing_jobs(sorted({r["_existing"] for r in known}))
            for r in known:
                job_id = r.pop("_existing")
                job = found.get(job_id) if recent is None else recent.newest(job_id, found.get(job_id))
                if job is not None and job.tenant == tenant:
                    r["job"] = job_view(job)
        created = sum(1 for r in results if r["status"] == 201)
        return JSONResponse({"results": results, "created": created,
                             "existing": sum(1 for r in results if r["status"] == 200),
                             "pending": sum(1 for r in results if r["status"] == 202),
                             "refused": sum(1 for r in results if r["status"] >= 400)})


__all__ = ["BATCH_BODY_MAX_BYTES", "BATCH_ITEMS_MAX", "Answer", "Send", "add_batch_route", "parse_items", "plan_batch"]
