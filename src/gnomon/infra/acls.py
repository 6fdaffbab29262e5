"""Kafka ACLs per role, as data (docs/adr/0006-kafka-auth-and-tenant-proof.md).

Each role of :data:`gnomon.credentials.KAFKA_ROLES` is a SCRAM user ``User:<role>``.
``admin`` (and the servers' own ``broker``/``controller`` principals) are super users in
``server.properties``; every other role gets exactly the grants below, derived from the
topology (``streams/topology.toml``, read through :class:`gnomon.topology.Topology`):

* topics by their Topology attribute name (``job_commands`` = ``gnomon.job-commands``);
  READ and WRITE imply DESCRIBE;
* consumer groups by id (group ids used in the code: grep ``consumer_config(``);
* transactional ids by prefix (the processor's ``gnomon-processor-<instance>``).

A region's namespace (:mod:`gnomon.region`, ``Topology.region``) has its own topics and
its own ids of the groups that join or commit (:data:`REGIONAL_GROUPS`:
``gnomon-processor.<region>``, ...); the other groups are only assigned and keep their
ids. :func:`grants_for` is the table of several namespaces.

``python -m gnomon.infra up`` applies them with :func:`apply` (idempotent: missing ones
are created, grants for these principals that the table no longer lists are deleted),
for every namespace at once: applying one never deletes another's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gnomon import region
from gnomon.topology import Topology

LITERAL, PREFIXED = "LITERAL", "PREFIXED"
TOPIC, GROUP, TRANSACTIONAL_ID = "TOPIC", "GROUP", "TRANSACTIONAL_ID"

# role -> topics (Topology attribute names) it consumes / produces to.
TOPIC_READS: Mapping[str, tuple[str, ...]] = {
    "processor": ("job_commands", "run_events", "jobs", "runs", "workers", "tenants", "calendars", "dependencies",
                  "regions"),
    # limits and usage, for admission pre-checks (feeds/tenants.py); the results of the
    # job commands it (or a service producing as it: gnomon.events) wrote
    "api": ("tenants", "tenant_usage", "command_results", "alert_configs", "calendars"),
    "worker": ("worker_inbox", "regions"),  # regions: the gate (gnomon.gate) says which region runs its namespace
    "projector": ("jobs", "runs", "run_logs"),
    # the run-exports sinks (JSON lines, JDBC)
    "connect": ("run_exports",),
    "registry": ("schemas",),  # the schema registry reads its store at start (gnomon.registry)
    "alerter": ("runs", "alert_configs"),  # the ledger and the tenants' webhooks (gnomon.alerts)
}
TOPIC_WRITES: Mapping[str, tuple[str, ...]] = {
    # commands, run commands (cancel, replay) included; tenant limits (admin endpoints,
    # api/tenants.py); alert configs: PUT /v1/alerts (api/alerts.py); calendars. Never
    # run-events: only workers report runs (docs/adr/0006, decision 4)
    "api": ("job_commands", "tenants", "alert_configs", "calendars"),
    # a team's own service: signed job commands only, and no read at all: every tenant's
    # answers share gnomon.command-results, so it reads its own through the REST API
    # (docs/adr/0006, decisions 3 and 4); never the configuration topics the API writes
    "producer": ("job_commands",),
    "processor": ("run_events", "jobs", "runs", "worker_inbox", "dead_letters", "poison",
                  "tenant_usage", "command_results", "dependencies", "regions"),  # regions: heartbeats, takeovers
    "worker": ("run_events", "run_logs", "workers"),
    "projector": ("run_exports",),  # finished runs, once stored (gnomon.history.export)
    "registry": ("schemas",),
}

# role -> (group id, pattern, operation). READ lets a member join and commit; DESCRIBE
# only reads committed offsets (the processor watches the projector's position).
GROUPS: Mapping[str, tuple[tuple[str, str, str], ...]] = {
    "processor": (
        ("gnomon-processor", LITERAL, "READ"),  # the processors' group (processor/runtime.py)
        ("gnomon-adverts", LITERAL, "READ"),  # worker adverts, assigned (processor/adverts.py)
        ("gnomon-tenants", LITERAL, "READ"),  # tenant limits, assigned (feeds/tenants.py)
        ("gnomon-standby", LITERAL, "READ"),  # standby copies (processor/standby.py)
        ("gnomon-restore", LITERAL, "READ"),  # changelog restore (processor/runtime.py)
        ("gnomon-history", LITERAL, "DESCRIBE"),  # the projector's offsets (processor/history_mark.py)
        ("gnomon-regions", LITERAL, "READ"),  # the region gate's reader, assigned (gnomon.gate)
    ),
    "api": (("gnomon-tenants", LITERAL, "READ"),  # tenant limits and usage, assigned (feeds/tenants.py)
            ("gnomon-alert-configs", LITERAL, "READ"),  # alert configs, assigned (alerts/feed.py)
            ("gnomon-api-answers", LITERAL, "READ")),  # the processor's answers, assigned (api/answers.py)
    "worker": (("gnomon-worker-inbox", LITERAL, "READ"),
               ("gnomon-regions", LITERAL, "READ")),  # the region gate's reader, assigned (gnomon.gate)
    "projector": (("gnomon-history", LITERAL, "READ"),),
    "connect": (("connect-", PREFIXED, "READ"),),  # sink connectors' groups: connect-<name>
    "registry": (("gnomon-registry", LITERAL, "READ"),),  # its store, assigned (registry/kafka_store.py)
    # the ledger consumer (alerts/service.py): gnomon-alerter, or gnomon-alerter-<name> (--group-id)
    "alerter": (("gnomon-alerter", PREFIXED, "READ"),
                ("gnomon-alert-configs", LITERAL, "READ")),  # alert configs, assigned (alerts/feed.py)
}
# The groups that join or commit offsets: a region's namespace has its own ids of them
# (gnomon.region.group_id). A PREFIXED grant already admits them (gnomon-alerter.<region>,
# gnomon-alerter-<name>.<region>), so only LITERAL grants are renamed.
REGIONAL_GROUPS = frozenset({"gnomon-processor", "gnomon-history", "gnomon-worker-inbox", "gnomon-alerter"})
TRANSACTIONAL_IDS: Mapping[str, tuple[tuple[str, str], ...]] = {
    "processor": (("gnomon-processor-", PREFIXED),),
}


@dataclass(frozen=True, order=True)
class Grant:
    """ALLOW ``operation`` on a resource to ``User:<role>`` from any host."""

    role: str
    resource: str  # TOPIC | GROUP | TRANSACTIONAL_ID
    name: str
    pattern: str  # LITERAL | PREFIXED
    operation: str  # READ | WRITE | DESCRIBE

    @property
    def principal(self) -> str:
        return f"User:{self.role}"


def _group(name: str, pattern: str, topo: Topology) -> str:
    """``name`` in ``topo``'s namespace: a regional group's regional id (LITERAL only)."""
    if pattern == LITERAL and name in REGIONAL_GROUPS:
        return region.group_id(name, topo.region)
    return name


def grants(topo: Topology) -> list[Grant]:
    """The whole ACL table for ``topo`` (sorted, no duplicates): its topics, and its
    region's group ids when ``topo.region`` is set."""
    out: set[Grant] = set()
    for role, attrs in TOPIC_READS.items():
        out.update(Grant(role, TOPIC, getattr(topo, a), LITERAL, "READ") for a in attrs)
    for role, attrs in TOPIC_WRITES.items():
        out.update(Grant(role, TOPIC, getattr(topo, a), LITERAL, "WRITE") for a in attrs)
    for role, groups in GROUPS.items():
        out.update(Grant(role, GROUP, _group(name, pattern, topo), pattern, op) for name, pattern, op in groups)
    for role, ids in TRANSACTIONAL_IDS.items():
        out.update(Grant(role, TRANSACTIONAL_ID, name, pattern, "WRITE") for name, pattern in ids)
    if topo.region is not None:
        # a region's processors hand a moved job to its new region on that region's
        # job-commands topic (core.jobs.AdoptJob, signed with the operator's command key);
        # the default namespace has no moves, and there only the API writes commands
        out.add(Grant("processor", TOPIC, topo.job_commands, LITERAL, "WRITE"))
    return sorted(out)


