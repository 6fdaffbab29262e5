"""Control records: keys starting with NUL on gnomon's topics (docs/adr/0012).

Job and run ids cannot contain NUL (refused at validation), so no control key collides
with one. Two exist: the grow marker on the job-commands topic and the partitions record
on the jobs changelog (``gnomon.processor.growth``). The processors take only the grow
key as a marker; any other record keyed with NUL on an input topic is read as what its
value says, and a command is refused and answered as one (its job id is invalid). The
jobs changelog's readers (the processors' restores, the history projector) skip
control keys.
"""

from __future__ import annotations

from gnomon.core.errors import ValidationError

CONTROL_PREFIX = "\0"
# on the jobs changelog: this partition's count of partitions since a grow (ASCII int)
PARTITIONS_KEY = "\0partitions"
# on the job-commands topic: "grow to M" (value: M as ASCII), written by ``gnomon infra grow``
GROW_KEY = "\0grow"
# a forwarded record's position where it was first read: b"<partition>:<offset>"
ORIGIN_HEADER = "gnomon-origin"
GROW_TO_MAX = 4_096  # a sanity bound on the count of partitions


def is_control(key: bytes | str | None) -> bool:
    if key is None:
        return False
    return (key.startswith(b"\0") if isinstance(key, bytes) else key.startswith(CONTROL_PREFIX))


def encode_count(count: int) -> bytes:
    assert 1 <= count <= GROW_TO_MAX
    return str(count).encode()


def decode_count(raw: bytes | None, where: str) -> int:
    """The count of a partitions or grow record; ValidationError naming ``where`` if it is not one."""
    try:
        count = int((raw or b"").decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise ValidationError("value", f"{where}: not a partition count: {(raw or b'')[:40]!r}") from None
    if not 1 <= count <= GROW_TO_MAX:
        raise ValidationError("value", f"{where}: partition count {count} out of 1..{GROW_TO_MAX}")
    return count


def check_grow(old: int, new: int) -> None:
    """ValueError unless ``old`` partitions may grow to ``new`` (a larger multiple)."""
    if new <= old:
        raise ValueError(f"partitions can only grow: {new} is not more than {old}")
    if new % old:
        raise ValueError(f"the new count must be a multiple of the current one ({old}): {new} is not "
                         "(each new partition takes its jobs from exactly one old one)")
    if new > GROW_TO_MAX:
        raise ValueError(f"at most {GROW_TO_MAX} partitions")
