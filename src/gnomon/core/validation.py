"""Turn user input (the JSON body of the API, the SDK's keyword arguments, the CLI's
flags) into a ``JobSpec``, or raise ``ValidationError`` naming the offending field.

The API, the SDK and the CLI all call ``parse_job_spec``: one set of rules.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any
from urllib.parse import urlparse

from gnomon.core import schedule as slots
from gnomon.core.calendars import check_name as check_calendar_name
from gnomon.core.clock import iso_to_ms, ms_to_iso
from gnomon.core.cron import CronSchedule, load_zone
from gnomon.core.errors import ValidationError
from gnomon.core.model import (
    CatchUp,
    DependsOn,
    JobSpec,
    OverlapPolicy,
    Priority,
    RetryPolicy,
    Schedule,
    Target,
    TargetType,
    Upstream,
)

PAYLOAD_MAX_BYTES = 64 * 1024
NAME_MAX_CHARS = 200
TIMEOUT_MAX_S = 7 * 24 * 3600
RETRY_MAX_ATTEMPTS = 25
BACKOFF_MAX_S = 24 * 3600.0
ARGV_MAX_ITEMS = 256
ARGV_ITEM_MAX_CHARS = 4096
URL_MAX_CHARS = 2048
IDEMPOTENCY_KEY_MAX_CHARS = 128
DEFAULT_POOLS = frozenset({"default", "batch"})

_JOB_FIELDS = frozenset(
    {"name", "schedule", "timezone", "runAt", "target", "payload", "priority", "timeoutS",
     "retry", "catchUp", "pool", "secrets", "jitterS", "overlap", "alertLateS", "lateMaxS",
     "every", "from", "startAt", "endAt", "maxRuns", "excludeCalendars", "after", "waitMaxS"}
)
# the fields that say when a job runs (what a PATCH of one of them replaces)
_KIND_FIELDS = {"schedule": ("runAt", "every", "from"), "runAt": ("schedule", "every", "from"),
                "every": ("schedule", "runAt")}
EVERY_MIN_S = 1
EVERY_MAX_S = 366 * 86_400
MAX_RUNS_MAX = 1_000_000_000
_DURATION_RE = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")
_RETRY_FIELDS = frozenset({"max", "backoffS", "backoffCapS"})
_TARGET_FIELDS = {
    TargetType.HANDLER: frozenset({"type", "name"}),
    TargetType.HTTP: frozenset({"type", "url"}),
    TargetType.COMMAND: frozenset({"type", "argv"}),
    TargetType.CONTAINER: frozenset({"type", "image", "argv"}),
}
_IMAGE_RE = re.compile(r"[a-z0-9][a-z0-9._\-/:@]{0,254}")
_SECRET_RE = re.compile(r"[a-z][a-z0-9-]{0,62}")
SECRETS_MAX_ITEMS = 16
JITTER_MAX_S = 3600
LATE_MAX_S = 7 * 86_400  # alertLateS: a late-start alert threshold (gnomon.core.alerts)
_POOL_RE = re.compile(r"^[a-z][a-z0-9-]{0,31}$")
_KEY_RE = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")
# C0/C1 controls (ESC, NUL, newline, DEL...), line/paragraph separators and the bidi
# embeddings/overrides/isolates: in an identifier they forge log lines and terminal
# output or make a name display differently from what it is ("Trojan Source").
_CONTROL_RE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def reject_control_chars(value: str, field: str) -> str:
    """``value`` unchanged, or ``ValidationError(field)`` if it holds a control or bidi
    character: identifiers are echoed into logs, terminals and other tenants' views."""
    found = _CONTROL_RE.search(value)
    if found is not None:
        raise ValidationError(field, f"must not contain control or bidi characters "
                                     f"(U+{ord(found.group()):04X} at index {found.start()})")
    return value


def _reject_unknown(data: Mapping[str, Any], allowed: frozenset[str], prefix: str) -> None:
    for key in data:
        if key not in allowed:
            raise ValidationError(f"{prefix}{key}", f"unknown field; allowed: {', '.join(sorted(allowed))}")


