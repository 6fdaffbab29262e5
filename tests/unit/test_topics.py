"""topic_specs and config_diff: the topology file as topics, and what to change (no Kafka)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gnomon.config import REPO_ROOT
from gnomon.infra.topics import (
    TopicSpec,
    config_diff,
    min_insync_for,
    parse_topology,
    topic_specs,
)

TOPOLOGY = REPO_ROOT / "streams" / "topology.toml"


def test_repo_topology_expands_dispatch_and_defaults() -> None:
    specs = {s.name: s for s in topic_specs(TOPOLOGY)}
    assert specs["gnomon.runs"] == TopicSpec("gnomon.runs", 8, "compact", None,
                                             {"segment.ms": "600000", "min.cleanable.dirty.ratio": "0.1",
                                              "delete.retention.ms": "3600000"})
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
