"""Where a processor keeps its partitions' state stores and their checkpoints.

``RocksStores`` (production): one RocksDB directory per partition under
``<state_dir>/processor/<instance>/pNNN`` and a ``pNNN.checkpoint`` file beside it.
``MemoryStores`` (the simulation): ``MemoryKV`` stores and checkpoints in dicts; an
instance outlives a Processor object the way a disk outlives a process.

Either opens a store behind a ``FloorKV`` (``gnomon.adapters.floors``): the tick's scans
of the time-ordered indexes start past their deleted head.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Protocol

from gnomon.adapters.floors import FloorKV
from gnomon.adapters.kv import MemoryKV, RocksKV
from gnomon.ports import KeyValueStore
from gnomon.processor.attempts import FileMarker, Marker, MemoryMarker

Checkpoint = dict[str, int]  # changelog topic -> offset, and the time it was written


class StateStores(Protocol):
    def open(self, partition: int, *, fresh: bool) -> KeyValueStore:
        """The partition's store; ``fresh``: emptied first."""
        ...
    def exists(self, partition: int) -> bool: ...
    def take_checkpoint(self, partition: int) -> Checkpoint | None:
        """The partition's checkpoint, deleted as it is read (None: none, or unreadable)."""
        ...
    def put_checkpoint(self, partition: int, checkpoint: Checkpoint) -> None:
        """OSError when it cannot be written."""
        ...
    def marker(self) -> Marker:
        """Where the processor notes the record it is applying (``processor.attempts``)."""
        ...


class RocksStores:
    def __init__(self, state_dir: Path, instance_id: str) -> None:
        self.root = state_dir / "processor" / instance_id
        self._marker: FileMarker | None = None

    def marker(self) -> Marker:
        if self._marker is None:
            self._marker = FileMarker(self.root / "applying")
        return self._marker

    def path(self, partition: int) -> Path:
        return self.root / f"p{partition:03d}"

    def open(self, partition: int, *, fresh: bool) -> KeyValueStore:
        return FloorKV(RocksKV(self.path(partition), fresh=fresh))

    def exists(self, partition: int) -> bool:
        return self.path(partition).is_dir()

    def take_checkpoint(self, partition: int) -> Checkpoint | None:
        ckpt_file = self.path(partition).with_suffix(".checkpoint")
        if not ckpt_file.exists():
            return None
        ckpt: Checkpoint | None = None
        with contextlib.suppress(OSError, ValueError):
            ckpt = {str(k): int(v) for k, v in json.loads(ckpt_file.read_text()).items()}
        ckpt_file.unlink(missing_ok=True)
        return ckpt

    def put_checkpoint(self, partition: int, checkpoint: Checkpoint) -> None:
        ckpt = self.path(partition).with_suffix(".checkpoint")
        tmp = ckpt.with_suffix(".tmp")
        tmp.write_text(json.dumps(checkpoint))
        tmp.replace(ckpt)


class MemoryStores:
    def __init__(self) -> None:
        self.stores: dict[int, MemoryKV] = {}
        self.checkpoints: dict[int, Checkpoint] = {}
        self._marker = MemoryMarker()

    def marker(self) -> Marker:
        return self._marker

    def open(self, partition: int, *, fresh: bool) -> KeyValueStore:
        if fresh or partition not in self.stores:
            self.stores[partition] = MemoryKV()
        return FloorKV(self.stores[partition])

    def exists(self, partition: int) -> bool:
        return partition in self.stores

    def take_checkpoint(self, partition: int) -> Checkpoint | None:
        return self.checkpoints.pop(partition, None)

    def put_checkpoint(self, partition: int, checkpoint: Checkpoint) -> None:
        self.checkpoints[partition] = dict(checkpoint)
