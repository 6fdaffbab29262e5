"""The topology, read from ``streams/topology.toml`` (the topology as data): the one place
topic names are written.

:func:`parse_topology` is the only parser of that file. It gives a :class:`Topology`:

* every topic's name by its *role* (``topo.job_commands``, ``topo.runs``, ...): each
  ``[topics."<name>"]`` table says ``role = "<attribute>"``, and every role of
  :data:`ROLES` must be declared exactly once;
* every topic's Kafka spec (:class:`TopicSpec`, ``topo.topics``);
* the worker pools a job may name (``[pools]``, ``topo.pools``) and the priority tiers
  (``topo.priorities``, the :class:`~gnomon.core.model.Priority` values);
* what each processor consumes and produces (``[processors.<name>]``,
  ``topo.processors``), checked against the declared topics;
* ``[defaults]``: ``partitions`` (1 if not given), ``replication_factor`` and
  ``min_insync_replicas`` (1).

A region's namespace (:mod:`gnomon.region`) is the same topology with every topic
renamed (:func:`regional`); :func:`load_topology` gives the namespace of
``$GNOMON_REGION`` unless told which.

Other modules take names from a ``Topology`` (``load_topology()``), never spell them;
``tests/unit/test_topology_names.py`` checks that.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from functools import lru_cache
from pathlib import Path
from typing import Any, Final

from gnomon import region as regions
from gnomon.config import load
from gnomon.core.model import Priority

# Topology attribute names, one per topic role.
ROLES: tuple[str, ...] = (
    "job_commands", "command_results", "run_events", "jobs", "runs", "run_exports", "worker_inbox",
    "run_logs", "dead_letters", "poison", "workers", "tenants", "tenant_usage", "schemas", "alert_configs",
    "calendars", "dependencies", "regions",
)
# Roles every region shares: a region's namespace (``regional``) keeps their names.
SHARED_ROLES: tuple[str, ...] = ("regions",)
# Keyed by job_id: one processor instance owns a job's schedule and its runs together.
CO_PARTITIONED: tuple[str, ...] = ("job_commands", "command_results", "run_events", "jobs", "runs", "dependencies")
_TOPIC_KEYS = frozenset({"role", "key", "partitions", "cleanup_policy", "retention_ms", "config"})
_POOLS_KEYS = frozenset({"names"})
_PROCESSOR_KEYS = frozenset({"consumes", "changelog", "consumes_also", "produces"})


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    cleanup_policy: str = "delete"
    retention_ms: int | None = None
    extra_config: dict[str, str] = field(default_factory=dict)
    role: str | None = None  # its Topology attribute

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


@dataclass(frozen=True)
class ProcessorSpec:
    """A ``[processors.<name>]`` table: topic names (declared in ``[topics]``)."""

    name: str
    consumes: tuple[str, ...] = ()
    changelog: str | None = None
    consumes_also: tuple[str, ...] = ()  # read whole, outside the consumer group
    produces: tuple[str, ...] = ()

    def reads(self) -> tuple[str, ...]:
        return (*self.consumes, *([self.changelog] if self.changelog else []), *self.consumes_also)

    def writes(self) -> tuple[str, ...]:
        return (*self.produces, *([self.changelog] if self.changelog else []))


def _packaged(role: str) -> Callable[[], str]:
    """The default of a name field: that role's name in the packaged topology, default
    namespace (for a ``Topology(...)`` built by hand with other sizes, e.g. in tests)."""
    return lambda: str(getattr(load_topology(region=None), role))


@dataclass(frozen=True)
class Topology:
    partitions: int
    pools: tuple[str, ...]
    job_commands: str = field(default_factory=_packaged("job_commands"))
    command_results: str = field(default_factory=_packaged("command_results"))  # core.replies, key job_id
    run_events: str = field(default_factory=_packaged("run_events"))
    jobs: str = field(default_factory=_packaged("jobs"))
    runs: str = field(default_factory=_packaged("runs"))
    run_exports: str = field(default_factory=_packaged("run_exports"))  # core.exports, key run_id
    worker_inbox: str = field(default_factory=_packaged("worker_inbox"))
    run_logs: str = field(default_factory=_packaged("run_logs"))
    dead_letters: str = field(default_factory=_packaged("dead_letters"))
    poison: str = field(default_factory=_packaged("poison"))
    workers: str = field(default_factory=_packaged("workers"))
    tenants: str = field(default_factory=_packaged("tenants"))  # tenant limits (core.tenants), key tenant
    tenant_usage: str = field(default_factory=_packaged("tenant_usage"))  # per-partition usage, "<tenant>/<p>"
    schemas: str = field(default_factory=_packaged("schemas"))  # the schema registry's store (gnomon.registry)
    alert_configs: str = field(default_factory=_packaged("alert_configs"))  # alert webhooks (core.alerts), key tenant
    calendars: str = field(default_factory=_packaged("calendars"))  # exclusion calendars, key "<tenant>/<name>"
    dependencies: str = field(default_factory=_packaged("dependencies"))  # core.dependencies, key job_id
    regions: str = field(default_factory=_packaged("regions"))  # who runs each region (core.regions): shared
    topics: tuple[TopicSpec, ...] = ()  # every topic ((): not from a file)
    processors: tuple[ProcessorSpec, ...] = ()
    replication_factor: int = 1
    min_insync_replicas: int = 1
    region: str | None = None  # the namespace (gnomon.region) these names are of; None: the default one

    @property
    def priorities(self) -> tuple[str, ...]:
        """The priority tiers, highest first (the :class:`~gnomon.core.model.Priority` values)."""
        return tuple(p.value for p in Priority)

    def co_partitioned(self) -> list[str]:
        """The names of the topics keyed by job id, with one partition count (``CO_PARTITIONED``)."""
        return [str(getattr(self, role)) for role in CO_PARTITIONED]

    def roles(self) -> dict[str, str]:
        """Role (attribute) -> topic name, for every role of :data:`ROLES`."""
        return {role: str(getattr(self, role)) for role in ROLES}


def _str_list(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{where} must be a list of strings")
    return tuple(value)


def _unknown_keys(table: Mapping[str, Any], allowed: frozenset[str], where: str) -> None:
    extra = sorted(set(table) - allowed)
    if extra:
        raise ValueError(f"{where}: unknown keys {', '.join(extra)} (allowed: {', '.join(sorted(allowed))})")


def _spec(name: str, table: Mapping[str, Any], default_partitions: int, role: str | None) -> TopicSpec:
    retention = table.get("retention_ms")
    return TopicSpec(
        name=name,
        partitions=int(table.get("partitions", default_partitions)),
        cleanup_policy=str(table.get("cleanup_policy", "delete")),
        retention_ms=int(retention) if retention is not None else None,
        extra_config={str(k): str(v) for k, v in table.get("config", {}).items()},
        role=role,
    )


def parse_topology(data: Mapping[str, Any], source: str = "topology") -> Topology:
    """The topology of an already-parsed topology document (pure). ``source`` names it in
    errors. Raises ``ValueError`` for a document that breaks the rules above."""
    defaults = data.get("defaults", {})
    parts = int(defaults.get("partitions", 1))
    specs: list[TopicSpec] = []
    names: dict[str, str] = {}
    for name, table in data.get("topics", {}).items():
        where = f'{source}: [topics."{name}"]'
        _unknown_keys(table, _TOPIC_KEYS, where)
        role = table.get("role")
        if role not in ROLES:
            raise ValueError(f"{where}: role must be one of {', '.join(ROLES)}; got {role!r}")
        if role in names:
            raise ValueError(f"{where}: role {role} is already {names[role]}")
        names[role] = name
        specs.append(_spec(name, table, parts, role))
    missing = [r for r in ROLES if r not in names]
    if missing:
        raise ValueError(f"{source}: no topic has the role {', '.join(missing)}")
    for role in CO_PARTITIONED:
        spec = next(s for s in specs if s.role == role)
        if spec.partitions != parts:
            raise ValueError(f"{source}: {spec.name} must have {parts} partitions (co-partitioned by job_id)")
    if "dispatch" in data:
        raise ValueError(f"{source}: [dispatch] is gone (the old pull path's topics); name the pools in "
                         "[pools] names = [...]: docs/operations.md, \"Migrations\"")
    pools_table = data.get("pools")
    if not isinstance(pools_table, Mapping) or "names" not in pools_table:
        raise ValueError(f"{source}: [pools] with names = [...] is required")
    _unknown_keys(pools_table, _POOLS_KEYS, f"{source}: [pools]")
    pools = _str_list(pools_table["names"], f"{source}: [pools].names")
    if not pools:
        raise ValueError(f"{source}: [pools].names must name at least one pool")
    declared = {s.name for s in specs if s.role is not None}
    processors = []
    for pname, table in data.get("processors", {}).items():
        where = f"{source}: [processors.{pname}]"
        _unknown_keys(table, _PROCESSOR_KEYS, where)
        changelog = table.get("changelog")
        proc = ProcessorSpec(
            pname,
            consumes=_str_list(table.get("consumes", []), f"{where}.consumes"),
            changelog=None if changelog is None else str(changelog),
            consumes_also=_str_list(table.get("consumes_also", []), f"{where}.consumes_also"),
            produces=_str_list(table.get("produces", []), f"{where}.produces"),
        )
        unknown = sorted({t for t in (*proc.reads(), *proc.writes()) if t not in declared})
        if unknown:
            raise ValueError(f"{where}: names topics not declared in [topics]: {', '.join(unknown)}")
        processors.append(proc)
    replication = int(defaults.get("replication_factor", 1))
    return Topology(
        partitions=parts,
        pools=pools,
        **names,
        topics=tuple(specs),
        processors=tuple(processors),
        replication_factor=replication,
        min_insync_replicas=int(defaults.get("min_insync_replicas", 1)),
    )


def read_topology(path: Path) -> Topology:
    """The topology of the file at ``path``, read now (see :func:`load_topology`)."""
    return parse_topology(tomllib.loads(path.read_text()), source=str(path))


def regional(topo: Topology, region: str | None) -> Topology:
    """``topo`` as ``region``'s namespace (pure): every topic name (each role, each
    ``TopicSpec``, what each processor consumes and produces) renamed by
    :func:`gnomon.region.topic_name`, and ``region`` set. None: ``topo`` itself.
    ValueError for a bad name, or a ``topo`` already of another region."""
    if region is None or topo.region == region:
        return topo
    regions.validate(region)
    if topo.region is not None:
        raise ValueError(f"the topology is region {topo.region}'s already, not the default namespace's")

    shared = {str(getattr(topo, role)) for role in SHARED_ROLES}

    def name(n: str) -> str:
        return n if n in shared else regions.topic_name(n, region)

    def names(ns: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(name(n) for n in ns)

    renamed: dict[str, Any] = {role: name(str(getattr(topo, role))) for role in ROLES}
    return replace(
        topo,
        **renamed,
        topics=tuple(replace(s, name=name(s.name)) for s in topo.topics),
        processors=tuple(
            replace(p, consumes=names(p.consumes), changelog=None if p.changelog is None else name(p.changelog),
                    consumes_also=names(p.consumes_also), produces=names(p.produces))
            for p in topo.processors
        ),
        region=region,
    )


class _Current(Enum):
    REGION = "$GNOMON_REGION"


CURRENT: Final = _Current.REGION  # load_topology's default: the namespace of gnomon.region.current()


def load_topology(path: Path | None = None, region: str | _Current | None = CURRENT) -> Topology:
    """The topology of the file at ``path`` (default: the settings' ``topology_path``,
    the packaged ``streams/topology.toml`` or ``$GNOMON_TOPOLOGY``) as ``region``'s
    namespace (default: ``$GNOMON_REGION``'s, :func:`gnomon.region.current`; None: the
    default namespace), read once per path and region."""
    return _load_topology(path, regions.current() if region is CURRENT else region)


@lru_cache(maxsize=16)
def _load_topology(path: Path | None, region: str | None) -> Topology:
    if region is not None:
        return regional(_load_topology(path, None), region)
    return read_topology(path or load().topology_path)


def namespace_names(layout: Sequence[str] = ()) -> tuple[str | None, ...]:
    """None (the default namespace), then every configured region (``$GNOMON_REGIONS``,
    :func:`gnomon.region.configured`, and ``layout``'s), each once: what infra creates."""
    return (None, *dict.fromkeys((*regions.configured(), *layout)))


def namespaces(path: Path | None = None, layout: Sequence[str] = ()) -> tuple[Topology, ...]:
    """The topology of each of :func:`namespace_names`, the default namespace's first."""
    return tuple(load_topology(path, region=r) for r in namespace_names(layout))