def grants_for(topos: Sequence[Topology]) -> list[Grant]:
    """The ACL table of every namespace of ``topos`` (sorted union of :func:`grants`)."""
    out: set[Grant] = set()
    for topo in topos:
        out.update(grants(topo))
    return sorted(out)


def roles_with(grant_list: list[Grant], topic: str, operation: str) -> set[str]:
    """Roles allowed ``operation`` on ``topic`` by ``grant_list`` (literal or prefix match)."""
    return {
        g.role
        for g in grant_list
        if g.resource == TOPIC
        and g.operation == operation
        and (g.name == topic if g.pattern == LITERAL else topic.startswith(g.name))
    }


# --- applying -----------------------------------------------------------------------


def _binding(g: Grant) -> Any:
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        AclBinding,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    return AclBinding(
        ResourceType[g.resource], g.name, ResourcePatternType[g.pattern], g.principal, "*",
        AclOperation[g.operation], AclPermissionType.ALLOW,
    )


def _grant_of(binding: Any) -> Grant:
    return Grant(
        binding.principal.removeprefix("User:"), binding.restype.name, binding.name,
        binding.resource_pattern_type.name, binding.operation.name,
    )


def apply(client: Any, topos: Topology | Sequence[Topology], roles: tuple[str, ...],
          timeout_s: float = 30.0) -> tuple[int, int]:
    """Make the ACLs of ``roles`` exactly :func:`grants_for` ``topos`` (every namespace:
    a grant of one left out is deleted; ``client``: an admin AdminClient).

    Returns (created, deleted). Creating an existing ACL is a no-op in Kafka, so only the
    missing ones are sent; ACLs of other principals are never touched.
    """
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    wanted = set(grants_for([topos] if isinstance(topos, Topology) else topos))
    principals = {f"User:{r}" for r in roles}
    anything: Any = None  # a filter's None matches any name/principal/host (the stubs say str)
    any_filter = AclBindingFilter(
        ResourceType.ANY, anything, ResourcePatternType.ANY, anything, anything,
        AclOperation.ANY, AclPermissionType.ANY,
    )
    existing = client.describe_acls(any_filter, request_timeout=timeout_s).result()
    ours = [b for b in existing if b.principal in principals]
    have = {_grant_of(b) for b in ours if b.host == "*" and b.permission_type == AclPermissionType.ALLOW}
    missing = sorted(wanted - have)
    if missing:
        for future in client.create_acls([_binding(g) for g in missing], request_timeout=timeout_s).values():
            future.result()
    stale = [b for b in ours if b.host != "*" or b.permission_type != AclPermissionType.ALLOW
             or _grant_of(b) not in wanted]
    if stale:
        filters = [
            AclBindingFilter(b.restype, b.name, b.resource_pattern_type, b.principal, b.host,
                             b.operation, b.permission_type)
            for b in stale
        ]
        for future in client.delete_acls(filters, request_timeout=timeout_s).values():
            future.result()
    return len(missing), len(stale)
