"""A minimal Faust app for the stack proof: reads one topic, writes one record per input.

Configured by environment variables so that the test (tests/integration/test_stack.py)
and the kill -9 experiment (bench/faust_eos_kill.py) can run it as a subprocess:

    STACK_BROKER        kafka://127.0.0.1:9092
    STACK_APP_ID        Faust app id (also the consumer group id)
    STACK_IN            input topic   (pre-created by the caller)
    STACK_OUT           output topic  (pre-created by the caller)
    STACK_PARTITIONS    partitions of both topics
    STACK_DATADIR       Faust datadir (tables' local state)
    STACK_STORE         memory:// or rocksdb://
    STACK_GUARANTEE     at_least_once | exactly_once
    STACK_TABLE         1 = also count records per key in a table
    STACK_CHANGELOG     the table's changelog topic (pre-created, compacted)
    STACK_INSTANCE      a label written into every output value
    STACK_SUBSCRIBE_SINK  1 = also run a no-op agent on the output topic (see below)
    STACK_COMMIT_INTERVAL seconds between commits (default 1; huge = never commit)

Output value: JSON {"id": <input value's id>, "key": <key>, "instance": ..., "count": n}
where count is the table's count for the key after this record (0 without a table).

Run:  python faust_relay.py worker --without-web -l info   (cwd = this directory)
"""

from __future__ import annotations

import json
import os

import faust

BROKER = os.environ.get("STACK_BROKER", "kafka://127.0.0.1:9092")
APP_ID = os.environ["STACK_APP_ID"]
IN_TOPIC = os.environ["STACK_IN"]
OUT_TOPIC = os.environ["STACK_OUT"]
PARTITIONS = int(os.environ.get("STACK_PARTITIONS", "4"))
DATADIR = os.environ["STACK_DATADIR"]
STORE = os.environ.get("STACK_STORE", "memory://")
GUARANTEE = os.environ.get("STACK_GUARANTEE", "at_least_once")
WITH_TABLE = os.environ.get("STACK_TABLE", "0") == "1"
CHANGELOG = os.environ.get("STACK_CHANGELOG", f"{IN_TOPIC}.changelog")
INSTANCE = os.environ.get("STACK_INSTANCE", "a")
SUBSCRIBE_SINK = os.environ.get("STACK_SUBSCRIBE_SINK", "0") == "1"
COMMIT_INTERVAL = float(os.environ.get("STACK_COMMIT_INTERVAL", "1.0"))



def _credentials() -> dict[str, object]:
    """gnomon's Kafka credentials (admin role in development), as Faust broker credentials."""
    from gnomon.adapters.kafka import aiokafka_security

    sec = aiokafka_security()
    if not sec:
        return {}
    return {"broker_credentials": faust.SASLCredentials(
        username=sec["sasl_plain_username"], password=sec["sasl_plain_password"],
        mechanism=sec["sasl_mechanism"])}


app = faust.App(
    APP_ID,
    broker=BROKER,
    broker_client_id=f"{APP_ID}-{INSTANCE}",
    datadir=DATADIR,
    store=STORE,
    processing_guarantee=GUARANTEE,
    # web_enabled=False alone does not stop `worker` from binding 6066: run it with
    # `worker --without-web` (two instances on one host would otherwise collide).
    web_enabled=False,
    topic_partitions=PARTITIONS,
    topic_replication_factor=1,
    # The caller creates every topic (all named stackproof.*); Faust's default names
    # would be derived from the app id (<id>-__assignor-__leader, <id>-<table>-changelog).
    topic_allow_declare=False,
    topic_disable_leader=True,
    broker_session_timeout=10.0,
    broker_heartbeat_interval=1.0,
    broker_commit_every=100 if COMMIT_INTERVAL <= 60 else 10**9,
    broker_commit_interval=COMMIT_INTERVAL,
    table_cleanup_interval=3600.0,
    consumer_auto_offset_reset="earliest",
    producer_acks=-1,
    **_credentials(),
)

raw = {"key_serializer": "raw", "value_serializer": "raw", "partitions": PARTITIONS}
source = app.topic(IN_TOPIC, **raw)
sink = app.topic(OUT_TOPIC, **raw)

counts = (
    app.Table(
        "counts",
        default=int,
        partitions=PARTITIONS,
        key_type=str,
        value_type=int,
        changelog_topic=app.topic(
            CHANGELOG, key_type=str, value_type=int, partitions=PARTITIONS, compacting=True
        ),
    )
    if WITH_TABLE
    else None
)


@app.agent(source)
async def relay(stream: faust.StreamT) -> None:
    async for event in stream.events():
        key = event.key or b""
        body = json.loads(event.value)
        count = 0
        if counts is not None:
            k = key.decode()
            counts[k] += 1
            count = counts[k]
        out = {"id": body["id"], "key": key.decode(), "instance": INSTANCE, "count": count}
        # Same partition as the input, as a co-partitioned processor would do.
        await sink.send(key=key, value=json.dumps(out).encode(), partition=event.message.partition)


if SUBSCRIBE_SINK:
    # faust-streaming 0.15.3, exactly_once: TransactionManager.send() picks the
    # transactional producer from the *consumer's* metadata; for a topic the app does not
    # consume, key_partition() returns None and the record goes out on the plain,
    # non-transactional producer (seen as isTransactional=false in the log segments).
    # Consuming the sink makes its metadata known, so outputs join the transaction of
    # the input partition with the same number. bench/faust_eos_kill.py measures both.
    @app.agent(sink)
    async def sink_metadata(stream: faust.StreamT) -> None:
        async for _ in stream.events():
            pass


@app.task
async def announce() -> None:
    print(f"STACKPROOF-READY {APP_ID} {INSTANCE}", flush=True)


if __name__ == "__main__":
    app.main()
