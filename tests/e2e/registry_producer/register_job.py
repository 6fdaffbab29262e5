"""Register a gnomon job knowing only the schema registry and the job-event contract
(docs/job-events.md): no gnomon import, no schema file. confluent-kafka's AvroSerializer
takes the latest version of the commands topic's subject from the registry (it never
registers a schema); the processor's answer is read from the REST API
(``GET /v1/commands/{partition}-{offset}`` with the tenant's token, $GNOMON_API_TOKEN).

Arguments: registry_url bootstrap username password commands_topic api_url
job_id tenant cron argv...  Exit 0: accepted; 3: refused; 4: no answer within 60 s.
"""

import hashlib
import hmac
import json
import os
import struct
import sys
import time
import urllib.request

from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
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


def answer_of(api_url, partition, offset):
    """The processor's answer to the command Kafka wrote at ``partition``/``offset``, as
    the REST API has it for this tenant (docs/job-events.md, "Answers"); None: pending."""
    req = urllib.request.Request(f"{api_url}/v1/commands/{partition}-{offset}",
                                 headers={"Authorization": "Bearer " + os.environ["GNOMON_API_TOKEN"]})
    with urllib.request.urlopen(req, timeout=10) as resp:
        body = json.load(resp)
    return None if body["status"] == "pending" else body


def main(argv):
    registry_url, bootstrap, user, password, commands, api_url, job_id, tenant, cron = argv[:9]
    command_argv = argv[9:]
    user_info = os.environ.get("GNOMON_REGISTRY_USER_INFO")  # the registry's reader, user:password
    sr = SchemaRegistryClient({"url": registry_url, **({"basic.auth.user.info": user_info} if user_info else {})})
    serialize = AvroSerializer(sr, conf={"auto.register.schemas": False, "use.latest.version": True})
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
        answer = answer_of(api_url, msg.partition(), msg.offset())
        if answer is not None:
            print("answer " + json.dumps(answer, sort_keys=True))
            return 0 if answer["code"] == "accepted" else 3
        time.sleep(0.2)
    print("no answer within 60 s")
    return 4


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
