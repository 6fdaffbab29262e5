"""Counting a tenant's jobs, queued one-off runs and granted runs across partitions, and
the share of each limit one processor instance may use (docs/adr/0008-tenant-quotas.md).

A tenant's jobs and runs are spread over every partition (keyed by job id), while its
limits (``core.tenants``) are per tenant. Each partition counts what it holds, from
index entries written in the same transaction as the state they derive from (so a
count is restored with the state, never drifts from it, and needs no ledger of its own):

    tq/<tenant>\\0<pool>\\0<run_id>  a run granted to a worker (staged or running): holds quota
    tb/<tenant>\\0<run_id>           a one-off run (manual, backfilled, or of a one-time job) not started
    tb/<tenant>\\0job:<job_id>       a one-time job not triggered yet
    tj/<tenant>\\0<job_id>           a registered job

A processor instance sums its partitions' counts (``QuotaBook``) and may use the share of
each limit *homed* on the partitions it owns: a limit of L is L units, unit j homed on
partition ``(hash(tenant) + j * N // L) % N`` (spread evenly, starting at a partition
that depends on the tenant). The units of all instances add up to L exactly, so the
limit holds across instances without talking to each other; an instance owning every
partition (one processor, or the in-memory harness) may use all of L. With several
instances a tenant may use less than its quota at once when its waiting runs sit on an
instance whose units are busy (the ADR's trade-off), never more.

Pure: counts and shares; the partition task decides, the runtime wires the instance.
"""

from __future__ import annotations

import hashlib
from collections import Counter, deque
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from gnomon.core.jobs import JobState, JobStatus
from gnomon.core.runs import RunState, RunStatus
from gnomon.core.tenants import TenantBook, TenantLimits

WAITING_FOR_QUOTA = "waiting for quota"
TRIGGER_WINDOW_MS = 60_000
BACKFILL_WINDOW_MS = 86_400_000  # backfilled runs are counted per tenant over a day


class Family(StrEnum):
    """What an index family counts."""

    GRANTED = "tq/"  # runs holding concurrency quota
    BACKLOG = "tb/"  # one-off runs queued and not started
    JOBS = "tj/"  # registered jobs


def granted_key(run: RunState) -> bytes | None:
    """The ``tq/`` entry of a run that holds quota: granted to a worker, not ended."""
    if run.status is not RunStatus.RUNNING:
        return None
    return (Family.GRANTED.value + run.tenant + "\0" + run.spec.pool + "\0" + run.run_id).encode()


def backlog_key(run: RunState) -> bytes | None:
    """The ``tb/`` entry of a one-off run (manual, backfilled, or a one-time job's) not
    started yet."""
    one_off = run.manual or run.backfill or run.spec.schedule.is_one_time
    if not one_off or not run.never_started or run.status.terminal or run.status is RunStatus.RETRY_WAIT:
        return None
    return (Family.BACKLOG.value + run.tenant + "\0" + run.run_id).encode()


def job_key(tenant: str, job_id: str) -> bytes:
    return (Family.JOBS.value + tenant + "\0" + job_id).encode()


def pending_one_time_key(job: JobState | None) -> bytes | None:
    """The ``tb/`` entry of a one-time job whose run has not been created yet (it is in
    the backlog from registration on; its run takes its place when it is triggered)."""
    if job is None or not job.spec.schedule.is_one_time or job.next_run_at_ms is None:
        return None
    if job.status not in (JobStatus.ACTIVE, JobStatus.PAUSED):
        return None
    return (Family.BACKLOG.value + job.tenant + "\0job:" + job.job_id).encode()


_FAMILY_OF_HEAD: dict[bytes, Family] = {f.value.encode(): f for f in Family}


def parse_key(key: bytes) -> tuple[Family, str, str] | None:
    """(family, tenant, pool or "") of a counting entry, or None if ``key`` is not one."""
    family = _FAMILY_OF_HEAD.get(key[:3])  # (a dict: Family(head) was ~5 % of the processor)
    if family is None:
        return None
    parts = key[3:].decode().split("\0")
    if family is Family.GRANTED:
        return (family, parts[0], parts[1]) if len(parts) == 3 else None
    return (family, parts[0], "") if len(parts) == 2 else None


