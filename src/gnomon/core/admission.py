"""Admission: whether a tenant's limits (``core.tenants``) let a command in.

Pure functions over the limits and the counts the caller has (the processor's, from its
state: ``core.quota``; the API's, from history, to answer with an HTTP status before the
processor decides). Each refusal is a ``LimitExceeded`` naming the limit:

* a registration over ``jobs_max``, or a cron schedule firing more often than
  ``interval_min_s``: refused, waiting does not help (422). A job with no schedule of
  its own (after its upstreams) is not checked here: its upstreams were, its runs fire
  no more often than all of theirs together (``core.schedule.shortest_gap_ms``);
* a manual trigger or a one-time job over ``backlog_max``, or a trigger over
  ``triggers_per_min_max``: refused with a Retry-After (429);
* a backfill: its new runs are one-off runs and triggers too, all or none: refused
  (422) if it alone is larger than ``backlog_max`` or ``triggers_per_min_max``; refused
  (429) if they would take the backlog past ``backlog_max`` or the minute's triggers past
  ``triggers_per_min_max``, or the tenant's backfilled runs of the last day past
  ``BACKFILL_RUNS_PER_DAY_MAX`` (counted by each processor instance in memory, over the
  partitions it owns: a restart or a rebalance forgets them, so it is a brake, not an
  exact ledger). Per call: ``core.jobs.BACKFILL_SLOTS_MAX`` slots, none before the job
  existed.
"""

from __future__ import annotations

from functools import lru_cache

from gnomon.core import schedule as slots
from gnomon.core.errors import LimitExceeded
from gnomon.core.model import JobSpec, Schedule
from gnomon.core.tenants import TenantLimits

INTERVAL_SAMPLE_FIRES = 64  # fire times examined for a schedule's shortest gap
BACKLOG_RETRY_AFTER_S = 10
BACKFILL_RUNS_PER_DAY_MAX = 10_000
"""Runs one tenant's backfills may create or reopen in a day, whatever its other limits."""


@lru_cache(maxsize=4096)
def _shortest_gap_s(schedule: Schedule, from_ms: int) -> float:
    gap = slots.shortest_gap_ms(schedule, from_ms, INTERVAL_SAMPLE_FIRES)
    return gap / 1000 if gap is not None else float("inf")


def shortest_interval_s(spec: JobSpec, now_ms: int) -> float:
    """The shortest gap between two of the schedule's next fire times (over the next
    ``INTERVAL_SAMPLE_FIRES`` fires of a cron schedule, sampled from the start of the
    current day so that the answer is stable within it; an interval's own length);
    infinity for a one-time job. Bounds do not change it."""
    if spec.schedule.run_at_ms is not None:
        return float("inf")
    day_ms = now_ms - now_ms % 86_400_000
    return _shortest_gap_s(spec.schedule, day_ms)


def check_schedule(limits: TenantLimits, spec: JobSpec, now_ms: int) -> None:
    """A cron schedule must not fire more often than the tenant's ``interval_min_s``."""
    gap = shortest_interval_s(spec, now_ms)
    if gap < limits.interval_min_s:
        raise LimitExceeded("interval_min_s", f"the schedule fires every {gap:g} s at its most frequent; "
                            f"tenant {limits.tenant} may schedule no more often than every "
                            f"{limits.interval_min_s} s", field="schedule")


def check_registration(limits: TenantLimits, spec: JobSpec, *, jobs: int, backlog: int, now_ms: int) -> None:
    """A new job: ``jobs`` the tenant already has, ``backlog`` its queued one-off runs."""
    if jobs >= limits.jobs_max:
        raise LimitExceeded("jobs_max", f"tenant {limits.tenant} has {jobs} jobs, its limit is "
                            f"{limits.jobs_max}; delete some or ask an admin to raise jobs_max")
    check_schedule(limits, spec, now_ms)
    if spec.schedule.is_one_time:
        check_backlog(limits, backlog)


def check_backlog(limits: TenantLimits, backlog: int) -> None:
    if backlog >= limits.backlog_max:
        raise LimitExceeded("backlog_max", f"tenant {limits.tenant} has {backlog} one-off runs queued, "
                            f"its limit is {limits.backlog_max}; retry when some have started",
                            retry_after_s=BACKLOG_RETRY_AFTER_S)


def check_trigger(limits: TenantLimits, *, backlog: int, triggers_last_min: int, oldest_trigger_ms: int | None,
                  now_ms: int) -> None:
    """A manual trigger: ``triggers_last_min`` accepted in the minute before ``now_ms``,
    the oldest of them at ``oldest_trigger_ms`` (it leaves the window first)."""
    if triggers_last_min >= limits.triggers_per_min_max:
        wait_ms = 60_000 if oldest_trigger_ms is None else max(0, oldest_trigger_ms + 60_000 - now_ms)
        raise LimitExceeded("triggers_per_min_max", f"tenant {limits.tenant} made {triggers_last_min} manual "
                            f"triggers in the last minute, its limit is {limits.triggers_per_min_max}",
                            retry_after_s=max(1, -(-wait_ms // 1000)))
    check_backlog(limits, backlog)


def check_backfill(limits: TenantLimits, runs: int, *, backlog: int, triggers_last_min: int,
                   oldest_trigger_ms: int | None, backfilled_last_day: int, now_ms: int) -> None:
    """A backfill that creates or reopens ``runs`` runs, all admitted or none. One larger
    than a limit itself is refused for good (422: send a smaller range), one that only
    meets what is queued or was triggered already, with a Retry-After (429)."""
    for limit, value in (("backlog_max", limits.backlog_max), ("triggers_per_min_max", limits.triggers_per_min_max)):
        if runs > value:
            raise LimitExceeded(limit, f"a backfill of {runs} runs is more than tenant {limits.tenant}'s "
                                f"{limit} of {value}; send at most {value} slots at a time", field="to")
    if backfilled_last_day + runs > BACKFILL_RUNS_PER_DAY_MAX:
        raise LimitExceeded("backfill_runs_per_day", f"tenant {limits.tenant} backfilled {backfilled_last_day} "
                            f"runs in the last day; {runs} more would pass the {BACKFILL_RUNS_PER_DAY_MAX} a day "
                            "allowed", retry_after_s=3600)
    if triggers_last_min + runs > limits.triggers_per_min_max:
        wait_ms = 60_000 if oldest_trigger_ms is None else max(0, oldest_trigger_ms + 60_000 - now_ms)
        raise LimitExceeded("triggers_per_min_max", f"a backfill of {runs} runs: tenant {limits.tenant} made "
                            f"{triggers_last_min} triggers in the last minute, its limit is "
                            f"{limits.triggers_per_min_max}; send a smaller range",
                            retry_after_s=max(1, -(-wait_ms // 1000)))
    if backlog + runs > limits.backlog_max:
        raise LimitExceeded("backlog_max", f"a backfill of {runs} runs: tenant {limits.tenant} has {backlog} "
                            f"one-off runs queued, its limit is {limits.backlog_max}; send a smaller range or "
                            "retry when some have started", retry_after_s=BACKLOG_RETRY_AFTER_S)
