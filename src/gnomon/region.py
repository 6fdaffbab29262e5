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