def units_homed(tenant: str, limit: int, partitions_total: int, owned: frozenset[int]) -> int:
    """How many of the ``limit`` units of ``tenant`` are homed on the ``owned`` partitions
    (of ``partitions_total``). Summed over disjoint owners covering every partition, it is
    exactly ``limit``."""
    assert partitions_total > 0 and limit >= 0
    if len(owned) >= partitions_total:
        return limit
    h = int.from_bytes(hashlib.sha256(tenant.encode()).digest()[:4], "big") % partitions_total
    n = 0
    for p in owned:
        q = (p - h) % partitions_total
        # units j with floor(j * N / L) == q: ceil((q + 1) * L / N) - ceil(q * L / N)
        n += -(-(q + 1) * limit // partitions_total) - -(-q * limit // partitions_total)
    return n


@dataclass(frozen=True)
class QuotaDecision:
    """Whether one more run of ``tenant`` in ``pool`` may be granted now."""

    allowed: bool
    granted: int  # runs of the tenant in the pool this instance has granted
    share: int  # of the tenant's concurrency_max, the units this instance holds
    limit: int

    @property
    def reason(self) -> str:
        return (f"{WAITING_FOR_QUOTA}: {self.granted} of {self.limit} runs granted "
                f"(this processor holds {self.share} of them)")


class QuotaBook:
    """One processor instance's counts, per partition it owns, and its shares."""

    def __init__(self, tenants: TenantBook | None = None, partitions_total: int = 1) -> None:
        assert partitions_total > 0
        self.tenants = tenants or TenantBook()
        self.partitions_total = partitions_total
        self._counts: dict[int, Counter[tuple[Family, str, str]]] = {}
        self._totals: Counter[tuple[Family, str, str]] = Counter()  # the sum of ``_counts`` (read per grant)
        self._triggers: dict[int, dict[str, deque[int]]] = {}  # partition -> tenant -> accepted at
        self._backfills: dict[int, dict[str, deque[tuple[int, int]]]] = {}  # ... -> (accepted at, runs)
        self._owned: frozenset[int] = frozenset()

    # ---- counts, kept by the partition tasks -----------------------------------------

    def open(self, partition: int) -> None:
        """Start counting ``partition`` from zero (its entries are counted as loaded)."""
        self._forget_counts(partition)
        self._counts[partition] = Counter()
        self._triggers[partition] = {}
        self._backfills[partition] = {}
        self._owned = frozenset(self._counts)

    def close(self, partition: int) -> None:
        """``partition`` is no longer owned here: forget its counts."""
        self._forget_counts(partition)
        self._triggers.pop(partition, None)
        self._backfills.pop(partition, None)
        self._owned = frozenset(self._counts)

    def _forget_counts(self, partition: int) -> None:
        old = self._counts.pop(partition, None)
        if old:
            self._totals.subtract(old)
            self._totals = +self._totals  # (drops the zeros)

    def counting(self, partition: int) -> bool:
        return partition in self._counts

    def entry(self, partition: int, key: bytes, delta: int) -> None:
        """An index entry of ``partition`` was written (+1) or deleted (-1)."""
        counts = self._counts.get(partition)
        parsed = parse_key(key) if counts is not None else None
        if counts is None or parsed is None:
            return
        counts[parsed] += delta
        assert counts[parsed] >= 0, f"count of {parsed} below zero in partition {partition}"
        if counts[parsed] == 0:
            del counts[parsed]
        totals = self._totals
        totals[parsed] += delta
        if totals[parsed] == 0:
            del totals[parsed]

    def count(self, family: Family, tenant: str, pool: str = "") -> int:
        return self._totals.get((family, tenant, pool), 0)

    def partition_counts(self, partition: int, now_ms: int) -> dict[str, dict[str, int]]:
        """tenant -> {"jobs", "backlog", "running", "triggers_last_min"} of one partition
        at ``now_ms`` (what the processor publishes on gnomon.tenant-usage). Triggers
        older than the window are dropped first: the API takes the larger of its own
        count and the published one, so a stale window would refuse the tenant for good."""
        out: dict[str, dict[str, int]] = {}
        for (family, tenant, _), n in self._counts.get(partition, Counter()).items():
            row = out.setdefault(tenant, {"jobs": 0, "backlog": 0, "running": 0, "triggers_last_min": 0})
            row[{Family.JOBS: "jobs", Family.BACKLOG: "backlog", Family.GRANTED: "running"}[family]] += n
        for tenant, window in self._triggers.get(partition, {}).items():
            _prune(window, now_ms)
            if window:
                row = out.setdefault(tenant, {"jobs": 0, "backlog": 0, "running": 0, "triggers_last_min": 0})
                row["triggers_last_min"] = len(window)
        return out

    # ---- shares and decisions ----------------------------------------------------------

    def limits(self, tenant: str) -> TenantLimits:
        return self.tenants.limits(tenant)

    def share(self, tenant: str, limit: int) -> int:
        return units_homed(tenant, limit, self.partitions_total, self._owned)

    def may_grant(self, tenant: str, pool: str) -> QuotaDecision:
        limit = self.limits(tenant).concurrency_max
        share = self.share(tenant, limit)
        granted = self.count(Family.GRANTED, tenant, pool)
        return QuotaDecision(granted < share, granted, share, limit)

    def effective_limits(self, tenant: str) -> TenantLimits:
        """The tenant's limits scaled to this instance's shares (jobs, backlog, trigger
        rate; at least 1 each, so an instance owning a partition can admit there: these
        are admission limits, exact with one instance and approximate with several)."""
        lim = self.limits(tenant)
        if len(self._owned) >= self.partitions_total:
            return lim
        return replace(lim, jobs_max=max(1, self.share(tenant, lim.jobs_max)),
                       backlog_max=max(1, self.share(tenant, lim.backlog_max)),
                       triggers_per_min_max=max(1, self.share(tenant, lim.triggers_per_min_max)))

    def triggers(self, tenant: str, now_ms: int) -> tuple[int, int | None]:
        """(manual triggers accepted in the minute before ``now_ms``, the oldest's time)."""
        n = 0
        oldest: int | None = None
        for windows in self._triggers.values():
            window = windows.get(tenant)
            if not window:
                continue
            _prune(window, now_ms)
            n += len(window)
            if window and (oldest is None or window[0] < oldest):
                oldest = window[0]
        return n, oldest

    def trigger_accepted(self, partition: int, tenant: str, now_ms: int, window_max: int = 1_000_000) -> None:
        windows = self._triggers.get(partition)
        if windows is None:
            return
        window = windows.setdefault(tenant, deque())
        window.append(now_ms)
        while len(window) > window_max:
            window.popleft()

    def backfilled(self, tenant: str, now_ms: int) -> int:
        """Runs a backfill created or reopened for ``tenant`` in the day before ``now_ms``."""
        n = 0
        for windows in self._backfills.values():
            window = windows.get(tenant)
            if window:
                _prune(window, now_ms, BACKFILL_WINDOW_MS)
                n += sum(count for _, count in window)
        return n

    def backfill_accepted(self, partition: int, tenant: str, runs: int, now_ms: int, window_max: int = 100_000) -> None:
        windows = self._backfills.get(partition)
        if windows is None:
            return
        window = windows.setdefault(tenant, deque())
        window.append((now_ms, runs))
        while len(window) > window_max:
            window.popleft()


def _prune(window: deque[Any], now_ms: int, window_ms: int = TRIGGER_WINDOW_MS) -> None:
    """Drop the entries of ``window`` (accepted-at times, or (time, count) pairs; oldest
    first) that are a whole ``window_ms`` or more before ``now_ms``."""
    while window and _at(window[0]) <= now_ms - window_ms:
        window.popleft()


def mark_waiting(run: RunState, decision: QuotaDecision, now_ms: int) -> RunState:
    """A READY run its tenant's quota holds back: say so on the run (once; the reason is
    cleared when it is granted)."""
    assert run.status is RunStatus.READY
    if run.reason is not None and run.reason.startswith(WAITING_FOR_QUOTA):
        return run
    return replace(run, reason=decision.reason, updated_at_ms=now_ms)


def clear_waiting(run: RunState) -> RunState:
    if run.reason is not None and run.reason.startswith(WAITING_FOR_QUOTA):
        return replace(run, reason=None)
    return run


def _at(entry: int | tuple[int, int]) -> int:
    return entry if isinstance(entry, int) else entry[0]
