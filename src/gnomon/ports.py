"""The narrow interfaces between gnomon's core and the outside world, in one place.

Adapters (Kafka, RocksDB, Cassandra) implement these and translate their library's
errors into ``gnomon.core.errors`` (EventLogError, StateStoreError, HistoryStoreError).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gnomon.core.clock import Clock  # re-exported: the clock port
from gnomon.core.jobs import JobState
from gnomon.core.messages import LogLine
from gnomon.core.runs import RunState

__all__ = ["Clock", "HistoryStore", "KeyValueStore", "Page"]


class KeyValueStore(Protocol):
    """An ordered byte-key store (RocksDB via rocksdict in production)."""

    def get(self, key: bytes) -> bytes | None: ...
    def put(self, key: bytes, value: bytes) -> None: ...
    def delete(self, key: bytes) -> None: ...
    def scan(self, start: bytes, stop: bytes, limit: int) -> Iterator[tuple[bytes, bytes]]:
        """Keys in [start, stop) in byte order, at most ``limit`` of them."""
        ...
    def size(self) -> tuple[int, int]:
        """(keys, bytes) held, estimated; for status logs."""
        ...
    def close(self) -> None: ...


@dataclass(frozen=True)
class Page:
    items: Sequence[Any]
    cursor: str | None  # opaque; None = no more


class HistoryStore(Protocol):
    """Queryable history (Cassandra keyspace ``gnomon`` in production)."""

    def put_job(self, state: JobState) -> None: ...
    def delete_job(self, tenant: str, job_id: str) -> None: ...
    def get_job(self, job_id: str) -> JobState | None: ...
    def list_jobs(self, tenant: str, limit: int, cursor: str | None) -> Page: ...
    def put_run(self, state: RunState) -> None: ...
    def get_run(self, run_id: str) -> RunState | None: ...
    def list_runs(self, job_id: str, status: str | None, limit: int, cursor: str | None) -> Page:
        """Runs of a job, newest slot first."""
        ...
    def put_log(self, line: LogLine) -> None: ...
    def get_logs(self, run_id: str, limit: int, cursor: str | None) -> Page: ...
    def list_dead_letters(self, tenant: str, limit: int, cursor: str | None) -> Page: ...
    def close(self) -> None: ...
