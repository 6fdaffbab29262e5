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

The budget is a rate of triggers per second for ``normal`` and ``low`` (``OverloadGovernor``),
AIMD on what an outside observer sees: the start lag of the most urgent runs that started
(``high`` when any did, else ``normal``), the 90th percentile over a window (the runtime
does not feed it the input lag: after an outage a processor reads a backlog, and slowing
its triggers then would only make the return later). A lag over the target cuts the rate to ``decrease`` times what was actually triggered; a
lag under half the target raises it by ``increase_fraction`` of itself (at least
``increase_min_per_s``); a rate that has not bound for ``unbound_after_s`` goes back to
unlimited, so a box that is not overloaded never sees a budget at all. The simulation
gives a fixed budget per tick instead (``TickBudget(n)``) to test the order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


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
    """AIMD rate of ``normal``/``low`` triggers per second (see the module doc). Pure:
    time comes in as ``now_ms``."""

    target_lag_ms: int = 800
    lags_kept_max: int = 2_000  # per window (beyond, later lags replace earlier ones in turn)
    window_ms: int = 2_000  # the rate moves at most once per window (a cut shows in start lags seconds later)
    decrease: float = 0.7
    increase_fraction: float = 0.1
    increase_min_per_s: float = 20.0
    rate_min_per_s: float = 10.0  # never below: normal and low starve slowly, not at once
    unbound_after_s: float = 30.0
    rate_per_s: float = math.inf
    _window_start_ms: int | None = None
    _window_lags: dict[int, list[int]] = field(default_factory=dict)  # priority rank (0 high) -> start lags
    _window_seen: int = 0
    _window_input_lag_ms: int = 0
    _window_used: int = 0
    _window_deferred: int = 0
    _carry: float = 0.0
    _last_bound_ms: int = 0
    _last_tick_ms: int | None = None
    changes: list[tuple[int, float]] = field(default_factory=list)  # (at, new rate), the last few
    last_window_lag_ms: int = 0

    @property
    def limited(self) -> bool:
        return math.isfinite(self.rate_per_s)

    def observe_start(self, rank: int, lag_ms: int) -> None:
        """A run of priority ``rank`` (0 high, 1 normal, 2 low) started ``lag_ms`` after its time."""
        lags = self._window_lags.setdefault(rank, [])
        self._window_seen += 1
        if len(lags) < self.lags_kept_max:
            lags.append(lag_ms)
        else:
            lags[self._window_seen % self.lags_kept_max] = lag_ms

    def observe_input_lag(self, lag_ms: int) -> None:
        """How far behind its input the processor is (the time of the last record it read)."""
        self._window_input_lag_ms = max(self._window_input_lag_ms, lag_ms)

    def window_lag_ms(self) -> int:
        """This window's signal: the 90th percentile start lag of the most urgent priority
        that started runs, or the input lag if that is worse."""
        urgent = min(self._window_lags, default=None)
        lags = sorted(self._window_lags[urgent]) if urgent is not None else []
        p90 = lags[min(len(lags) - 1, len(lags) * 9 // 10)] if lags else 0
        return max(p90, self._window_input_lag_ms)

    def budget(self, now_ms: int) -> TickBudget:
        """This tick's budget: what the rate allows since the last tick (unlimited when the
        rate is)."""
        last, self._last_tick_ms = self._last_tick_ms, now_ms
        if not self.limited:
            return TickBudget()
        elapsed_s = 0.0 if last is None else max(0, now_ms - last) / 1000
        self._carry = min(self._carry + self.rate_per_s * elapsed_s, max(self.rate_per_s, 1.0))
        n = int(self._carry)
        self._carry -= n
        return TickBudget(left=n)

    def after_tick(self, budget: TickBudget, now_ms: int) -> None:
        """What the tick did with its budget; once per window, move the rate."""
        self._window_used += budget.used
        self._window_deferred += budget.deferred
        if budget.deferred:
            self._last_bound_ms = now_ms
        if self._window_start_ms is None:
            self._window_start_ms = now_ms
        span_ms = now_ms - self._window_start_ms
        if span_ms < self.window_ms:
            return
        lag, used = self.window_lag_ms(), self._window_used
        self.last_window_lag_ms = lag
        self._window_start_ms, self._window_used, self._window_deferred = now_ms, 0, 0
        self._window_lags, self._window_input_lag_ms = {}, 0
        if lag > self.target_lag_ms:
            actual = used * 1000 / span_ms
            base = actual if not self.limited else min(self.rate_per_s, actual)
            self._set(now_ms, max(self.rate_min_per_s, base * self.decrease))
            self._last_bound_ms = now_ms
        elif self.limited and lag <= self.target_lag_ms // 2:
            if now_ms - self._last_bound_ms >= self.unbound_after_s * 1000:
                self._set(now_ms, math.inf)
            else:
                self._set(now_ms, self.rate_per_s + max(self.increase_min_per_s,
                                                        self.rate_per_s * self.increase_fraction))

    def _set(self, now_ms: int, rate: float) -> None:
        self.rate_per_s = rate
        self.changes.append((now_ms, rate))
        del self.changes[:-20]
