"""Where a region's consumer groups are coordinated (regions layout, ADR 0013).

A group's coordinator is the broker that leads one partition of ``__consumer_offsets``:
``abs(hashCode(group id)) % offsets.topic.num.partitions`` (Kafka's
``GroupCoordinator.partitionFor``, Java's ``String.hashCode``). Left to Kafka, those
partitions' leaders are spread over the three sites, so region b's processor group may
be coordinated from region a's broker: when a is cut off, b's transactions cannot commit
their offsets and b's processors lose their partitions until the coordinator moves (run
14 of the region test: 13 s without a commit in b, and b's own runs 11 s late).

In a regions layout ``gnomon infra up`` therefore creates ``__consumer_offsets`` itself,
before any group uses it, with the partition of each of a region's groups led from that
region's own site (``plan``); the rest keep Kafka's spread. Where two regions' groups
hash to one partition, the processors' group wins and the other is named in ``clashes``
(it is coordinated from the other region's site, and a cut of that site stalls it).
After a heal, Kafka's preferred-leader balancing moves the leaderships back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gnomon import region as regions

OFFSETS_TOPIC = "__consumer_offsets"
OFFSETS_PARTITIONS = 16  # offsets.topic.num.partitions (infra/kafka/server.properties.template)
# what Kafka gives the topic it makes itself (GroupCoordinator's offsets topic properties)
OFFSETS_CONFIG = {"cleanup.policy": "compact", "compression.type": "producer", "segment.bytes": "104857600"}
# a region's groups that use their coordinator (joins, heartbeats, offsets), the processors'
# first: it wins a partition two regions' groups share (the workers' inbox group is only
# assigned, never joined nor committed)
GROUPS = ("gnomon-processor", "gnomon-history", "gnomon-alerter")


def java_hash(text: str) -> int:
    """Java's ``String.hashCode`` (UTF-16 code units, 32-bit wrap-around), signed."""
    h = 0
    for unit in _utf16_units(text):
        h = (31 * h + unit) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def _utf16_units(text: str) -> list[int]:
    raw = text.encode("utf-16-be")
    return [int.from_bytes(raw[i:i + 2], "big") for i in range(0, len(raw), 2)]


def partition_for(group_id: str, partitions: int = OFFSETS_PARTITIONS) -> int:
    """The ``__consumer_offsets`` partition whose leader coordinates ``group_id``
    (Kafka's ``Utils.abs``: Integer.MIN_VALUE counts as 0)."""
    h = java_hash(group_id)
    return (0 if h == -(1 << 31) else abs(h)) % partitions


@dataclass(frozen=True)
class Plan:
    leaders: Mapping[int, int]  # partition -> the broker (host number) that should lead it
    clashes: tuple[str, ...] = field(default=())  # groups coordinated from another region's site


def plan(hosts: Mapping[str, int], partitions: int = OFFSETS_PARTITIONS,
         groups: Sequence[str] = GROUPS) -> Plan:
    """Which ``__consumer_offsets`` partitions each region's site should lead
    (``hosts``: region -> its host number)."""
    leaders: dict[int, int] = {}
    owner: dict[int, str] = {}
    clashes: list[str] = []
    for base in groups:  # the processors' groups of every region first, then the others
        for name, host in sorted(hosts.items()):
            group = regions.group_id(base, name)
            p = partition_for(group, partitions)
            if p in leaders and leaders[p] != host:
                clashes.append(f"{group} (partition {p}, led from {owner[p]})")
                continue
            leaders[p], owner[p] = host, name
    return Plan(leaders, tuple(clashes))


def assignment(p: Plan, brokers: int, partitions: int = OFFSETS_PARTITIONS) -> list[list[int]]:
    """Every partition's replicas: a planned one's leader first, the others as Kafka
    spreads them (leader ``1 + partition % brokers``)."""
    from gnomon.infra.topics import preferred

    return [preferred(p.leaders.get(i, 1 + i % brokers), brokers, i) for i in range(partitions)]
