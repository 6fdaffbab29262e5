"""Overload: how much scheduled work a processor takes on per tick when it cannot do it all.

The order (docs/semantics.md):

1. Records already in the input (worker reports, commands) are always applied: they are
   facts, and what they cost is what runs already granted cost.
2. ``high`` jobs' due slots are triggered every tick without a budget (only ``due_max``
   bounds a tick, as for every index scan).
3. ``normal``, then ``low`` jobs' due slots are triggered, oldest first, while the tick's
   ``TickBudget`` lasts. A slot left over stays due (its job's ``next_run_at`` does not
   move): it runs late, at a later tick.
4. A slot later than its job's ``late_max_s`` (default: the misfire grace, 60 s) is given
   up: recorded skipped with reason ``overload`` (``core.jobs.decide_tick``), never as if
   there had been an outage, never silently.

On the real stack the budget is a **window** (``OverloadGovernor``): how many ``normal`` and
``low`` runs may be in flight (triggered and not started) on the processor at once; a tick
may trigger what the window has left. The window is AIMD on what an outside observer
sees, the start lag of the most urgent runs that started (``high`` when any did, else
``normal``; 90th percentile over 2 s): above the target it is cut to ``decrease`` times
what was in flight; below half the target, while it binds, it doubles (slow start, until
the first cut) or grows by ``increase_fraction``. A window, unlike a rate, is
self-clocking (a run that starts frees room for the next) and bounds the backlog a
saturated box builds: the lookahead of thousands of jobs registered at once is triggered
as fast as runs start, not in one tick. It starts at ``window_start_runs``.

Runs triggered ahead of their slot (the lookahead) are in flight too, and a healthy box
always has about (its start rate x the lookahead) of them: a window below that would make
the runs it defers late by itself (300 per-second jobs need ~9,000 in flight; the window
alone, cut once at start-up, held them back for a minute). So the room is the window
**plus a pipeline allowance**: the highest ``normal``/``low`` start rate of the last
lookahead (counted from starts, in quiet periods too) times the lookahead. AIMD moves only
the window, on what is in flight beyond the allowance. Under overload the allowance is
what ``normal`` already achieves, so it is not held below that; it still gets little while
``high``'s lag keeps the window at its floor (the 4,000-job bench: 7 normal runs a second).
The simulation gives a fixed budget per tick instead (``TickBudget(n)``) to test the order.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

OVERLOAD_RETRY_AFTER_S = 30  # new one-off work refused while overloaded (429): try again after this


@dataclass
class TickBudget:
    """Triggers left this tick for ``normal`` and ``low`` jobs, across one processor's
    partitions (None: unlimited). ``deferred``: jobs with a due slot left for later."""

    left: int | None = None
    used: int = 0
    deferred: int = 0

    @property
    def exhausted(self) -> bool:
        return self.left is not None and self.left <= 0

    def spend(self, n: int) -> None:
        self.used += n
        if self.left is not None:
            self.left -= n


@dataclass
class OverloadGovernor:
    """AIMD window of ``normal``/``low`` runs in flight (see the module doc). Pure: time
    and the in-flight count come in as arguments."""

    target_lag_ms: int = 800
    lags_kept_max: int = 2_000  # per window (beyond, later lags replace earlier ones in turn)
    period_ms: int = 2_000  # the window moves at most once per period (a cut shows in start lags later)
    decrease: float = 0.7
    increase_fraction: float = 0.1
    window_start_runs: float = 10_000.0  # a 10,000-run spike registered ahead, triggered in one go
    window_min_runs: float = 50.0  # never below: normal and low starve slowly, not at once
    window_max_runs: float = 10_000_000.0
    window_runs: float = field(init=False)
    slow_start: bool = True
    lookahead_ms: int = 30_000  # the scheduler's lookahead (the pipeline allowance's horizon)
    _period_start_ms: int | None = None
    _started: int = 0  # normal/low runs started this period (quiet or not)
    _rates: deque[float] = field(default_factory=deque)  # their starts per second, a period each
    _lags: dict[int, list[int]] = field(default_factory=dict)  # priority rank (0 high) -> start lags
    _seen: int = 0
    _inflight_peak: int = 0
    _deferred: int = 0
    last_lag_ms: int = 0  # the signal of the last period
    last_deferred: int = 0  # due jobs deferred in the last period
    changes: list[tuple[int, float]] = field(default_factory=list)  # (at, new window), the last few

    def __post_init__(self) -> None:
        self.window_runs = self.window_start_runs

    def observe_start(self, rank: int, lag_ms: int, *, judged: bool = True) -> None:
        """A run of priority ``rank`` (0 high, 1 normal, 2 low) started ``lag_ms`` after its
        time. ``judged=False`` (a quiet period: the lag is an outage's): it counts towards
        the start rate only."""
        if rank:
            self._started += 1
        if not judged:
            return
        lags = self._lags.setdefault(rank, [])
        self._seen += 1
        if len(lags) < self.lags_kept_max:
            lags.append(lag_ms)
        else:
            lags[self._seen % self.lags_kept_max] = lag_ms

    def period_lag_ms(self) -> int:
        """This period's signal: the 90th percentile start lag of the most urgent priority
        that started runs (0 if none did)."""
        urgent = min(self._lags, default=None)
        lags = sorted(self._lags[urgent]) if urgent is not None else []
        return lags[min(len(lags) - 1, len(lags) * 9 // 10)] if lags else 0

    @property
    def overloaded(self) -> bool:
        """The last period deferred due jobs: the window binds."""
        return self.last_deferred > 0

    @property
    def pipeline_runs(self) -> float:
        """The allowance for runs triggered ahead: the highest normal/low start rate of the
        last lookahead times the lookahead."""
        return max(self._rates, default=0.0) * self.lookahead_ms / 1000

    @property
    def room_runs(self) -> float:
        """Normal/low runs that may be in flight: the window plus the pipeline allowance."""
        return self.window_runs + self.pipeline_runs

    def budget(self, inflight_runs: int) -> TickBudget:
        """This tick's budget: what the room has left over the runs in flight."""
        self._inflight_peak = max(self._inflight_peak, inflight_runs)
        return TickBudget(left=max(0, int(self.room_runs) - inflight_runs))

    def after_tick(self, budget: TickBudget, inflight_runs: int, now_ms: int, *, hold: bool = False) -> None:
        """What the tick did; once per period, move the window (``hold``: keep it where it
        is, the period is still reported)."""
        self._inflight_peak = max(self._inflight_peak, inflight_runs)
        self._deferred += budget.deferred
        if self._period_start_ms is None:
            self._period_start_ms, self._started = now_ms, 0  # (starts before it fall in no period)
        if now_ms - self._period_start_ms < self.period_ms:
            return
        lag, deferred = self.period_lag_ms(), self._deferred
        peak = max(0.0, self._inflight_peak - self.pipeline_runs)  # in flight beyond the allowance
        self.last_lag_ms, self.last_deferred = lag, deferred
        self._rates.append(self._started * 1000 / max(1, now_ms - self._period_start_ms))
        while len(self._rates) > max(1, -(-self.lookahead_ms // self.period_ms)):
            self._rates.popleft()
        self._period_start_ms, self._lags, self._inflight_peak, self._deferred = now_ms, {}, inflight_runs, 0
        self._started = 0
        if hold:
            return
        if lag > self.target_lag_ms:
            self.slow_start = False
            self._set(now_ms, max(self.window_min_runs, min(self.window_runs, peak) * self.decrease))
        elif lag <= self.target_lag_ms // 2 and (deferred or peak >= 0.8 * self.window_runs):
            grown = self.window_runs * (2.0 if self.slow_start else 1.0 + self.increase_fraction)
            self._set(now_ms, min(self.window_max_runs, grown))

    def _set(self, now_ms: int, window: float) -> None:
        self.window_runs = window
        self.changes.append((now_ms, window))
        del self.changes[:-20]
