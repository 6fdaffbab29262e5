"""The local stack from ``gnomon.infra``: processes, topics, and both Python Kafka clients."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import ConfigResource

from gnomon.adapters.kafka import aiokafka_security, security_config
from gnomon.config import Settings
from gnomon.infra import cassandra, kafka, manager, topics

pytestmark = pytest.mark.integration


def test_status_reports_both_up(infra: Settings) -> None:
    st = manager.status(infra)
    assert st["kafka"]["state"] == "up"
    assert st["kafka"]["version"].startswith("3.9.")
    assert st["cassandra"]["state"] == "up"
    assert st["cassandra"]["version"].startswith("5.0.")
    assert st["registry"]["state"] == "up" and st["registry"]["subjects"] > 0


def test_topics_match_topology(infra: Settings) -> None:
    specs = topics.topic_specs(infra.topology_path)
    client = kafka.admin(infra.kafka_bootstrap)
    existing = client.list_topics(timeout=10).topics
    resources = [ConfigResource("topic", s.name) for s in specs]
    configs = {r.name: f.result() for r, f in client.describe_configs(resources).items()}
    for spec in specs:
        assert spec.name in existing, spec.name
        assert len(existing[spec.name].partitions) == spec.partitions, spec.name
        assert configs[spec.name]["cleanup.policy"].value == spec.cleanup_policy, spec.name
        if spec.retention_ms is not None:
            assert configs[spec.name]["retention.ms"].value == str(spec.retention_ms), spec.name


def test_replicas_of_reads_each_partitions_replicas(infra: Settings) -> None:
    # what infra up compares with its coordinators' placement (regions layout)
    specs = topics.topic_specs(infra.topology_path)
    got = topics.replicas_of(infra.kafka_bootstrap, specs[0].name)
    assert got == [[1]] * specs[0].partitions  # one node: every partition's only replica
    missing = f"gnomon.no-such-topic-{uuid.uuid4().hex[:6]}"
    assert topics.replicas_of(infra.kafka_bootstrap, missing) == []
    # and asking made no such topic (a metadata request naming it would, with the broker's
    # auto.create.topics.enable: it did in CI)
    assert missing not in kafka.admin(infra.kafka_bootstrap).list_topics(timeout=10).topics


def test_up_again_is_idempotent(infra: Settings) -> None:
    before = manager.status(infra)
    started = time.monotonic()
    after = manager.up(infra, kafka_nodes=before["kafka"]["nodes"])
    assert time.monotonic() - started < 15
    assert after["kafka"]["pids"] == before["kafka"]["pids"]
    assert after["cassandra"]["pid"] == before["cassandra"]["pid"]
    assert after["registry"]["pid"] == before["registry"]["pid"]
    specs = topics.topic_specs(infra.topology_path)
    assert topics.ensure_topics(infra.kafka_bootstrap, specs, replication_factor=1) == []


def test_ensure_topics_applies_changed_configs(infra: Settings) -> None:
    """An existing topic gets the declared values that differ; undeclared configs stay."""
    from confluent_kafka.admin import NewTopic

    name = f"test.cfg.{uuid.uuid4().hex[:8]}"
    client = kafka.admin(infra.kafka_bootstrap)
    created = {"retention.ms": "86400000", "segment.ms": "600000"}
    client.create_topics([NewTopic(name, 1, 1, config=created)])[name].result(timeout=30)
    spec = topics.TopicSpec(name, 1, "delete", 3600000)
    res = ConfigResource("topic", name)
    try:
        changes = topics.sync_topics(infra.kafka_bootstrap, [spec], replication_factor=1)
        assert changes.created == []
        assert changes.reconfigured == {name: {"retention.ms": ("86400000", "3600000")}}
        configs = client.describe_configs([res])[res].result(timeout=30)
        assert configs["retention.ms"].value == "3600000"
        assert configs["segment.ms"].value == "600000"  # not declared: left as it was
        # nothing left to change, and the list-of-created API still answers the same
        assert topics.ensure_topics(infra.kafka_bootstrap, [spec], replication_factor=1) == []
        assert topics.sync_topics(infra.kafka_bootstrap, [spec], 1).reconfigured == {}
    finally:
        client.delete_topics([name])[name].result(timeout=30)


def test_cassandra_answers_cql(infra: Settings) -> None:
    assert cassandra.release_version(infra).startswith("5.0.")


def test_confluent_producer_and_aiokafka_transactions_interoperate(infra: Settings) -> None:
    """The broker version must serve both clients: confluent-kafka and aiokafka (Faust's)."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    topic = f"test.infra.{uuid.uuid4().hex[:8]}"
    bootstrap = infra.kafka_bootstrap

    async def scenario() -> list[bytes]:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **aiokafka_security())
        await admin.start()
        try:
            await admin.create_topics([NewTopic(topic, num_partitions=3, replication_factor=1)])
        finally:
            await admin.close()
        producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                **security_config(),
                "partitioner": "murmur2_random",
                "enable.idempotence": True,
                "acks": "all",
            }
        )
        producer.produce(topic, key=b"job-1", value=b"from-confluent")
        assert producer.flush(10) == 0
        tx = AIOKafkaProducer(bootstrap_servers=bootstrap, **aiokafka_security(), transactional_id=f"tx-{topic}")
        await tx.start()
        try:
            async with tx.transaction():
                await tx.send_and_wait(topic, key=b"job-1", value=b"from-aiokafka-tx")
        finally:
            await tx.stop()
        consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=bootstrap, **aiokafka_security(),
            group_id=f"g-{topic}",
            auto_offset_reset="earliest",
            isolation_level="read_committed",
        )
        await consumer.start()
        try:
            got: list[bytes] = []
            deadline = time.monotonic() + 20
            while len(got) < 2 and time.monotonic() < deadline:
                batch = await consumer.getmany(timeout_ms=1000)
                got += [m.value for msgs in batch.values() for m in msgs if m.value is not None]
            await consumer.commit()
            return got
        finally:
            await consumer.stop()

    try:
        got = asyncio.run(scenario())
    finally:
        kafka.admin(bootstrap).delete_topics([topic])
    # same key -> same partition under murmur2 in both clients, so order is preserved
    assert got == [b"from-confluent", b"from-aiokafka-tx"]


# Three KRaft nodes (replication factor 3, min ISR 2, authentication and ACLs on three
# nodes, then down): checked in tests/chaos/test_broker_loss.py, which starts such a cluster
# anyway (`three_nodes_up`), rather than starting one more here.
