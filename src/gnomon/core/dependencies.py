"""Job dependencies, the pure core (docs/adr/0011 decision 4; issue 25). A job declares
``after`` (upstream jobs of its tenant); the processor (``gnomon.processor.task``) calls
what is here:

* ``check_dag``: may job J declare these upstreams, given the tenant's other edges? Refuses
  a cycle (naming it), a self-reference, a repeat, and the limits on fan-in, fan-out, the
  DAG's depth and size, each as ``ValidationError`` naming ``after`` or ``after[i].job``.
* The messages of ``gnomon.dependencies`` (co-partitioned with the jobs, written and read
  by processors only), each keyed by the job whose partition must act on it:
  ``DependencyDeclared`` / ``DependencyDropped`` (keyed by the upstream: it keeps the list
  of its downstreams) and ``UpstreamEnded`` (keyed by the downstream: one of its
  upstream's runs, or a skipped range of its slots, ended), written in the transaction of
  the upstream run's terminal state.
* ``record_end``: the downstream keeps the latest ends of each upstream (bounded).
* ``decide_waiting``: for a downstream slot T, given the ends it has received, release the
  run, keep it waiting, or record it skipped with the reason.

**Logical time.** A downstream slot T waits, of each upstream U, for U's latest slot at or
before T. An end covers T when ``first_slot <= T < next_slot`` (``next_slot``: U's first
slot after the end's last one), which the upstream computes from its own schedule, so the
downstream needs no copy of it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from gnomon.core.errors import ValidationError
from gnomon.core.model import DependsOn, Upstream

UPSTREAMS_MAX = 10  # fan-in: upstreams one job may wait for
DOWNSTREAMS_MAX = 100  # fan-out: jobs that may wait for one job
DAG_JOBS_MAX = 1000  # jobs connected by dependencies, per tenant component
DAG_DEPTH_MAX = 20  # edges on the longest chain through a job
WAIT_MAX_S_DEFAULT = 86_400
WAIT_MAX_S_MAX = 7 * 86_400
ENDS_KEPT_PER_UPSTREAM = 4  # a downstream keeps this many of each upstream's latest ends

On = DependsOn  # (the name the pure core was written with)

__all__ = ["DependsOn", "On", "Upstream"]  # re-exported from gnomon.core.model


class Outcome(StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # dead-lettered: its retries ran out
    CANCELLED = "cancelled"
    SKIPPED = "skipped"  # the slot (or a range of them) was recorded skipped
    DELETED = "deleted"  # the upstream job was deleted (or is not the tenant's): covers every slot


@dataclass(frozen=True)
class UpstreamEnded:
    downstream_job: str
    upstream_job: str
    upstream_run: str  # the run that ended (a skipped range: the run id of its last slot)
    first_slot_ms: int
    last_slot_ms: int
    next_slot_ms: int | None  # the upstream's first slot after last_slot_ms; None: it has no more
    outcome: Outcome
    at_ms: int
    reason: str | None = None
    tenant: str = ""

    def covers(self, slot_ms: int) -> bool:
        """Is the upstream's latest slot at or before ``slot_ms`` one of this end's?"""
        return self.first_slot_ms <= slot_ms and (self.next_slot_ms is None or slot_ms < self.next_slot_ms)


@dataclass(frozen=True)
class DependencyDeclared:
    """Job ``downstream_job`` now runs after ``upstream_job`` (keyed by the upstream)."""

    upstream_job: str
    downstream_job: str
    tenant: str
    at_ms: int


@dataclass(frozen=True)
class DependencyDropped:
    """Job ``downstream_job`` no longer runs after ``upstream_job`` (edited or deleted)."""

    upstream_job: str
    downstream_job: str
    tenant: str
    at_ms: int


DependencyMessage = DependencyDeclared | DependencyDropped | UpstreamEnded


def receiver(msg: DependencyMessage) -> str:
    """The job whose partition acts on ``msg`` (its key on gnomon.dependencies)."""
    return msg.downstream_job if isinstance(msg, UpstreamEnded) else msg.upstream_job


@dataclass(frozen=True)
class Release:
    pass


@dataclass(frozen=True)
class Wait:
    pending: tuple[str, ...]  # upstream job ids whose covering end has not come
    until_ms: int  # then it is skipped


@dataclass(frozen=True)
class Skip:
    reason: str


Verdict = Release | Wait | Skip


def covering(ends: Sequence[UpstreamEnded], slot_ms: int) -> UpstreamEnded | None:
    """The newest of ``ends`` that covers ``slot_ms`` (a replay's success comes after the
    failure it replays, for the same slot: the newest end decides)."""
    best: UpstreamEnded | None = None
    for end in ends:
        if end.covers(slot_ms) and (best is None or end.at_ms >= best.at_ms):
            best = end
    return best


def wait_max_s(spec_wait_max_s: int | None) -> int:
    return WAIT_MAX_S_DEFAULT if spec_wait_max_s is None else spec_wait_max_s


def decide_waiting(slot_ms: int, upstreams: Sequence[Upstream], ends: Mapping[str, Sequence[UpstreamEnded]],
                   now_ms: int, wait_max_s: int = WAIT_MAX_S_DEFAULT, wait_from_ms: int | None = None) -> Verdict:
    """What the downstream run of ``slot_ms`` does now. ``ends``: by upstream job id, the
    ends received so far. An end that rules the run out skips it at once (its reason
    names the upstream run); all satisfied releases it; otherwise it waits until
    ``wait_from_ms`` (default: the slot; the processor gives the run's creation when that
    is later: a catch-up or a backfill) + ``wait_max_s``, then is skipped naming what it
    waited for."""
    assert upstreams, "a run without upstreams does not wait"
    pending: list[str] = []
    for up in upstreams:
        end = covering(ends.get(up.job_id, ()), slot_ms)
        if end is None:
            pending.append(up.job_id)
        elif end.outcome is Outcome.DELETED:
            why = f" ({end.reason})" if end.reason else ""
            return Skip(f"upstream job {up.job_id} was deleted{why}")
        elif end.outcome is not Outcome.SUCCEEDED and up.on is DependsOn.SUCCEEDED:
            why = f": {end.reason}" if end.reason else ""
            return Skip(f"upstream {end.upstream_run} {end.outcome.value}{why}")
    if not pending:
        return Release()
    until = max(slot_ms, wait_from_ms or slot_ms) + wait_max_s * 1000
    if now_ms >= until:
        return Skip(f"waited {wait_max_s} s (waitMaxS) for upstream {', '.join(pending)}")
    return Wait(tuple(pending), until)


@dataclass(frozen=True)
class NextTime:
    """Of a job after its upstreams: its first logical time after a slot (None: none)."""

    next_slot_ms: int | None


def next_logical_time(slot_ms: int, upstreams: Sequence[Upstream],
                      ends: Mapping[str, Sequence[UpstreamEnded]]) -> NextTime | None:
    """A job after its upstreams has their slots for logical times: after ``slot_ms``, the
    earliest of each upstream's first slot after its slot at or before ``slot_ms``. Known
    only when every upstream (but a deleted one) has an end covering ``slot_ms`` (its
    ``next_slot_ms`` says it): None until then. What the job's end of ``slot_ms`` covers
    for its own downstreams: [slot_ms, next)."""
    nexts: list[int] = []
    live = 0
    for up in upstreams:
        end = covering(ends.get(up.job_id, ()), slot_ms)
        if end is None:
            return None
        if end.outcome is Outcome.DELETED:
            continue
        live += 1
        if end.next_slot_ms is not None:
            nexts.append(end.next_slot_ms)
    if not live:
        return None
    return NextTime(min(nexts, default=None))


def ends_by_upstream(ends: Sequence[UpstreamEnded]) -> dict[str, list[UpstreamEnded]]:
    out: dict[str, list[UpstreamEnded]] = {}
    for end in ends:
        out.setdefault(end.upstream_job, []).append(end)
    return out


def record_end(ends: tuple[UpstreamEnded, ...], end: UpstreamEnded,
               upstreams: Sequence[Upstream]) -> tuple[UpstreamEnded, ...]:
    """The ends a downstream keeps after receiving ``end``: only of its current
    upstreams; a newer end of the same upstream run replaces the older one (a replay);
    of each upstream the ``ENDS_KEPT_PER_UPSTREAM`` received last (a deletion, covering
    every slot, is kept until the job is edited). A duplicate (the same run and time)
    changes nothing. (A held run is decided when an end arrives; what is kept serves the
    runs not yet staged, and a backfill's old slots, whose ends arrive as they end.)"""
    wanted = {u.job_id for u in upstreams}
    kept = [e for e in ends if e.upstream_job in wanted
            and not (e.upstream_run == end.upstream_run and e.upstream_job == end.upstream_job
                     and e.at_ms <= end.at_ms)
            # a run's end after the upstream was "deleted" (registered again since): it lives
            and not (e.upstream_job == end.upstream_job and e.outcome is Outcome.DELETED
                     and end.outcome is not Outcome.DELETED and e.at_ms <= end.at_ms)]
    if end.upstream_job in wanted and not any(
            e.upstream_job == end.upstream_job and e.upstream_run == end.upstream_run for e in kept):
        kept.append(end)
    out: list[UpstreamEnded] = []
    for group in ends_by_upstream(kept).values():
        group.sort(key=lambda e: (e.outcome is Outcome.DELETED, e.at_ms))
        out.extend(group[-ENDS_KEPT_PER_UPSTREAM:])
    return tuple(out)


def reopens(reason: str | None) -> bool:
    """Is a run skipped with ``reason`` one that a later success of its upstream releases
    (an upstream's failure, cancel or skip that a replay or backfill then made good)?"""
    return reason is not None and reason.startswith("upstream ") and not reason.startswith("upstream job ")


# ---- the DAG ----------------------------------------------------------------------------


def check_dag(job_id: str, upstreams: Sequence[Upstream], edges: Mapping[str, Sequence[str]]) -> None:
    """May ``job_id`` wait for ``upstreams``? ``edges``: every other job of the tenant ->
    the job ids it waits for (``job_id``'s own current edges are replaced by these).
    ValidationError naming ``after`` or ``after[i].job`` otherwise."""
    if len(upstreams) > UPSTREAMS_MAX:
        raise ValidationError("after", f"names {len(upstreams)} upstream jobs; at most {UPSTREAMS_MAX}")
    graph = {k: tuple(v) for k, v in edges.items() if k != job_id}
    graph[job_id] = tuple(u.job_id for u in upstreams)
    seen: set[str] = set()
    for i, up in enumerate(upstreams):
        field = f"after[{i}].job"
        if up.job_id == job_id:
            raise ValidationError(field, "a job cannot wait for itself")
        if up.job_id in seen:
            raise ValidationError(field, f"names {up.job_id} twice")
        seen.add(up.job_id)
        cycle = _path(graph, up.job_id, job_id)
        if cycle is not None:
            raise ValidationError(field, "closes a cycle: " + " -> ".join([job_id, *cycle]))
        fan_out = sum(1 for k, ups in graph.items() if up.job_id in ups)
        if fan_out > DOWNSTREAMS_MAX:
            raise ValidationError(field, f"{up.job_id} would have {fan_out} downstream jobs; at most "
                                         f"{DOWNSTREAMS_MAX}")
    depth = _longest_up(graph, job_id, {}) + _longest_down(graph, job_id)
    if depth > DAG_DEPTH_MAX:
        raise ValidationError("after", f"makes a chain of {depth} dependencies; at most {DAG_DEPTH_MAX}")
    size = len(_component(graph, job_id))
    if size > DAG_JOBS_MAX:
        raise ValidationError("after", f"connects {size} jobs by dependencies; at most {DAG_JOBS_MAX}")


def _path(graph: Mapping[str, Sequence[str]], start: str, goal: str) -> list[str] | None:
    """A path of upstream edges from ``start`` to ``goal`` (the jobs on it, start first)."""
    stack: list[tuple[str, list[str]]] = [(start, [start])]
    visited: set[str] = set()
    while stack:
        node, path = stack.pop()
        if node == goal:
            return path
        if node in visited:
            continue
        visited.add(node)
        for nxt in graph.get(node, ()):
            stack.append((nxt, [*path, nxt]))
    return None


def _longest_up(graph: Mapping[str, Sequence[str]], node: str, memo: dict[str, int]) -> int:
    """Edges on the longest chain of upstreams above ``node``."""
    return _longest(node, lambda n: graph.get(n, ()), memo, set())


def _longest_down(graph: Mapping[str, Sequence[str]], node: str) -> int:
    """Edges on the longest chain of downstreams below ``node``."""
    down: dict[str, list[str]] = {}
    for k, ups in graph.items():
        for u in ups:
            down.setdefault(u, []).append(k)
    return _longest(node, lambda n: down.get(n, ()), {}, set())


def _longest(node: str, nexts: Callable[[str], Sequence[str]], memo: dict[str, int], visiting: set[str]) -> int:
    if node in memo:
        return memo[node]
    if node in visiting:
        # (two registrations that raced may have closed a cycle the check could not see)
        raise ValidationError("after", f"the tenant's dependencies through {node} hold a cycle; remove it first")
    if len(visiting) > DAG_DEPTH_MAX:
        raise ValidationError("after", f"makes a chain of more than {DAG_DEPTH_MAX} dependencies")
    visiting.add(node)
    memo[node] = max((1 + _longest(n, nexts, memo, visiting) for n in nexts(node)), default=0)
    visiting.discard(node)
    return memo[node]


def _component(graph: Mapping[str, Sequence[str]], node: str) -> set[str]:
    links: dict[str, set[str]] = {}
    for k, ups in graph.items():
        for u in ups:
            links.setdefault(k, set()).add(u)
            links.setdefault(u, set()).add(k)
    seen, todo = {node}, [node]
    while todo:
        for nxt in links.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen
