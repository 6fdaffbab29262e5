"""The run-exports stream: the history projector publishes each finished run it stored.

Why the projector (and not the processor): the export is a projection, like the
Cassandra history, and follows the same rule: a run is exported once its final state is
stored, so a row in PostgreSQL is always a run the history API also knows. It keeps the
processor's transaction (the scheduling hot path) as it is, and the projector already
decodes every RunState of the ledger. It reads the ledger ``gnomon.runs`` before the
retention purge tombstones a run (the processor purges only runs history has), and
writes to ``gnomon.run-exports``, which is not compacted and never tombstoned (7 d).

Delivery is at-least-once: the projector writes the store, then publishes the exports
of the batch's final runs and waits for Kafka's acknowledgement, and only then commits
its offsets. A crash or a failed publish replays the batch: the same records again, in
the same order per run (keyed by ``run_id``, so one partition per run). Sinks therefore
upsert by ``run_id`` (the JDBC sink's ``insert.mode=upsert``) or keep the last line; a
dead letter replayed to a new final state is exported again and wins by order (and by
``updated_at_ms``).
"""

from __future__ import annotations

from collections.abc import Sequence

from gnomon.core.errors import EventLogError, HistoryStoreError
from gnomon.core.exports import RunExport, export_of
from gnomon.core.runs import RunState
from gnomon.eventlog.port import Producer

__all__ = ["ExportPublishError", "RunExportPublisher"]

CLIENT_ID = "gnomon-run-exports"


class ExportPublishError(HistoryStoreError):
    """Publishing the exports of a stored batch failed. A HistoryStoreError because the
    projector treats it like a failed store write: retried, then the batch is replayed."""


class RunExportPublisher:
    """Produces one ``RunExport`` (Confluent-framed Avro, key ``run_id``) per final run, on
    a plain producer of the event-log port."""

    def __init__(self, producer: Producer, topic: str, *, flush_timeout_s: float = 30.0) -> None:
        from gnomon.topology import load_topology

        self.producer = producer
        self.topic = topic
        # the value schema is the run-exports role's, whatever the topic is called (tests)
        self._codec_topic = load_topology().run_exports
        self.flush_timeout_s = flush_timeout_s
        self.published = 0

    @classmethod
    def connect(cls, bootstrap: str, *, role: str | None = None, topic: str | None = None) -> RunExportPublisher:
        from gnomon.eventlog.kafka import KafkaEventLog
        from gnomon.topology import load_topology

        producer = KafkaEventLog(bootstrap, role=role).producer(client_id=CLIENT_ID)
        return cls(producer, topic or load_topology().run_exports)

    def exports(self, runs: Sequence[RunState]) -> list[RunExport]:
        return [e for e in (export_of(r) for r in runs) if e is not None]

    def publish(self, runs: Sequence[RunState]) -> int:
        """Publish the exports of the final runs among ``runs`` and wait until Kafka has
        them all. Returns how many; raises ExportPublishError if any was not delivered."""
        from gnomon.codec import encode

        exports = self.exports(runs)
        if not exports:
            return 0
        failed: list[str] = []

        def delivered(err: str | None, _partition: int, _offset: int) -> None:
            if err is not None:
                failed.append(err)

        try:
            for e in exports:
                self.producer.produce(self.topic, e.run_id.encode(), encode(e, self._codec_topic),
                                      on_delivery=delivered)
            left = self.producer.flush(self.flush_timeout_s)
        except EventLogError as exc:
            raise ExportPublishError(f"publishing run exports to {self.topic}: {exc}") from exc
        if left or failed:
            raise ExportPublishError(
                f"publishing run exports to {self.topic}: {left} not acknowledged in {self.flush_timeout_s}s, "
                f"{len(failed)} failed{': ' + failed[0] if failed else ''}")
        self.published += len(exports)
        return len(exports)

    def close(self) -> None:
        self.producer.flush(self.flush_timeout_s)
