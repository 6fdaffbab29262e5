"""One partition's processing: consume a command, call the pure core, write state,
return outputs. No Kafka here: the runtime (``gnomon.processor.runtime``) feeds records
in and produces what comes out, inside one transaction per batch. Tests and the
in-memory runner drive this class directly.

State layout in the partition's ordered key-value store (RocksDB):

    j/<job_id>                      -> JobState (codec)
    j<prio>/<next_run_at_ms:013>/<job_id> -> b""  due index, one per priority (j0/ high, j1/
                                             normal, j2/ low), each ordered by time (a store
                                             written before 2026-12 has one jd/ index:
                                             ``migrate_due_index`` moves it when it is opened)
    r/<run_id>                      -> RunState (codec)
    rt/<timer_ms:013>/<run_id>      -> b""   run timer index (stage, lease, retry backoff)
    rw/<pool>\0<lane><prio>/<due_ms:013>/<run_id> -> b"" READY runs waiting for a worker with
                                             room: punctual before catch-up, by priority, by due time
    jr/<job_id>\0<run_id>           -> b""   runs of a job that have not started (edits reach them)
    jh/<job_id>\0<run_id>           -> b""   runs of a job held for its upstreams (processor.dependencies)
    ja/<job_id>\0<run_id>           -> b""   active runs of a job with an overlap policy, and its
                                             buffered one (overlap: bufferOne)
    ws/<worker_id>\0<run_id>        -> b""   attempts staged on a worker (moved if it is lost)
    rp/<purge_at_ms:013>/<run_id>   -> b""   finished runs, by when they may leave state (purge)
    rf/<run_id>                     -> b""   scheduled normal/low runs triggered and not started:
                                             the overload window's count (core.overload)
    tq/<tenant>\0<pool>\0<run_id>  -> b""   runs granted to a worker: hold the tenant's quota
    tb/<tenant>\0<run_id>           -> b""   one-off runs not started: the tenant's backlog
    tj/<tenant>\0<job_id>           -> b""   the tenant's jobs
                                             (the last three are counted: core.quota, ADR 0008)

A tick reads only the index prefixes up to "now": its cost grows with what is due,
not with what exists.

Staging: a run is released ``stage_ahead_ms`` before its slot and, in the same step,
granted to a live worker of its pool with a free slot (``WorkerDirectory``); the grant
goes to that worker's inbox and the worker starts it at the slot. A trigger is applied
to the co-partitioned run state directly (no round trip through gnomon.run-events).

Bounded state (docs/adr/0005-bounded-state.md): a finished run is purged (state deleted,
tombstone on the ledger) at ``RunState.purge_at_ms`` once history has its final state
(``history_until_ms``, from the projector's committed position). A purged slot never runs
again: the scheduler never re-triggers a slot behind the job's ``next_run_at``, a trigger
read from the log for an unknown run must be ahead of it, and a manual trigger is refused
once it is older than the idempotency-key retention.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from gnomon import codec
from gnomon.adapters.kafka import partition_for
from gnomon.core import admission as A
from gnomon.core import jobs as J
from gnomon.core import quota as Q
from gnomon.core import runs as R
from gnomon.core.calendars import CalendarBook
from gnomon.core.command_auth import OPERATOR, CommandKey, Unauthenticated
from gnomon.core.command_auth import require as require_signature
from gnomon.core.command_auth import sign as sign_command
from gnomon.core.command_checks import check_command
from gnomon.core.errors import (
    Conflict,
    GnomonError,
    InfraError,
    InternalError,
    LimitExceeded,
    RunNotFound,
    TransitionError,
    ValidationError,
)
from gnomon.core.messages import Grant, LeaseAck, PoisonRecord, Stop, StopReason
from gnomon.core.model import OverlapPolicy
from gnomon.core.overload import OVERLOAD_RETRY_AFTER_S, TickBudget
from gnomon.core.priorities import WeightedPicker
from gnomon.core.replies import ALREADY_REGISTERED, CommandResult, result_for
from gnomon.core.workers import WorkerDirectory
from gnomon.ports import KeyValueStore
from gnomon.processor import dependencies as deps
from gnomon.processor import growth
from gnomon.processor.output import Output
from gnomon.processor.savepoint import JournalKV
from gnomon.processor.waiting import assign_waiting
from gnomon.region import other_region_topic
from gnomon.region import validate as validate_region
from gnomon.topology import Topology

log = logging.getLogger(__name__)

# keys one transaction may write in a partition and still be taken back by its journal
# (their values before it are held in memory); past it an abort rebuilds the partition
# from its changelogs. Of the values it read, this many are kept for a later write's
# journal entry (a write after that reads its key again).
TXN_KEYS_MAX = 100_000
TXN_READS_KEPT_MAX = 10_000

_TIME_W = 13  # digits of epoch ms, good until the year 2286


def _job_key(job_id: str) -> bytes:
    return b"j/" + job_id.encode()


_PRIO_RANK = {"high": b"0", "normal": b"1", "low": b"2"}
_DUE = tuple(b"j%s/" % r for r in (b"0", b"1", b"2"))  # the due indexes, most urgent first


def tick_near(tasks: list[PartitionTask], now_ms: int, budget: TickBudget) -> list[Output]:
    """The near phase of a tick (``TickPhase.NEAR``) across a processor's partitions, one
    due index (priority) after the other: ``high`` jobs all, then ``normal`` and ``low``
    oldest slot first across the partitions while the budget lasts, so a budget that binds
    makes every partition's jobs equally late, not the last partitions' alone. Ties go to
    the earlier partition in ``tasks`` (the processor turns its order from tick to tick)."""
    out: list[Output] = []
    for due in _DUE:
        entries = [(key, i, job_id) for i, task in enumerate(tasks) for key, job_id in task.near_due(due, now_ms)]
        entries.sort(key=lambda e: (e[0].split(b"/", 1)[0], e[1]))
        budgeted = due != _DUE[0]
        for n, (_, i, job_id) in enumerate(entries):
            if budgeted and budget.exhausted:  # left for later: their give-up is the backlog pass's
                left: dict[int, int] = {}
                for _, j, _ in entries[n:]:
                    left[j] = left.get(j, 0) + 1
                for j, jobs in left.items():
                    tasks[j].defer(jobs, budget)
                break
            out.extend(tasks[i].tick_near_job(due, job_id, now_ms, budget))
    return out


class TickPhase(enum.Enum):
    """The due jobs' phases of a tick, in order: 1. the slots due now (next_run_at from
    the misfire edge on), near ones only; 2. the older backlog (catch-up after an outage,
    paced by a record budget; slots deferred by an overloaded tick), near slots only;
    3. the rest of the lookahead. A processor runs each phase across all its partitions
    before the next, so the overload budget goes to slots due now first."""

    NEAR = "near"
    BACKLOG = "backlog"
    FAR = "far"


_OLD_DUE = b"jd/"  # the single due index of stores written before the priority indexes


def _due_key(ms: int, job: J.JobState) -> bytes:
    return b"j" + _PRIO_RANK.get(job.spec.priority.value, b"1") + b"/%013d/" % ms + job.job_id.encode()


def _run_key(run_id: str) -> bytes:
    return b"r/" + run_id.encode()


def _timer_key(ms: int, run_id: str) -> bytes:
    return b"rt/%013d/" % ms + run_id.encode()


# Variable parts of index keys end with NUL, so no id is a prefix of another's entries
# ("jr/a\0" never matches the runs of job "a/b"); ids never contain NUL.
def _waiting_prefix(pool: str) -> bytes:
    return b"rw/" + pool.encode() + b"\0"


_WAITING_FIXED = len(b"00/") + _TIME_W + 1  # "<lane><prio>/<due_ms:013>/" after the prefix


def _waiting_key(run: R.RunState, catch_up_after_ms: int) -> bytes:
    """Order of READY runs waiting for room: punctual runs (lane 0) before catch-up
    backlog (lane 1: created long after its slot), then by priority, then by due time."""
    due = max(run.not_before_ms, run.dispatched_at_ms or 0)
    lane = b"1" if run.created_at_ms - run.not_before_ms > catch_up_after_ms else b"0"
    return (_waiting_prefix(run.spec.pool) + lane + _PRIO_RANK.get(run.spec.priority.value, b"1")
            + b"/%013d/" % due + run.run_id.encode())


def _job_runs_prefix(job_id: str) -> bytes:
    return b"jr/" + job_id.encode() + b"\0"


def _active_prefix(job_id: str) -> bytes:
    return b"ja/" + job_id.encode() + b"\0"


_STAGED = b"ws/"  # ws/<worker_id>\0<run_id>: the attempts staged on each worker
STAGED_WORKERS_MAX = 10_000


def _staged_prefix(worker_id: str) -> bytes:
    return _STAGED + worker_id.encode() + b"\0"


def _purge_key(ms: int, run_id: str) -> bytes:
    return b"rp/%013d/" % ms + run_id.encode()


_PARTITIONS = b"\0partitions"  # the count this partition places jobs by, once grown (gnomon.processor.growth)
_IN_FLIGHT = b"rf/"  # rf/<run_id>: a scheduled normal/low run triggered and not started (``_in_flight``)
_COUNTED = frozenset(f.value.encode() for f in Q.Family)
COUNTED_ENTRIES_MAX = 100_000_000  # a partition's counting entries read when it is opened
TICK_FAILURES_KEPT_MAX = 10_000  # distinct failing jobs/runs remembered (each poisoned once)
PROGRESS_EVERY = 10_000  # keys loaded between two progress reports (``PartitionTask.on_progress``)


def _in_flight(run: R.RunState | None) -> int:
    """1 for a scheduled normal or low run triggered and not started (what the overload
    window counts, ``core.overload``), else 0."""
    return int(run is not None and run.never_started and not run.manual and run.spec.priority.value != "high")


def _counted_job(job: J.JobState | None) -> bool:
    """A job that counts against its tenant's ``jobs_max``: registered, not deleted."""
    return job is not None and job.status is not J.JobStatus.DELETED and job.moved_to is None


def _prefix_end(prefix: bytes) -> bytes:
    return prefix[:-1] + bytes([prefix[-1] + 1])


def _bound(prefix: bytes, upto_ms: int) -> bytes:
    """Exclusive upper bound of ``prefix`` entries with time <= upto_ms."""
    return prefix + b"%013d/" % (upto_ms + 1)


# what may be read from the run-events topic: workers' reports. (Cancel and replay are
# refused with their own reason below. Triggers and skips are the processor's own
# decisions, applied in place: one read from the log is a replay or a forgery, and would
# move a slot or skip it.)
_WORKER_REPORTS = (R.ClaimRun, R.Heartbeat, R.AttemptStarted, R.CompleteAttempt, R.ReturnGrant)
_RUN_REPORTS = (*_WORKER_REPORTS, R.CancelRun, R.ReplayRun)