def _int(value: Any, field: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(field, f"must be an integer between {lo} and {hi}")
    if not lo <= value <= hi:
        raise ValidationError(field, f"must be between {lo} and {hi}, got {value}")
    return value


def check_late_s(value: object, field: str) -> int | None:
    """A late-start alert threshold in seconds (``alertLateS``, ``lateS``), or None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= LATE_MAX_S:
        raise ValidationError(field, f"must be a whole number of seconds from 0 to {LATE_MAX_S}, or null")
    return value


def check_late_max_s(value: object) -> int | None:
    """``lateMaxS``: how late a slot may start under overload before it is given up, or None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= LATE_MAX_S:
        raise ValidationError("lateMaxS", f"must be a whole number of seconds from 1 to {LATE_MAX_S}, or null")
    return value


def _num(value: Any, field: str, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValidationError(field, f"must be a number between {lo} and {hi}")
    if not lo <= value <= hi:
        raise ValidationError(field, f"must be between {lo} and {hi}, got {value}")
    return float(value)


def _enum(value: Any, field: str, enum: type[Priority] | type[CatchUp] | type[OverlapPolicy]) -> Any:
    member = enum._value2member_map_.get(value) if isinstance(value, str) else None
    if member is None:
        allowed = [m.value for m in enum]
        raise ValidationError(field, f"must be one of {', '.join(allowed)}, got {value!r}")
    return member


def parse_target(data: Any, field: str = "target") -> Target:
    if not isinstance(data, Mapping):
        raise ValidationError(field, 'must be an object such as {"type": "command", "argv": ["echo", "hi"]}')
    kind = data.get("type")
    if kind not in [t.value for t in TargetType]:
        raise ValidationError(f"{field}.type", f"must be one of handler, http, command, container, got {kind!r}")
    ttype = TargetType(kind)
    _reject_unknown(data, _TARGET_FIELDS[ttype], f"{field}.")
    if ttype is TargetType.HANDLER:
        name = data.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.:\-]{0,127}", name):
            raise ValidationError(f"{field}.name", "must be a handler name (letters, digits, _ . : -)")
        return Target(type=ttype, handler=name)
    if ttype is TargetType.HTTP:
        url = data.get("url")
        if not isinstance(url, str) or len(url) > URL_MAX_CHARS:
            raise ValidationError(f"{field}.url", "must be an http(s) URL")
        parsed = urlparse(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValidationError(f"{field}.url", f"must be an http(s) URL, got {url!r}")
        return Target(type=ttype, url=url)
    image = None
    if ttype is TargetType.CONTAINER:
        image = data.get("image")
        if not isinstance(image, str) or not _IMAGE_RE.fullmatch(image):
            raise ValidationError(f"{field}.image", "must be an image reference such as registry.local/team/app:1.2")
    argv = data.get("argv")
    if (
        not isinstance(argv, list | tuple)
        or not argv
        or len(argv) > ARGV_MAX_ITEMS
        or not all(isinstance(a, str) and len(a) <= ARGV_ITEM_MAX_CHARS for a in argv)
        or not argv[0]
    ):
        raise ValidationError(f"{field}.argv", f"must be a non-empty list of at most {ARGV_MAX_ITEMS} strings")
    for i, arg in enumerate(argv):
        if "\x00" in arg:
            raise ValidationError(f"{field}.argv[{i}]", "must not contain NUL characters")
    return Target(type=ttype, argv=tuple(argv), image=image)


def parse_secrets(data: Any, field: str = "secrets") -> tuple[str, ...]:
    """Names of the tenant's secrets the job needs; their values stay on the workers."""
    if data is None:
        return ()
    if not isinstance(data, list | tuple) or len(data) > SECRETS_MAX_ITEMS:
        raise ValidationError(field, f"must be a list of at most {SECRETS_MAX_ITEMS} secret names")
    for i, name in enumerate(data):
        if not isinstance(name, str) or not _SECRET_RE.fullmatch(name):
            raise ValidationError(f"{field}[{i}]", "must be a secret name (lowercase letters, digits, -)")
    if len(set(data)) != len(data):
        raise ValidationError(field, "names a secret twice")
    return tuple(data)


def parse_retry(data: Any, field: str = "retry") -> RetryPolicy:
    if data is None:
        return RetryPolicy()
    if not isinstance(data, Mapping):
        raise ValidationError(field, 'must be an object such as {"max": 3, "backoffS": 1}')
    _reject_unknown(data, _RETRY_FIELDS, f"{field}.")
    default = RetryPolicy()
    max_attempts = _int(data.get("max", default.max_attempts), f"{field}.max", 1, RETRY_MAX_ATTEMPTS)
    base = _num(data.get("backoffS", default.backoff_base_s), f"{field}.backoffS", 0.0, BACKOFF_MAX_S)
    cap = _num(data.get("backoffCapS", max(default.backoff_cap_s, base)), f"{field}.backoffCapS", 0.0, BACKOFF_MAX_S)
    if cap < base:
        raise ValidationError(f"{field}.backoffCapS", f"must be >= backoffS ({base})")
    return RetryPolicy(max_attempts=max_attempts, backoff_base_s=base, backoff_cap_s=cap)


def canonical_payload(value: Any, field: str = "payload") -> str:
    try:
        text = json.dumps(value, separators=(",", ":"), sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValidationError(field, f"must be JSON-serialisable: {exc}") from None
    if len(text.encode()) > PAYLOAD_MAX_BYTES:
        raise ValidationError(field, f"is {len(text.encode())} bytes; the limit is {PAYLOAD_MAX_BYTES} bytes")
    return text


EXCLUDE_CALENDARS_MAX = 10


def parse_exclude_calendars(data: Any, field: str = "excludeCalendars") -> tuple[str, ...]:
    """Names of the tenant's calendars a job does not run on (whether they exist is the
    processor's to check, against the calendars it has read)."""
    if data is None:
        return ()
    if not isinstance(data, list | tuple) or len(data) > EXCLUDE_CALENDARS_MAX:
        raise ValidationError(field, f"must be a list of at most {EXCLUDE_CALENDARS_MAX} calendar names")
    for i, name in enumerate(data):
        check_calendar_name(name, f"{field}[{i}]")
    if len(set(data)) != len(data):
        raise ValidationError(field, "names a calendar twice")
    return tuple(data)


UPSTREAMS_MAX = 10  # (core.dependencies.UPSTREAMS_MAX: that module checks the DAG)
WAIT_MAX_S_MAX = 7 * 86_400
_UPSTREAM_FIELDS = frozenset({"job", "on"})


def parse_after(data: Any, field: str = "after") -> tuple[Upstream, ...]:
    """``[{"job": ID, "on": "succeeded" | "finished"}]``: the jobs (of the same tenant)
    whose runs this job's runs wait for. Whether they exist, and whether they close a
    cycle, the API checks against history (api/dependencies.py)."""
    if data is None:
        return ()
    if not isinstance(data, list | tuple) or len(data) > UPSTREAMS_MAX:
        raise ValidationError(field, f"must be a list of at most {UPSTREAMS_MAX} upstream jobs")
    out: list[Upstream] = []
    for i, item in enumerate(data):
        where = f"{field}[{i}]"
        if isinstance(item, str):
            item = {"job": item}
        if not isinstance(item, Mapping):
            raise ValidationError(where, 'must be {"job": ID, "on": "succeeded" | "finished"}')
        _reject_unknown(item, _UPSTREAM_FIELDS, where + ".")
        job = item.get("job")
        if not isinstance(job, str) or not job or len(job) > 200 or "@" in job or "\0" in job or job != job.strip():
            raise ValidationError(where + ".job", "must be a job id (1-200 characters, no '@')")
        reject_control_chars(job, where + ".job")
        on = item.get("on", "succeeded")
        if on not in ("succeeded", "finished"):
            raise ValidationError(where + ".on", 'must be "succeeded" or "finished"')
        if any(u.job_id == job for u in out):
            raise ValidationError(where + ".job", f"names {job} twice")
        out.append(Upstream(job, DependsOn(on)))
    return tuple(out)


def parse_duration_s(value: Any, field: str) -> int:
    """``"90m"``, ``"1h30m"``, ``"7d"``, ``"45s"`` -> whole seconds, from EVERY_MIN_S to
    EVERY_MAX_S (days, hours, minutes, seconds, in that order, each at most once)."""
    match = _DURATION_RE.fullmatch(value) if isinstance(value, str) and len(value) <= 32 else None
    if match is None or not any(match.groups()):
        raise ValidationError(field, f"must be a duration such as \"90m\", \"1h30m\", \"7d\" or \"45s\", got {value!r}")
    days, hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())
    total = days * 86_400 + hours * 3600 + minutes * 60 + seconds
    if not EVERY_MIN_S <= total <= EVERY_MAX_S:
        raise ValidationError(field, f"must be from {EVERY_MIN_S} s to {EVERY_MAX_S // 86_400} days, got {value!r}")
    return total


def format_duration_s(seconds: int) -> str:
    """``5400`` -> ``"1h30m"``: the duration text ``parse_duration_s`` reads."""
    out = ""
    for unit, size in (("d", 86_400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size:
            out += f"{seconds // size}{unit}"
            seconds %= size
    return out or "0s"


def parse_instant(value: Any, tz: str, field: str) -> int:
    """An ISO-8601 instant (``2026-03-01T09:00:00Z``, ``...+01:00``) or a local date-time
    without offset (``2026-03-01T09:00``, ``2026-03-01``), read in the zone ``tz``; whole
    seconds, UTC epoch ms."""
    if not isinstance(value, str) or len(value) > 64:
        raise ValidationError(field, "must be an ISO-8601 date-time such as 2026-03-01T09:00:00Z")
    raw = value.strip()
    if raw.endswith(("Z", "z")):
        raw = raw[:-1] + "+00:00"
    try:
        dt = datetime.fromisoformat(raw)
    except ValueError as exc:
        raise ValidationError(field, f"not an ISO-8601 date-time: {exc}") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=load_zone(tz, "timezone"))
    try:
        ms = int(dt.timestamp()) * 1000
    except (OverflowError, OSError, ValueError):
        raise ValidationError(field, f"{value!r} is outside the years 1970-9999") from None
    if not 0 <= ms <= slots.SLOT_MAX_MS:
        raise ValidationError(field, f"{value!r} is outside the years 1970-9999")
    return ms


def _parse_bounds(data: Mapping[str, Any], schedule: Schedule, now_ms: int, end_at_must_be_future: bool) -> Schedule:
    """``startAt``, ``endAt`` and ``maxRuns`` onto a repeating ``schedule``."""
    given = [f for f in ("startAt", "endAt", "maxRuns") if data.get(f) is not None]
    if not given:
        return schedule
    if schedule.run_at_ms is not None:
        raise ValidationError(given[0], "bounds (startAt, endAt, maxRuns) apply to a repeating schedule "
                                        "(schedule or every), not to runAt")
    if schedule.after_upstreams:
        raise ValidationError(given[0], "bounds (startAt, endAt, maxRuns) apply to a schedule of the job's "
                                        "own; a job after its upstreams runs when they do")
    start = parse_instant(data["startAt"], schedule.tz, "startAt") if data.get("startAt") is not None else None
    end = parse_instant(data["endAt"], schedule.tz, "endAt") if data.get("endAt") is not None else None
    if start is not None and end is not None and end < start:
        raise ValidationError("endAt", f"{ms_to_iso(end)} is before startAt ({ms_to_iso(start)})")
    if end is not None and end_at_must_be_future and end < now_ms - 1000:
        raise ValidationError("endAt", f"{ms_to_iso(end)} is in the past (now {ms_to_iso(now_ms)})")
    max_runs = _int(data["maxRuns"], "maxRuns", 1, MAX_RUNS_MAX) if data.get("maxRuns") is not None else None
    bounded = replace(schedule, start_at_ms=start, end_at_ms=end, max_runs=max_runs)
    if slots.first_at_or_after(bounded, start if start is not None else 0) is None:
        raise ValidationError(given[0], f"the schedule has no slot between startAt and endAt "
                                        f"({ms_to_iso(start or 0)} .. {ms_to_iso(end or slots.SLOT_MAX_MS)})")
    return bounded


def _parse_when(data: Mapping[str, Any], tz: str, now_ms: int, run_at_must_be_future: bool) -> Schedule:
    """Exactly one of ``schedule`` (cron), ``every`` (an interval, with ``from``) or ``runAt``;
    or none of them with ``after``: the job runs after each run of its upstreams."""
    cron_expr, run_at, every = data.get("schedule"), data.get("runAt"), data.get("every")
    given = sum(v is not None for v in (cron_expr, run_at, every))
    if given == 0 and data.get("after") and data.get("from") is None:
        return Schedule(tz=tz)
    if given != 1:
        raise ValidationError("schedule", "give exactly one of schedule (a cron expression), every (an "
                                          "interval such as \"90m\") or runAt (an ISO-8601 instant), or none "
                                          "of them with after (the job runs after each run of its upstreams)")
    if data.get("from") is not None and every is None:
        raise ValidationError("from", "is the anchor of an interval: give it with every")
    if cron_expr is not None:
        if not isinstance(cron_expr, str):
            raise ValidationError("schedule", "must be a cron expression string")
        cron = CronSchedule.parse(cron_expr, tz, "schedule")
        return Schedule(cron=cron.expr, tz=tz)
    if every is not None:
        every_s = parse_duration_s(every, "every")
        anchor = parse_instant(data["from"], tz, "from") if data.get("from") is not None else None
        return Schedule(every_s=every_s, anchor_ms=anchor, tz=tz)
    if not isinstance(run_at, str):
        raise ValidationError("runAt", "must be an ISO-8601 instant with offset, e.g. 2026-01-01T09:00:00Z")
    try:
        run_at_ms = iso_to_ms(run_at)
    except ValueError as exc:
        raise ValidationError("runAt", f"not an ISO-8601 instant with offset: {exc}") from None
    run_at_ms -= run_at_ms % 1000  # slots are whole seconds
    if run_at_must_be_future and run_at_ms < now_ms - 1000:
        raise ValidationError("runAt", f"{ms_to_iso(run_at_ms)} is in the past (now {ms_to_iso(now_ms)})")
    return Schedule(run_at_ms=run_at_ms, tz=tz)


SCHEDULE_FIELDS = frozenset({"schedule", "every", "from", "runAt", "timezone", "startAt", "endAt", "maxRuns"})


def parse_schedule(data: Mapping[str, Any], now_ms: int) -> Schedule:
    """Only the fields that say when a job runs (``SCHEDULE_FIELDS``), as ``parse_job_spec``
    reads them (no "in the past" check): what a preview takes."""
    _reject_unknown(data, SCHEDULE_FIELDS, "")
    tz = data.get("timezone", "UTC")
    if not isinstance(tz, str):
        raise ValidationError("timezone", "must be an IANA zone name such as Europe/London")
    load_zone(tz, "timezone")
    return _parse_bounds(data, _parse_when(data, tz, now_ms, False), now_ms, False)


def parse_job_spec(
    data: Any,
    now_ms: int,
    *,
    pools: frozenset[str] = DEFAULT_POOLS,
    run_at_must_be_future: bool = True,
    end_at_must_be_future: bool = True,
) -> JobSpec:
    """Validate a job definition in the API's JSON shape. ``now_ms`` decides "in the past"."""
    if not isinstance(data, Mapping):
        raise ValidationError("body", "must be a JSON object")
    _reject_unknown(data, _JOB_FIELDS, "")

    name = data.get("name")
    if not isinstance(name, str) or not name.strip() or len(name) > NAME_MAX_CHARS:
        raise ValidationError("name", f"must be a non-empty string of at most {NAME_MAX_CHARS} characters")
    reject_control_chars(name, "name")

    tz = data.get("timezone", "UTC")
    if not isinstance(tz, str):
        raise ValidationError("timezone", "must be an IANA zone name such as Europe/London")
    load_zone(tz, "timezone")
    schedule = _parse_bounds(data, _parse_when(data, tz, now_ms, run_at_must_be_future), now_ms,
                             end_at_must_be_future)

    if "target" not in data:
        raise ValidationError("target", "is required")
    target = parse_target(data["target"])
    payload_json = canonical_payload(data.get("payload"))
    priority = _enum(data.get("priority", "normal"), "priority", Priority)
    timeout_s = _int(data.get("timeoutS", 3600), "timeoutS", 1, TIMEOUT_MAX_S)
    retry = parse_retry(data.get("retry"))
    catch_up = _enum(data.get("catchUp", "once"), "catchUp", CatchUp)
    pool = data.get("pool", "default")
    if isinstance(pool, str):
        reject_control_chars(pool, "pool")
    if not isinstance(pool, str) or not _POOL_RE.match(pool):
        raise ValidationError("pool", "must be a pool name (lowercase letters, digits, -)")
    if pool not in pools:
        raise ValidationError("pool", f"unknown pool {pool!r}; known: {', '.join(sorted(pools))}")
    return JobSpec(
        name=name.strip(),
        schedule=schedule,
        target=target,
        payload_json=payload_json,
        priority=priority,
        timeout_s=timeout_s,
        retry=retry,
        catch_up=catch_up,
        pool=pool,
        secrets=parse_secrets(data.get("secrets")),
        jitter_s=_int(data.get("jitterS", 0), "jitterS", 0, JITTER_MAX_S),
        overlap=_enum(data.get("overlap", "allow"), "overlap", OverlapPolicy),
        alert_late_s=check_late_s(data.get("alertLateS"), "alertLateS"),
        late_max_s=check_late_max_s(data.get("lateMaxS")),
        exclude_calendars=parse_exclude_calendars(data.get("excludeCalendars")),
        after=parse_after(data.get("after")),
        wait_max_s=None if data.get("waitMaxS") is None else _int(data.get("waitMaxS"), "waitMaxS", 1,
                                                                     WAIT_MAX_S_MAX),
    )


def job_spec_to_json(spec: JobSpec) -> dict[str, Any]:
    """The inverse of ``parse_job_spec``: the API's JSON shape of a spec."""
    sched = spec.schedule
    out: dict[str, Any] = {"name": spec.name, "timezone": sched.tz}
    if sched.cron is not None:
        out["schedule"] = sched.cron
    elif sched.every_s is not None:
        out["every"] = format_duration_s(sched.every_s)
        if sched.anchor_ms is not None:
            out["from"] = ms_to_iso(sched.anchor_ms)
    elif sched.run_at_ms is not None:
        out["runAt"] = ms_to_iso(sched.run_at_ms)
    # (none: the job runs after its upstreams, ``after`` below)
    # bounds only when set (a reader of an older job sees the fields it knew)
    if sched.start_at_ms is not None:
        out["startAt"] = ms_to_iso(sched.start_at_ms)
    if sched.end_at_ms is not None:
        out["endAt"] = ms_to_iso(sched.end_at_ms)
    if sched.max_runs is not None:
        out["maxRuns"] = sched.max_runs
    t = spec.target
    if t.type is TargetType.HANDLER:
        out["target"] = {"type": "handler", "name": t.handler}
    elif t.type is TargetType.HTTP:
        out["target"] = {"type": "http", "url": t.url}
    elif t.type is TargetType.CONTAINER:
        out["target"] = {"type": "container", "image": t.image, "argv": list(t.argv)}
    else:
        out["target"] = {"type": "command", "argv": list(t.argv)}
    out["payload"] = json.loads(spec.payload_json)
    out["priority"] = spec.priority.value
    out["timeoutS"] = spec.timeout_s
    out["retry"] = {
        "max": spec.retry.max_attempts,
        "backoffS": spec.retry.backoff_base_s,
        "backoffCapS": spec.retry.backoff_cap_s,
    }
    out["catchUp"] = spec.catch_up.value
    out["pool"] = spec.pool
    out["secrets"] = list(spec.secrets)
    out["jitterS"] = spec.jitter_s
    out["overlap"] = spec.overlap.value
    out["alertLateS"] = spec.alert_late_s
    out["lateMaxS"] = spec.late_max_s
    if spec.exclude_calendars:
        out["excludeCalendars"] = list(spec.exclude_calendars)
    if spec.after:
        out["after"] = [{"job": u.job_id, "on": u.on.value} for u in spec.after]
    if spec.wait_max_s is not None:
        out["waitMaxS"] = spec.wait_max_s
    return out


def apply_patch(spec: JobSpec, patch: Any, now_ms: int, *, pools: frozenset[str] = DEFAULT_POOLS) -> JobSpec:
    """A PATCH merges top-level fields into the current spec and re-validates the whole."""
    if not isinstance(patch, Mapping):
        raise ValidationError("body", "must be a JSON object")
    _reject_unknown(patch, _JOB_FIELDS, "")
    merged = job_spec_to_json(spec)
    for kind, others in _KIND_FIELDS.items():
        if patch.get(kind) is not None:
            for other in others:
                merged.pop(other, None)
    merged.update(patch)
    return parse_job_spec(merged, now_ms, pools=pools, run_at_must_be_future="runAt" in patch,
                          end_at_must_be_future="endAt" in patch)


def check_patch(patch: Any, now_ms: int, *, pools: frozenset[str] = DEFAULT_POOLS) -> None:
    """A patch's field names and values, checked without the job it is for (merged into
    a template definition): what a sender can be told at once. The merge itself, on the
    job's current definition, is the processor's (``core.jobs.decide``)."""
    apply_patch(_PATCH_TEMPLATE, patch, now_ms, pools=pools)


def validate_idempotency_key(key: Any, field: str = "idempotencyKey") -> str:
    if isinstance(key, str):
        reject_control_chars(key, field)
    if not isinstance(key, str) or not _KEY_RE.fullmatch(key):
        raise ValidationError(field, f"must be 1-{IDEMPOTENCY_KEY_MAX_CHARS} characters of A-Z a-z 0-9 . _ : -")
    return key


_PATCH_TEMPLATE = JobSpec(name="template", schedule=Schedule(cron="0 0 1 1 *"),
                          target=Target(TargetType.HANDLER, handler="h"))
