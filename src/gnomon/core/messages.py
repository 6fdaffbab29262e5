"""Messages that leave the processors for workers and for history (not state events)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from gnomon.core.model import JobSpec


@dataclass(frozen=True)
class DispatchRun:
    """Retired (2026-12-04): was on gnomon.dispatch.<pool>.<priority>, "this run wants a
    worker", the old pull path's hint (Claim -> Grant). Nothing writes it; its subject
    stays registered so what an old cluster holds still decodes (codec ``RETIRED``)."""

    run_id: str
    job_id: str
    tenant: str
    attempt: int
    pool: str
    priority: str
    not_before_ms: int
    at_ms: int


@dataclass(frozen=True)
class Grant:
    """On gnomon.worker-inbox: the worker may start this attempt, fenced by ``token``."""

    worker_id: str
    run_id: str
    job_id: str
    tenant: str
    attempt: int
    token: int
    lease_until_ms: int
    deadline_ms: int
    spec: JobSpec
    slot_ms: int
    at_ms: int
    # Start the attempt at this instant by the worker's own clock, never before it
    # (pre-staging). 0 in grants written before staging existed: start at once.
    not_before_ms: int = 0


class StopReason(StrEnum):
    REJECTED = "rejected"  # claim refused: somebody else has it, or it is not ready
    STALE = "stale"  # your token is not the current grant: stop the attempt
    CANCELLED = "cancelled"  # the run was cancelled: stop the attempt
    REVOKED = "revoked"  # a staged grant taken back (paused, deleted, edited, reassigned): drop it


@dataclass(frozen=True)
class Stop:
    """On gnomon.worker-inbox: do not start (claim rejected) or stop (stale / cancelled)."""

    worker_id: str
    run_id: str
    token: int
    kind: StopReason
    reason: str
    at_ms: int


@dataclass(frozen=True)
class LeaseAck:
    """On gnomon.worker-inbox: a heartbeat was accepted; the lease now ends at lease_until_ms."""

    worker_id: str
    run_id: str
    token: int
    lease_until_ms: int
    at_ms: int


class LogStream(StrEnum):
    STDOUT = "stdout"
    STDERR = "stderr"
    SYSTEM = "system"  # gnomon's own lines about the attempt (started, exit code, ...)


@dataclass(frozen=True)
class LogLine:
    """On gnomon.run-logs (key run_id)."""

    run_id: str
    job_id: str
    tenant: str
    attempt: int
    seq: int
    stream: LogStream
    line: str
    at_ms: int


@dataclass(frozen=True)
class PoisonRecord:
    """On gnomon.poison: a record a processor could not decode or apply, kept whole."""

    source_topic: str
    partition: int
    offset: int
    reason: str
    key: bytes | None
    value: bytes | None
    at_ms: int