class RecordFailed(InternalError):
    """Applying one record raised something gnomon did not mean to raise (a bug a value
    reached): its writes were rolled back, and it goes to the poison topic. ``answer``:
    the command-results record that tells its producer (job commands), or None."""

    def __init__(self, cause: BaseException, answer: Output | None = None) -> None:
        super().__init__(f"{type(cause).__name__}: {str(cause)[:500]}")
        self.cause = cause
        self.answer = answer


@dataclass
class TaskStats:
    commands: int = 0
    triggers: int = 0
    skips: int = 0
    releases: int = 0
    grants: int = 0
    revocations: int = 0
    withdrawals: int = 0
    assign_misses: int = 0
    rejections: int = 0
    completions: int = 0
    tick_jobs_examined: int = 0
    catch_up_deferred: int = 0  # ticks whose catch-up budget ran out (the backlog goes on next tick)
    overload_deferred: int = 0  # due normal/low jobs left for a later tick: the tick's budget ran out
    overload_given_up: int = 0  # slots given up (recorded skipped, reason overload) past their lateness bound
    tick_runs_examined: int = 0
    purged: int = 0  # finished runs that left state (tombstoned)
    replays_refused: int = 0  # triggers for slots already decided (maybe purged), refused
    follow_ends_too_old: int = 0  # upstream ends too late to stage a run of a job after its upstreams
    quota_waits: int = 0  # grants held back because the run's tenant was at its quota
    admissions_refused: int = 0  # commands over a tenant limit
    unsigned_refused: int = 0  # commands whose signature did not prove their tenant (core.command_auth)
    commands_refused: int = 0  # job commands answered "refused" on the command-results topic
    rolled_back: int = 0  # records (and tick items) whose writes were taken back after they raised
    tick_failures: int = 0  # jobs and runs whose time-driven step raised (contained, retried next tick)
    handed_over_jobs: int = 0  # jobs handed to new partitions by a grow (gnomon.processor.growth)


