"""Compatibility levels, as Confluent defines them, over :mod:`gnomon.codec.compat`.

* BACKWARD: the new schema reads data written with the previous version;
* FORWARD: the previous version reads data written with the new schema;
* FULL: both; NONE: no check;
* ``*_TRANSITIVE``: against every earlier version, not only the latest.

The default, FULL_TRANSITIVE, is what a rolling upgrade needs: records written by any
registered version are read by every other, old readers and new alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gnomon.codec.compat import incompatibilities

LEVELS: tuple[str, ...] = (
    "NONE", "BACKWARD", "BACKWARD_TRANSITIVE", "FORWARD", "FORWARD_TRANSITIVE", "FULL", "FULL_TRANSITIVE",
)


def directions(level: str) -> tuple[bool, bool]:
    """(backward, forward) checks that ``level`` asks for."""
    base = level.removesuffix("_TRANSITIVE")
    return base in ("BACKWARD", "FULL"), base in ("FORWARD", "FULL")


def against(level: str, previous: Sequence[Any]) -> Sequence[Any]:
    """Which of the earlier versions (oldest first) ``level`` checks a new one against."""
    if level == "NONE" or not previous:
        return ()
    return previous if level.endswith("_TRANSITIVE") else previous[-1:]


def problems(level: str, new: Any, previous: Sequence[tuple[int, Any]]) -> list[str]:
    """Why the resolved schema ``new`` may not follow ``previous`` ((version, resolved
    schema) pairs, oldest first) at ``level``; empty when it may."""
    if level not in LEVELS:
        raise ValueError(f"unknown compatibility level {level!r}")
    backward, forward = directions(level)
    out: list[str] = []
    for version, old in against(level, previous):
        if backward:
            out += [f"version {version} cannot be read by the new schema: {p}" for p in incompatibilities(old, new)]
        if forward:
            out += [f"the new schema cannot be read by version {version}: {p}" for p in incompatibilities(new, old)]
    return out
