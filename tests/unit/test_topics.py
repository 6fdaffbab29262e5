"""The topology file as a Topology (gnomon.topology, the one parser) and as topics
(infra.topics.topic_specs), and config_diff: what to change (no Kafka)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from gnomon.config import REPO_ROOT
from gnomon.infra import acls
from gnomon.infra.topics import TopicSpec, config_diff, min_insync_for, topic_specs
from gnomon.topology import CO_PARTITIONED, ROLES, Topology, load_topology, parse_topology

TOPOLOGY = REPO_ROOT / "streams" / "topology.toml"


def _doc(**over: Any) -> dict[str, Any]:
    """A minimal valid topology document: one topic per role, one pool."""
    doc: dict[str, Any] = {
        "defaults": {"partitions": 4},
        "topics": {f"t.{role}": {"role": role} for role in ROLES},
        "pools": {"names": ["p"]},
    }
    doc.update(over)
    return doc


def test_repo_topology_declares_its_topics_pools_and_defaults() -> None:
    specs = {s.name: s for s in topic_specs(TOPOLOGY)}
    topo = load_topology(TOPOLOGY)
    assert specs[topo.runs] == TopicSpec(topo.runs, 8, "compact", None,
                                         {"segment.ms": "600000", "min.cleanable.dirty.ratio": "0.1",
                                          "delete.retention.ms": "3600000"}, role="runs")
    assert specs[topo.job_commands].retention_ms == 604800000
    assert all(s.role is not None for s in specs.values()) and len(specs) == len(ROLES)
    assert not any(n.startswith("gnomon.dispatch") for n in specs)  # the old pull path's topics are gone
    assert topo.pools == ("default", "batch") and topo.priorities == ("high", "normal", "low")


def test_every_role_is_a_declared_topic_and_the_names_come_from_the_file() -> None:
    data = tomllib.loads(TOPOLOGY.read_text())
    topo = load_topology(TOPOLOGY)
    assert topo.roles() == {t["role"]: name for name, t in data["topics"].items()}
    assert set(topo.roles()) == set(ROLES)
    assert topo.pools == tuple(data["pools"]["names"])
    # a Topology built by hand (tests) gets the packaged names
    assert Topology(1, ("default",)).runs == topo.runs


def test_partitions_default_and_override() -> None:
    doc = _doc()
    doc["topics"]["t.jobs"].update(cleanup_policy="compact")
    doc["topics"]["t.workers"].update(partitions=2, retention_ms=10)
    topo = parse_topology(doc)
    specs = {s.name: s for s in topo.topics}
    assert specs["t.jobs"] == TopicSpec("t.jobs", 4, "compact", role="jobs")
    assert specs["t.workers"] == TopicSpec("t.workers", 2, "delete", 10, role="workers")
    assert (topo.partitions, topo.replication_factor, topo.min_insync_replicas) == (4, 1, 1)
    no_defaults = parse_topology(_doc(defaults={}))
    assert no_defaults.partitions == 1 and {s.partitions for s in no_defaults.topics} == {1}


def test_file_is_read(tmp_path: Path) -> None:
    path = tmp_path / "t.toml"
    lines = ["[defaults]", "partitions = 3"]
    for role in ROLES:
        lines += [f'[topics."x.{role}"]', f'role = "{role}"']
    lines += ["[pools]", 'names = ["a"]']
    path.write_text("\n".join(lines) + "\n")
    specs = topic_specs(path)
    assert len(specs) == len(ROLES) and {s.partitions for s in specs} == {3}
    assert load_topology(path).pools == ("a",)
    assert load_topology(path).runs == "x.runs"


@pytest.mark.parametrize(("mutate", "match"), [
    (lambda d: d["topics"].pop("t.runs"), "no topic has the role runs"),
    (lambda d: d["topics"]["t.runs"].update(role="nope"), "role must be one of"),
    (lambda d: d["topics"]["t.runs"].pop("role"), "role must be one of"),
    (lambda d: d["topics"].update({"t.other": {"role": "runs"}}), "role runs is already t.runs"),
    (lambda d: d["topics"]["t.runs"].update(partitions=2), "co-partitioned"),
    (lambda d: d["topics"]["t.runs"].update(partition=2), "unknown keys partition"),
    (lambda d: d.pop("pools"), "pools. with names"),
    (lambda d: d["pools"].update(names=[]), "at least one pool"),
    (lambda d: d["pools"].update(name=["p"]), "unknown keys name"),
    (lambda d: d.update(dispatch={"name_format": "t.d.{pool}.{priority}"}), "dispatch. is gone"),
    (lambda d: d.update(processors={"x": {"consumes": ["t.nope"]}}), "not declared in .topics.: t.nope"),
    (lambda d: d.update(processors={"x": {"consume": ["t.runs"]}}), "unknown keys consume"),
    (lambda d: d.update(processors={"x": {"consumes": "t.runs"}}), "must be a list of strings"),
])
def test_bad_documents_are_refused(mutate: Any, match: str) -> None:
    doc = _doc()
    mutate(doc)
    with pytest.raises(ValueError, match=match):
        parse_topology(doc)


def test_co_partitioned_roles_share_the_default_partition_count() -> None:
    topo = load_topology(TOPOLOGY)
    by_role = {s.role: s for s in topo.topics if s.role}
    assert {by_role[r].partitions for r in CO_PARTITIONED} == {topo.partitions}


def test_processors_section_matches_the_processor_acls() -> None:
    """[processors.*] says what the processors read and write; the processor role's
    Kafka ACLs grant exactly that."""
    topo = load_topology(TOPOLOGY)
    assert {p.name for p in topo.processors} == {"scheduler", "runs"}
    names = topo.roles()
    reads = {names[r] for r in acls.TOPIC_READS["processor"]}
    writes = {names[r] for r in acls.TOPIC_WRITES["processor"]}
    assert {t for p in topo.processors for t in p.reads()} == reads
    assert {t for p in topo.processors for t in p.writes()} == writes


def test_config() -> None:
    spec = TopicSpec("a", 1, "delete", 60000)
    assert spec.config(min_insync_for(3)) == {
        "cleanup.policy": "delete",
        "min.insync.replicas": "2",
        "retention.ms": "60000",
    }
    assert min_insync_for(1) == 1


def test_config_diff_only_declared_keys_that_differ() -> None:
    current = {
        "cleanup.policy": "delete",
        "retention.ms": "86400000",
        "min.insync.replicas": "1",
        "segment.bytes": "1073741824",  # not declared: never in the diff
    }
    wanted = TopicSpec("t", 1, "delete", 3600000).config(min_insync_for(1))
    assert config_diff(current, wanted) == {"retention.ms": ("86400000", "3600000")}


def test_config_diff_unreported_key_and_no_change() -> None:
    spec = TopicSpec("t", 1, "compact,delete", None, {"segment.ms": "600000"})
    wanted = spec.config(min_insync_for(3))
    current: dict[str, str | None] = {
        "cleanup.policy": "compact,delete",
        "min.insync.replicas": "1",
        "segment.ms": None,
    }
    assert config_diff(current, wanted) == {
        "min.insync.replicas": ("1", "2"),
        "segment.ms": (None, "600000"),
    }
    assert config_diff({}, {"retention.ms": "10"}) == {"retention.ms": (None, "10")}
    assert config_diff(dict(wanted), wanted) == {}
    assert config_diff({"retention.ms": "5"}, {}) == {}
