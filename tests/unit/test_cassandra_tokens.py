"""Every Cassandra node of a three-host layout owns its own vnode tokens (gnomon.infra.cassandra)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gnomon.config import Settings
from gnomon.infra import cassandra
from gnomon.infra.errors import InfraError


def _config(tmp_path: Path, index: int, count: int) -> dict[str, object]:
    settings = Settings(state_dir=tmp_path)
    node = cassandra.nodes(settings, count)[index - 1]
    loaded = yaml.safe_load(cassandra.render_config(settings, node, count))
    assert isinstance(loaded, dict)
    return loaded


def test_three_nodes_own_disjoint_tokens_dealt_round_the_ring(tmp_path: Path) -> None:
    per_node = [cassandra.initial_tokens(i, 3) for i in (1, 2, 3)]
    every = [t for tokens in per_node for t in tokens]
    assert all(len(tokens) == cassandra.NUM_TOKENS for tokens in per_node)
    assert len(set(every)) == 3 * cassandra.NUM_TOKENS  # no token held twice
    assert all(-(2**63) < t < 2**63 for t in every)  # on the ring, never its minimum
    owner = {t: i for i, tokens in enumerate(per_node) for t in tokens}
    assert [owner[t] for t in sorted(every)] == [0, 1, 2] * cassandra.NUM_TOKENS  # dealt in turn: equal shares
    gaps = {b - a for a, b in zip(sorted(every), sorted(every)[1:], strict=False)}
    assert len(gaps) == 1  # equal arcs


def test_the_rendered_configs_name_each_nodes_tokens(tmp_path: Path) -> None:
    for i in (1, 2, 3):
        conf = _config(tmp_path, i, 3)
        assert conf["num_tokens"] == cassandra.NUM_TOKENS
        assert "allocate_tokens_for_local_replication_factor" not in conf
        tokens = [int(t) for t in str(conf["initial_token"]).split(",")]
        assert tokens == cassandra.initial_tokens(i, 3)
    single = _config(tmp_path, 1, 1)  # one node: Cassandra chooses, as before
    assert "initial_token" not in single and single["allocate_tokens_for_local_replication_factor"] == 1


def test_a_node_outside_the_layout_is_refused() -> None:
    for index in (0, 4):
        with pytest.raises(InfraError, match="not one of 3"):
            cassandra.initial_tokens(index, 3)
