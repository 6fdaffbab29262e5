"""Each region's consumer groups are coordinated from its own site (gnomon.infra.coordinators):
the partition Kafka picks for a group, and the leaders planned for them."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gnomon.infra import coordinators as co


def test_java_string_hash_matches_java() -> None:
    assert co.java_hash("") == 0
    assert co.java_hash("hello") == 99162322  # "hello".hashCode()
    assert co.java_hash("polygenelubricants") == -(1 << 31)  # Integer.MIN_VALUE: Kafka's abs makes it 0
    assert co.partition_for("polygenelubricants", 16) == 0
    assert co.java_hash("\U0001F600") == 55357 * 31 + 56832  # a surrogate pair: two UTF-16 units


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
