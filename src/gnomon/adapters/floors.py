"""Skip the deleted head of a time-ordered index (RocksDB's queue problem).

A processor keeps time-ordered indexes in its store (``j<prio>/<ms>/<job>``: a job's
next slot; ``rt/<ms>/<run>``: a run's timer; ``rp/<ms>/<run>``: a purge) and scans them from
their start on every tick. Each slot deletes the entry it consumed, and RocksDB keeps a
deleted key as a tombstone until a compaction drops it, so a scan from the start of an
index walks over every entry consumed since the last compaction before it reaches a
live one: with 200 per-second jobs that was 35 % of the processor's CPU
(``bench/steady.py --jobs 200 --profile-s 60``, own time of ``RocksKV.scan``). The
waiting-run indexes (one per pool, lane and priority) are scanned every tick on every
partition and emptied as runs find room: the same.

``FloorKV`` remembers, per index, a *floor*: a key below which the index holds no live
entry. A scan starts at ``max(start, floor)`` and is not run at all when that is past its
stop; a scan that started at or below the floor raises it to the first live key it meets
(when it met none before its stop, to the first live key after it); a put below the
floor lowers it to that key. The floor is a cache of what scans saw, never a
decision: it starts at the index's beginning when a store is opened (the first scan
walks the tombstones once) and only the store's own writes move it down, so every scan
returns what it would without the floor (``tests/unit/test_floors.py`` holds both
against each other over random operations).
"""

from __future__ import annotations

from collections.abc import Iterator

from gnomon.ports import KeyValueStore

# The indexes of a partition's store that are consumed from their head (the key layout
# is gnomon.processor.task's): a due job (j<prio>/<ms>/<job>, one index per priority; jd/
# in stores written before those), a run's timer (rt/<ms>/<run>), a
# run's purge (rp/<ms>/<run>), each by time; and the runs waiting for room in a pool,
# one index per pool, lane and priority (rw/<pool>\0<lane><prio>/<ms>/<run>), scanned
# per tick for each of them on every partition.
TIME_INDEXES: frozenset[bytes] = frozenset({b"j0/", b"j1/", b"j2/", b"jd/", b"rt/", b"rp/"})
WAITING = b"rw/"


def index_of(key: bytes) -> bytes | None:
    """The consumed-from-its-head index ``key`` belongs to (or starts), if any."""
    head = key[:3]
    if head in TIME_INDEXES:
        return head
    if head == WAITING:
        nul = key.find(b"\0", 3)
        if nul > 0 and len(key) >= nul + 3:
            return key[:nul + 3]
    return None


def _index_end(index: bytes) -> bytes:
    """The first key past every key that starts with ``index``."""
    return index[:-1] + bytes([index[-1] + 1])  # (an index never ends in 0xff: "/" or a rank digit)


class FloorKV:
    """A ``KeyValueStore`` whose scans of an index (``index_of``) start past its deleted head."""

    def __init__(self, inner: KeyValueStore) -> None:
        self.inner = inner
        # index -> no live key of that index sorts below this one; at most the index's
        # end, so a key of another index or family is never below a floor. An index not
        # in the map has its floor at its start.
        self._floor: dict[bytes, bytes] = {}

    def floor(self, index: bytes) -> bytes:
        return self._floor.get(index, index)

    def get(self, key: bytes) -> bytes | None:
        return self.inner.get(key)

    def put(self, key: bytes, value: bytes) -> None:
        index = index_of(key)
        if index is not None and key < self._floor.get(index, index):
            self._floor[index] = key
        self.inner.put(key, value)

    def delete(self, key: bytes) -> None:
        self.inner.delete(key)

    def scan(self, start: bytes, stop: bytes, limit: int) -> Iterator[tuple[bytes, bytes]]:
        index = index_of(start)
        if index is None:
            return self.inner.scan(start, stop, limit)  # not a scan from inside one of our indexes
        return self._scan(index, start, stop, limit)

    def _scan(self, index: bytes, start: bytes, stop: bytes, limit: int) -> Iterator[tuple[bytes, bytes]]:
        # (a generator: the floor is read, the inner scan made and the floor updated at the
        # first next(), with no write in between, whenever the scan was created; a put
        # after that lowers the floor again if it must)
        floor = self._floor.get(index, index)
        begin = max(start, floor)
        if begin >= stop or limit <= 0:
            return
        covers_floor = start <= floor  # [start, begin) is known empty: this scan sees from the floor on
        first = True
        for key, value in self.inner.scan(begin, stop, limit):
            if first:
                first = False
                if covers_floor:
                    self._raise(index, key)
            yield key, value
        if first and covers_floor:
            # nothing live in [floor, stop): the floor goes to the first live key past it,
            # so that the next scans with a stop below that key (a tick finding nothing
            # due, five times a second) do not touch the store at all
            end = _index_end(index)
            after = next(iter(self.inner.scan(stop, end, 1)), None) if stop < end else None
            self._raise(index, end if after is None else after[0])

    def _raise(self, index: bytes, key: bytes) -> None:
        key = min(key, _index_end(index))
        if key > self._floor.get(index, index):
            self._floor[index] = key

    def size(self) -> tuple[int, int]:
        return self.inner.size()

    def close(self) -> None:
        self.inner.close()
