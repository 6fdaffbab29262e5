"""Regions as namespaces (issue 27): one stretched Kafka cluster and one Cassandra
cluster serve every region; each region is a *namespace*, a complete set of gnomon
topics and consumer groups of its own.

A job's home region is the namespace it was created in, and that namespace's processors
schedule it. When a region is lost, processes of its namespace are started in a
surviving region: same topics, same groups, so Kafka's group generations (and the
transactional fencing tied to them) carry over.

* ``$GNOMON_REGION`` (:data:`ENV`): the namespace whose jobs a process serves; unset:
  the default namespace (the names in ``streams/topology.toml``, as before regions).
* ``$GNOMON_RUNS_IN`` (:data:`RUNS_IN_ENV`): the region the process runs in (default:
  its ``$GNOMON_REGION``); differs only for a lost region's processes run elsewhere.
* ``$GNOMON_REGIONS`` (:data:`REGIONS_ENV`): every region, comma-separated; infra
  creates each one's namespace (topics, ACLs) besides the default one.

A region's topic is the default one with ``<region>.`` after its leading ``gnomon.``
(:func:`topic_name`: ``gnomon.job-commands`` -> ``gnomon.a.job-commands``); a consumer
group that joins or commits gets ``.<region>`` after its id (:func:`group_id`:
``gnomon-processor`` -> ``gnomon-processor.a``). Groups only assigned, never committed,
keep their ids. ``gnomon.topology.regional`` renames a whole topology.

Coordinators: Kafka coordinates a group or a transactional id from the leader of one
partition of ``__consumer_offsets`` or ``__transaction_state``, the one its id hashes to
(:func:`coordinator_partition`). ``gnomon infra up`` leads a region's partitions from its
own site (``gnomon.infra.coordinators``); a processor running in a region picks its
transactional id so that it hashes there too (:func:`transactional_id`).
"""

from __future__ import annotations

import os

from gnomon.core.regions import validate_name

ENV = "GNOMON_REGION"
RUNS_IN_ENV = "GNOMON_RUNS_IN"
REGIONS_ENV = "GNOMON_REGIONS"

_PREFIX = "gnomon."


def validate(name: str, variable: str = ENV) -> str:
    """``name`` if it is a region name (a lowercase letter, then at most 15 lowercase
    letters or digits); else ValueError naming ``variable`` (where the name came from)."""
    return validate_name(name, variable)


def _env(variable: str) -> str | None:
    value = os.environ.get(variable, "").strip()
    return validate(value, variable) if value else None


def current() -> str | None:
    """The namespace this process serves (``$GNOMON_REGION``); None: the default one."""
    return _env(ENV)


def runs_in() -> str | None:
    """The region this process runs in (``$GNOMON_RUNS_IN``, default :func:`current`)."""
    return _env(RUNS_IN_ENV) or current()


def configured() -> tuple[str, ...]:
    """Every region of ``$GNOMON_REGIONS`` (comma-separated; unset: none), in order.
    ValueError for a bad name or one given twice."""
    raw = os.environ.get(REGIONS_ENV, "")
    names = tuple(validate(n.strip(), REGIONS_ENV) for n in raw.split(",") if n.strip())
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"{REGIONS_ENV}: {', '.join(twice)} given more than once")
    return names


def topic_name(base: str, region: str | None) -> str:
    """``region``'s name of the topic called ``base`` in the default namespace:
    ``<region>.`` inserted after the leading ``gnomon.`` (prepended to a name without
    it); ``base`` itself for None."""
    if region is None:
        return base
    validate(region)
    if base.startswith(_PREFIX):
        return f"{_PREFIX}{region}.{base[len(_PREFIX):]}"
    return f"{region}.{base}"


def base_name(topic: str, region: str | None) -> str:
    """The default namespace's name of ``region``'s topic ``topic`` (the inverse of
    :func:`topic_name`); ValueError for a name that is not ``region``'s."""
    if region is None:
        return topic
    for prefix, keep in ((f"{_PREFIX}{validate(region)}.", _PREFIX), (f"{region}.", "")):
        if topic.startswith(prefix):
            return keep + topic[len(prefix):]
    raise ValueError(f"{topic!r} is not a topic of region {region}'s namespace")


def other_region_topic(topic: str, region: str | None, other: str) -> str:
    """Region ``other``'s name of ``region``'s topic ``topic``."""
    return topic_name(base_name(topic, region), other)


def group_id(base: str, region: str | None) -> str:
    """``region``'s id of the consumer group ``base``: ``<base>.<region>``; ``base`` for None."""
    if region is None:
        return base
    return f"{base}.{validate(region)}"


TXN_PARTITIONS = 16  # transaction.state.log.num.partitions (infra/kafka/server.properties.template)
TXN_SUFFIX_MAX = 10_000  # transactional ids tried for one that hashes to the region's partition


def java_hash(text: str) -> int:
    """Java's ``String.hashCode`` (UTF-16 code units, 32-bit wrap-around), signed."""
    h = 0
    raw = text.encode("utf-16-be")
    for i in range(0, len(raw), 2):
        h = (31 * h + int.from_bytes(raw[i:i + 2], "big")) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def coordinator_partition(key: str, partitions: int) -> int:
    """The partition of ``__consumer_offsets`` (a group id) or ``__transaction_state`` (a
    transactional id) whose leader coordinates ``key``: Kafka's
    ``abs(key.hashCode()) % partitions``, its ``Utils.abs`` counting Integer.MIN_VALUE as 0."""
    h = java_hash(key)
    return (0 if h == -(1 << 31) else abs(h)) % partitions


def txn_anchor(runs_in: str) -> str:
    """The key whose ``__transaction_state`` partition the transactional ids of processes
    running in region ``runs_in`` hash to (infra leads it from that region's site)."""
    return f"gnomon-transactions.{validate(runs_in)}"


def transactional_id(base: str, runs_in: str | None, partitions: int = TXN_PARTITIONS) -> str:
    """``base``, or for a process running in region ``runs_in`` the first of ``base``,
    ``base~1``, ``base~2``... that Kafka coordinates from the same ``__transaction_state``
    partition as :func:`txn_anchor`: from the region's own site, so that a cut of another
    site leaves its transactions a coordinator (the same id each time: a restarted
    process fences its earlier self)."""
    if runs_in is None:
        return base
    target = coordinator_partition(txn_anchor(runs_in), partitions)
    for k in range(TXN_SUFFIX_MAX):
        candidate = base if k == 0 else f"{base}~{k}"
        if coordinator_partition(candidate, partitions) == target:
            return candidate
    raise AssertionError(f"no transactional id for {base} hashes to partition {target} of {partitions}")
