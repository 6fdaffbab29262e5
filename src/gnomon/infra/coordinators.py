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

Transactions likewise: a transactional id is coordinated from the leader of the
``__transaction_state`` partition it hashes to. A processor running in a region picks its
id so that it hashes to that region's anchor partition (``gnomon.region.transactional_id``),
and ``gnomon infra up`` creates ``__transaction_state`` with each region's anchor
partition led from its site (``txn_plan``): a cut of the other region's site leaves a
region's processors their transaction coordinator (without it, a rebuilt producer's
``init_transactions`` and every commit wait for the coordinator to move).
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


def partition_for(group_id: str, partitions: int = OFFSETS_PARTITIONS) -> int:
    """The ``__consumer_offsets`` partition whose leader coordinates ``group_id``."""
    return regions.coordinator_partition(group_id, partitions)


@dataclass(frozen=True)
class Plan:
    leaders: Mapping[int, int]  # partition -> the broker (host number) that should lead it
    clashes: tuple[str, ...] = field(default=())  # groups coordinated from another region's site


def _place(keys: Sequence[tuple[str, str, str]], hosts: Mapping[str, int], partitions: int) -> Plan:
    """Each ``(label, region, key)`` in turn: the partition ``key`` hashes to, led from
    ``region``'s site, unless an earlier key of another region took it (named in clashes)."""
    leaders: dict[int, int] = {}
    owner: dict[int, str] = {}
    clashes: list[str] = []
    for label, name, key in keys:
        p = regions.coordinator_partition(key, partitions)
        if p in leaders and leaders[p] != hosts[name]:
            clashes.append(f"{label} (partition {p}, led from {owner[p]})")
            continue
        leaders[p], owner[p] = hosts[name], name
    return Plan(leaders, tuple(clashes))


def plan(hosts: Mapping[str, int], partitions: int = OFFSETS_PARTITIONS,
         groups: Sequence[str] = GROUPS) -> Plan:
    """Which ``__consumer_offsets`` partitions each region's site should lead
    (``hosts``: region -> its host number): the processors' groups of every region
    first, then the others."""
    keys = []
    for base in groups:
        for name in sorted(hosts):
            group = regions.group_id(base, name)
            keys.append((group, name, group))
    return _place(keys, hosts, partitions)


TXN_TOPIC = "__transaction_state"
TXN_PARTITIONS = regions.TXN_PARTITIONS


def txn_config(min_insync_replicas: int) -> dict[str, str]:
    """What Kafka gives the transaction log it makes itself (``TransactionLog``'s enforced
    properties; ``min.insync.replicas`` is the broker's transaction.state.log.min.isr)."""
    return {"cleanup.policy": "compact", "compression.type": "uncompressed", "segment.bytes": "104857600",
            "unclean.leader.election.enable": "false", "min.insync.replicas": str(min_insync_replicas)}


def txn_plan(hosts: Mapping[str, int], partitions: int = TXN_PARTITIONS) -> Plan:
    """Which ``__transaction_state`` partition each region's site should lead: the one its
    processes' transactional ids hash to (``hosts``: region -> its host number)."""
    keys = [(f"transactions of region {name}", name, regions.txn_anchor(name)) for name in sorted(hosts)]
    return _place(keys, hosts, partitions)


def assignment(p: Plan, brokers: int, partitions: int = OFFSETS_PARTITIONS) -> list[list[int]]:
    """Every partition's replicas: a planned one's leader first, the others as Kafka
    spreads them (leader ``1 + partition % brokers``)."""
    from gnomon.infra.topics import preferred

    return [preferred(p.leaders.get(i, 1 + i % brokers), brokers, i) for i in range(partitions)]


def misplaced(p: Plan, replicas: Sequence[Sequence[int]]) -> dict[int, int]:
    """Of ``p``'s partitions, those that an existing topic (``replicas``: each partition's
    replicas, the first its preferred leader) leads from another site: partition -> the
    host number that should lead it. A topic made before gnomon placed it, by Kafka on
    first use or by an older ``infra up``, keeps its own placement."""
    return {i: lead for i, lead in sorted(p.leaders.items())
            if i < len(replicas) and (not replicas[i] or replicas[i][0] != lead)}


def reassignment(p: Plan, replicas: Sequence[Sequence[int]], topic: str) -> dict[str, object]:
    """The ``kafka-reassign-partitions.sh --reassignment-json-file`` document that moves
    the ``misplaced`` partitions' preferred leader to their planned site (the same
    replicas, reordered); a preferred-leader election then moves their leadership."""
    moves = []
    for i, lead in misplaced(p, replicas).items():
        now = list(replicas[i])
        moves.append({"topic": topic, "partition": i, "replicas": [lead, *(b for b in now if b != lead)]})
    return {"version": 1, "partitions": moves}
