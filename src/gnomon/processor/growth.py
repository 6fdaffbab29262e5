"""Growing the partition count of a live system (docs/adr/0012-growing-partitions.md).

The co-partitioned topics go from N partitions to M, a multiple of N (``gnomon infra
grow --to M``: Kafka's CreatePartitions, then a *grow marker* on every partition of the
job-commands topic). A job's partition under M is ``h % M``, under N
``h % N``: every job of new partition q came from old partition ``q % N``, and old
partition p keeps the jobs with ``h % M == p``. So each old partition hands its leaving
jobs to their new partitions itself, at its marker, in one transaction:

* their job and run states are written to the new partitions' changelogs (jobs, runs)
  and dropped from its own store (not tombstoned: the history projector would read a
  job tombstone as a delete; a restore skips keys the partition no longer owns);
* a *partitions record* (key ``PARTITIONS_KEY``, value the count as ASCII) goes to its
  own jobs changelog and to each of its new partitions' (the handover's last word);
* from then on a record it reads for a job that lives elsewhere (a producer that has
  not yet seen the new partitions) is forwarded there, headers kept, with the position
  it was read at (``ORIGIN_HEADER``) so that the command's answer names the position its
  producer knows.

A new partition's processor holds its input records (reads them again later) until the
partitions record appears in its jobs changelog, then restores the handed-over state
and goes on: nothing is decided on it before its jobs are there.

Keys starting with NUL are control keys (``gnomon.core.control``): job and run ids
cannot contain NUL (refused at validation), so none collides with one.
"""

from __future__ import annotations

from gnomon.adapters.kafka import partition_for
from gnomon.core.control import (
    CONTROL_PREFIX,
    GROW_KEY,
    GROW_TO_MAX,
    ORIGIN_HEADER,
    PARTITIONS_KEY,
    check_grow,
    decode_count,
    encode_count,
    is_control,
)

__all__ = ["CONTROL_PREFIX", "GROW_KEY", "GROW_TO_MAX", "ORIGIN_HEADER", "PARTITIONS_KEY", "check_grow",
           "decode_count", "encode_count", "heirs", "is_control", "job_of", "origin_header", "origin_of", "origin_value", "owner"]

def heirs(partition: int, old: int, new: int) -> list[int]:
    """The new partitions that take jobs from old ``partition`` when ``old`` grows to ``new``."""
    check_grow(old, new)
    assert 0 <= partition < old
    return list(range(partition + old, new, old))


def job_of(key: str) -> str:
    """The job id a jobs or runs changelog key (a job id, or ``<job id>@<slot>``) belongs to."""
    return key.partition("@")[0]


def owner(job_id: str, count: int) -> int:
    return partition_for(job_id, count)


def origin_header(partition: int, offset: int) -> tuple[str, bytes]:
    return ORIGIN_HEADER, f"{partition}:{offset}".encode()


def origin_of(headers: tuple[tuple[str, bytes], ...]) -> tuple[int, int] | None:
    """The (partition, offset) a forwarded record was first read at, if it was forwarded
    (unverified: ``command_auth.verify_origin`` checks a signed one)."""
    value = origin_value(headers)
    if value is None:
        return None
    p, _, rest = value.decode("ascii", "replace").partition(":")
    try:
        return int(p), int(rest.partition(":")[0])
    except ValueError:
        return None


def origin_value(headers: tuple[tuple[str, bytes], ...]) -> bytes | None:
    """The raw ``gnomon-origin`` header, if there is one."""
    for name, value in headers:
        if name == ORIGIN_HEADER:
            return value
    return None
