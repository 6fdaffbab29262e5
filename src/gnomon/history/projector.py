"""``HistoryProjector``: Kafka -> HistoryStore (Cassandra in production).

Consumes, in consumer group ``gnomon-history`` with ``isolation.level=read_committed``
(only records of committed processor transactions) and manual commits:

=====================  ==================  ===========================================
topic                  key                 value
=====================  ==================  ===========================================
``gnomon.jobs``        job_id              JobState (codec); tombstone = job deleted
``gnomon.runs``        run_id              RunState (codec); tombstones are ignored
``gnomon.run-logs``    run_id              LogLine (codec)
=====================  ==================  ===========================================

Each batch (at most ``batch_max`` records) is decoded, coalesced to the last record per
key (a job, a run, a log line), written with ``store.write_batch`` (concurrent
statements, bounded; each state goes with its record's bytes, which the store may keep
instead of encoding the state again), and only then are its offsets committed. So delivery into the
store is at-least-once and every write is an idempotent upsert; a crash or a failed
commit replays a few records, which converge to the same rows.

A batch whose write fails is retried ``write_attempts`` times with backoff; then the
consumer is rewound to the batch's first offsets (nothing is skipped) and
``HistoryStoreError`` is raised from ``run_once``; ``run`` logs it, waits and goes on.

Exports: with ``exporter`` (``gnomon.history.export.RunExportPublisher``; the production
projector has one), each batch's runs that reached a final status are published to
``gnomon.run-exports`` after the store write and before the commit, as part of the same
retried step: a failed publish replays the batch like a failed write (at-least-once; the
sinks upsert by run_id).

Records that cannot be decoded (or carry the wrong type, or no usable key) are poison:
``on_poison(msg, reason)`` is called, then the record is skipped and counted in
``stats.poison``. The default hook logs; pass ``poison_sink`` (or override
``on_poison``) to forward them, e.g. to ``gnomon.poison``. The hook may see a record
again if its batch is replayed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gnomon import region
from gnomon.core.control import is_control
from gnomon.core.errors import EventLogError, HistoryStoreError
from gnomon.core.jobs import JobState
from gnomon.core.messages import LogLine
from gnomon.core.runs import RunState
from gnomon.eventlog.port import EventLog, GroupConsumer, Record
from gnomon.history.base import HistoryBatch, ProjectionStore
from gnomon.history.export import CLIENT_ID as EXPORT_CLIENT_ID
from gnomon.history.export import RunExportPublisher
from gnomon.metrics.projector import ProjectorMetrics
from gnomon.retrying import Retry
from gnomon.topology import load_topology

__all__ = ["GROUP_ID", "HistoryProjector", "ProjectorStats"]

log = logging.getLogger("gnomon.history.projector")

GROUP_ID = "gnomon-history"
JOBS, RUNS, LOGS = "jobs", "runs", "logs"
# The topology role of each: its name there is the codec topic (schema subject) the
# records are decoded with, whatever the consumed topic is called.
_TOPOLOGY_ROLE = {JOBS: "jobs", RUNS: "runs", LOGS: "run_logs"}
_TYPE = {JOBS: JobState, RUNS: RunState, LOGS: LogLine}


@dataclass
class _Pending:
    """A batch being read: the last record per key, and the bytes of each state."""

    jobs: dict[str, JobState | None] = field(default_factory=dict)  # None: a tombstone
    runs: dict[str, RunState] = field(default_factory=dict)
    logs: dict[tuple[str, int, int], LogLine] = field(default_factory=dict)
    job_blobs: dict[str, bytes] = field(default_factory=dict)
    run_blobs: dict[str, bytes] = field(default_factory=dict)

    def batch(self) -> HistoryBatch:
        return HistoryBatch(
            jobs=[s for s in self.jobs.values() if s is not None],
            deleted_jobs=[j for j, s in self.jobs.items() if s is None],
            runs=list(self.runs.values()),
            logs=list(self.logs.values()),
            job_blobs=self.job_blobs,
            run_blobs=self.run_blobs,
        )


@dataclass
class ProjectorStats:
    records: int = 0  # consumed (every record, poison included)
    jobs: int = 0  # job states written (after coalescing)
    jobs_deleted: int = 0
    runs: int = 0
    exported: int = 0  # run exports published (final runs; again when a batch is replayed)
    logs: int = 0
    poison: int = 0
    ignored: int = 0  # tombstones on gnomon.runs / gnomon.run-logs
    batches: int = 0
    write_failures: int = 0  # batches given up after write_attempts (then replayed)
    commit_failures: int = 0


ROLE = "projector"  # Kafka principal User:projector of the production projector (gnomon.infra.acls)
COMMIT_TIMEOUT_S = 10.0


def _quiet(_tps: list[tuple[str, int]]) -> None:
    """Rebalances need nothing of the projector: a new owner starts at the last commit."""


class HistoryProjector:
    def __init__(
        self,
        store: ProjectionStore,
        log: EventLog,
        *,
        topics: Mapping[str, str] | None = None,
        group_id: str = GROUP_ID,
        batch_max: int = 500,
        poll_timeout_s: float = 0.5,
        write_attempts: int = 5,
        retry_backoff_s: float = 0.2,
        retry_backoff_max_s: float = 5.0,
        session_timeout_ms: int = 10_000,
        consumer_config: Mapping[str, Any] | None = None,
        poison_sink: Callable[[Record, str], None] | None = None,
        owns_store: bool = False,
        exporter: RunExportPublisher | None = None,
    ) -> None:
        """``log``: the event log it reads (Kafka in production, the in-memory log in the
        simulation and unit tests); ``topics`` maps roles ``jobs``/``runs``/``logs`` to
        topic names (default: the topology's); ``group_id``: the group as named in the
        default namespace (joined as the topology's namespace's id of it, gnomon.region);
        ``consumer_config``: adapter tuning (librdkafka keys)."""
        if batch_max < 1 or write_attempts < 1:
            raise ValueError("batch_max and write_attempts must be >= 1")
        self.store = store
        topo = load_topology()
        self._codec_topic = {role: getattr(topo, name) for role, name in _TOPOLOGY_ROLE.items()}
        if topics is None:
            topics = self._codec_topic
        if set(topics) != set(_TOPOLOGY_ROLE):
            raise ValueError(f"topics must map exactly {sorted(_TOPOLOGY_ROLE)}; got {sorted(topics)}")
        self.topics = dict(topics)
        self._role = {name: role for role, name in self.topics.items()}
        self.group_id = group_id = region.group_id(group_id, topo.region)  # the namespace's id of it
        self.batch_max = batch_max
        self.poll_timeout_s = poll_timeout_s
        self.write_attempts = write_attempts
        self.retry_backoff_s = retry_backoff_s
        self.retry_backoff_max_s = retry_backoff_max_s
        self.poison_sink = poison_sink
        self.owns_store = owns_store
        self.exporter = exporter
        self.stats = ProjectorStats()
        self.metrics = ProjectorMetrics(group_id)  # a registry of its own; the CLI serves it
        self._stop = threading.Event()
        self.consumer: GroupConsumer = log.group_consumer(group_id, client_id="gnomon-history",
                                                          session_timeout_ms=session_timeout_ms,
                                                          config=consumer_config)
        self.consumer.subscribe(list(self.topics.values()), on_assign=_quiet, on_revoke=_quiet, on_lost=_quiet)

    @classmethod
    def from_settings(cls, settings: Any, **kwargs: Any) -> HistoryProjector:
        """The production projector: Cassandra from ``settings`` (schema applied if
        missing), Kafka at ``settings.kafka_bootstrap`` as principal ``projector``,
        finished runs published to the run-exports topic."""
        from gnomon.eventlog.kafka import KafkaEventLog
        from gnomon.history.cassandra import CassandraHistoryStore

        log = KafkaEventLog(settings.kafka_bootstrap, role=ROLE)
        if "exporter" not in kwargs:
            kwargs["exporter"] = RunExportPublisher(log.producer(client_id=EXPORT_CLIENT_ID),
                                                    load_topology().run_exports)
        store = CassandraHistoryStore(settings.cassandra_hosts, settings.cassandra_port, ensure_schema=True)
        return cls(store, log, owns_store=True, **kwargs)

    # ---- hooks ---------------------------------------------------------------------------

    def on_poison(self, rec: Record, reason: str) -> None:
        """A record that cannot be projected; it is skipped after this returns."""
        self.stats.poison += 1
        self.metrics.poison.labels(rec.topic).inc()
        log.warning("poison %s[%s]@%s skipped: %s", rec.topic, rec.partition, rec.offset, reason)
        if self.poison_sink is not None:
            self.poison_sink(rec, reason)

    # ---- loop ----------------------------------------------------------------------------

    def run(self, stop_event: threading.Event, poll_timeout_s: float | None = None) -> None:
        """Project until ``stop_event`` is set; then close the consumer (and the store,
        if owned). Store outages are waited out (the batch is replayed, never skipped);
        an event-log error raises ``EventLogError``."""
        if poll_timeout_s is not None:
            self.poll_timeout_s = poll_timeout_s
        self._stop = stop_event
        log.info("history projector: group %s, topics %s", self.group_id, ", ".join(self.topics.values()))
        failures = 0  # batches given up in a row
        try:
            while not stop_event.is_set():
                try:
                    self.run_once(self.batch_max)
                    failures = 0
                except HistoryStoreError as exc:
                    log.error("history write failed, will replay the batch: %s", exc)
                    failures += 1
                    stop_event.wait(self._write_retry().delay_s(failures))
        finally:
            log.info("history projector stopping: %s", self.stats)
            self.close()

    def run_once(self, max_messages: int = 500, timeout_s: float | None = None) -> int:
        """Consume up to ``max_messages`` (at most ``batch_max``) records, waiting up to
        ``timeout_s`` for the first one; write them; commit. Returns records consumed."""
        n = max(1, min(max_messages, self.batch_max))
        # the first record waits up to the timeout; the rest of the batch is what is there
        # already (a consume of n waits until n come or the timeout passes)
        recs = self.consumer.consume(1, self.poll_timeout_s if timeout_s is None else timeout_s)
        self.metrics.lag(self.consumer, list(self.topics.values()))
        if not recs:
            return 0
        if n > 1:
            recs += self.consumer.consume(n - 1, 0)
        return self._process(recs)

    def _process(self, recs: Sequence[Record]) -> int:
        pending = _Pending()
        first: dict[tuple[str, int], int] = {}
        last: dict[tuple[str, int], int] = {}
        count = 0
        for rec in recs:
            count += 1
            self.metrics.records.labels(rec.topic).inc()
            tp = (rec.topic, rec.partition)
            first.setdefault(tp, rec.offset)
            last[tp] = rec.offset
            self._route(rec, pending)
        self.stats.records += count
        if not last:
            return count
        batch = pending.batch()
        if len(batch):
            self._write(batch, first)
        self.stats.batches += 1
        self.metrics.batches.inc()
        self.stats.jobs += len(batch.jobs)
        self.stats.jobs_deleted += len(batch.deleted_jobs)
        self.stats.runs += len(batch.runs)
        self.stats.logs += len(batch.logs)
        self._commit(last)
        return count

    def _route(self, msg: Record, pending: _Pending) -> None:
        from gnomon.codec import DecodeError, decode

        role = self._role.get(msg.topic)
        if role is None:
            self.on_poison(msg, f"not a topic of the history projector: {msg.topic}")
            return
        if is_control(msg.key):  # a control record (docs/adr/0012): no history in it
            self.stats.ignored += 1
            return
        value = msg.value
        if value is None:
            if role != JOBS:
                self.stats.ignored += 1  # runs stay in history after the ledger forgets them
                return
            try:
                job_id = (msg.key or b"").decode()
            except UnicodeDecodeError:
                job_id = ""
            if not job_id:
                self.on_poison(msg, "tombstone without a job_id key")
                return
            pending.jobs.pop(job_id, None)
            pending.jobs[job_id] = None
            pending.job_blobs.pop(job_id, None)
            return
        try:
            obj = decode(value, self._codec_topic[role])
        except DecodeError as exc:
            self.on_poison(msg, f"DecodeError: {exc.message}")
            return
        if not isinstance(obj, _TYPE[role]):
            self.on_poison(msg, f"a {type(obj).__name__} on the {role} topic")
            return
        if isinstance(obj, JobState):
            if obj.moved_to is not None:
                # moved to another region (ADR 0013): history's row is shared by the regions,
                # and the new home's projector writes it; this one's last word would race it
                pending.jobs.pop(obj.job_id, None)
                pending.job_blobs.pop(obj.job_id, None)
                return
            pending.jobs.pop(obj.job_id, None)
            pending.jobs[obj.job_id] = obj
            pending.job_blobs[obj.job_id] = bytes(value)
        elif isinstance(obj, RunState):
            pending.runs[obj.run_id] = obj
            pending.run_blobs[obj.run_id] = bytes(value)
        else:
            assert isinstance(obj, LogLine)
            pending.logs[(obj.run_id, obj.attempt, obj.seq)] = obj

    def _write_retry(self) -> Retry:
        """Store writes: ``write_attempts`` in all, while not stopping; the wait ends on stop."""
        return Retry(self.write_attempts, self.retry_backoff_s, max(self.retry_backoff_s, self.retry_backoff_max_s),
                     retriable=lambda exc: isinstance(exc, HistoryStoreError) and not self._stop.is_set(),
                     sleep=self._stop.wait)

    def _write(self, batch: HistoryBatch, first: Mapping[tuple[str, int], int]) -> None:
        def retrying(attempt: int, exc: BaseException, _: float) -> None:
            log.warning("history write attempt %d/%d failed: %s", attempt, self.write_attempts, exc)

        def step() -> None:
            self.store.write_batch(batch)
            if self.exporter is not None and batch.runs:
                self.stats.exported += self.exporter.publish(batch.runs)

        try:
            with self.metrics.write_seconds.time():  # the store write and the exports' publish
                self._write_retry().call(step, on_retry=retrying)
        except HistoryStoreError:
            self.stats.write_failures += 1
            self.metrics.write_failures.inc()
            self._rewind(first)
            raise

    def _rewind(self, first: Mapping[tuple[str, int], int]) -> None:
        """Make the consumer read the failed batch again."""
        for (topic, partition), offset in first.items():
            try:
                self.consumer.seek((topic, partition), offset)
            except EventLogError as exc:  # revoked meanwhile: its new owner starts at the commit
                log.warning("cannot rewind %s[%d] to %d: %s", topic, partition, offset, exc)

    def _commit(self, last: Mapping[tuple[str, int], int]) -> None:
        try:
            self.consumer.commit({tp: off + 1 for tp, off in last.items()}, COMMIT_TIMEOUT_S)
        except EventLogError as exc:  # e.g. a rebalance: the records are replayed, idempotently
            self.stats.commit_failures += 1
            self.metrics.commit_failures.inc()
            log.warning("offset commit failed (records will be re-applied): %s", exc)

    def close(self) -> None:
        try:
            self.consumer.close()
        except Exception as exc:  # closing twice, or a broker gone: nothing left to do
            log.debug("consumer close: %s", exc)
        if self.exporter is not None:
            try:
                self.exporter.close()
            except Exception as exc:  # Kafka gone: the batch was not committed, it is replayed
                log.debug("exporter close: %s", exc)
        if self.owns_store:
            self.store.close()
