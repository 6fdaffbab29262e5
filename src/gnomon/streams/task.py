"""One partition's processing: consume a command, call the pure core, write state,
return outputs. No Kafka here: the runtime (``gnomon.streams.runtime``) feeds records
in and produces what comes out, inside one transaction per batch. Tests and the
in-memory runner drive this class directly.

State layout in the partition's ordered key-value store (RocksDB):

    j/<job_id>                      -> JobState (codec)
    jd/<next_run_at_ms:013>/<job_id> -> b""   due index, ordered by time
    r/<run_id>                      -> RunState (codec)
    rt/<timer_ms:013>/<run_id>      -> b""   run timer index (release, lease, retry)

A tick reads only the index prefixes up to "now": its cost grows with what is due,
not with what exists.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from gnomon import codec
from gnomon.core import jobs as J
from gnomon.core import runs as R
from gnomon.core.messages import DispatchRun, Grant, LeaseAck, Stop, StopReason
from gnomon.ports import KeyValueStore
from gnomon.topology import Topology

log = logging.getLogger(__name__)

_TIME_W = 13  # digits of epoch ms, good until the year 2286


def _job_key(job_id: str) -> bytes:
    return b"j/" + job_id.encode()


def _due_key(ms: int, job_id: str) -> bytes:
    return b"jd/%013d/" % ms + job_id.encode()


def _run_key(run_id: str) -> bytes:
    return b"r/" + run_id.encode()


def _timer_key(ms: int, run_id: str) -> bytes:
    return b"rt/%013d/" % ms + run_id.encode()


def _bound(prefix: bytes, upto_ms: int) -> bytes:
    """Exclusive upper bound of ``prefix`` entries with time <= upto_ms."""
    return prefix + b"%013d/" % (upto_ms + 1)


@dataclass(frozen=True)
class Output:
    """A record to produce. ``partition`` None: let the partitioner pick by key."""

    topic: str
    key: str
    value: Any  # a codec-encodable object, or None for a tombstone
    partition: int | None = None


@dataclass
class TaskStats:
    commands: int = 0
    triggers: int = 0
    skips: int = 0
    releases: int = 0
    grants: int = 0
    rejections: int = 0
    completions: int = 0
    tick_jobs_examined: int = 0
    tick_runs_examined: int = 0


class PartitionTask:
    def __init__(
        self,
        partition: int,
        kv: KeyValueStore,
        topology: Topology,
        sched_cfg: J.SchedulerConfig | None = None,
        run_cfg: R.RunConfig | None = None,
        due_max: int = 5000,
    ) -> None:
        self.partition = partition
        self.kv = kv
        self.topo = topology
        self.sched_cfg = sched_cfg or J.SchedulerConfig()
        self.run_cfg = run_cfg or R.RunConfig()
        self.due_max = due_max
        self.stats = TaskStats()

    # ---- state access ------------------------------------------------------------------

    def job(self, job_id: str) -> J.JobState | None:
        raw = self.kv.get(_job_key(job_id))
        return None if raw is None else codec.decode(raw)

    def run(self, run_id: str) -> R.RunState | None:
        raw = self.kv.get(_run_key(run_id))
        return None if raw is None else codec.decode(raw)

    def _store_job(self, job_id: str, old: J.JobState | None, new: J.JobState | None, out: list[Output]) -> None:
        if old is not None and old.next_run_at_ms is not None and old.status is J.JobStatus.ACTIVE:
            self.kv.delete(_due_key(old.next_run_at_ms, job_id))
        if new is None:
            self.kv.delete(_job_key(job_id))
            out.append(Output(self.topo.jobs, job_id, None, self.partition))
            return
        raw = codec.encode(new)
        self.kv.put(_job_key(job_id), raw)
        if new.next_run_at_ms is not None and new.status is J.JobStatus.ACTIVE:
            self.kv.put(_due_key(new.next_run_at_ms, job_id), b"")
        out.append(Output(self.topo.jobs, job_id, new, self.partition))

    def _store_run(self, old: R.RunState | None, new: R.RunState, out: list[Output]) -> None:
        old_t = old.timer_ms() if old is not None else None
        new_t = new.timer_ms()
        if old_t is not None and old_t != new_t:
            self.kv.delete(_timer_key(old_t, new.run_id))
        self.kv.put(_run_key(new.run_id), codec.encode(new))
        if new_t is not None:
            self.kv.put(_timer_key(new_t, new.run_id), b"")
        out.append(Output(self.topo.runs, new.run_id, new, self.partition))

    # ---- restore from changelogs -------------------------------------------------------

    def restore_job(self, job_id: str, value: bytes | None) -> None:
        old = self.job(job_id)
        new = None if value is None else codec.decode(value)
        self._store_job(job_id, old, new, [])

    def bulk_load(self, jobs: dict[str, bytes | None], runs: dict[str, bytes | None]) -> int:
        """Load an empty store from the last changelog value of each key (a full rebuild):
        one decode and one write per live key, no read of prior state."""
        n = 0
        for job_id, raw in jobs.items():
            if raw is None:
                continue
            job: J.JobState = codec.decode(raw)
            self.kv.put(_job_key(job_id), raw)
            if job.next_run_at_ms is not None and job.status is J.JobStatus.ACTIVE:
                self.kv.put(_due_key(job.next_run_at_ms, job_id), b"")
            n += 1
        for run_id, raw in runs.items():
            if raw is None:
                continue
            run: R.RunState = codec.decode(raw)
            self.kv.put(_run_key(run_id), raw)
            t = run.timer_ms()
            if t is not None:
                self.kv.put(_timer_key(t, run_id), b"")
            n += 1
        return n

    def restore_run(self, run_id: str, value: bytes | None) -> None:
        old = self.run(run_id)
        if value is None:
            if old is not None:
                t = old.timer_ms()
                if t is not None:
                    self.kv.delete(_timer_key(t, run_id))
                self.kv.delete(_run_key(run_id))
            return
        self._store_run(old, codec.decode(value), [])

    # ---- commands ----------------------------------------------------------------------

    def handle(self, cmd: Any, now_ms: int | None = None) -> list[Output]:
        """Apply one decoded command at processing time ``now_ms`` (default: the command's
        own time). Raises GnomonError (TransitionError...) if refused."""
        self.stats.commands += 1
        if isinstance(cmd, J.RegisterJob | J.UpdateJob | J.PauseJob | J.ResumeJob | J.DeleteJob | J.TriggerJob):
            return self._handle_job(cmd)
        return self._handle_run(cmd, now_ms)

    def _handle_job(self, cmd: J.JobCommand) -> list[Output]:
        state = self.job(cmd.job_id)
        events = J.decide(state, cmd, self.sched_cfg)
        return self._apply_job_events(cmd.job_id, state, events)

    def _apply_job_events(self, job_id: str, state: J.JobState | None, events: list[J.JobEvent]) -> list[Output]:
        out: list[Output] = []
        if not events:
            return out
        new = state
        for ev in events:
            new = J.evolve(new, ev)
            if isinstance(ev, J.RunTriggered | J.RunSkipped):
                if isinstance(ev, J.RunTriggered):
                    self.stats.triggers += 1
                else:
                    self.stats.skips += 1
                out.append(Output(self.topo.run_events, ev.job_id, ev, self.partition))
        self._store_job(job_id, state, new, out)
        return out

    def _handle_run(self, cmd: R.RunCommand, now_ms: int | None) -> list[Output]:
        state = self.run(cmd.run_id)
        events = R.decide(state, cmd, self.run_cfg, now_ms)
        return self._apply_run_events(state, events)

    def _apply_run_events(self, state: R.RunState | None, events: list[R.RunEvent]) -> list[Output]:
        out: list[Output] = []
        if not events:
            return out
        new = state
        for ev in events:
            new = R.evolve(new, ev)
            out.extend(self._messages_for(new, ev))
        assert new is not None
        if new != state:
            self._store_run(state, new, out)
        return out

    def _messages_for(self, run: R.RunState, ev: R.RunEvent) -> list[Output]:
        inbox = self.topo.worker_inbox
        if isinstance(ev, R.RunReleased):
            self.stats.releases += 1
            topic = self.topo.dispatch_topic(run.spec.pool, run.spec.priority.value)
            msg = DispatchRun(run.run_id, run.job_id, run.tenant, ev.attempt, run.spec.pool,
                              run.spec.priority.value, run.not_before_ms, ev.at_ms)
            return [Output(topic, run.run_id, msg)]
        if isinstance(ev, R.AttemptGranted):
            self.stats.grants += 1
            grant = Grant(ev.worker_id, run.run_id, run.job_id, run.tenant, ev.attempt, ev.token,
                          ev.lease_until_ms, ev.deadline_ms, run.spec, run.slot_ms, ev.at_ms)
            return [Output(inbox, ev.worker_id, grant)]
        if isinstance(ev, R.ClaimRejected):
            self.stats.rejections += 1
            return [Output(inbox, ev.worker_id, Stop(ev.worker_id, ev.run_id, 0, StopReason.REJECTED, ev.reason, ev.at_ms))]
        if isinstance(ev, R.StaleRejected):
            self.stats.rejections += 1
            return [Output(inbox, ev.worker_id, Stop(ev.worker_id, ev.run_id, ev.token, StopReason.STALE, ev.reason, ev.at_ms))]
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

    # ---- time --------------------------------------------------------------------------

    def tick(self, now_ms: int, read_up_to_ms: int | None = None) -> list[Output]:
        """Time-driven work of this partition: due jobs, run timers. Bounded by due_max.
        ``read_up_to_ms``: record time up to which this partition's input was read, when it
        is behind (see ``runs.decide_timer``); None when caught up."""
        out: list[Output] = []
        horizon = now_ms + self.sched_cfg.lookahead_ms
        due_jobs = [k[len(b"jd/") + _TIME_W + 1:].decode()
                    for k, _ in self.kv.scan(b"jd/", _bound(b"jd/", horizon), self.due_max)]
        for job_id in due_jobs:
            self.stats.tick_jobs_examined += 1
            state = self.job(job_id)
            if state is None:
                continue
            out.extend(self._apply_job_events(job_id, state, J.decide_tick(state, now_ms, self.sched_cfg)))
        due_runs = [k[len(b"rt/") + _TIME_W + 1:].decode()
                    for k, _ in self.kv.scan(b"rt/", _bound(b"rt/", now_ms), self.due_max)]
        for run_id in due_runs:
            self.stats.tick_runs_examined += 1
            run = self.run(run_id)
            if run is None:
                continue
            job = self.job(run.job_id) if run.status is R.RunStatus.SCHEDULED else None
            out.extend(self._apply_run_events(run, R.decide_timer(run, now_ms, self.run_cfg, job, read_up_to_ms)))
        return out
