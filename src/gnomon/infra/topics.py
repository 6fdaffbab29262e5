"""Topics from ``streams/topology.toml``: an idempotent creator.

The file is parsed by :func:`gnomon.topology.parse_topology` (the only parser): its
``Topology.topics`` are the :class:`TopicSpec` s created here (``[topics."<name>"]``
tables: ``partitions``, default ``[defaults].partitions``, ``cleanup_policy``, optionally
``retention_ms`` and ``config``).

:func:`sync_topics` creates the missing topics and sets, on the existing ones, every
declared config whose value differs (:func:`config_diff`); keys the topology does not
declare are never touched, and partition counts are never changed.

:func:`namespace_specs` adds every region's namespace (``$GNOMON_REGIONS``,
:mod:`gnomon.region`): the same topics, renamed (:func:`gnomon.topology.regional`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gnomon.infra.errors import InfraError
from gnomon.infra.progress import say
from gnomon.topology import CO_PARTITIONED, TopicSpec, namespace_names, read_topology, regional

__all__ = ["TopicChanges", "TopicSpec", "config_diff", "ensure_topics", "min_insync_for", "namespace_label",
           "namespace_specs", "sync_topics", "topic_specs"]


def topic_specs(path: Path) -> list[TopicSpec]:
    """Every topic declared in the topology file at ``path`` (``gnomon.topology`` parses it)."""
    return list(read_topology(path).topics)


def namespace_specs(path: Path, layout: Sequence[str] = ()) -> list[tuple[str | None, list[TopicSpec]]]:
    """(region, its topics) for each namespace: the default one (None), then every
    configured region's (``$GNOMON_REGIONS``, and ``layout``'s: the regions of
    ``gnomon infra up --regions``). ValueError for a bad region list."""
    topo = read_topology(path)
    out: list[tuple[str | None, list[TopicSpec]]] = []
    seen: set[str] = set()
    for r in namespace_names(layout):
        specs = [s for s in regional(topo, r).topics if s.name not in seen]  # a shared topic once
        seen.update(s.name for s in specs)
        out.append((r, specs))
    return out


def namespace_label(name: str | None) -> str:
    """The prefix of a progress line about namespace ``name``: nothing for the default one."""
    return "" if name is None else f"region {name}: "


def min_insync_for(replication_factor: int) -> int:
    """2 when there are 3+ replicas (one may be down), else 1."""
    return 2 if replication_factor >= 3 else 1


ConfigDiff = dict[str, tuple[str | None, str]]
"""Config key -> (current value, or None when the broker reports none; wanted value)."""

UNKNOWN_TOPIC_RETRY_S = 10.0
"""How long a topic's configs are asked for again while the broker asked does not know it."""


@dataclass(frozen=True)
class TopicChanges:
    """What :func:`sync_topics` did: topics created, and config changes per existing topic."""

    created: list[str] = field(default_factory=list)
    reconfigured: dict[str, ConfigDiff] = field(default_factory=dict)


def config_diff(current: Mapping[str, str | None], wanted: Mapping[str, str]) -> ConfigDiff:
    """The keys of ``wanted`` whose ``current`` value differs (pure).

    Only keys of ``wanted`` are looked at, so configs the topology does not declare are
    never changed; a key missing from ``current`` counts as different.
    """
    return {
        key: (current.get(key), value) for key, value in wanted.items() if current.get(key) != value
    }


def ensure_topics(
    bootstrap: str,
    specs: list[TopicSpec],
    replication_factor: int,
    timeout_s: float = 30.0,
    *,
    credentials_dir: Path | None = None,
    leader: int | None = None,
) -> list[str]:
    """Create the missing topics and apply changed configs to existing ones.

    Returns the names created (see :func:`sync_topics` for the config changes too).
    ``leader``: the broker new topics' partitions prefer as leader (a region's own: ADR 0013).
    """
    return sync_topics(
        bootstrap, specs, replication_factor, timeout_s, credentials_dir=credentials_dir, leader=leader
    ).created


