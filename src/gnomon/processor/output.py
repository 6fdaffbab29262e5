"""What a partition's task hands its runtime to produce: one record (``Output``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Output:
    """A record to produce. ``partition`` None: let the partitioner pick by key."""

    topic: str
    key: str
    value: Any  # a codec-encodable object, or None for a tombstone
    partition: int | None = None
    encoded: bytes | None = None  # ``value`` already encoded for ``topic`` (state writes reuse it)
    final: bool = False  # a ledger write of a run that has just become final (metrics count it)
    headers: tuple[tuple[str, bytes], ...] = ()  # a forwarded record's (``gnomon.processor.growth``)
