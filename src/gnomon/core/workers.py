"""Which workers exist and how much each can take: the processor's side of staging.

Workers advertise themselves on ``gnomon.workers`` (key worker_id) every
``interval_ms``: their pool, execution slots, how many attempts they run and hold
staged, and how many they are willing to hold staged. The advert is also the worker's
liveness signal: one record per worker, not one heartbeat per staged attempt.

``WorkerDirectory`` is soft state of one processor instance, rebuilt from recent
adverts after a restart. It never decides correctness (fencing tokens and leases do),
only *where* a run is staged: on a live worker of its pool that has a free slot *at the
run's start second*, so no run waits behind a small, busy, stalled or dead worker while
the pool has room elsewhere.

Capacity is counted per start second: a worker with ``slots`` = 8 can hold 8 runs due
at 10:00:00 and another 8 due at 10:00:01, minus what it is running (for seconds near
now) or what it has been running for a long time (further ahead): a worker busy with
long runs takes nothing. Between adverts the directory keeps its own account:
a grant takes a slot in its second's bucket, a staged grant taken back returns it, and
an attempt that ends frees a running slot.

Time is passed in (``now_ms`` = the processor's clock when the advert was *received*),
so a worker's clock skew never makes it look dead or alive.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# a worker advertises itself this often; silent for two adverts (at least DEAD_AFTER_MS) it
# is lost, and the runs granted to it that it has not reported started are granted again at
# once. (Adverts every 0.5 s were tried: the directory's count of what a worker holds is
# reset by each advert, which does not yet count the grants on their way to it, so under
# overload it granted past the worker's room: runs 1.8 s late in tests/unit/test_sim_waiting.py.)
ADVERT_INTERVAL_MS = 1_000
DEAD_AFTER_INTERVALS = 2
DEAD_AFTER_MS = 2_000
LONG_RUNNING_MS = 10_000  # an attempt running this long is expected to hold its slot a while
NEAR_S = 2  # start seconds up to this far past the advert count every running attempt


@dataclass(frozen=True)
class WorkerAdvert:
    """On gnomon.workers (key worker_id): "I am alive, this is my load"."""

    worker_id: str
    pool: str
    slots: int  # attempts it runs at once (concurrency_max)
    running: int
    staged: int  # granted, waiting for their slot in the worker's local timer
    interval_ms: int  # the next advert comes within this
    at_ms: int  # worker clock, for humans only
    leaving: bool = False  # graceful shutdown: stage nothing more on it
    stage_max: int = 0  # staged attempts it accepts in all (0: 100 x slots)
    long_running: int = 0  # of ``running``, those running for LONG_RUNNING_MS or more
    tenants: tuple[str, ...] = ()  # the tenants it serves; () from older workers: any

    def serves(self, tenant: str | None) -> bool:
        return tenant is None or not self.tenants or tenant in self.tenants


@dataclass
class _Entry:
    advert: WorkerAdvert
    seen_ms: int
    credited: int = 0  # attempts that ended here since the advert
    staged_since: int = 0  # grants made here since the advert
    buckets: dict[int, int] = field(default_factory=dict)  # start second -> grants made here
    lost: bool = False
    deaf_mark_ms: int = 0  # the directory's deaf time when this advert came

    def free_at(self, second: int) -> int:
        """Slots free for attempts starting in ``second``. Near the advert every running
        attempt counts; further ahead only the long-running ones (short ones will have
        ended), so a worker full of 10-minute runs takes nothing, while a worker whose
        slots turn over quickly can hold a run for every slot of every second ahead."""
        a = self.advert
        if second <= self.seen_ms // 1000 + NEAR_S:  # ended attempts free slots counted as running
            return a.slots - a.running + self.credited - self.buckets.get(second, 0)
        return a.slots - a.long_running - self.buckets.get(second, 0)

    def stage_room(self) -> int:
        a = self.advert
        return (a.stage_max or 100 * a.slots) - a.staged - self.staged_since


@dataclass
class WorkerDirectory:
    """Live workers per pool, with a round-robin pick among those with room."""

    dead_after_intervals: int = DEAD_AFTER_INTERVALS  # silent this many advert intervals = lost
    dead_after_min_ms: int = DEAD_AFTER_MS
    # a gap longer than this between two reads of the adverts is the processor's own
    # (stopped, starved, restoring), not the workers' silence: it is not counted
    deaf_gap_ms: int = 1_500
    workers_max: int = 100_000  # adverts beyond this many distinct workers are ignored
    _by_id: dict[str, _Entry] = field(default_factory=dict)
    _pools: dict[str, list[str]] = field(default_factory=dict)
    _cursor: dict[str, int] = field(default_factory=dict)
    # pools with runs waiting for room: set when a run finds none (``PartitionTask._assign``)
    # or a pass over the waiting runs leaves some (``processor.waiting``), cleared by a pass
    # that leaves none. A run released meanwhile queues behind them, not before.
    queued_pools: set[str] = field(default_factory=set)
    _listened_ms: int | None = None
    _deaf_ms: int = 0  # the sum of the gaps not counted as silence

    def listening(self, now_ms: int) -> None:
        """The processor reads the adverts at ``now_ms``. If it read none for longer than
        ``deaf_gap_ms`` (SIGSTOPped, starved of CPU, restoring a partition), that gap
        is not counted as any worker's silence: a processor that wakes up must not
        declare every worker lost and move their staged runs because *it* was away."""
        last, self._listened_ms = self._listened_ms, now_ms
        if last is not None and now_ms - last > self.deaf_gap_ms:
            self._deaf_ms += now_ms - last

    def observe(self, advert: WorkerAdvert, now_ms: int) -> None:
        entry = self._by_id.get(advert.worker_id)
        if entry is None:
            if len(self._by_id) >= self.workers_max:
                return
            self._pools.setdefault(advert.pool, []).append(advert.worker_id)
            buckets: dict[int, int] = {}
        else:
            if entry.advert.pool != advert.pool:
                self._pools[entry.advert.pool].remove(advert.worker_id)
                self._pools.setdefault(advert.pool, []).append(advert.worker_id)
            now_s = now_ms // 1000
            buckets = {s: n for s, n in entry.buckets.items() if s >= now_s}
        self._by_id[advert.worker_id] = _Entry(advert, now_ms, buckets=buckets, lost=advert.leaving,
                                               deaf_mark_ms=self._deaf_ms)

    def _dead_after_ms(self, e: _Entry) -> int:
        return max(self.dead_after_min_ms, self.dead_after_intervals * e.advert.interval_ms)

    def alive(self, worker_id: str, now_ms: int) -> bool:
        e = self._by_id.get(worker_id)
        return (e is not None and not e.lost
                and now_ms - e.seen_ms - (self._deaf_ms - e.deaf_mark_ms) <= self._dead_after_ms(e))

    def pools(self) -> list[str]:
        return sorted(p for p, ids in self._pools.items() if ids)

    def pick(self, pool: str, now_ms: int, start_ms: int | None = None, tenant: str | None = None) -> str | None:
        """A live worker of ``pool`` that serves ``tenant`` (its advert says which) with a
        free slot at ``start_ms`` (default: now), or None. The slot is taken (charged to
        that second)."""
        ids = self._pools.get(pool)
        if not ids:
            return None
        second = max(now_ms, start_ms if start_ms is not None else now_ms) // 1000
        n = len(ids)
        start = self._cursor.get(pool, 0)
        for i in range(n):
            wid = ids[(start + i) % n]
            e = self._by_id[wid]
            if e.advert.serves(tenant) and e.free_at(second) > 0 and e.stage_room() > 0 and self.alive(wid, now_ms):
                e.buckets[second] = e.buckets.get(second, 0) + 1
                e.staged_since += 1
                self._cursor[pool] = (start + i + 1) % n
                return wid
        return None

    def has_room(self, pool: str, now_ms: int) -> bool:
        """Some live worker of ``pool`` has a free slot now (cheap pre-check)."""
        second = now_ms // 1000
        return any(self._by_id[w].free_at(second) > 0 and self._by_id[w].stage_room() > 0
                   and self.alive(w, now_ms) for w in self._pools.get(pool, []))

    def release(self, worker_id: str, *, staged_start_ms: int | None) -> None:
        """A grant to ``worker_id`` is over: a staged one (``staged_start_ms``: its start)
        gives its bucket slot back; a started one that ended frees a running slot."""
        e = self._by_id.get(worker_id)
        if e is None:
            return
        if staged_start_ms is None:
            e.credited += 1
            return
        second = staged_start_ms // 1000
        if e.buckets.get(second, 0) > 0:
            e.buckets[second] -= 1
        e.staged_since = max(0, e.staged_since - 1)

    def lost(self, now_ms: int) -> list[str]:
        """Workers that went silent (or said they are leaving) since the last call,
        each reported once; they are forgotten."""
        gone = [wid for wid, e in self._by_id.items() if e.lost or not self.alive(wid, now_ms)]
        for wid in gone:
            e = self._by_id.pop(wid)
            self._pools[e.advert.pool].remove(wid)
        return sorted(gone)

    def free_slots(self, pool: str, now_ms: int) -> int:
        second = now_ms // 1000
        return sum(max(0, self._by_id[w].free_at(second)) for w in self._pools.get(pool, []) if self.alive(w, now_ms))

    def live(self, pool: str, now_ms: int) -> int:
        """Live workers of ``pool`` (for metrics)."""
        return sum(1 for w in self._pools.get(pool, []) if self.alive(w, now_ms))

    def pool_of(self, worker_id: str) -> str | None:
        """The pool ``worker_id`` last advertised, or None if it never did."""
        e = self._by_id.get(worker_id)
        return None if e is None else e.advert.pool

    def snapshot(self, now_ms: int) -> dict[str, int]:
        """worker_id -> free slots now (for status logs)."""
        return {wid: e.free_at(now_ms // 1000) for wid, e in self._by_id.items()}
