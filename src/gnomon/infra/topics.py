"""Topics from ``streams/topology.toml``: a pure parser and an idempotent creator.

``[topics."<name>"]`` tables give ``partitions`` (default ``[defaults].partitions``),
``cleanup_policy`` and optionally ``retention_ms``; ``[dispatch]`` expands to one topic
per pool x priority through ``name_format``.
"""

from __future__ import annotations

import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gnomon.infra.errors import InfraError
from gnomon.infra.progress import say


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    cleanup_policy: str = "delete"
    retention_ms: int | None = None
    extra_config: dict[str, str] = field(default_factory=dict)

    def config(self, min_insync_replicas: int) -> dict[str, str]:
        """Topic-level Kafka configs (strings, as the admin API wants them)."""
        cfg = {
            "cleanup.policy": self.cleanup_policy,
            "min.insync.replicas": str(min_insync_replicas),
        }
        if self.retention_ms is not None:
            cfg["retention.ms"] = str(self.retention_ms)
        cfg.update(self.extra_config)
        return cfg


def _spec(name: str, table: dict[str, Any], default_partitions: int) -> TopicSpec:
    retention = table.get("retention_ms")
    return TopicSpec(
        name=name,
        partitions=int(table.get("partitions", default_partitions)),
        cleanup_policy=str(table.get("cleanup_policy", "delete")),
        retention_ms=int(retention) if retention is not None else None,
        extra_config={str(k): str(v) for k, v in table.get("config", {}).items()},
    )


def parse_topology(data: dict[str, Any]) -> list[TopicSpec]:
    """Topic specs from an already-parsed topology document (pure)."""
    default_partitions = int(data.get("defaults", {}).get("partitions", 1))
    specs = [
        _spec(name, table, default_partitions) for name, table in data.get("topics", {}).items()
    ]
    dispatch = data.get("dispatch")
    if dispatch:
        fmt = str(dispatch.get("name_format", "gnomon.dispatch.{pool}.{priority}"))
        for pool in dispatch.get("pools", []):
            for priority in dispatch.get("priorities", []):
                specs.append(
                    _spec(fmt.format(pool=pool, priority=priority), dispatch, default_partitions)
                )
    names = [s.name for s in specs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"topology declares these topics twice: {', '.join(dupes)}")
    return specs


def topic_specs(path: Path) -> list[TopicSpec]:
    """Every topic declared in the topology file at ``path``."""
    with open(path, "rb") as f:
        return parse_topology(tomllib.load(f))


def min_insync_for(replication_factor: int) -> int:
    """2 when there are 3+ replicas (one may be down), else 1."""
    return 2 if replication_factor >= 3 else 1


def ensure_topics(
    bootstrap: str, specs: list[TopicSpec], replication_factor: int, timeout_s: float = 30.0
) -> list[str]:
    """Create the topics that do not exist yet; existing ones are left alone.

    Returns the names created. Warns (does not fail) when an existing topic has a
    different partition count than declared, because that breaks co-partitioning.
    """
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

    from gnomon.infra.kafka import admin

    client = admin(bootstrap)
    try:
        existing = client.list_topics(timeout=timeout_s).topics
    except KafkaException as exc:
        raise InfraError(f"cannot list topics on {bootstrap}: {exc}") from exc
    for spec in specs:
        if spec.name in existing and len(existing[spec.name].partitions) != spec.partitions:
            say(
                f"warning: topic {spec.name} has {len(existing[spec.name].partitions)} partitions, "
                f"topology.toml declares {spec.partitions}"
            )
    missing = [s for s in specs if s.name not in existing]
    if not missing:
        return []
    min_isr = min_insync_for(replication_factor)
    futures = client.create_topics(
        [
            NewTopic(
                s.name,
                num_partitions=s.partitions,
                replication_factor=replication_factor,
                config=s.config(min_isr),
            )
            for s in missing
        ],
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
    _wait_until_led(bootstrap, {s.name: s.partitions for s in missing}, timeout_s)
    return sorted(created)


def _wait_until_led(bootstrap: str, partitions: dict[str, int], timeout_s: float) -> None:
    """Wait until every listed broker's metadata shows all ``partitions`` with a leader.

    CreateTopics returns once the controller accepted; brokers learn it a moment later, and
    on a busy host one broker can lag for seconds. Each address in ``bootstrap`` is asked
    through its own fresh client, whose first request goes to that address.
    """
    from gnomon.infra.kafka import admin

    deadline = time.monotonic() + timeout_s
    for address in bootstrap.split(","):
        client = admin(address)
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
