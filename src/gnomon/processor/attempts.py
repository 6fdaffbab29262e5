"""Count the processes a record has killed, across restarts.

Containment (``processor.savepoint``) catches what a record raises. What it cannot catch is
a record that kills the process outright (the interpreter aborts, memory runs out and
the kernel kills it): the restarted processor reads the same record first again and
dies again, and scheduling stops for every tenant. So before applying each record the
processor writes where it is ("this topic, partition, offset; attempt n") to a marker
that outlives the process (a small memory-mapped file beside the state stores: about a
microsecond per record, no fsync: it must survive the process, not the machine), and
empties it once the record is applied, answered or poisoned, so that only a death inside
a record counts against it. A clean stop, and an abort the process survived, clear it. A processor that finds the
marker pointing at the record it is about to apply knows the last process died in it,
and counts one more attempt; past ``attempts_max`` the record goes to the poison topic
unapplied, with the count in its reason.

The count is per machine (the marker is local): a record that kills processors on
several machines is tried ``attempts_max`` times on each. An exit on an infrastructure
error (``InfraError``: the state store or Kafka failed, not the record) is a clean stop
here: it is not counted, because poisoning records while a disk is full would lose
their effect for no fault of theirs.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from pathlib import Path
from typing import Protocol

MARKER_BYTES = 512
_SEP = b"\x00"


class Marker(Protocol):
    """A few bytes that outlive the process."""

    def read(self) -> bytes: ...
    def write(self, data: bytes) -> None: ...


class MemoryMarker:
    """The simulation's: held by its ``MemoryStores``, which outlive a Processor object."""

    def __init__(self) -> None:
        self.data = b""

    def read(self) -> bytes:
        return self.data

    def write(self, data: bytes) -> None:
        self.data = data


class FileMarker:
    """A memory-mapped file of ``MARKER_BYTES``: a write is a copy into the page cache,
    which the kernel keeps when the process dies."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_size != MARKER_BYTES:
                os.ftruncate(fd, MARKER_BYTES)
            self._map = mmap.mmap(fd, MARKER_BYTES)
        finally:
            os.close(fd)

    def read(self) -> bytes:
        return bytes(self._map[:]).rstrip(b"\x00 ")

    def write(self, data: bytes) -> None:
        assert len(data) <= MARKER_BYTES
        self._map[:] = data.ljust(MARKER_BYTES, b" ")

    def close(self) -> None:
        with contextlib.suppress(ValueError, BufferError):
            self._map.close()


class RecordAttempts:
    """``begin`` before each record: the attempt it is (1 unless the last process died in
    it). ``clear`` when the process knows it did not die in a record."""

    def __init__(self, marker: Marker, attempts_max: int = 3) -> None:
        assert attempts_max >= 1
        self.marker = marker
        self.attempts_max = attempts_max
        self._last: tuple[str, int, int] | None = None
        self._carried = self._parse(marker.read())  # what the last process left

    @staticmethod
    def _parse(data: bytes) -> tuple[str, int, int, int] | None:
        parts = data.split(_SEP)
        if len(parts) != 4:
            return None
        try:
            return parts[0].decode(), int(parts[1]), int(parts[2]), int(parts[3])
        except ValueError:
            return None

    @property
    def carried(self) -> tuple[str, int, int, int] | None:
        """(topic, partition, offset, attempts) the last process died in, if it did."""
        return self._carried

    def begin(self, topic: str, partition: int, offset: int) -> int:
        attempt = 1
        carried = self._carried
        if carried is not None and carried[:3] == (topic, partition, offset):
            attempt = carried[3] + 1
            self._carried = (topic, partition, offset, attempt)
        if attempt > self.attempts_max:
            return attempt  # not written: the caller poisons it, and it is not begun again
        data = topic.encode() + _SEP + b"%d" % partition + _SEP + b"%d" % offset + _SEP + b"%d" % attempt
        if len(data) <= MARKER_BYTES:
            self.marker.write(data)
        return attempt

    def done(self) -> None:
        """The record begun last was applied: a death after this is not its doing. (What
        the last process left is kept: the record it died in is still to come.)"""
        self.marker.write(b"")

    def clear(self) -> None:
        """The process did not die in the record it began last (a clean stop, an abort it
        survived, an infrastructure error): nothing to count."""
        self._carried = None
        self.marker.write(b"")
