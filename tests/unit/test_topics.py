"""topic_specs: the topology file as a list of topics (pure parsing, no Kafka)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gnomon.config import REPO_ROOT
from gnomon.infra.topics import TopicSpec, min_insync_for, parse_topology, topic_specs

TOPOLOGY = REPO_ROOT / "streams" / "topology.toml"


def test_repo_topology_expands_dispatch_and_defaults() -> None:
    specs = {s.name: s for s in topic_specs(TOPOLOGY)}
    assert specs["gnomon.runs"] == TopicSpec("gnomon.runs", 8, "compact", None,
                                             {"segment.ms": "600000", "min.cleanable.dirty.ratio": "0.1"})
    assert specs["gnomon.job-commands"].retention_ms == 604800000
    dispatch = sorted(n for n in specs if n.startswith("gnomon.dispatch."))
    assert len(dispatch) == 6 and "gnomon.dispatch.batch.low" in dispatch
    assert specs["gnomon.dispatch.default.high"].retention_ms == 86400000


def test_partitions_default_and_override(tmp_path: Path) -> None:
    path = tmp_path / "t.toml"
    path.write_text(
        "[defaults]\npartitions = 4\n"
        '[topics."a"]\ncleanup_policy = "compact"\n'
        '[topics."b"]\npartitions = 2\nretention_ms = 10\n'
    )
    assert topic_specs(path) == [TopicSpec("a", 4, "compact"), TopicSpec("b", 2, "delete", 10)]


def test_config_and_duplicates() -> None:
    spec = TopicSpec("a", 1, "delete", 60000)
    assert spec.config(min_insync_for(3)) == {
        "cleanup.policy": "delete",
        "min.insync.replicas": "2",
        "retention.ms": "60000",
    }
    assert min_insync_for(1) == 1
    doc = {
        "topics": {"gnomon.dispatch.x.y": {}},
        "dispatch": {
            "pools": ["x"],
            "priorities": ["y"],
            "name_format": "gnomon.dispatch.{pool}.{priority}",
        },
    }
    with pytest.raises(ValueError, match="twice"):
        parse_topology(doc)