class PartitionTask:
    def __init__(
        self,
        partition: int,
        kv: KeyValueStore,
        topology: Topology,
        sched_cfg: J.SchedulerConfig | None = None,
        run_cfg: R.RunConfig | None = None,
        due_max: int = 5000,
        directory: WorkerDirectory | None = None,
        quota: Q.QuotaBook | None = None,
        calendars: CalendarBook | None = None,
        calendars_catch_up: Callable[[int], object] | None = None,
    ) -> None:
        self.partition = partition
        self.calendars = calendars  # the tenants' exclusion calendars (core.calendars), None: none checked
        # reads the calendars topic up to its end (the runtime's feed; rate-limited there):
        # a calendar PUT just before the job that names it is not refused for a feed's lag
        self.calendars_catch_up = calendars_catch_up
        self.kv: KeyValueStore = kv
        self._journal = JournalKV(kv)  # ``kv`` while a savepoint is open: its writes can be taken back
        # ``kv`` from ``txn_begin`` on: every write since the last commit, taken back by
        # ``txn_rollback`` (an aborted transaction) instead of a rebuild from the changelogs
        self._txn = JournalKV(kv, keys_max=TXN_KEYS_MAX, overflow_raises=False, reads_kept_max=TXN_READS_KEPT_MAX)
        # per changelog topic: an offset of this partition at or below the end of what its
        # last commit wrote (every record before it is in the store; ``Processor._commit``)
        self.changelog_at: dict[str, int] = {}
        self._quota_undo: list[tuple[bytes, int]] | None = None  # counts moved under a savepoint
        self.topo = topology
        self.sched_cfg = sched_cfg or J.SchedulerConfig()
        self.run_cfg = run_cfg or R.RunConfig()
        self.due_max = due_max
        # Where runs are staged: the processor's workers, shared by its partitions (a task
        # made alone, in a test, gets a directory of its own, with no worker in it).
        self.directory = directory if directory is not None else WorkerDirectory()
        # Tenant limits and counts shared by the partitions of this processor instance;
        # None: no limits (the counting index entries are written all the same).
        self.quota = quota
        self.quota_waits_per_tick_max = 2_000  # waiting runs held back by quota, tried per tick
        self._quota_waits_this_tick = 0
        self.stats = TaskStats()
        self.cache_max = 100_000  # decoded states kept per partition (each map)
        self.assign_misses_per_tick_max = 200  # waiting runs tried without room, per pool per tick
        self._pickers: dict[str, WeightedPicker] = {}  # pool -> its priority tiers' round-robin state
        # a run is purged only if its last write is this much older than history_until_ms
        # (guards against a wall clock stepping back between a sample and a write)
        self.purge_clock_margin_ms = 5_000
        # a tick emits the slots due within this first, for every job, then the rest of the lookahead
        self.near_lookahead_ms = 2_000
        self._near: tuple[J.SchedulerConfig, J.SchedulerConfig] | None = None
        self._jobs_cache: dict[str, J.JobState | None] = {}
        self._pools = frozenset(self.topo.pools)
        # called every PROGRESS_EVERY keys of a long load (a restore is progress: liveness)
        self.on_progress: Callable[[], None] | None = None
        # regions: where a moved job's adoption gets its signature (the operator's key, read
        # from the processor's keyring when a move is decided, so a key made after the
        # processor started counts); None: commands are not signed here, nor adoptions
        self.operator_key: Callable[[], CommandKey | None] | None = None
        self._tick_failed: set[tuple[str, str]] = set()  # jobs and runs whose tick step raised (poisoned once)
        self._tick_failure_logged_s = 0.0
        self._runs_cache: dict[str, R.RunState | None] = {}
        # a tick more than this after the previous one: the partition was away in between
        # (its untriggered slots were missed, not deferred by overload)
        self.absent_after_ms = 15_000
        self.start_lags: list[tuple[int, int]] = []  # (priority rank, ms) of first attempts started
        self.start_lags_max = 10_000
        self.in_flight_runs = 0  # scheduled normal/low runs triggered and not started (``_in_flight``)
        self.overloaded = False  # set by the runtime: its last ticks deferred due jobs (new one-off work refused)
        self._last_tick_ms: int | None = None
        self._present_since_ms: int | None = None
        # The count of partitions this partition's jobs are placed by: the topology's
        # until a grow reaches it (``gnomon.processor.growth``), then the grown count
        # (its jobs changelog's partitions record). A partition born in a grow waits
        # (``awaiting``) until its handover has come: nothing is decided on it before.
        # (kept in the store too: a store reopened from its checkpoint or a standby's
        # copy may have read the partitions record before the tail it replays)
        self.partitions = topology.partitions
        self.grown = False
        self.awaiting = partition >= topology.partitions
        stored = kv.get(_PARTITIONS)
        if stored is not None:
            self.partitions, self.grown, self.awaiting = int(stored), True, False

    # ---- state access ------------------------------------------------------------------

    # Decoded states are cached: this task is the only writer of its store, and every write
    # goes through _store_job / _store_run / restore_*, which keep the cache in step. A
    # decode costs ~90 us of Avro; a busy partition reads each run several times.

    def job(self, job_id: str) -> J.JobState | None:
        """The job, if it exists (a deleted job's owner record is no job: None)."""
        state = self.stored_job(job_id)
        return None if state is None or state.status is J.JobStatus.DELETED else state

    def stored_job(self, job_id: str) -> J.JobState | None:
        """What the store holds of the job: its state, or a deleted job's owner record
        (``J.deleted_owner``), or None."""
        if job_id in self._jobs_cache:
            return self._jobs_cache[job_id]
        raw = self.kv.get(_job_key(job_id))
        state = None if raw is None else codec.decode(raw)
        self._cache(self._jobs_cache, job_id, state)
        return state

    def run(self, run_id: str) -> R.RunState | None:
        if run_id in self._runs_cache:
            return self._runs_cache[run_id]
        raw = self.kv.get(_run_key(run_id))
        state = None if raw is None else codec.decode(raw)
        self._cache(self._runs_cache, run_id, state)
        return state

    def _cache(self, cache: dict[str, Any], key: str, value: Any) -> None:
        if len(cache) >= self.cache_max:
            cache.clear()  # bounded; cheap to refill
        cache[key] = value

    def _put_index(self, key: bytes) -> None:
        """Add an index entry the state did not have (a diff of ``_index_keys``)."""
        if self.quota is not None and key[:3] in _COUNTED and self.quota.counting(self.partition):
            if self.kv.get(key) is None:
                self._count(key, +1)
        elif self.kv is self._journal:
            self._journal.assume(key, None)  # no read to journal it
        self.kv.put(key, b"")

    def _del_index(self, key: bytes) -> None:
        """Remove an index entry the state had."""
        if self.quota is not None and key[:3] in _COUNTED and self.quota.counting(self.partition):
            if self.kv.get(key) is not None:
                self._count(key, -1)
        elif self.kv is self._journal:
            self._journal.assume(key, b"")
        self.kv.delete(key)

    def _count(self, key: bytes, delta: int) -> None:
        assert self.quota is not None
        self.quota.entry(self.partition, key, delta)
        if self._quota_undo is not None:
            self._quota_undo.append((key, delta))

    # ---- the transaction's journal: an abort costs the transaction, not a rebuild ----------

    def txn_begin(self) -> None:
        """From now on every write is journaled until the next ``txn_committed`` (the
        partition's state is at a commit now: restored, or just committed)."""
        assert self.kv is self._txn.inner and not self._txn.open, "the transaction journal is open already"
        self._txn.begin()
        self.kv = self._txn

    def txn_committed(self) -> None:
        """The transaction committed: what it wrote stays; journal the next one."""
        if self.kv is self._txn:
            self._txn.release()
            self._txn.begin()

    def txn_end(self) -> None:
        """Journal no more (the partition is released: closed, or kept as a standby)."""
        if self.kv is self._txn:
            self._txn.release()
            self.kv = self._txn.inner

    def txn_rollback(self) -> KeyValueStore | None:
        """Put the store back at the last commit; the store, or None when the journal cannot
        (never opened, or it overflowed ``TXN_KEYS_MAX``: rebuild instead). The task is
        done with either way (its caches and counts are of the undone writes)."""
        txn = self._txn
        if self.kv is not txn:
            return None
        self.kv = txn.inner
        if not txn.open:  # (overflowed)
            txn.release()
            return None
        txn.rollback()
        return txn.inner

    # ---- savepoints: one record's failure stays its own -----------------------------------

    def savepoint(self, call: Callable[[], list[Output]]) -> list[Output]:
        """Run ``call`` (one record, or one job's or run's tick step) so that if it raises,
        this partition's state is as it was before: store writes undone
        (``processor.savepoint``), counts moved back, the decoded states it touched dropped
        from the caches. A GnomonError is re-raised as it was (a refusal); anything else
        becomes ``RecordFailed``. An InfraError (the store itself failed) is re-raised
        untouched: the runtime stops. The worker directory's reservations are not taken
        back: it is an estimate that the worker's next advert corrects."""
        journal = self._journal
        assert not journal.open and self.kv is not journal, "savepoints do not nest"
        store = self.kv
        # under the transaction's journal: write past it, and hand it what was kept
        txn = self._txn if store is self._txn else None
        journal.inner = store if txn is None else txn.inner
        journal.begin()
        self.kv, self._quota_undo = journal, []
        in_flight = self.in_flight_runs
        try:
            out = call()
        except InfraError:
            raise
        except Exception as exc:
            self.in_flight_runs = in_flight
            self._undo()
            if isinstance(exc, GnomonError):
                raise
            raise RecordFailed(exc) from exc
        finally:  # whatever happened (a rollback that failed too), the store is the store again
            kept = journal.release()
            if txn is not None and kept:
                txn.absorb(kept)  # (an assumed prior too: right while the indexes match the states)
            self.kv, self._quota_undo = store, None
        return out

    def _undo(self) -> None:
        """Take back what the open savepoint wrote (nothing, for most refusals: they come
        before the first write)."""
        written = self._journal.written()
        counted = self._quota_undo or []
        if not written and not counted:
            return
        self._journal.rollback()
        if self.quota is not None:
            for key, delta in reversed(counted):
                self.quota.entry(self.partition, key, -delta)
        for key in written:  # (a state's cache entry follows its store key)
            if key.startswith(b"j/"):
                self._jobs_cache.pop(key[2:].decode(), None)
            elif key.startswith(b"r/"):
                self._runs_cache.pop(key[2:].decode(), None)
        self.stats.rolled_back += 1

    def apply_record(self, cmd: Any, now_ms: int, topic: str, offset: int,
                     signed: CommandKey | Unauthenticated | None = None,
                     origin: tuple[int, int] | None = None) -> list[Output]:
        """One decoded input record of ``topic`` at ``offset`` of this partition: a job
        command is answered on the command-results topic (``handle_command``); any other
        is applied (``handle``). Raises GnomonError for a refused non-command record, and
        ``RecordFailed`` (with the command's answer, if it is one) when it broke; either
        way nothing it wrote stays. ``signed``: the key that signed a command record or
        why none did (None: signatures are not checked). ``origin``: the (partition,
        offset) a forwarded record was first read at (``gnomon.processor.growth``): a
        command is answered under that position, the one its producer knows."""
        if topic == self.topo.job_commands:
            partition, offset = origin if origin is not None else (self.partition, offset)
            return self.handle_command(cmd, now_ms, partition, offset, signed)
        return self.savepoint(lambda: self.handle(cmd, now_ms, topic))

    def load_counts(self) -> int:
        """Count this partition's counting entries into the quota book (after a restore,
        which writes state without counting); from then on every write is counted. And
        the runs in flight, from their ``rf/`` entries (a store written before those has
        none: its runs in flight then are not counted, and the count is floored at 0)."""
        self.in_flight_runs = sum(1 for _ in self.kv.scan(_IN_FLIGHT, _prefix_end(_IN_FLIGHT), COUNTED_ENTRIES_MAX))
        if self.quota is None:
            return 0
        self.quota.open(self.partition)
        n = 0
        for family in Q.Family:
            prefix = family.value.encode()
            for key, _ in self.kv.scan(prefix, _prefix_end(prefix), COUNTED_ENTRIES_MAX):
                self.quota.entry(self.partition, key, +1)
                n += 1
                self._progress(n)
        return n

    def migrate_due_index(self, chunk_max: int = 10_000) -> int:
        """Move a store's old single due index (``jd/<ms>/<job>``, before 2026-12) to the
        per-priority ones; the number of entries moved (0 for every store written since).
        Idempotent: an interrupted move goes on at the next open."""
        moved = 0
        while True:
            chunk = [k for k, _ in self.kv.scan(_OLD_DUE, _prefix_end(_OLD_DUE), chunk_max)]
            if not chunk:
                return moved
            for key in chunk:
                job = self.job(key[len(_OLD_DUE) + _TIME_W + 1:].decode())
                if job is not None and job.next_run_at_ms is not None and job.status is J.JobStatus.ACTIVE:
                    self.kv.put(_due_key(job.next_run_at_ms, job), b"")
                self.kv.delete(key)
                moved += 1
                self._progress(moved)

    def _store_job(self, job_id: str, old: J.JobState | None, new: J.JobState | None, out: list[Output]) -> None:
        if old is not None and old.next_run_at_ms is not None and old.status is J.JobStatus.ACTIVE:
            self.kv.delete(_due_key(old.next_run_at_ms, old))
        was, now = _counted_job(old), _counted_job(new)
        if was and not now:
            assert old is not None
            self._del_index(Q.job_key(old.tenant, job_id))
        elif now and not was:
            assert new is not None
            self._put_index(Q.job_key(new.tenant, job_id))
        pending_was, pending_now = Q.pending_one_time_key(old), Q.pending_one_time_key(new)
        if pending_was is not None and pending_was != pending_now:
            self._del_index(pending_was)
        if pending_now is not None and pending_now != pending_was:
            self._put_index(pending_now)
        if new is None:
            self.kv.delete(_job_key(job_id))
            self._jobs_cache.pop(job_id, None)
            out.append(Output(self.topo.jobs, job_id, None, self.partition))
            return
        raw = codec.encode(new, self.topo.jobs)
        self.kv.put(_job_key(job_id), raw)
        self._cache(self._jobs_cache, job_id, new)
        if new.next_run_at_ms is not None and new.status is J.JobStatus.ACTIVE:
            self.kv.put(_due_key(new.next_run_at_ms, new), b"")
        out.append(Output(self.topo.jobs, job_id, new, self.partition, raw))

    def _index_keys(self, run: R.RunState | None) -> set[bytes]:
        """Every index entry of ``run`` (derived from its state alone)."""
        if run is None:
            return set()
        keys = set()
        if run.status is R.RunStatus.READY:
            keys.add(_waiting_key(run, self.sched_cfg.misfire_grace_ms))  # waits for room, not for time
        else:
            t = run.timer_ms(self.run_cfg)
            if t is not None:
                keys.add(_timer_key(t, run.run_id))
        if run.never_started and run.status in (R.RunStatus.READY, R.RunStatus.RUNNING):
            keys.add(_job_runs_prefix(run.job_id) + run.run_id.encode())
        if run.held:
            keys.add(deps.held_prefix(run.job_id) + run.run_id.encode())
        if _in_flight(run):
            keys.add(_IN_FLIGHT + run.run_id.encode())
        if run.staged and run.worker_id is not None:
            keys.add(_staged_prefix(run.worker_id) + run.run_id.encode())
        if run.spec.overlap is not OverlapPolicy.ALLOW and (R.is_active(run) or run.buffered):
            keys.add(_active_prefix(run.job_id) + run.run_id.encode())
        purge_at = run.purge_at_ms(self.run_cfg)
        if purge_at is not None:
            keys.add(_purge_key(purge_at, run.run_id))
        for counted in (Q.granted_key(run), Q.backlog_key(run)):
            if counted is not None:
                keys.add(counted)
        return keys

    def _store_run(self, old: R.RunState | None, new: R.RunState, out: list[Output]) -> None:
        old_keys = self._index_keys(old)
        new_keys = self._index_keys(new)
        for k in old_keys - new_keys:
            self._del_index(k)
        raw = codec.encode(new, self.topo.runs)
        self.kv.put(_run_key(new.run_id), raw)
        self._cache(self._runs_cache, new.run_id, new)
        self.in_flight_runs = max(0, self.in_flight_runs + _in_flight(new) - _in_flight(old))
        for k in new_keys - old_keys:
            self._put_index(k)
        final = new.status.terminal and (old is None or old.status is not new.status)
        out.append(Output(self.topo.runs, new.run_id, new, self.partition, raw, final=final))

    # ---- restore from changelogs -------------------------------------------------------

    # ---- a grow (gnomon.processor.growth) -------------------------------------------------

    def owns(self, job_id: str) -> bool:
        """Whether ``job_id`` lives on this partition (by the count it places jobs by)."""
        return growth.owner(job_id, self.partitions) == self.partition

    def _foreign(self, key: str) -> bool:
        """A changelog key of a job handed over to another partition in a grow."""
        return self.grown and not self.owns(growth.job_of(key))

    def set_partitions(self, count: int) -> tuple[list[tuple[str, bytes]], list[tuple[str, bytes]]]:
        """Place jobs by ``count`` partitions from now on (a partitions record, or this
        partition's own grow): every job and run that now lives elsewhere leaves the
        store. Returns them (key, encoded state) for a handover. A count below the one
        in force is refused (ValueError): partitions only grow."""
        if count < self.partitions:
            raise ValidationError("value", f"partition {self.partition} places jobs by {self.partitions} partitions; "
                             f"a record of {count} is older")
        self.partitions = count
        self.grown = True
        self.awaiting = False
        self.kv.put(_PARTITIONS, str(count).encode())
        jobs: list[tuple[str, bytes]] = []
        runs: list[tuple[str, bytes]] = []
        for key, raw in list(self.kv.scan(b"j/", _prefix_end(b"j/"), COUNTED_ENTRIES_MAX)):
            job_id = key[2:].decode()
            if not self.owns(job_id):
                jobs.append((job_id, raw))
                self._store_job(job_id, self.job(job_id), None, [])
        for key, raw in list(self.kv.scan(b"r/", _prefix_end(b"r/"), COUNTED_ENTRIES_MAX)):
            run_id = key[2:].decode()
            if not self.owns(growth.job_of(run_id)):
                run = self.run(run_id)
                runs.append((run_id, raw))
                if run is not None:
                    self._forget_run(run)
        return jobs, runs

    def grow(self, count: int) -> list[Output]:
        """This partition's grow marker: hand the jobs that live elsewhere under ``count``
        partitions (and their runs) to their new partitions' changelogs, then a
        partitions record to each of those and to its own. Idempotent: a marker for the
        count already in force writes nothing. ValueError for a count that is not a
        multiple of the one in force (ValidationError)."""
        if self.grown and count == self.partitions:
            return []
        old = self.partitions
        try:
            heirs = growth.heirs(self.partition, old, count)
        except ValueError as exc:
            raise ValidationError("value", str(exc)) from None
        before = (self.partitions, self.grown, self.awaiting)
        try:  # (the store's writes are undone by the savepoint the runtime runs this under)
            jobs, runs = self.set_partitions(count)
        except BaseException:
            self.partitions, self.grown, self.awaiting = before
            raise
        out: list[Output] = []
        for job_id, raw in jobs:
            out.append(Output(self.topo.jobs, job_id, None, growth.owner(job_id, count), raw))
        for run_id, raw in runs:
            out.append(Output(self.topo.runs, run_id, None, growth.owner(growth.job_of(run_id), count), raw))
        record = growth.encode_count(count)
        for p in (*heirs, self.partition):  # last: the handover's end on each heir
            out.append(Output(self.topo.jobs, growth.PARTITIONS_KEY, None, p, record))
        log.info("partition %d grown from %d to %d partitions: %d jobs and %d runs handed to partitions %s",
                 self.partition, old, count, len(jobs), len(runs), heirs)
        self.stats.handed_over_jobs += len(jobs)
        return out

    def restore_job(self, job_id: str, value: bytes | None) -> None:
        if growth.is_control(job_id):
            if job_id == growth.PARTITIONS_KEY:
                self.set_partitions(growth.decode_count(value, f"{self.topo.jobs}[{self.partition}]"))
            return
        if self._foreign(job_id):
            return
        old = self.job(job_id)
        new = None if value is None else codec.decode(value)
        self._store_job(job_id, old, new, [])

    def bulk_load(self, jobs: dict[str, bytes | None], runs: dict[str, bytes | None]) -> int:
        """Load an empty store from the last changelog value of each key (a full rebuild):
        one decode and one write per live key, no read of prior state."""
        self._jobs_cache.clear()
        self._runs_cache.clear()
        n = 0
        count = jobs.get(growth.PARTITIONS_KEY)
        if count is not None:
            self.set_partitions(growth.decode_count(count, f"{self.topo.jobs}[{self.partition}]"))
        for job_id, raw in jobs.items():
            if raw is None or growth.is_control(job_id) or self._foreign(job_id):
                continue
            job: J.JobState = codec.decode(raw)
            self.kv.put(_job_key(job_id), raw)
            if job.next_run_at_ms is not None and job.status is J.JobStatus.ACTIVE:
                self.kv.put(_due_key(job.next_run_at_ms, job), b"")
            if _counted_job(job):
                self._put_index(Q.job_key(job.tenant, job_id))
            pending = Q.pending_one_time_key(job)
            if pending is not None:
                self._put_index(pending)
            n += 1
            self._progress(n)
        for run_id, raw in runs.items():
            if raw is None or self._foreign(run_id):
                continue
            run: R.RunState = codec.decode(raw)
            self.kv.put(_run_key(run_id), raw)
            self.in_flight_runs += _in_flight(run)  # (its rf/ entry is among the index keys below)
            for k in self._index_keys(run):
                self._put_index(k)
            n += 1
            self._progress(n)
        return n

    def _progress(self, n: int) -> None:
        if self.on_progress is not None and n % PROGRESS_EVERY == 0:
            self.on_progress()

    def restore_run(self, run_id: str, value: bytes | None) -> None:
        if self._foreign(run_id):
            return
        old = self.run(run_id)
        if value is None:
            if old is not None:
                self._forget_run(old)
            return
        self._store_run(old, codec.decode(value), [])

    def _forget_run(self, run: R.RunState) -> None:
        self.in_flight_runs = max(0, self.in_flight_runs - _in_flight(run))
        for k in self._index_keys(run):
            self._del_index(k)
        self.kv.delete(_run_key(run.run_id))
        self._runs_cache.pop(run.run_id, None)

    # ---- commands ----------------------------------------------------------------------

    def handle(self, cmd: Any, now_ms: int | None = None, source: str | None = None) -> list[Output]:
        """Apply one decoded command at processing time ``now_ms`` (default: the command's
        own time), read from topic ``source`` (None: given in process, as tests do).
        Raises GnomonError (TransitionError...) if refused."""
        self.stats.commands += 1
        if source is not None and isinstance(cmd, J.RunTriggered) and cmd.backfill:
            # a backfill is decided from a BackfillJob (gnomon.job-commands) and applied in
            # place: one read from a log is a replay or a forgery, and would reopen a skipped run
            raise TransitionError(f"RunTriggered {cmd.run_id} refused: a backfill trigger is never read from "
                                  f"a topic (send a BackfillJob to {self.topo.job_commands})")
        if source == self.topo.run_events and isinstance(cmd, R.CancelRun | R.ReplayRun):
            # workers may write gnomon.run-events; only the API writes gnomon.job-commands
            raise TransitionError(f"{type(cmd).__name__} {cmd.run_id} refused: cancel and replay are accepted "
                                  f"only from {self.topo.job_commands}, which the API alone may write")
        if source == self.topo.run_events and isinstance(cmd, J.RunTriggered) and cmd.manual:
            # a manual run is decided from a TriggerJob, which passes admission (trigger
            # rate, backlog); one read from run-events (workers may write it) would not
            raise TransitionError(f"RunTriggered {cmd.run_id} refused: a manual trigger is accepted only as a "
                                  f"TriggerJob on {self.topo.job_commands}")
        if source == self.topo.run_events and not isinstance(cmd, _RUN_REPORTS):
            # workers (who may write run-events) send their reports; a job command passes the
            # API's checks and admission on the topic only the API may write, and the rest
            # (triggers, skips, WorkerLost, JobChanged) the processor only decides itself
            raise TransitionError(f"{type(cmd).__name__} refused: {self.topo.run_events} carries workers' "
                                  f"reports ({', '.join(t.__name__ for t in _WORKER_REPORTS)}) only")
        if deps.check_source(self, cmd, source):
            return deps.handle(self, cmd, cmd.at_ms if now_ms is None else now_ms)
        if "\0" in getattr(cmd, "job_id", "") or "\0" in getattr(cmd, "run_id", ""):
            raise ValidationError("job_id", "ids must not contain NUL")  # they end index key parts
        if source == self.topo.job_commands and isinstance(cmd, R.CancelRun | R.ReplayRun):
            cmd = check_command(cmd, cmd.at_ms if now_ms is None else now_ms, pools=self._pools)
        if isinstance(cmd, J.JOB_COMMANDS):
            now = cmd.at_ms if now_ms is None else now_ms
            if source is not None:  # read from a topic: the API's rules again, by the decider
                cmd = check_command(cmd, now, pools=self._pools)
            if isinstance(cmd, J.TriggerJob) and now - cmd.at_ms >= self.run_cfg.manual_key_retention_ms:
                self.stats.replays_refused += 1
                raise TransitionError(
                    f"manual trigger of {cmd.job_id} (key {cmd.idempotency_key!r}) was requested "
                    f"{(now - cmd.at_ms) // 1000} s ago, beyond the idempotency-key retention of "
                    f"{self.run_cfg.manual_key_retention_ms // 1000} s; refused (its run may be purged)")
            if isinstance(cmd, J.BackfillJob) and now - cmd.at_ms >= self.run_cfg.retention_ms:
                # the API left out the slots history had; a run it could not see then may be
                # purged by now (retention_ms after it ended), and would be run again
                self.stats.replays_refused += 1
                raise TransitionError(
                    f"backfill of {cmd.job_id} was requested {(now - cmd.at_ms) // 1000} s ago, beyond the run "
                    f"retention of {self.run_cfg.retention_ms // 1000} s; refused (send it again)")
            return self._handle_job(cmd, now)
        if isinstance(cmd, J.RunTriggered | J.RunSkipped) and self.run(cmd.run_id) is None:
            refused = self._decided_slot(cmd, cmd.at_ms if now_ms is None else now_ms)
            if refused is not None:
                self.stats.replays_refused += 1
                raise TransitionError(f"{type(cmd).__name__} {cmd.run_id} refused: {refused}")
        if isinstance(cmd, R.ReplayRun):
            return self._replay(cmd, cmd.at_ms if now_ms is None else now_ms)
        return self._handle_run(cmd, now_ms)

    def _replay(self, cmd: R.ReplayRun, now_ms: int) -> list[Output]:
        """A dead letter run again: new work, so it passes the admission a manual trigger
        does (overload, the tenant's trigger rate and backlog) and counts as a trigger.
        A replay of a run that is not a dead letter changes nothing and is not counted."""
        run = self.run(cmd.run_id)
        if run is None or run.status is not R.RunStatus.FAILED:
            return self._handle_run(cmd, now_ms)
        if self.overloaded:
            self._refuse_overloaded("replays are")
        if self.quota is not None:
            try:
                self._check_trigger_rate(run.tenant, now_ms)
            except GnomonError:
                self.stats.admissions_refused += 1
                raise
        out = self._handle_run(cmd, now_ms)
        if self.quota is not None:
            self.quota.trigger_accepted(self.partition, run.tenant, now_ms)
        return out

    def handle_command(self, cmd: Any, now_ms: int, partition: int, offset: int,
                       signed: CommandKey | Unauthenticated | None = None) -> list[Output]:
        """A decoded record of the job-commands topic at ``partition``/``offset``: apply it
        as ``handle`` does, and answer on the command-results topic (core.replies):
        accepted with the job's version, or refused with the field and reason. A refusal
        is an answer, not an error: it raises nothing and writes nothing else."""
        try:
            if not isinstance(cmd, (*J.JOB_COMMANDS, R.CancelRun, R.ReplayRun)):
                # run commands (triggers, claims, completions) come from the processor itself
                # or from workers on run-events, never from the producers of this topic
                raise TransitionError(f"{type(cmd).__name__} refused: {self.topo.job_commands} carries job "
                                      "commands (and run cancel and replay) only")
            if signed is not None:  # first: an unproven command learns nothing of the state
                try:
                    require_signature(signed, cmd.tenant)
                except Unauthenticated:
                    self.stats.unsigned_refused += 1
                    raise
            self._check_owner(cmd)
            if isinstance(cmd, R.CancelRun | R.ReplayRun):
                self._check_run_action(cmd, now_ms)
            if isinstance(cmd, J.AdoptJob) and isinstance(signed, CommandKey) and signed.tenant != OPERATOR:
                # a tenant's key proves the tenant's own commands; an adoption is the
                # processors' word (the old home checked the tenant's move): an operator key
                self.stats.unsigned_refused += 1
                raise Unauthenticated(f"an AdoptJob is written by processors, signed with the operator's key; this "
                                      f"one is signed with key {signed.key_id!r} of tenant {signed.tenant!r}")
            out = self.savepoint(lambda: self.handle(cmd, now_ms, self.topo.job_commands))
            # the job's version after it: from the changelog record it wrote (no second
            # read of the store), else the stored job (a command that changed nothing)
            written = [o.value for o in out if o.topic == self.topo.jobs and isinstance(o.value, J.JobState)]
            job = written[-1] if written else (
                self.job(cmd.job_id) if isinstance(cmd, J.JOB_COMMANDS) else None)
        except InfraError:
            raise  # not the command's fault (a state store that failed): the runtime aborts and retries
        except RecordFailed as exc:  # a bug the command reached: answered, and poisoned by the runtime
            self.stats.commands_refused += 1
            refusal = TransitionError(f"the processor could not apply {type(cmd).__name__} ({exc}); it is kept "
                                      f"on {self.topo.poison} for the operators")
            exc.answer = self._result(result_for(cmd, partition, offset, now_ms, error=refusal), partition)
            raise
        except GnomonError as exc:
            self.stats.commands_refused += 1
            answer = self._result(result_for(cmd, partition, offset, now_ms, error=exc), partition)
            if isinstance(cmd, J.AdoptJob) and not isinstance(exc, Unauthenticated):
                return [*self._send_back(cmd, exc), answer]
            return [answer]
        version = None if job is None else job.version
        note = ALREADY_REGISTERED if isinstance(cmd, J.RegisterJob) and not written else None
        return [*out, self._result(result_for(cmd, partition, offset, now_ms, job_version=version, note=note),
                                   partition)]

    def _check_run_action(self, cmd: R.CancelRun | R.ReplayRun, now_ms: int) -> None:
        """A user's cancel or replay (the API's, on the job-commands topic) is refused when
        it can do nothing: the run is not the sender's to see (RunNotFound), a cancel of
        a run that has finished (cancelled included: the API's 409 says how it ended), a
        replay of a run that is neither failed nor already replayed and under way, or of
        a dead letter past its replayable window (Conflict). A replay again while the
        first is under way is accepted (nothing changes). The processor's own cancels
        (overlap) do not come this way."""
        run = self.run(cmd.run_id)
        if run is None or run.tenant != cmd.tenant:
            raise RunNotFound(f"no run {cmd.run_id!r}")
        if isinstance(cmd, R.CancelRun):
            if run.status.terminal:
                raise Conflict(f"run {cmd.run_id!r} is {run.status.value}; only a run that has not finished can be "
                               "cancelled")
            return
        if run.status is R.RunStatus.FAILED:
            window_ms = self.run_cfg.dead_letter_retention_ms
            if run.finished_at_ms is not None and now_ms - run.finished_at_ms >= window_ms:
                raise Conflict(f"run {cmd.run_id!r} failed more than {window_ms // 86_400_000} days ago; dead letters "
                               "are replayable for that long (history keeps it; trigger the job by hand instead)")
            return
        if run.replays > 0 and not run.status.terminal:
            return  # a replay again: it is under way
        raise Conflict(f"run {cmd.run_id!r} is {run.status.value}; only a failed (dead-lettered) run can be replayed")

    def _check_owner(self, cmd: J.JobCommand | R.CancelRun | R.ReplayRun) -> None:
        """A command read on another partition than its job's would create a second copy
        of the job (and its run ids) beside the real one: refused. Producers key every
        command by its job id (docs/job-events.md), and Kafka's partitioner does the rest."""
        job_id = cmd.job_id if isinstance(cmd, J.JOB_COMMANDS) else cmd.run_id.partition("@")[0]
        owner = partition_for(job_id, self.partitions)
        if owner != self.partition:
            raise ValidationError("job_id", f"job {job_id[:200]!r} lives on partition {owner}, but this command "
                                            f"was read from partition {self.partition}: key each command by its "
                                            "job id and let the murmur2 partitioner place it")

    def _result(self, result: CommandResult, partition: int) -> Output:
        # the command's own partition number: co-partitioned, so a producer that knows
        # where its command went knows where to read its answer
        return Output(self.topo.command_results, result.job_id, result, partition=partition)

    def _decided_slot(self, cmd: J.RunTriggered | J.RunSkipped, now_ms: int) -> str | None:
        """Why a trigger read from the log (the scheduler applies its own triggers in
        place, so this is a replay or a forgery) must not create its unknown run: its slot
        is already decided, and its run may have been purged. None: it may."""
        job = self.job(cmd.job_id)
        if job is None or job.tenant != cmd.tenant:
            return "the job does not exist (deleted or never registered)"
        if isinstance(cmd, J.RunTriggered) and cmd.manual:
            if now_ms - cmd.at_ms >= self.run_cfg.manual_key_retention_ms:
                return "a manual trigger older than the idempotency-key retention"
            return None
        if job.next_run_at_ms is None or cmd.slot_ms < job.next_run_at_ms:
            return "its slot is behind the job's schedule position (already decided; maybe purged)"
        return None

    def _handle_job(self, cmd: J.JobCommand, now_ms: int) -> list[Output]:
        stored = self.stored_job(cmd.job_id)  # (a deleted job's owner decides who may take the id)
        state = None if stored is None or stored.status is J.JobStatus.DELETED else stored
        # a patch is validated against the pools of this topology, like the API does
        events = J.decide(stored, cmd, self.sched_cfg, pools=frozenset(self.topo.pools), region=self.topo.region)
        moves = any(isinstance(e, J.JobMovedOut) for e in events)
        key = self.operator_key() if moves and self.operator_key is not None else None
        if moves and self.operator_key is not None and key is None:
            raise TransitionError(f"job {cmd.job_id} cannot move: this processor has no operator command key to sign "
                                  "its adoption with (gnomon infra up makes one in a regions layout: its keys "
                                  "directory's operator file, the same on every region's processors); nothing changed")
        self._check_calendars(cmd.tenant, events, cmd.at_ms)
        new_triggers = self._admit(cmd, state, events, now_ms)
        out = self._apply_job_events(cmd.job_id, state, events, now_ms, preflight=isinstance(cmd, J.BackfillJob))
        for ev in events:
            if isinstance(ev, J.JobMovedOut):
                assert state is not None and self.topo.region is not None
                adopt = J.adoption_of(state, ev, self.topo.region)
                out.append(self._to_region(ev.to_region, adopt, key))
                log.info("partition %d: job %s moves to region %s from slot %s (in this transaction)",
                         self.partition, cmd.job_id, ev.to_region, state.next_run_at_ms)
        if new_triggers and self.quota is not None:
            for _ in range(new_triggers):
                self.quota.trigger_accepted(self.partition, cmd.tenant, now_ms)
            if isinstance(cmd, J.BackfillJob):
                self.quota.backfill_accepted(self.partition, cmd.tenant, new_triggers, now_ms)
        return out

    def _to_region(self, to_region: str, adopt: J.AdoptJob, key: CommandKey | None) -> Output:
        """``adopt`` on ``to_region``'s job-commands topic, signed with ``key``, the operator's
        (None: unsigned, where commands are not signed): the processors' word, after the old
        home checked the tenant's signature of the move (ADR 0013); a tenant's own key
        cannot forge one."""
        topic = other_region_topic(self.topo.job_commands, self.topo.region, to_region)
        raw = codec.encode(adopt, topic)
        headers = () if key is None else sign_command(key, topic, adopt.job_id.encode(), raw)
        return Output(topic, adopt.job_id, adopt, encoded=raw, headers=headers)

    def _send_back(self, cmd: J.AdoptJob, why: GnomonError) -> list[Output]:
        """An adoption refused here goes back to the region it came from, which takes the
        job back where it left it; a returned one refused again is only answered (and
        logged: the job's last state stays on the old home's changelog, moved away)."""
        region = self.topo.region
        try:
            validate_region(cmd.from_region)
        except ValueError:
            return []
        if cmd.returned:
            log.error("partition %d: the return of job %s from region %s is refused too (%s); the job runs "
                      "nowhere until an operator registers it again", self.partition, cmd.job_id,
                      cmd.from_region, why)
            return []
        key = self.operator_key() if self.operator_key is not None else None
        if region is None or cmd.from_region == region or (self.operator_key is not None and key is None):
            log.error("partition %d: the adoption of job %s from region %s is refused (%s) and cannot go back "
                      "(%s)", self.partition, cmd.job_id, cmd.from_region, why,
                      "no operator command key to sign it" if region is not None and cmd.from_region != region
                      else "it names no other region")
            return []
        log.warning("partition %d: the move of job %s from region %s is refused (%s); it goes back",
                    self.partition, cmd.job_id, cmd.from_region, why)
        return [self._to_region(cmd.from_region, J.returned(cmd, region), key)]

    def _check_calendars(self, tenant: str, events: list[J.JobEvent], made_at_ms: int) -> None:
        """A job may name only calendars its tenant has (ValidationError naming the first
        missing one, before anything is written)."""
        if self.calendars is None:
            return
        for ev in events:
            if isinstance(ev, J.JobRegistered | J.JobUpdated | J.JobAdopted) and ev.spec.exclude_calendars:
                for i, name in enumerate(ev.spec.exclude_calendars):
                    if self.calendars.get(tenant, name) is None and self.calendars_catch_up is not None:
                        self.calendars_catch_up(made_at_ms)
                    if self.calendars.get(tenant, name) is None:
                        raise ValidationError(f"excludeCalendars[{i}]", f"tenant {tenant!r} has no calendar {name!r} "
                                                                        "(PUT /v1/calendars/{name} first)")

    def _admit(self, cmd: J.JobCommand, state: J.JobState | None, events: list[J.JobEvent], now_ms: int) -> int:
        """Refuse (LimitExceeded) a command over its tenant's limits, before anything is
        written; the runs it creates that count toward the trigger rate (a manual trigger's
        new run, a backfill's new or reopened runs)."""
        if self.overloaded and events:
            self._refuse_one_off_while_overloaded(cmd, events)
        if self.quota is None or not events:
            return 0
        try:
            if isinstance(cmd, J.BackfillJob):
                return self._admit_backfill(cmd, events, now_ms)
            return self._admit_events(cmd, state, events, now_ms)
        except GnomonError:
            self.stats.admissions_refused += 1
            raise

    def _admit_events(self, cmd: J.JobCommand, state: J.JobState | None, events: list[J.JobEvent],
                      now_ms: int) -> int:
        """``_admit`` for a command other than a backfill, event by event."""
        assert self.quota is not None
        limits = self.quota.effective_limits(cmd.tenant)
        backlog = self.quota.count(Q.Family.BACKLOG, cmd.tenant)
        for ev in events:
            if isinstance(ev, J.JobRegistered) or (isinstance(ev, J.JobAdopted) and isinstance(cmd, J.AdoptJob)
                                                   and not cmd.returned):
                jobs = self.quota.count(Q.Family.JOBS, cmd.tenant)
                A.check_registration(limits, ev.spec, jobs=jobs, backlog=backlog, now_ms=now_ms)
            elif isinstance(ev, J.JobUpdated) and state is not None and ev.spec.schedule != state.spec.schedule:
                A.check_schedule(limits, ev.spec, now_ms)
                if ev.spec.schedule.is_one_time and Q.pending_one_time_key(state) is None:
                    # (a pending one-time job moved to another instant is counted already)
                    A.check_backlog(limits, backlog)
            elif isinstance(ev, J.RunTriggered) and ev.manual:
                if self.run(ev.run_id) is not None:
                    return 0  # the same idempotency key again: nothing new
                self._check_trigger_rate(cmd.tenant, now_ms)
                return 1
        return 0

    def _check_trigger_rate(self, tenant: str, now_ms: int) -> None:
        """A new manual run of ``tenant`` (a trigger, a replay) within its trigger rate and
        backlog (``core.admission.check_trigger``); LimitExceeded if not."""
        assert self.quota is not None
        n, oldest = self.quota.triggers(tenant, now_ms)
        A.check_trigger(self.quota.effective_limits(tenant), backlog=self.quota.count(Q.Family.BACKLOG, tenant),
                        triggers_last_min=n, oldest_trigger_ms=oldest, now_ms=now_ms)

    def _admit_backfill(self, cmd: J.BackfillJob, events: list[J.JobEvent], now_ms: int) -> int:
        """A backfill's runs pass the tenant's limits together or not at all: each new run
        (or a skipped one reopened) is a one-off run queued and a trigger (core.admission)."""
        assert self.quota is not None
        runs = 0
        for ev in events:
            if isinstance(ev, J.RunTriggered):
                existing = self.run(ev.run_id)
                runs += existing is None or existing.status is R.RunStatus.SKIPPED
        if not runs:
            return 0
        n, oldest = self.quota.triggers(cmd.tenant, now_ms)
        A.check_backfill(self.quota.effective_limits(cmd.tenant), runs,
                         backlog=self.quota.count(Q.Family.BACKLOG, cmd.tenant), triggers_last_min=n,
                         oldest_trigger_ms=oldest, backfilled_last_day=self.quota.backfilled(cmd.tenant, now_ms),
                         now_ms=now_ms)
        return runs

    def _refuse_one_off_while_overloaded(self, cmd: J.JobCommand, events: list[J.JobEvent]) -> None:
        """New one-off work (a one-time job, a manual trigger that makes a new run) is
        refused while this processor is overloaded, with a Retry-After: it would only
        queue behind what is already late (docs/semantics.md). Recurring registrations,
        edits, pauses and deletes go on."""
        for ev in events:
            one_off = (isinstance(ev, J.JobRegistered) and ev.spec.schedule.is_one_time) or (
                isinstance(ev, J.RunTriggered) and (ev.manual or ev.backfill) and self.run(ev.run_id) is None)
            if one_off:
                self._refuse_overloaded("new one-off work is")

    def _refuse_overloaded(self, what: str) -> None:
        """LimitExceeded("overload") with a Retry-After, counted: ``what`` (e.g. "replays
        are") is refused while this processor is overloaded."""
        self.stats.admissions_refused += 1
        raise LimitExceeded("overload", f"the scheduler is overloaded (partition {self.partition} defers "
                            f"due jobs): {what} refused for now; retry later", retry_after_s=OVERLOAD_RETRY_AFTER_S)

    def _apply_job_events(self, job_id: str, state: J.JobState | None, events: list[J.JobEvent],
                          now_ms: int, *, preflight: bool = False, start: J.JobState | None = None) -> list[Output]:
        """``preflight``: decide the run commands first, so one that is refused raises
        before anything is written (a backfill: many runs of one command). ``start``: the
        state the events apply to when it is not the stored ``state`` yet (one record)."""
        out: list[Output] = []
        if not events:
            return out
        new = start if start is not None else state
        changed = False
        run_cmds: list[J.RunTriggered | J.RunSkipped] = []
        for ev in events:
            new = J.evolve(new, ev)
            if isinstance(ev, J.RunTriggered | J.RunSkipped):
                if isinstance(ev, J.RunTriggered):
                    self.stats.triggers += 1
                else:
                    self.stats.skips += 1
                run_cmds.append(ev)
            else:
                changed = True
        for cmd in run_cmds if preflight else ():
            # the runs decide first (pure): a refusal (a backfill of another tenant's run
            # left from a deleted job) must come before anything is written
            R.decide(self.run(cmd.run_id), cmd, self.run_cfg, now_ms)
        kept = J.deleted_owner(state, now_ms) if new is None and state is not None else new
        self._store_job(job_id, state, kept, out)
        for cmd in run_cmds:
            # the run lives in this same partition: apply it here, in this transaction
            out.extend(self._handle_run(cmd, now_ms))
        if changed and state is not None:  # (a job that did not exist has no runs waiting to start)
            out.extend(self._job_changed(job_id, new, now_ms))
        if changed and ((state is not None and (state.spec.after or state.downstreams))
                        or (new is not None and new.spec.after)):
            declare = any(isinstance(ev, J.JobRegistered | J.JobUpdated | J.JobResumed) for ev in events)
            out.extend(deps.job_changed(self, job_id, state, new, declare, now_ms))
        return out

    def _job_changed(self, job_id: str, job: J.JobState | None, now_ms: int) -> list[Output]:
        """An edit, pause or delete reaches the job's runs that have not started yet."""
        out: list[Output] = []
        for run_id in self._run_ids_under(_job_runs_prefix(job_id)):
            out.extend(self._handle_run(R.JobChanged(run_id, job, now_ms), now_ms))
        out.extend(deps.wake(self, job, now_ms, job_id))  # held runs: paused, deleted, edited
        return out

    def worker_lost(self, worker_id: str, now_ms: int) -> list[Output]:
        """``worker_id`` stopped advertising: its attempts not reported started go to
        other workers now, whether their slot is ahead or has passed (a worker starts an
        attempt only once Kafka took its start report, so one not known started never
        ran; a start report read after this is refused, and its Stop ends the attempt).
        The revoked grant uses none of the run's attempts."""
        out: list[Output] = []
        for run_id in self._run_ids_under(_staged_prefix(worker_id)):
            run = self.run(run_id)
            if run is not None:
                out.extend(self._contained("run", run_id, now_ms,
                                           partial(self._handle_run, R.WorkerLost(run_id, worker_id, now_ms), now_ms)))
        return out

    def staged_workers(self, limit: int = STAGED_WORKERS_MAX) -> list[str]:
        """The workers this partition has attempts staged on (one seek per worker)."""
        out: list[str] = []
        start, end = _STAGED, _prefix_end(_STAGED)
        while len(out) < limit:
            found = next(iter(self.kv.scan(start, end, 1)), None)
            if found is None:
                break
            key = found[0]
            worker_id = key[len(_STAGED):key.index(b"\0", len(_STAGED))].decode()
            out.append(worker_id)
            start = _prefix_end(_staged_prefix(worker_id))
        return out

    def _run_ids_under(self, prefix: bytes) -> list[str]:
        """The run ids of an ``<index>/<id>\0<run_id>`` index entry family (at most due_max)."""
        return [k[len(prefix):].decode() for k, _ in self.kv.scan(prefix, _prefix_end(prefix), self.due_max)]

    def _handle_run(self, cmd: R.RunCommand, now_ms: int | None) -> list[Output]:
        state = self.run(cmd.run_id)
        events = R.decide(state, cmd, self.run_cfg, now_ms)
        return self._apply_run_events(state, events, cmd.at_ms if now_ms is None else now_ms)

    def _apply_run_events(self, state: R.RunState | None, events: list[R.RunEvent], now_ms: int) -> list[Output]:
        out: list[Output] = []
        if not events:
            return out
        new = state
        for ev in events:
            if new is None and isinstance(ev, R.ClaimRejected | R.StaleRejected):
                out.extend(self._rejection(ev))  # a command for a run not (or no longer) held here
                continue
            new = R.evolve(new, ev)
            out.extend(self._messages_for(new, ev))
            if (isinstance(ev, R.AttemptStartReported) and new.attempt <= 1 and not new.manual
                    and new.created_at_ms <= new.not_before_ms):  # (triggered ahead: not catch-up, not deferred)
                self._note_start(new, ev.started_at_ms)
        if new is None:
            return out
        # a skipped range reopened at its last slot by a backfill: the rest stays skipped
        rest = None
        if state is not None and any(isinstance(ev, R.RunReopened) for ev in events):
            rest = R.reopened_range_rest(state, now_ms, lambda run_id: self.run(run_id) is not None)
        # a run due for staging now is staged now, not at the next tick
        active: R.RunState | None = None
        if new.status is R.RunStatus.SCHEDULED and (new.timer_ms(self.run_cfg) or 0) <= now_ms:
            job = self.job(new.job_id)
            active = self._active_sibling(new, job)
            buffered = self._buffered_sibling(new, job) if active is not None else None
            for ev in R.decide_timer(new, now_ms, self.run_cfg, job, active=active, buffered=buffered,
                                     upstreams=deps.verdict(new, job, now_ms)):
                new = R.evolve(new, ev)
                out.extend(self._messages_for(new, ev))
        if new.status is R.RunStatus.READY:
            new = self._assign(new, now_ms, out)
        if new != state:
            self._store_run(state, new, out)
            out.extend(deps.ended(self, state, new, now_ms))
        out.extend(self._replace_active(new.run_id, active, now_ms))
        if rest is not None:
            out.extend(self._handle_run(rest, now_ms))
        return out

    def _note_start(self, run: R.RunState, started_at_ms: int) -> None:
        """A scheduled run's first attempt started: its start lag, for the overload governor
        (``start_lags``, drained by the runtime; at most ``start_lags_max`` kept)."""
        if len(self.start_lags) < self.start_lags_max:
            rank = int(_PRIO_RANK.get(run.spec.priority.value, b"1"))
            self.start_lags.append((rank, max(0, started_at_ms - run.not_before_ms)))

    def _active_sibling(self, run: R.RunState, job: J.JobState | None) -> R.RunState | None:
        """For a scheduled run of a job with an overlap policy: another of its runs that is
        released and not finished (the ``ja/`` index holds only those), or None."""
        if run.status is not R.RunStatus.SCHEDULED or run.manual or job is None:
            return None
        if job.spec.overlap is OverlapPolicy.ALLOW:
            return None
        for run_id in self._run_ids_under(_active_prefix(run.job_id)):
            other = self.run(run_id)
            if run_id != run.run_id and other is not None and R.is_active(other):
                return other
        return None

    def _buffered_sibling(self, run: R.RunState, job: J.JobState | None) -> R.RunState | None:
        """``overlap: bufferOne``: another run of the job that already waits for the active
        one to end (buffered runs are in the ``ja/`` index too), or None."""
        if run.status is not R.RunStatus.SCHEDULED or run.manual or job is None:
            return None
        if job.spec.overlap is not OverlapPolicy.BUFFER_ONE:
            return None
        for run_id in self._run_ids_under(_active_prefix(run.job_id)):
            other = self.run(run_id)
            if run_id != run.run_id and other is not None and other.buffered:
                return other
        return None

    def _replace_active(self, released_id: str, active: R.RunState | None, now_ms: int) -> list[Output]:
        """``overlap: replace``: once the new slot's run is released, cancel the active one."""
        if active is None:
            return []
        released = self.run(released_id)
        if released is None or not R.is_active(released):
            return []
        cancel = R.replacement_cancel(released, active, now_ms)
        return [] if cancel is None else self._handle_run(cancel, now_ms)

    def _assign(self, run: R.RunState, now_ms: int, out: list[Output]) -> R.RunState:
        """Grant a READY run to a live worker with a free slot, if the pool has one and
        the run's tenant is under its quota (else the run says it waits for quota). Not
        while runs of its pool wait for room (``WorkerDirectory.queued_pools``): it waits
        in the ``rw/`` index with them, and the next tick grants oldest first
        (``processor.waiting``), so a run released now never takes the room of a run
        that has waited since before."""
        if run.spec.pool in self.directory.queued_pools:
            return run
        new, result = self._try_assign(run, now_ms, out)
        if result == "room":
            self.directory.queued_pools.add(run.spec.pool)  # it waits: so do the next ones, behind it
        return new

    def _try_assign(self, run: R.RunState, now_ms: int, out: list[Output]) -> tuple[R.RunState, str]:
        """(the run after, "granted" | "quota" | "room")."""
        if self.quota is not None:
            decision = self.quota.may_grant(run.tenant, run.spec.pool)
            if not decision.allowed:
                self.stats.quota_waits += 1
                return Q.mark_waiting(run, decision, now_ms), "quota"
        worker = self.directory.pick(run.spec.pool, now_ms, run.not_before_ms, run.tenant)
        if worker is None:
            self.stats.assign_misses += 1
            return run, "room"
        run = Q.clear_waiting(run)
        for ev in R.decide(run, R.ClaimRun(run.run_id, worker, now_ms), self.run_cfg, now_ms):
            run = R.evolve(run, ev)
            out.extend(self._messages_for(run, ev))
        return run, "granted"

    def _messages_for(self, run: R.RunState, ev: R.RunEvent) -> list[Output]:
        inbox = self.topo.worker_inbox
        if isinstance(ev, R.GrantRevoked | R.RunWithdrawn | R.AttemptEnded | R.RunCancelled):
            # the worker's slot is free again (in the directory's own account)
            worker = run.worker_id if isinstance(ev, R.AttemptEnded) else ev.worker_id
            if worker is not None and self.directory is not None:
                staged = isinstance(ev, R.GrantRevoked | R.RunWithdrawn) or run.attempt_started_at_ms is None
                self.directory.release(worker, staged_start_ms=run.not_before_ms if staged else None)
        if isinstance(ev, R.GrantRevoked | R.RunWithdrawn):
            # a staged grant taken back: its worker (if it is to be told) drops it
            if isinstance(ev, R.GrantRevoked):
                self.stats.revocations += 1
                tell = ev.worker_id if ev.notify_worker else None
            else:
                self.stats.withdrawals += 1
                tell = ev.worker_id
            if tell is None:
                return []
            return [Output(inbox, tell, Stop(tell, ev.run_id, ev.token, StopReason.REVOKED, ev.reason, ev.at_ms))]
        if isinstance(ev, R.RunReleased):
            self.stats.releases += 1
            return []  # staged by the processor on a worker's inbox (``_assign``)
        if isinstance(ev, R.AttemptGranted):
            self.stats.grants += 1
            grant = Grant(ev.worker_id, run.run_id, run.job_id, run.tenant, ev.attempt, ev.token,
                          ev.lease_until_ms, ev.deadline_ms, run.spec, run.slot_ms, ev.at_ms, run.not_before_ms)
            return [Output(inbox, ev.worker_id, grant)]
        if isinstance(ev, R.ClaimRejected | R.StaleRejected):
            return self._rejection(ev)
        if isinstance(ev, R.LeaseExtended):
            assert run.worker_id is not None
            return [Output(inbox, run.worker_id, LeaseAck(run.worker_id, run.run_id, ev.token, ev.lease_until_ms, ev.at_ms))]
        if isinstance(ev, R.RunCancelled) and ev.worker_id is not None:
            return [Output(inbox, ev.worker_id, Stop(ev.worker_id, ev.run_id, ev.token, StopReason.CANCELLED, ev.reason, ev.at_ms))]
        if isinstance(ev, R.AttemptEnded):
            self.stats.completions += 1
            if run.status is R.RunStatus.FAILED:
                return [Output(self.topo.dead_letters, run.run_id, run)]
        return []

    def _rejection(self, ev: R.ClaimRejected | R.StaleRejected) -> list[Output]:
        self.stats.rejections += 1
        inbox = self.topo.worker_inbox
        if isinstance(ev, R.ClaimRejected):
            return [Output(inbox, ev.worker_id, Stop(ev.worker_id, ev.run_id, 0, StopReason.REJECTED, ev.reason, ev.at_ms))]
        return [Output(inbox, ev.worker_id, Stop(ev.worker_id, ev.run_id, ev.token, StopReason.STALE, ev.reason, ev.at_ms))]

    # ---- time --------------------------------------------------------------------------

    def tick(self, now_ms: int, read_up_to_ms: int | None = None, history_until_ms: int | None = None,
             assign_waiting: bool = True, budget: TickBudget | None = None) -> list[Output]:
        """Time-driven work of this partition: due jobs, run timers, purges. Bounded by due_max.
        ``read_up_to_ms``: record time up to which this partition's input was read, when it
        is behind (see ``runs.decide_timer``); None when caught up. ``history_until_ms``:
        every ledger record this partition committed before that time is in history (the
        projector has read past it); None: unknown, purge nothing. ``budget``: triggers
        left for normal and low jobs (``core.overload``; None: unlimited). A processor with
        several partitions calls the steps itself (``begin_tick``, ``tick_due`` per phase
        across its partitions, ``tick_timers``), so that one budget goes to the slots due
        now in every partition before any partition's lookahead."""
        self.begin_tick(now_ms)
        budget = budget if budget is not None else TickBudget()
        out: list[Output] = []
        for phase in TickPhase:
            out.extend(self.tick_due(phase, now_ms, budget))
        out.extend(self.tick_timers(now_ms, read_up_to_ms, history_until_ms, assign_waiting))
        return out

    def begin_tick(self, now_ms: int) -> None:
        """Start a tick: this tick's counters, and whether the partition was present since
        the last one (``_presence``)."""
        self._quota_waits_this_tick = 0
        self._presence(now_ms)

    def tick_due(self, phase: TickPhase, now_ms: int, budget: TickBudget) -> list[Output]:
        """One phase of the due jobs (``TickPhase``), each index by priority: high first,
        then normal and low while the tick's budget lasts. So a tick that has much to do (a
        backlog decided, a lookahead filled after a restart) emits the slots due in the next
        seconds first, for every job: their grants come first in each worker's inbox, ahead
        of slots 30 s away."""
        assert self._present_since_ms is not None, "begin_tick first"
        present = self._present_since_ms
        out: list[Output] = []
        edge = max(now_ms - self.sched_cfg.misfire_grace_ms, 0)
        near = self._near_cfg()
        if phase is TickPhase.NEAR:
            out.extend(tick_near([self], now_ms, budget))
        elif phase is TickPhase.BACKLOG:
            catch_up = self.sched_cfg.catch_up_records_per_tick_max
            for index in _DUE:
                backlog = self.kv.scan(index, index + b"%013d/" % edge, self.due_max)
                for job_id in [k[len(index) + _TIME_W + 1:].decode() for k, _ in backlog]:
                    if catch_up <= 0:
                        self.stats.catch_up_deferred += 1
                        break
                    produced = self._tick_budgeted(index, job_id, now_ms, near, budget, present)
                    catch_up -= max(1, len(produced))
                    out.extend(produced)
        else:
            for index in _DUE:
                out.extend(self._tick_lookahead(index, edge, now_ms, budget, present))
        return out

    def tick_timers(self, now_ms: int, read_up_to_ms: int | None = None, history_until_ms: int | None = None,
                    assign_waiting: bool = True) -> list[Output]:
        """The rest of a tick (see ``tick``): run timers due, waiting runs (when this
        partition assigns its own), purges."""
        out: list[Output] = []
        due = [(k, k[len(b"rt/") + _TIME_W + 1:].decode())
               for k, _ in self.kv.scan(b"rt/", _bound(b"rt/", now_ms), self.due_max)]
        for key, run_id in due:
            self.stats.tick_runs_examined += 1
            run = self.run(run_id)
            if run is None or key not in self._index_keys(run):
                self._drop_stale_entry(key, run)
                continue
            out.extend(self._contained("run", run_id, now_ms, partial(self._tick_run, run, now_ms, read_up_to_ms)))
        if assign_waiting:  # (a processor with several partitions does it across them)
            out.extend(self._assign_waiting(now_ms))
        if history_until_ms is not None:
            out.extend(self._purge(now_ms, history_until_ms))
        return out

    def _purge(self, now_ms: int, history_until_ms: int) -> list[Output]:
        """Finished runs past their retention whose final state history has: out of state,
        a tombstone on the ledger. Bounded per tick."""
        out: list[Output] = []
        cutoff = history_until_ms - self.purge_clock_margin_ms
        # purge_at >= ended + retention_ms, so every entry up to this bound ended before cutoff
        upto = min(now_ms, cutoff - 1 + self.run_cfg.retention_ms)
        for key, _ in list(self.kv.scan(b"rp/", _bound(b"rp/", upto), self.run_cfg.purges_per_tick_max)):
            run = self.run(key[len(b"rp/") + _TIME_W + 1:].decode())
            if run is None or key not in self._index_keys(run):
                self._drop_stale_entry(key, run)
                continue
            if run.updated_at_ms >= cutoff:
                continue  # (never expected: terminal runs end when last updated)
            self._forget_run(run)
            self.stats.purged += 1
            out.append(Output(self.topo.runs, run.run_id, None, self.partition))
        return out

    def _drop_stale_entry(self, key: bytes, run: R.RunState | None) -> None:
        """An index entry its run does not derive (any more): e.g. computed with other
        settings (retention, lease) before a restart. Replace it with the run's own
        entries, so the run keeps its timer and its purge."""
        self._del_index(key)
        if run is not None:
            for k in self._index_keys(run):
                self._put_index(k)

    def _near_cfg(self) -> J.SchedulerConfig:
        if self._near is None or self._near[0] is not self.sched_cfg:
            cfg = replace(self.sched_cfg, lookahead_ms=min(self.near_lookahead_ms, self.sched_cfg.lookahead_ms))
            self._near = (self.sched_cfg, cfg)
        return self._near[1]

    def near_due(self, due: bytes, now_ms: int) -> list[tuple[bytes, str]]:
        """The jobs of due index ``due`` whose next slot is in the near phase's window (at
        most due_max), as (``time/job`` key, job id): time-ordered."""
        edge = max(now_ms - self.sched_cfg.misfire_grace_ms, 0)
        scan = self.kv.scan(due + b"%013d/" % edge, _bound(due, now_ms + self._near_cfg().lookahead_ms),
                            self.due_max)
        return [(k[len(due):], k[len(due) + _TIME_W + 1:].decode()) for k, _ in scan]

    def tick_near_job(self, due: bytes, job_id: str, now_ms: int, budget: TickBudget) -> list[Output]:
        """One job of the near phase (``tick_near``)."""
        assert self._present_since_ms is not None, "begin_tick first"
        return self._tick_budgeted(due, job_id, now_ms, self._near_cfg(), budget, self._present_since_ms)

    def defer(self, jobs: int, budget: TickBudget) -> None:
        """``jobs`` due now left for a later tick: the budget ran out."""
        budget.deferred += jobs
        self.stats.overload_deferred += jobs

    def _tick_lookahead(self, due: bytes, from_ms: int, now_ms: int, budget: TickBudget,
                        present_since_ms: int) -> list[Output]:
        """Tick the jobs of due index ``due`` whose next slot is in [from_ms, now + lookahead]
        (at most due_max): slots not due yet, none of which waits for the budget (what is
        due now is ``tick_near``'s, which counts what it leaves as deferred)."""
        out: list[Output] = []
        budgeted = due != _DUE[0]
        if budgeted and budget.exhausted:
            return out
        scan = self.kv.scan(due + b"%013d/" % from_ms, _bound(due, now_ms + self.sched_cfg.lookahead_ms),
                            self.due_max)
        for job_id in [k[len(due) + _TIME_W + 1:].decode() for k, _ in scan]:
            if budgeted and budget.exhausted:
                break
            out.extend(self._tick_budgeted(due, job_id, now_ms, self.sched_cfg, budget, present_since_ms))
        return out

    def _tick_budgeted(self, due: bytes, job_id: str, now_ms: int, cfg: J.SchedulerConfig, budget: TickBudget,
                       present_since_ms: int) -> list[Output]:
        """One due job: triggered (high always; normal and low while the budget lasts), or
        left due with only its slots past their lateness bound given up."""
        if due == _DUE[0]:
            return self._tick_job(job_id, now_ms, cfg, present_since_ms)
        if budget.exhausted:
            budget.deferred += 1
            self.stats.overload_deferred += 1
            return self._tick_job(job_id, now_ms, cfg, present_since_ms, trigger=False)
        if budget.left is not None and budget.left < cfg.triggers_per_tick_max:
            cfg = replace(cfg, triggers_per_tick_max=budget.left)  # (a late job takes no more than is left)
        before = self.stats.triggers
        out = self._tick_job(job_id, now_ms, cfg, present_since_ms)
        budget.spend(self.stats.triggers - before)
        return out

    def _presence(self, now_ms: int) -> int:
        """Since when this partition has been ticked without a gap over ``absent_after_ms``
        (``core.jobs.decide_tick``: slots due in that time and still untriggered were
        deferred by overload, not missed in an outage; a slot before the first tick after
        an absence was the absence's, which the catch-up policy decides)."""
        last, self._last_tick_ms = self._last_tick_ms, now_ms
        if self._present_since_ms is None or last is None or not 0 <= now_ms - last <= self.absent_after_ms:
            self._present_since_ms = now_ms
        return self._present_since_ms

    def _tick_run(self, run: R.RunState, now_ms: int, read_up_to_ms: int | None) -> list[Output]:
        job = self.job(run.job_id) if run.status is R.RunStatus.SCHEDULED else None
        active = self._active_sibling(run, job)
        buffered = self._buffered_sibling(run, job) if active is not None else None
        events = R.decide_timer(run, now_ms, self.run_cfg, job, read_up_to_ms, active, buffered,
                                upstreams=deps.verdict(run, job, now_ms))
        out = self._apply_run_events(run, events, now_ms)
        out.extend(self._replace_active(run.run_id, active, now_ms))
        return out

    def _tick_job(self, job_id: str, now_ms: int, cfg: J.SchedulerConfig, present_since_ms: int | None = None,
                  trigger: bool = True) -> list[Output]:
        self.stats.tick_jobs_examined += 1
        return self._contained("job", job_id, now_ms,
                               lambda: self._tick_job_step(job_id, now_ms, cfg, present_since_ms, trigger))

    def _tick_job_step(self, job_id: str, now_ms: int, cfg: J.SchedulerConfig, present_since_ms: int | None,
                       trigger: bool) -> list[Output]:
        state = self.job(job_id)
        if state is None:
            return []
        cals = (self.calendars.for_job(state.tenant, state.spec.exclude_calendars)
                if self.calendars is not None and state.spec.exclude_calendars else ())
        events = J.decide_tick(state, now_ms, cfg, present_since_ms, triggers=trigger, calendars=cals)
        out = self._apply_job_events(job_id, state, events, now_ms)
        self.stats.overload_given_up += sum(ev.count for ev in events
                                            if isinstance(ev, J.RunSkipped) and ev.reason == J.OVERLOAD_REASON)
        return out

    def _contained(self, kind: str, ident: str, now_ms: int, call: Callable[[], list[Output]]) -> list[Output]:
        """One job's or run's time-driven step, under a savepoint: if it raises, its writes
        are undone, the rest of the tick goes on, and it is tried again next tick. The
        first failure of each is kept on the poison topic (its key: the job or run id), so
        the poison metric and alert show it; later ones are counted and logged at most
        once a minute per partition."""
        try:
            return self.savepoint(call)
        except InfraError:
            raise
        except Exception as exc:
            self.stats.tick_failures += 1
            err = exc.cause if isinstance(exc, RecordFailed) else exc
            reason = f"{kind} {ident}: tick step failed: {type(err).__name__}: {str(err)[:500]}"
            first = (kind, ident) not in self._tick_failed
            if first and len(self._tick_failed) < TICK_FAILURES_KEPT_MAX:
                self._tick_failed.add((kind, ident))
            if first or time.monotonic() - self._tick_failure_logged_s >= 60:
                self._tick_failure_logged_s = time.monotonic()
                log.error("partition %d: %s (%d tick failures so far; state unchanged, tried again next tick)",
                          self.partition, reason, self.stats.tick_failures, exc_info=first)
            if not first:
                return []
            source = self.topo.jobs if kind == "job" else self.topo.runs
            return [Output(self.topo.poison, source,
                           PoisonRecord(source, self.partition, -1, reason, ident.encode(), None, now_ms))]

    def _assign_waiting(self, now_ms: int) -> list[Output]:
        """This partition alone (see ``processor.waiting.assign_waiting``, which a processor
        runs across all its partitions so that the weighted mix holds over all of them)."""
        return assign_waiting([self], now_ms, self._pickers)

    def waiting_cursor(self, pool: str, lane: bytes) -> WaitingCursor:
        """This tick's view of the READY runs of ``pool`` waiting for room in ``lane``
        (b"0" punctual, b"1" catch-up), per priority tier, each by due time."""
        prefix = _waiting_prefix(pool) + lane
        tiers = {i: iter(list(self.kv.scan(prefix + rank, _prefix_end(prefix + rank), self.due_max)))
                 for i, rank in enumerate(_PRIO_RANK.values())}
        return WaitingCursor(self, len(_waiting_prefix(pool)), tiers)

    def assign_waiting_run(self, key: bytes, prefix_len: int, now_ms: int, out: list[Output]) -> str:
        """Try to grant the waiting run of index entry ``key``: "granted"; "room" (no
        worker with room: a miss); "quota" (its tenant is at quota: the run says so);
        "stale" (the entry is no run's, dropped). Contained like a tick step: one that
        raises changes nothing and counts as a miss."""
        result = ["room"]

        def step() -> list[Output]:
            granted: list[Output] = []
            result[0] = self._assign_waiting_run(key, prefix_len, now_ms, granted)
            return granted

        out.extend(self._contained("run", key[prefix_len + _WAITING_FIXED:].decode(errors="replace"), now_ms, step))
        return result[0]

    def _assign_waiting_run(self, key: bytes, prefix_len: int, now_ms: int, out: list[Output]) -> str:
        run = self.run(key[prefix_len + _WAITING_FIXED:].decode())
        if run is None or run.status is not R.RunStatus.READY:
            self.kv.delete(key)  # stale entry: never expected, but never loop on it
            return "stale"
        new, result = self._try_assign(run, now_ms, out)
        if new is not run:
            self._store_run(run, new, out)
        if result == "quota":
            # another tenant's run may have room: not a miss, but bounded on its own
            self._quota_waits_this_tick += 1
            return "quota" if self._quota_waits_this_tick <= self.quota_waits_per_tick_max else "room"
        return result


