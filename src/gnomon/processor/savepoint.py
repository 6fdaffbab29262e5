"""Undo one record's writes: how one bad record is isolated inside a batch's transaction.

A processor applies a batch of records to its partitions' stores and commits outputs,
changelogs and offsets in one Kafka transaction. If applying one record raises halfway
(a state-machine refusal after a first write, or a bug that a hostile value reaches),
the batch must neither stop nor commit that record's half: ``JournalKV`` remembers, for
every key the record writes, the value it had before, and ``rollback`` puts those back.
The record is then answered or sent to the poison topic, and the batch goes on; the
transaction commits the other records as usual. (Aborting the transaction instead would
cost a rebuild of every partition's state per bad record.)

The journal costs one read per distinct key a record writes (none for a key the record
read first: that value is kept, or whose value the caller knows: ``assume``, for the
index entries a state change adds or removes), and nothing when no savepoint is open (restores and
standbys write through it unjournaled).

The same journal, one level out, covers a whole transaction (``PartitionTask.txn_begin``):
every write since the last commit, so that an aborted transaction puts the partition back
at its last commit instead of rebuilding it from its changelogs. That journal has a
bound of its own (``overflow_raises=False``): past it, it stops journaling and says so
(``overflowed``), and the partition is rebuilt as before.
"""

from __future__ import annotations

from collections.abc import Iterator

from gnomon.ports import KeyValueStore

UNDO_KEYS_MAX = 1_000_000  # keys one record may write before the journal refuses (a runaway record)


class RecordTooLarge(Exception):
    """One record wrote more than ``UNDO_KEYS_MAX`` keys under a savepoint."""


class JournalKV:
    """A ``KeyValueStore`` that can take back the writes made since ``begin``."""

    def __init__(self, inner: KeyValueStore, *, keys_max: int = UNDO_KEYS_MAX, overflow_raises: bool = True,
                 reads_kept_max: int | None = None) -> None:
        self.inner = inner
        self._undo: dict[bytes, bytes | None] | None = None
        self._read: dict[bytes, bytes | None] = {}  # read since ``begin``, not yet written
        self.keys_max = keys_max
        # values read kept for a later write's journal entry (past it, that write reads again)
        self.reads_kept_max = keys_max if reads_kept_max is None else reads_kept_max
        self.overflow_raises = overflow_raises  # False: past keys_max, stop journaling (``overflowed``)
        self.overflowed = False

    @property
    def open(self) -> bool:
        return self._undo is not None

    def begin(self) -> None:
        assert self._undo is None, "savepoints do not nest"
        self._undo = {}
        self._read.clear()
        self.overflowed = False

    def release(self) -> dict[bytes, bytes | None] | None:
        """Keep what was written since ``begin``; the values those keys had then (None
        when nothing was journaled: not open, or rolled back)."""
        undo, self._undo = self._undo, None
        self._read.clear()
        self.overflowed = False
        return undo

    def absorb(self, priors: dict[bytes, bytes | None]) -> None:
        """Journal writes made past this journal (an inner savepoint's, kept: ``priors``
        are the values their keys had before it); a key journaled already keeps its
        older value."""
        undo = self._undo
        if undo is None:
            return
        read = self._read
        for key, old in priors.items():
            if key in undo:
                continue
            if len(undo) >= self.keys_max:
                self._overflow()
                return
            undo[key] = old
            read.pop(key, None)

    def _overflow(self) -> None:
        """More than ``keys_max`` keys written: RecordTooLarge, or (``overflow_raises``
        False) journal no more: too much to take back, the caller rebuilds instead."""
        if self.overflow_raises:
            raise RecordTooLarge(f"one record wrote more than {self.keys_max} keys")
        self._undo = None
        self._read.clear()
        self.overflowed = True

    def written(self) -> list[bytes]:
        """The keys written since ``begin``."""
        return list(self._undo or ())

    def rollback(self) -> int:
        """Put back every key written since ``begin``; the number of keys restored."""
        undo, self._undo = self._undo, None
        self._read.clear()
        if undo is None:
            return 0
        for key, old in undo.items():
            if old is None:
                self.inner.delete(key)
            else:
                self.inner.put(key, old)
        return len(undo)

    def assume(self, key: bytes, prior: bytes | None) -> None:
        """The caller knows ``key``'s value before this record (an index entry it is adding,
        None, or removing, b""): its next write is journaled without a read. A wrong guess
        only matters to a rollback (an index entry left or lost, which the tick's scans
        treat as stale)."""
        undo = self._undo
        if undo is not None and key not in undo and key not in self._read:
            self._read[key] = prior

    def _remember(self, key: bytes) -> None:
        undo = self._undo
        if undo is not None and key not in undo:
            if len(undo) >= self.keys_max:
                self._overflow()
                return
            read = self._read
            undo[key] = read.pop(key) if key in read else self.inner.get(key)

    # ---- KeyValueStore ------------------------------------------------------------------

    def get(self, key: bytes) -> bytes | None:
        value = self.inner.get(key)
        if self._undo is not None and key not in self._undo and len(self._read) < self.reads_kept_max:
            self._read[key] = value  # its value before this record, should it write it
        return value

    def put(self, key: bytes, value: bytes) -> None:
        self._remember(key)
        self.inner.put(key, value)

    def delete(self, key: bytes) -> None:
        self._remember(key)
        self.inner.delete(key)

    def scan(self, start: bytes, stop: bytes, limit: int) -> Iterator[tuple[bytes, bytes]]:
        return self.inner.scan(start, stop, limit)

    def size(self) -> tuple[int, int]:
        return self.inner.size()

    def close(self) -> None:
        self._undo = None
        self._read.clear()
        self.inner.close()
