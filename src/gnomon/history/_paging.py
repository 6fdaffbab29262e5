"""Cursors and page assembly shared by every HistoryStore, so they page identically.

A cursor is the clustering key of the last row a page *looked at*, tagged with the
listing it belongs to, as URL-safe base64 of compact JSON (opaque to clients; stable
across nodes, driver versions and store implementations, unlike a driver paging state).
The next page starts strictly after that key.

Pages are exact: a store fetches ``limit + 1`` rows, so ``cursor`` is ``None`` exactly
when nothing follows. With a filter (``keep``) rows are filtered by the client while
scanning, at most ``scan_max`` rows per call: such a page may hold fewer than ``limit``
items (even none) and still carry a cursor; follow it to continue the scan.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Awaitable, Callable, Generator, Sequence
from typing import Any, TypeVar

from gnomon.core.errors import ValidationError

T = TypeVar("T")
Key = tuple[Any, ...]
# fetch(after, n): at most n rows strictly after ``after`` (None: from the start), in
# listing order, each as (clustering key, item).
Fetch = Callable[[Key | None, int], Sequence[tuple[Key, T]]]
AsyncFetch = Callable[[Key | None, int], Awaitable[Sequence[tuple[Key, T]]]]

# Listing tags and the types of their key components.
JOBS = "j"  # (job_id,)
RUNS = "r"  # (slot_ms, run_id)        newest first
LOGS = "l"  # (attempt, seq)           oldest first
DEAD = "d"  # (slot_ms, run_id)        newest first
_SHAPES: dict[str, tuple[type, ...]] = {JOBS: (str,), RUNS: (int, str), LOGS: (int, int), DEAD: (int, str)}

CURSOR_MAX_CHARS = 2048
SCAN_CHUNK_MIN = 200


def encode_cursor(kind: str, key: Key) -> str:
    raw = json.dumps([kind, *key], separators=(",", ":"), ensure_ascii=False).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def decode_cursor(kind: str, cursor: str | None) -> Key | None:
    """The key in ``cursor``; ``ValidationError('cursor', ...)`` if it is not one of ours."""
    if cursor is None:
        return None
    bad = ValidationError("cursor", "not a cursor of this listing (pass back the cursor of the previous page)")
    if not isinstance(cursor, str) or not cursor or len(cursor) > CURSOR_MAX_CHARS:
        raise bad
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        data = json.loads(raw.decode())
    except (binascii.Error, ValueError, UnicodeDecodeError, RecursionError):  # a crafted cursor of nested brackets
        raise bad from None
    shape = _SHAPES[kind]
    if not isinstance(data, list) or len(data) != len(shape) + 1 or data[0] != kind:
        raise bad
    key = tuple(data[1:])
    for value, typ in zip(key, shape, strict=True):
        if type(value) is not typ:  # bool is not an int here
            raise bad
        if isinstance(value, int) and not -(2**63) <= value < 2**63:
            raise bad
    return key


def check_limit(limit: int) -> int:
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise ValidationError("limit", f"must be a positive integer, got {limit!r}")
    return limit


def page(
    kind: str,
    fetch: Fetch[T],
    limit: int,
    cursor: str | None,
    keep: Callable[[T], bool] | None = None,
    scan_max: int = 5000,
) -> tuple[list[T], str | None]:
    """One page of a listing: its items and the cursor of the next page (None: no more)."""
    steps = pager(kind, limit, cursor, keep, scan_max)
    try:
        want = next(steps)
        while True:
            want = steps.send(fetch(*want))
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


async def apage(
    kind: str,
    fetch: AsyncFetch[T],
    limit: int,
    cursor: str | None,
    keep: Callable[[T], bool] | None = None,
    scan_max: int = 5000,
) -> tuple[list[T], str | None]:
    """``page`` with an async ``fetch``: the same pages, cursors and scan budget."""
    steps = pager(kind, limit, cursor, keep, scan_max)
    try:
        want = next(steps)
        while True:
            want = steps.send(await fetch(*want))
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


def pager(
    kind: str,
    limit: int,
    cursor: str | None,
    keep: Callable[[T], bool] | None = None,
    scan_max: int = 5000,
) -> Generator[tuple[Key | None, int], Sequence[tuple[Key, T]], tuple[list[T], str | None]]:
    """The paging algorithm, free of I/O: yields each fetch it needs as ``(after, n)``, is
    sent the rows, and returns (items, next cursor). ``page`` and ``apage`` drive it."""
    check_limit(limit)
    after = decode_cursor(kind, cursor)
    if keep is None:
        rows = yield (after, limit + 1)
        items = [item for _, item in rows[:limit]]
        more = len(rows) > limit
        return items, (encode_cursor(kind, rows[limit - 1][0]) if more else None)
    out: list[T] = []
    scanned = 0
    last = after
    while True:
        n = min(max(limit + 1, SCAN_CHUNK_MIN), scan_max - scanned)
        rows = yield (last, n + 1)  # one more than the budget allows: is there more?
        for key, item in rows:
            if scanned == scan_max:  # budget spent and rows remain: resume after the last one looked at
                assert last is not None
                return out, encode_cursor(kind, last)
            if keep(item):
                if len(out) == limit:  # a match beyond the page: resume just before it
                    assert last is not None
                    return out, encode_cursor(kind, last)
                out.append(item)
            scanned += 1
            last = key
        if len(rows) <= n:
            return out, None  # the listing is exhausted