def sync_topics(
    bootstrap: str,
    specs: list[TopicSpec],
    replication_factor: int,
    timeout_s: float = 30.0,
    *,
    credentials_dir: Path | None = None,
    leader: int | None = None,
) -> TopicChanges:
    """Create the missing topics; set the declared configs that differ on existing ones.

    New topics get ``replication_factor`` replicas. An existing topic's wanted
    ``min.insync.replicas`` follows its own replica count, so running this with another
    replication factor never sets a min ISR its replicas cannot meet. Warns (does not
    fail, changes nothing) when an existing topic has a different partition count than
    declared, because that breaks co-partitioning. Says one line per changed key.
    Connects as the Kafka admin (credentials from ``credentials_dir``, default the
    settings' one).
    """
    from confluent_kafka import KafkaException

    from gnomon.infra.kafka import admin

    client = admin(bootstrap, credentials_dir=credentials_dir)
    try:
        existing = client.list_topics(timeout=timeout_s).topics
    except KafkaException as exc:
        raise InfraError(f"cannot list topics on {bootstrap}: {exc}") from exc
    _warn_partition_mismatch(specs, existing)
    missing = [s for s in specs if s.name not in existing]
    created = _create_topics(client, bootstrap, missing, replication_factor, timeout_s, credentials_dir, leader)
    present = {s.name: s for s in specs if s.name in existing}
    wanted = {
        name: spec.config(min_insync_for(_replicas(existing[name], replication_factor)))
        for name, spec in present.items()
    }
    current = _current_configs(client, sorted(present), timeout_s)
    diffs = {name: config_diff(current[name], wanted[name]) for name in sorted(present)}
    reconfigured = {name: diff for name, diff in diffs.items() if diff}
    _alter_configs(client, reconfigured, timeout_s)
    return TopicChanges(created=created, reconfigured=reconfigured)


def create_with_assignment(bootstrap: str, name: str, replicas: list[list[int]], config: Mapping[str, str], *,
                           credentials_dir: Path | None = None, timeout_s: float = 30.0) -> bool:
    """Create topic ``name`` with these replicas per partition (the first leads) unless it
    exists (False: left as it is, e.g. an internal topic Kafka made on first use)."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

    from gnomon.infra.kafka import admin

    client = admin(bootstrap, credentials_dir=credentials_dir)
    try:
        if name in client.list_topics(timeout=timeout_s).topics:
            return False
        topic = NewTopic(name, num_partitions=len(replicas), replica_assignment=replicas, config=dict(config))
        client.create_topics([topic], operation_timeout=timeout_s, request_timeout=timeout_s)[name].result()
    except KafkaException as exc:
        if exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS:
            return False  # made meanwhile
        raise InfraError(f"cannot create topic {name} on {bootstrap}: {exc}") from exc
    return True


def replicas_of(bootstrap: str, name: str, *, credentials_dir: Path | None = None,
                timeout_s: float = 30.0) -> list[list[int]]:
    """Topic ``name``'s replicas per partition (the first is the preferred leader); empty
    when it does not exist."""
    from confluent_kafka import KafkaException

    from gnomon.infra.kafka import admin

    try:
        # (every topic's metadata, not the one topic's: a request naming a topic that does
        # not exist makes the broker create it when auto.create.topics.enable is on)
        topic = admin(bootstrap, credentials_dir=credentials_dir).list_topics(timeout=timeout_s).topics.get(name)
    except KafkaException as exc:
        raise InfraError(f"cannot read topic {name}'s partitions on {bootstrap}: {exc}") from exc
    if topic is None or topic.error is not None:
        return []
    return [list(topic.partitions[i].replicas) for i in sorted(topic.partitions)]


def preferred(leader: int, brokers: int, partition: int) -> list[int]:
    """Partition ``partition``'s replicas: ``leader`` first, then the other brokers
    (1..``brokers``) rotating with the partition, so followers share the load."""
    assert 1 <= leader <= brokers, (leader, brokers)
    others = [b for b in range(1, brokers + 1) if b != leader]
    k = partition % len(others) if others else 0
    return [leader, *others[k:], *others[:k]]


def _warn_partition_mismatch(specs: list[TopicSpec], existing: Mapping[str, Any]) -> None:
    for spec in specs:
        have = len(existing[spec.name].partitions) if spec.name in existing else spec.partitions
        if spec.role in CO_PARTITIONED and have > spec.partitions and have % spec.partitions == 0:
            continue  # grown (`gnomon infra grow`, docs/adr/0012): the file keeps the count at creation
        if have != spec.partitions:
            say(
                f"warning: topic {spec.name} has {len(existing[spec.name].partitions)} partitions, "
                f"topology.toml declares {spec.partitions}"
            )


def _replicas(topic: Any, default: int) -> int:
    """The fewest replicas of any partition of ``topic`` (metadata), ``default`` if none."""
    counts = [len(p.replicas) for p in topic.partitions.values()]
    return min(counts) if counts else default


def _create_topics(
    client: Any,
    bootstrap: str,
    missing: list[TopicSpec],
    replication_factor: int,
    timeout_s: float,
    credentials_dir: Path | None = None,
    leader: int | None = None,
) -> list[str]:
    """Create ``missing``; returns the names created (not those a concurrent call made).
    ``leader``: every partition's first (preferred leader) replica is that broker, the
    others follow in turn (brokers 1..``replication_factor``)."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

    if not missing:
        return []
    min_isr = min_insync_for(replication_factor)
    def new_topic(s: TopicSpec) -> Any:
        if leader is None:
            return NewTopic(s.name, num_partitions=s.partitions, replication_factor=replication_factor,
                            config=s.config(min_isr))
        # (this client wants the partition count with an assignment, despite its error's words)
        return NewTopic(s.name, num_partitions=s.partitions, replica_assignment=[preferred(leader, replication_factor, p)
                                                    for p in range(s.partitions)], config=s.config(min_isr))

    futures = client.create_topics(
        [new_topic(s) for s in missing],
        operation_timeout=timeout_s,
        request_timeout=timeout_s,
    )
    created = []
    for name, future in futures.items():
        try:
            future.result()
            created.append(name)
        except KafkaException as exc:
            err = exc.args[0]
            if err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                continue  # a concurrent `up` won the race
            raise InfraError(f"cannot create topic {name}: {err}") from exc
    _wait_until_led(bootstrap, {s.name: s.partitions for s in missing}, timeout_s, credentials_dir)
    return sorted(created)