class WaitingCursor:
    """One tick's iterators over a partition's waiting runs of one pool and lane, per tier."""

    def __init__(self, task: PartitionTask, prefix_len: int, tiers: dict[int, Iterator[tuple[bytes, bytes]]]) -> None:
        self.task = task
        self._prefix_len = prefix_len
        self._tiers = tiers
        self._heads: dict[int, bytes] = {}
        for tier in list(tiers):
            self._advance(tier)

    def _advance(self, tier: int) -> None:
        item = next(self._tiers[tier], None)
        if item is None:
            del self._tiers[tier]
            self._heads.pop(tier, None)
        else:
            self._heads[tier] = item[0]

    @property
    def tiers(self) -> set[int]:
        """Tiers with a run still to try this tick."""
        return set(self._heads)

    def head(self, tier: int) -> R.RunState | None:
        """The run the next ``step(tier)`` tries (None: its index entry is stale)."""
        return self.task.run(self._heads[tier][self._prefix_len + _WAITING_FIXED:].decode())

    def head_key(self, tier: int) -> bytes:
        """The next run's place in the tier: its due time, then its id."""
        return self._heads[tier][self._prefix_len + _WAITING_FIXED - _TIME_W - 1:]

    def step(self, tier: int, now_ms: int, out: list[Output]) -> str:
        """Try the next run of ``tier`` (``PartitionTask.assign_waiting_run``'s result)."""
        key = self._heads[tier]
        self._advance(tier)
        return self.task.assign_waiting_run(key, self._prefix_len, now_ms, out)
