"""Skip the deleted head of a time-ordered index (RocksDB's queue problem).

A processor keeps time-ordered indexes in its store (``jd/<ms>/<job>``: a job's next
slot; ``rt/<ms>/<run>``: a run's timer; ``rp/<ms>/<run>``: a purge) and scans them from
their start on every tick. Each slot deletes the entry it consumed, and RocksDB keeps a
deleted key as a tombstone until a compaction drops it, so a scan from the start of an
index walks over every entry consumed since the last compaction before it reaches a
live one: with 200 per-second jobs that was 35 % of the processor's CPU
(``bench/steady.py --jobs 200 --profile-s 60``, own time of ``RocksKV.scan``).

``FloorKV`` remembers, per index, a *floor*: a key below which the index holds no live
entry. A scan starts at ``max(start, floor)``; a scan that started at or below the floor
raises it to the first live key it meets (or to its stop, when it met none); a put below
the floor lowers it to that key. The floor is a cache of what scans saw, never a
decision: it starts at the index's beginning when a store is opened (the first scan
walks the tombstones once) and only the store's own writes move it down, so every scan
returns what it would without the floor (``tests/unit/test_floors.py`` holds both
against each other over random operations).
"""

from __future__ import annotations

from collections.abc import Iterator

from gnomon.ports import KeyValueStore

# The time-ordered indexes of a partition's store (gnomon.streams.task): a due job, a
# run's timer, a run's purge. Each is consumed from its head as time passes.
TIME_INDEXES: tuple[bytes, ...] = (b"jd/", b"rt/", b"rp/")


class FloorKV:
    """A ``KeyValueStore`` whose scans of ``indexes`` start past their deleted head."""

    def __init__(self, inner: KeyValueStore, indexes: tuple[bytes, ...] = TIME_INDEXES) -> None:
        assert all(len(p) == len(indexes[0]) for p in indexes), "index prefixes have one length"
        self.inner = inner
        self._width = len(indexes[0]) if indexes else 0
        # index prefix -> no live key of that index sorts below this one; at most the
        # index's end, so a key of another family is never below a floor
        self._floor: dict[bytes, bytes] = {p: p for p in indexes}
        self._end: dict[bytes, bytes] = {p: p[:-1] + bytes([p[-1] + 1]) for p in indexes}

    def floor(self, index: bytes) -> bytes:
        return self._floor[index]

    def get(self, key: bytes) -> bytes | None:
        return self.inner.get(key)

    def put(self, key: bytes, value: bytes) -> None:
        index = key[:self._width]
        floor = self._floor.get(index)
        if floor is not None and key < floor:
            self._floor[index] = key
        self.inner.put(key, value)

    def delete(self, key: bytes) -> None:
        self.inner.delete(key)

    def scan(self, start: bytes, stop: bytes, limit: int) -> Iterator[tuple[bytes, bytes]]:
        index = start[:self._width]
        floor = self._floor.get(index)
        if floor is None:
            return self.inner.scan(start, stop, limit)  # not a scan from inside one of our indexes
        return self._scan(index, floor, start, stop, limit)

    def _scan(self, index: bytes, floor: bytes, start: bytes, stop: bytes, limit: int
              ) -> Iterator[tuple[bytes, bytes]]:
        # (a generator: the inner scan and the floor's update happen at the first next(),
        # with no write in between; a put after that lowers the floor again if it must)
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
            self._raise(index, stop)  # nothing live in [floor, stop)

    def _raise(self, index: bytes, key: bytes) -> None:
        key = min(key, self._end[index])
        if key > self._floor[index]:
            self._floor[index] = key

    def size(self) -> tuple[int, int]:
        return self.inner.size()

    def close(self) -> None:
        self.inner.close()
