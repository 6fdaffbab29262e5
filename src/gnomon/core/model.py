"""The job model: frozen value objects and their enums. No validation logic here;
see ``gnomon.core.validation`` for turning user input into these."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum


class Priority(StrEnum):
    HIGH = "high"
    NORMAL = "normal"
    LOW = "low"


class CatchUp(StrEnum):
    ONCE = "once"  # run only the latest missed slot; earlier ones are recorded skipped
    ALL = "all"  # run every missed slot, capped at CATCH_UP_ALL_MAX; the rest skipped
    SKIP = "skip"  # run none of the missed slots; each is recorded skipped


class OverlapPolicy(StrEnum):
    """What a slot does while an earlier run of the same job is still active."""

    ALLOW = "allow"  # runs may overlap (the default)
    FORBID = "forbid"  # the slot is skipped, recorded "overlap"
    REPLACE = "replace"  # the active run is cancelled ("replaced by ..."), the slot runs
    # at most one later slot waits (not released) and starts when the active run ends;
    # any further slot is skipped, recorded "overlap: ..." (the API's camelCase value)
    BUFFER_ONE = "bufferOne"


class TargetType(StrEnum):
    HANDLER = "handler"  # a Python function registered with @worker.handler(name)
    HTTP = "http"  # POST to a callback URL
    COMMAND = "command"  # an argv run in a sandbox (bubblewrap) on the worker
    CONTAINER = "container"  # an image with arguments, run by podman on the worker


@dataclass(frozen=True)
class Target:
    type: TargetType
    handler: str | None = None
    url: str | None = None
    argv: tuple[str, ...] = ()
    image: str | None = None  # container targets

    def describe(self) -> str:
        if self.type is TargetType.HANDLER:
            return f"handler:{self.handler}"
        if self.type is TargetType.HTTP:
            return f"http:{self.url}"
        if self.type is TargetType.CONTAINER:
            return f"container:{self.image} " + " ".join(self.argv)
        return "command:" + " ".join(self.argv)


@dataclass(frozen=True)
class RetryPolicy:
    """How many attempts a run gets and how long to wait between them.

    ``max_attempts`` counts every attempt, the first one included (1 = no retry).
    """

    max_attempts: int = 3
    backoff_base_s: float = 1.0
    backoff_cap_s: float = 300.0


@dataclass(frozen=True)
class Schedule:
    """At most one of ``cron`` (with ``tz``), ``every_s`` (an interval) or ``run_at_ms``
    (one time) is set. The slots it makes: ``gnomon.core.schedule``. None of them: the job
    has no schedule of its own and runs after its upstreams (``after_upstreams``)."""

    cron: str | None = None
    tz: str = "UTC"
    run_at_ms: int | None = None
    # an interval: slots every this many seconds (absolute time, DST does not shape it),
    # from ``anchor_ms`` (None: the Unix epoch)
    every_s: int | None = None
    anchor_ms: int | None = None
    # bounds of a repeating schedule: no slot before start_at_ms nor after end_at_ms
    # (inclusive), at most max_runs runs triggered by the schedule (core.jobs counts them)
    start_at_ms: int | None = None
    end_at_ms: int | None = None
    max_runs: int | None = None

    @property
    def is_one_time(self) -> bool:
        return self.run_at_ms is not None

    @property
    def after_upstreams(self) -> bool:
        """No slot of its own: the job's logical times are its upstreams' slots, each one
        staged when an upstream run of it ends (``gnomon.core.dependencies``)."""
        return self.cron is None and self.run_at_ms is None and self.every_s is None


class DependsOn(StrEnum):
    """What a downstream job waits for of an upstream run (core.dependencies)."""

    SUCCEEDED = "succeeded"  # only a success releases it; any other end skips it
    FINISHED = "finished"  # any end (succeeded, failed, cancelled, skipped) releases it


@dataclass(frozen=True)
class Upstream:
    """One job a job runs after: its run for a slot waits for this job's run of the
    latest slot at or before it (core.dependencies)."""

    job_id: str
    on: DependsOn = DependsOn.SUCCEEDED


@dataclass(frozen=True)
class JobSpec:
    """What a user registers. ``payload_json`` is the payload as canonical JSON text."""

    name: str
    schedule: Schedule
    target: Target
    payload_json: str = "null"
    priority: Priority = Priority.NORMAL
    timeout_s: int = 3600
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    catch_up: CatchUp = CatchUp.ONCE
    pool: str = "default"
    # names of the tenant's secrets the worker injects into the sandbox (never their values)
    secrets: tuple[str, ...] = ()
    # a scheduled run starts at slot + jitter_offset_ms(job, slot, jitter_s): spreads a spike
    jitter_s: int = 0
    overlap: OverlapPolicy = OverlapPolicy.ALLOW
    # a run that starts more than this many seconds after its start time alerts the tenant
    # (gnomon.alerts); None: the tenant's alert config's default
    alert_late_s: int | None = None
    # while the scheduler is overloaded, a slot not started within this many seconds of
    # its time is given up, recorded skipped with reason "overload"
    # (docs/semantics.md); None: the scheduler's misfire grace (60 s by default)
    late_max_s: int | None = None
    # names of the tenant's calendars (core.calendars) whose dates this job does not run
    # on: such a slot is recorded skipped, reason "calendar <name>"
    exclude_calendars: tuple[str, ...] = ()
    # jobs of the same tenant whose runs this job's runs wait for (core.dependencies), and
    # how long a run waits past its slot before it is recorded skipped (None: 24 h)
    after: tuple[Upstream, ...] = ()
    wait_max_s: int | None = None


def slot_run_id(job_id: str, slot_ms: int) -> str:
    """The run id of a scheduled slot: ``{job_id}@{slot as UTC ISO-8601}``."""
    from gnomon.core.clock import ms_to_iso

    return f"{job_id}@{ms_to_iso(slot_ms)}"


def manual_run_id(job_id: str, idempotency_key: str) -> str:
    return f"{job_id}@manual:{idempotency_key}"


def idempotent_job_id(tenant: str, key: str) -> str:
    """The job id a registration with idempotency key ``key`` gets (REST
    ``Idempotency-Key`` or ``gnomon.events``): the same for every retry, different per
    tenant. Ids of this form are reserved for it: a registration of one must carry the
    key it was derived from, with its tenant (``is_derived_job_id``; checked by the
    processor), so no other tenant can take it first."""
    import hashlib

    return "job_" + hashlib.sha256(f"{tenant}\0{key}".encode()).hexdigest()[:16]


_DERIVED_ID = re.compile(r"job_[0-9a-f]{16}")


def is_derived_job_id(job_id: str) -> bool:
    """Whether ``job_id`` has the form of ``idempotent_job_id``'s ids (``job_`` and 16 hex
    digits): reserved for registrations that carry their idempotency key."""
    return _DERIVED_ID.fullmatch(job_id) is not None


def random_job_id() -> str:
    """A new job id for a registration without an idempotency key (``job_`` and 20 hex
    digits: never of the derived form)."""
    import secrets

    return "job_" + secrets.token_hex(10)


def job_id_of(run_id: str) -> str:
    job_id, sep, _ = run_id.partition("@")
    if not sep or not job_id:
        raise ValueError(f"not a run id: {run_id!r}")
    return job_id


def jitter_offset_ms(job_id: str, slot_ms: int, jitter_s: int) -> int:
    """Where in [0, jitter_s] seconds a scheduled run of ``slot_ms`` starts after its slot:
    a hash of job and slot, so every processor (and ``gnomon cron next``) computes the
    same start, and a job's runs do not all land on the same offset."""
    if jitter_s <= 0:
        return 0
    import hashlib

    digest = hashlib.sha256(f"{job_id}\0{slot_ms}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % (jitter_s * 1000 + 1)
