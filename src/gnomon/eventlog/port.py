"""The event-log port: what the processor, its feeds and the worker need of Kafka.

Five small interfaces, each mapping one kind of Kafka client:

* ``Reader``: a consumer outside any group (assign, consume, positions, watermarks, the
  committed offsets of its group id, pause/resume): changelog restores and standbys,
  adverts, tenant limits, the history watermark, a worker's inbox;
* ``GroupConsumer``: a member of a consumer group with rebalance callbacks (assigned,
  revoked, lost), committed positions and seek (the processor's input), and a plain
  offset commit outside any transaction (the history projector's at-least-once input);
* ``TransactionalProducer``: begin / produce / send offsets / commit / abort. Its
  contract: a ``TransactionError`` that is not ``fatal`` means "abort, then rewind
  state and positions to the last commit"; a ``fatal`` one means the producer is unusable
  (fenced by a newer instance, or its transaction timed out): build a new one and rewind;
  ``retriable`` ones may be retried as they are. ``send_offsets`` carries the consumer
  group's metadata (KIP-447), so a member whose generation is stale cannot commit;
* ``Producer``: plain, non-transactional, with backpressure (``produce`` waits while the
  local queue is full) and optional delivery reports (the worker); ``produce`` and
  ``poll`` raise ``ProducerFatalError`` once it can deliver nothing again;
* ``EventLog``: makes the clients and reads a partition's end offset or its records to
  the end.

Records are delivered as ``Record`` values, never with an error: adapters log or raise
(``gnomon.core.errors.EventLogError``) at their edge. ``config`` arguments are
adapter-specific tuning (librdkafka settings); other implementations ignore them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gnomon.core.errors import EventLogError

TP = tuple[str, int]  # (topic, partition)
Headers = tuple[tuple[str, bytes], ...]  # a record's headers
OFFSET_BEGINNING = -2  # as librdkafka: the first offset still on the log
OFFSET_END = -1  # the end of the log as of the assignment


@dataclass(frozen=True, slots=True)
class Record:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int
    headers: Headers = ()  # (name, value) pairs, as written (the job commands' signature)


class TransactionError(EventLogError):
    """A transactional call failed. ``fatal``: the producer is unusable; ``retriable``:
    the same call may succeed again; otherwise abort and rewind."""

    def __init__(self, message: str, *, fatal: bool = False, retriable: bool = False) -> None:
        super().__init__(message)
        self.fatal = fatal
        self.retriable = retriable


class ProducerFatalError(EventLogError):
    """A plain producer can deliver nothing again (an idempotent producer's fatal state):
    build a new one and send again what was not acknowledged."""


Partitions = Callable[[list[TP]], None]  # a rebalance callback: the partitions concerned


class Reader(Protocol):
    def assign(self, positions: Sequence[tuple[str, int, int]]) -> None:
        """Read exactly these (topic, partition, offset); offset may be OFFSET_BEGINNING/END."""
        ...
    def consume(self, max_records: int, timeout_s: float) -> list[Record]: ...
    def position(self, tps: Sequence[TP]) -> dict[TP, int]:
        """The next offset to read; -1 when not known yet."""
        ...
    def watermarks(self, tp: TP, timeout_s: float = 10.0, *, cached: bool = False) -> tuple[int, int]: ...
    def committed(self, tps: Sequence[TP], timeout_s: float) -> dict[TP, int | None]:
        """The committed offsets of this reader's group id (None: none committed)."""
        ...
    def partitions(self, topic: str, timeout_s: float = 10.0) -> list[int]:
        """The topic's partitions; EventLogError when it does not exist."""
        ...
    def offsets_for_time(self, topic: str, partitions: Sequence[int], ts_ms: int,
                         timeout_s: float = 10.0) -> dict[int, int]:
        """Per partition the first offset with a timestamp >= ts_ms; -1 (OFFSET_END) if none."""
        ...
    def pause(self, tps: Sequence[TP]) -> None: ...
    def resume(self, tps: Sequence[TP]) -> None: ...
    def close(self) -> None: ...


class GroupConsumer(Protocol):
    def subscribe(self, topics: Sequence[str], *, on_assign: Partitions, on_revoke: Partitions,
                  on_lost: Partitions) -> None: ...
    def consume(self, max_records: int, timeout_s: float) -> list[Record]:
        """The next batch; rebalance callbacks run inside this call."""
        ...
    def assignment(self) -> list[TP]: ...
    def position(self, tps: Sequence[TP]) -> dict[TP, int]: ...
    def high_watermark(self, tp: TP) -> int:
        """The last known end offset (no round trip); -1 when unknown."""
        ...
    def committed(self, tps: Sequence[TP], timeout_s: float) -> dict[TP, int | None]: ...
    def seek(self, tp: TP, offset: int) -> None: ...
    def commit(self, offsets: Mapping[TP, int], timeout_s: float) -> None:
        """Commit these next offsets for the group, outside any transaction (at-least-once:
        what was read after the last commit is read again by the partition's next owner).
        EventLogError when refused, e.g. the member's generation is stale after a rebalance."""
        ...
    def group_metadata(self) -> Any:
        """Opaque: what ``TransactionalProducer.send_offsets`` needs for fencing."""
        ...
    def close(self) -> None: ...


class TransactionalProducer(Protocol):
    def init_transactions(self, timeout_s: float) -> None:
        """Claim the transactional id: fences older producers with the same id and
        aborts what they left open."""
        ...
    def begin(self) -> None: ...
    def produce(self, topic: str, key: bytes | None, value: bytes | None, partition: int | None = None,
                headers: Headers = ()) -> None: ...
    def send_offsets(self, offsets: Mapping[TP, int], group_metadata: Any, timeout_s: float) -> None: ...
    def partitions(self, topic: str, timeout_s: float) -> int:
        """How many partitions ``topic`` has, asked of the cluster now: afterwards this
        producer writes to each of them (its metadata is refreshed). EventLogError when
        the cluster does not answer."""
        ...
    def commit(self, timeout_s: float) -> None: ...
    def abort(self, timeout_s: float) -> None: ...
    def flush(self, timeout_s: float) -> int: ...


# a delivery report: (None, partition, offset) when written there, else (the error's text, -1, -1)
Delivery = Callable[[str | None, int, int], None]


class Producer(Protocol):
    def produce(self, topic: str, key: bytes | None, value: bytes | None, *, on_delivery: Delivery | None = None,
                headers: Headers = ()) -> None:
        """Queue a record (partition by key, murmur2); waits while the local queue is full.
        EventLogError: the record can never be sent (e.g. too large)."""
        ...
    def poll(self, timeout_s: float) -> int:
        """Serve delivery reports; how many."""
        ...
    def flush(self, timeout_s: float) -> int:
        """Wait for every queued record; how many are still undelivered."""
        ...


class EventLog(Protocol):
    def reader(self, group_id: str, *, client_id: str | None = None,
               config: Mapping[str, Any] | None = None) -> Reader: ...
    def group_consumer(self, group_id: str, *, client_id: str, session_timeout_ms: int,
                       config: Mapping[str, Any] | None = None) -> GroupConsumer: ...
    def transactional_producer(self, transactional_id: str, *, client_id: str, transaction_timeout_ms: int,
                               config: Mapping[str, Any] | None = None) -> TransactionalProducer: ...
    def producer(self, *, client_id: str, config: Mapping[str, Any] | None = None) -> Producer: ...
    def end_offset(self, topic: str, partition: int) -> int:
        """EventLogError when it cannot be read."""
        ...
    def read_to_end(self, topic: str, partition: int, timeout_s: float, start: int | None = None) -> Iterator[Record]:
        """Every committed record of one partition from ``start`` (default: the beginning)
        to the current end, read once no transaction is open on it (a previous owner's
        commit in flight is waited for, not missed). EventLogError when the end is not
        reached in time."""
        ...
