"""Register a gnomon job knowing only the schema registry and the job-event contract
(docs/job-events.md): no gnomon import, no schema file. confluent-kafka's AvroSerializer
takes the latest version of the commands topic's subject from the registry (it never
registers a schema), AvroDeserializer reads the processor's answer by its schema id.

Arguments: registry_url bootstrap username password commands_topic results_topic
job_id tenant cron argv...  Exit 0: accepted; 3: refused; 4: no answer within 60 s.
"""

import hashlib
import hmac
import json
import os
import struct
import sys
import time

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext


def signature(topic, key, value):
    """The gnomon-sig header (docs/job-events.md, "Signing a command") made with the newest
    key of the tenant's key file that $GNOMON_COMMAND_KEY_FILE names; none without it."""
    path = os.environ.get("GNOMON_COMMAND_KEY_FILE")
    if not path:
        return []
    with open(path) as f:
        newest = json.load(f)["keys"][-1]
    msg = b"gnomon-command-v1\0" + b"".join(struct.pack(">I", len(p)) + p for p in (topic.encode(), key, value))
    mac = hmac.new(bytes.fromhex(newest["secret"]), msg, hashlib.sha256).hexdigest()
    return [("gnomon-sig", f"v1:{newest['id']}:{mac}".encode())]


def main(argv):
    registry_url, bootstrap, user, password, commands, results, job_id, tenant, cron = argv[:9]
    command_argv = argv[9:]
    user_info = os.environ.get("GNOMON_REGISTRY_USER_INFO")  # the registry's reader, user:password
    sr = SchemaRegistryClient({"url": registry_url, **({"basic.auth.user.info": user_info} if user_info else {})})
    serialize = AvroSerializer(sr, conf={"auto.register.schemas": False, "use.latest.version": True})
    deserialize = AvroDeserializer(sr)
    kafka = {"bootstrap.servers": bootstrap, "security.protocol": "SASL_PLAINTEXT",
             "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": user, "sasl.password": password}

    now_ms = int(time.time() * 1000)
    spec = {"name": "registered through the schema registry",
            "schedule": {"cron": cron, "tz": "UTC"},
            "target": {"type": "command", "argv": command_argv},
            "timeout_s": 30}
    # `body` is a union of records: the tuple names the branch (fastavro's notation)
    command = {"body": ("gnomon.RegisterJob", {"job_id": job_id, "tenant": tenant, "spec": spec, "at_ms": now_ms})}
    value = serialize(command, SerializationContext(commands, MessageField.VALUE))
    print(f"schema id {int.from_bytes(value[1:5], 'big')} from {registry_url}")

    consumer = Consumer({**kafka, "group.id": "gnomon-events", "enable.auto.commit": False,
                         "isolation.level": "read_committed"})
    parts = consumer.list_topics(results, timeout=10).topics[results].partitions
    tps = []
    for p in parts:  # read every partition of the results topic from its end *before* sending
        _, high = consumer.get_watermark_offsets(TopicPartition(results, p), timeout=10)
        tps.append(TopicPartition(results, p, high))
    consumer.assign(tps)

    acked = []
    producer = Producer({**kafka, "acks": "all", "enable.idempotence": True, "partitioner": "murmur2_random"})
    producer.produce(commands, key=job_id.encode(), value=value, headers=signature(commands, job_id.encode(), value),
                     on_delivery=lambda err, msg: acked.append((err, msg)))
    producer.flush(30)
    err, msg = acked[0]
    if err is not None:
        print(f"not written: {err}")
        return 1
    print(f"sent {job_id} to {msg.topic()}[{msg.partition()}]@{msg.offset()}")

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        rec = consumer.poll(0.2)
        if rec is None or rec.error() is not None:
            continue
        answer = deserialize(rec.value(), SerializationContext(results, MessageField.VALUE))
        if (answer["source_partition"], answer["source_offset"]) == (msg.partition(), msg.offset()):
            print("answer " + json.dumps(answer, sort_keys=True))
            consumer.close()
            return 0 if answer["code"] == "accepted" else 3
    print("no answer within 60 s")
    return 4


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
