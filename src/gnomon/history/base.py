"""What every gnomon HistoryStore shares beyond ``gnomon.ports.HistoryStore``: the batch
the projector writes, and argument checks."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from gnomon.core.errors import ValidationError
from gnomon.core.jobs import JobState
from gnomon.core.messages import LogLine
from gnomon.core.runs import RunState, RunStatus
from gnomon.ports import HistoryStore

__all__ = ["HistoryBatch", "ProjectionStore", "parse_status"]

STATUS_SCAN_MAX = 5000  # rows a filtered list_runs / list_dead_letters call looks at, at most


@dataclass(frozen=True)
class HistoryBatch:
    """Writes to apply together (in any order: each key appears at most once).

    ``deleted_jobs`` are job ids whose ``gnomon.jobs`` record was a tombstone: the store
    finds their tenant itself. The projector coalesces a batch to the last record per key.

    ``job_blobs`` (by job_id) and ``run_blobs`` (by run_id) are optional: the
    ``gnomon.codec`` bytes a state was decoded from (its Kafka record's value). A store
    that keeps encoded states may store them instead of encoding the state again (the
    Cassandra store does, when they carry the schema id ``encode`` would write); others
    ignore them. A blob must decode to exactly its state.
    """

    jobs: Sequence[JobState] = ()
    deleted_jobs: Sequence[str] = ()
    runs: Sequence[RunState] = ()
    logs: Sequence[LogLine] = ()
    job_blobs: Mapping[str, bytes] = field(default_factory=dict)
    run_blobs: Mapping[str, bytes] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.jobs) + len(self.deleted_jobs) + len(self.runs) + len(self.logs)


class ProjectionStore(HistoryStore, Protocol):
    """A HistoryStore the projector can write to in batches."""

    def write_batch(self, batch: HistoryBatch) -> None: ...
    def forget_job(self, job_id: str) -> None: ...


def parse_status(status: str | None) -> RunStatus | None:
    """``list_runs``' status filter: None (all) or a RunStatus value such as ``"failed"``."""
    if status is None:
        return None
    try:
        return RunStatus(status)
    except ValueError:
        allowed = ", ".join(s.value for s in RunStatus)
        raise ValidationError("status", f"must be one of {allowed}; got {status!r}") from None
