"""Each region's consumer groups are coordinated from its own site (gnomon.infra.coordinators):
the partition Kafka picks for a group, and the leaders planned for them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gnomon.config import Settings
from gnomon.infra import coordinators as co
from gnomon.infra import manager, topics
from gnomon.region import java_hash


def test_java_string_hash_matches_java() -> None:
    assert java_hash("") == 0
    assert java_hash("hello") == 99162322  # "hello".hashCode()
    assert java_hash("polygenelubricants") == -(1 << 31)  # Integer.MIN_VALUE: Kafka's abs makes it 0
    assert co.partition_for("polygenelubricants", 16) == 0
    assert java_hash("\U0001F600") == 55357 * 31 + 56832  # a surrogate pair: two UTF-16 units


@given(st.text(max_size=40), st.integers(min_value=1, max_value=64))
def test_a_group_maps_to_one_partition_in_range(group: str, partitions: int) -> None:
    assert 0 <= co.partition_for(group, partitions) < partitions


def test_each_regions_groups_are_led_from_its_site() -> None:
    plan = co.plan({"a": 1, "b": 2}, partitions=16)
    for base in co.GROUPS:
        assert plan.leaders[co.partition_for(f"{base}.a", 16)] == 1
        assert plan.leaders[co.partition_for(f"{base}.b", 16)] == 2
    assert plan.clashes == ()


def test_the_processors_group_wins_a_partition_two_regions_share() -> None:
    # with 16 partitions gnomon-processor.a and gnomon-worker-inbox.b both hash to 4
    assert co.partition_for("gnomon-processor.a", 16) == co.partition_for("gnomon-worker-inbox.b", 16) == 4
    plan = co.plan({"a": 1, "b": 2}, partitions=16, groups=("gnomon-processor", "gnomon-worker-inbox"))
    assert plan.leaders[4] == 1 and plan.leaders[co.partition_for("gnomon-processor.b", 16)] == 2
    assert sorted(c.split()[0] for c in plan.clashes) == ["gnomon-worker-inbox.a", "gnomon-worker-inbox.b"]


def test_the_assignment_puts_each_planned_leader_first_with_three_distinct_replicas() -> None:
    plan = co.plan({"a": 1, "b": 2}, partitions=16)
    replicas = co.assignment(plan, brokers=3, partitions=16)
    assert len(replicas) == 16
    for p, rs in enumerate(replicas):
        assert sorted(rs) == [1, 2, 3]
        if p in plan.leaders:
            assert rs[0] == plan.leaders[p]


def test_the_plan_counts_the_partitions_the_brokers_are_given() -> None:
    from gnomon.config import REPO_ROOT

    template = (REPO_ROOT / "infra" / "kafka" / "server.properties.template").read_text()
    assert f"offsets.topic.num.partitions={co.OFFSETS_PARTITIONS}\n" in template


def test_the_template_gives_the_transaction_log_the_partitions_the_ids_are_picked_for() -> None:
    from gnomon.config import REPO_ROOT

    template = (REPO_ROOT / "infra" / "kafka" / "server.properties.template").read_text()
    assert f"transaction.state.log.num.partitions={co.TXN_PARTITIONS}\n" in template


@given(st.from_regex(r"[a-z0-9-]{1,20}", fullmatch=True), st.sampled_from(["a", "b", "east", "west2"]))
def test_a_processors_transactional_id_is_coordinated_from_its_regions_partition(instance: str, where: str) -> None:
    from gnomon import region

    base = f"gnomon-processor-{instance}.{where}"
    tid = region.transactional_id(base, where)
    assert tid == base or tid.startswith(base + "~")  # (the processors' PREFIXED ACL admits it)
    assert co.partition_for(tid, co.TXN_PARTITIONS) == co.partition_for(region.txn_anchor(where), co.TXN_PARTITIONS)
    assert region.transactional_id(base, where) == tid  # the same id each time: a restart fences its earlier self
    assert region.transactional_id(base, None) == base  # no regions: as before


def test_each_regions_transactions_are_led_from_its_site() -> None:
    from gnomon import region

    plan = co.txn_plan({"a": 1, "b": 2})
    assert plan.clashes == ()
    for name, host in (("a", 1), ("b", 2)):
        assert plan.leaders[co.partition_for(region.txn_anchor(name), co.TXN_PARTITIONS)] == host
    replicas = co.assignment(plan, brokers=3, partitions=co.TXN_PARTITIONS)
    assert all(sorted(rs) == [1, 2, 3] for rs in replicas)
    assert co.txn_config(2)["min.insync.replicas"] == "2"


def test_two_regions_whose_anchors_share_a_partition_are_named() -> None:
    from gnomon import region

    names = [f"r{i}" for i in range(40)]
    by_partition: dict[int, list[str]] = {}
    for n in names:
        by_partition.setdefault(co.partition_for(region.txn_anchor(n), co.TXN_PARTITIONS), []).append(n)
    first, second = next(ns for ns in by_partition.values() if len(ns) > 1)[:2]
    plan = co.txn_plan({first: 1, second: 2})
    assert len(plan.leaders) == 1 and len(plan.clashes) == 1 and second in plan.clashes[0]


def test_a_topic_made_before_the_placement_is_found_and_the_fix_written(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    plan = co.txn_plan({"a": 1, "b": 2})
    pa, pb = (next(p for p, h in plan.leaders.items() if h == host) for host in (1, 2))
    placed = co.assignment(plan, 3, co.TXN_PARTITIONS)
    assert co.misplaced(plan, placed) == {}
    # Kafka's own spread (leader 1 + partition % 3): whichever of a's and b's partitions it puts elsewhere
    spread = [topics.preferred(1 + i % 3, 3, i) for i in range(co.TXN_PARTITIONS)]
    wrong = co.misplaced(plan, spread)
    assert wrong == {p: h for p, h in ((pa, 1), (pb, 2)) if spread[p][0] != h} and wrong
    fix = co.reassignment(plan, spread, co.TXN_TOPIC)
    for move in fix["partitions"]:  # type: ignore[attr-defined]
        p = move["partition"]
        assert move["replicas"][0] == plan.leaders[p] and sorted(move["replicas"]) == sorted(spread[p])
    # infra up on such a cluster: a warning naming the partitions, and the reassignment file
    said: list[str] = []
    monkeypatch.setattr(manager, "say", said.append)
    monkeypatch.setattr(topics, "replicas_of", lambda *_a, **_k: spread)
    settings = Settings(state_dir=tmp_path)
    manager._check_placement(settings, "b:1", co.TXN_TOPIC, plan, "processors' transactions", {1: "a", 2: "b"})
    (line,) = said
    assert line.startswith(f"warning: {co.TXN_TOPIC} existed before gnomon placed it: partition ")
    assert all(f"partition {p} (region" in line for p in wrong)
    written = json.loads((tmp_path / "reassign-transaction_state.json").read_text())
    assert written == fix
    said.clear()
    monkeypatch.setattr(topics, "replicas_of", lambda *_a, **_k: placed)
    manager._check_placement(settings, "b:1", co.TXN_TOPIC, plan, "processors' transactions", {1: "a", 2: "b"})
    assert said == []