def _is_unknown_topic(exc: Exception) -> bool:
    from confluent_kafka import KafkaError

    err = exc.args[0] if exc.args else None
    return isinstance(err, KafkaError) and err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART


def _current_configs(
    client: Any, names: list[str], timeout_s: float
) -> dict[str, dict[str, str | None]]:
    """Each topic's configs as the broker reports them (defaults included).

    On a fresh multi-broker cluster the broker asked may not know a just-created topic
    yet (UNKNOWN_TOPIC_OR_PART): such topics are asked again for up to
    :data:`UNKNOWN_TOPIC_RETRY_S`.
    """
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import ConfigResource  # type: ignore[attr-defined]

    deadline = time.monotonic() + UNKNOWN_TOPIC_RETRY_S
    found: dict[str, dict[str, str | None]] = {}
    pending = list(names)
    while pending:
        try:
            futures = client.describe_configs(
                [ConfigResource("topic", n) for n in pending], request_timeout=timeout_s
            )
        except KafkaException as exc:
            raise InfraError(f"cannot read the configs of topics {pending}: {exc}") from exc
        retry = []
        for resource, future in futures.items():
            try:
                entries = future.result()
            except KafkaException as exc:
                if _is_unknown_topic(exc) and time.monotonic() < deadline:
                    retry.append(resource.name)
                    continue
                raise InfraError(
                    f"cannot read the configs of topic {resource.name}: {exc.args[0]}"
                ) from exc
            found[resource.name] = {key: entry.value for key, entry in entries.items()}
        pending = retry
        if pending:
            time.sleep(0.2)
    return found


def _alter_configs(client: Any, diffs: Mapping[str, ConfigDiff], timeout_s: float) -> None:
    """SET the wanted value of every key in ``diffs`` (incrementally: nothing else changes).

    Says one line per key set; raises InfraError naming each topic and key that failed.
    """
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
    )

    if not diffs:
        return
    resources = [
        ConfigResource(
            "topic",
            name,
            incremental_configs=[
                ConfigEntry(key, wanted, incremental_operation=AlterConfigOpType.SET)
                for key, (_, wanted) in diff.items()
            ],
        )
        for name, diff in diffs.items()
    ]
    try:
        futures = client.incremental_alter_configs(resources, request_timeout=timeout_s)
    except KafkaException as exc:
        raise InfraError(f"cannot alter the configs of topics {sorted(diffs)}: {exc}") from exc
    failures = []
    for resource, future in sorted(futures.items(), key=lambda item: str(item[0].name)):
        diff = diffs[resource.name]
        try:
            future.result()
        except KafkaException as exc:
            keys = ", ".join(f"{key}={wanted}" for key, (_, wanted) in diff.items())
            failures.append(f"cannot set {keys} on topic {resource.name}: {exc.args[0]}")
            continue
        for key, (current, wanted) in diff.items():
            shown = current if current is not None else "(unset)"
            say(f"topic {resource.name}: {key} {shown} -> {wanted}")
    if failures:
        raise InfraError("; ".join(failures))


def _wait_until_led(
    bootstrap: str, partitions: dict[str, int], timeout_s: float, credentials_dir: Path | None = None
) -> None:
    """Wait until every listed broker's metadata shows all ``partitions`` with a leader.

    CreateTopics returns once the controller accepted; brokers learn it a moment later, and
    on a busy host one broker can lag for seconds. Each address in ``bootstrap`` is asked
    through its own fresh client, whose first request goes to that address.
    """
    from gnomon.infra.kafka import admin

    deadline = time.monotonic() + timeout_s
    for address in bootstrap.split(","):
        client = admin(address, credentials_dir=credentials_dir)
        pending = dict(partitions)
        while pending:
            topics = client.list_topics(timeout=timeout_s).topics
            for name, count in list(pending.items()):
                parts = topics[name].partitions if name in topics else {}
                if len(parts) == count and all(p.leader >= 0 for p in parts.values()):
                    del pending[name]
            if pending and time.monotonic() > deadline:
                raise InfraError(
                    f"{address} does not show topics {sorted(pending)} "
                    f"{timeout_s:.0f}s after creating them"
                )
            if pending:
                time.sleep(0.2)
