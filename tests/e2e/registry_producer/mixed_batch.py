"""A service outside gnomon sends one batch of job commands, valid and invalid mixed, and
reads the answer to each (issue 21). It knows only docs/job-events.md, the schema
registry and the REST API: no gnomon import, no schema file; confluent-kafka's
AvroSerializer writes the latest version of the commands topic's subject, and each
answer is read from ``GET /v1/commands/{partition}-{offset}`` with the tenant's token
($GNOMON_API_TOKEN): a team's Kafka credential cannot read the answers topic, which
holds every tenant's (docs/adr/0006, decision 4).

Arguments: registry_url bootstrap username password commands_topic api_url
prefix tenant [--halves]

The batch is produced back to back and flushed. With ``--halves`` the first half is
produced and flushed and the line ``{"event": "half", ...}`` is printed; the second half
waits for a line on stdin (the test kills and restarts the processor in between).

Output, one JSON object per line: ``schema`` (the id the serializer took), ``sent`` per
record (label, job id, partition, offset), ``answer`` per command once the API has its
answer, and ``done`` with the labels left unanswered. (That the answers topic itself
holds exactly one committed answer per command, a processor killed mid-batch included,
the test checks with a reader of its own.)
Exit 0: every command answered; 4: some unanswered.
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

ANSWER_TIMEOUT_S = 150
POLL_S = 0.2
DAY_MS = 86_400_000


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


def spec(name, *, cron=None, tz="UTC", run_at_ms=None, argv=("true",), **more):
    """A JobSpec as the Avro record (fields with defaults left out, as the contract allows)."""
    return {"name": name, "schedule": {"cron": cron, "tz": tz, "run_at_ms": run_at_ms},
            "target": {"type": "command", "argv": list(argv)}, "timeout_s": 30, **more}


def batch(prefix, tenant, now_ms):
    """(label, job id, union branch or None for raw bytes, record) in the order sent.
    Labels starting ``ok-`` are valid; ``bad-`` ones break the API's rules,
    ``missing-job`` names a job that does not exist, ``not-avro`` is not a command at all
    (framed with the commands' schema id, then bytes that are not Avro of it)."""
    def job(label):
        return f"{prefix}-{label}"

    def echo(label):
        return ("sh", "-c", f"echo {job(label)}")

    def reg(label, s, at_ms=now_ms):
        return (label, job(label), "gnomon.RegisterJob",
                {"job_id": job(label), "tenant": tenant, "spec": s, "at_ms": at_ms})

    every_2s = "*/2 * * * * *"
    return [
        reg("ok-cron", spec("batch cron", cron=every_2s, argv=echo("ok-cron"))),
        reg("bad-cron", spec("bad cron", cron="61 * * * *")),
        reg("ok-once", spec("batch once", run_at_ms=now_ms + 4_000, argv=echo("ok-once"))),
        reg("bad-tz", spec("bad zone", cron="0 * * * *", tz="Mars/Olympus")),
        ("ok-patch", job("ok-cron"), "gnomon.PatchJob",
         {"job_id": job("ok-cron"), "tenant": tenant, "patch_json": json.dumps({"priority": "high"}),
          "expected_version": 1, "at_ms": now_ms}),
        reg("bad-pool", spec("no such pool", cron="0 * * * *", pool="nowhere")),
        reg("bad-name", spec("", cron="0 * * * *")),
        ("ok-trigger", job("ok-once"), "gnomon.TriggerJob",
         {"job_id": job("ok-once"), "tenant": tenant, "idempotency_key": "deploy-1", "at_ms": now_ms}),
        reg("bad-timeout", {**spec("negative timeout", cron="0 * * * *"), "timeout_s": -5}),
        reg("bad-payload", spec("payload not JSON", cron="0 * * * *", payload_json="{not json")),
        reg("bad-run-at", spec("one-time in the past", run_at_ms=now_ms - 30 * DAY_MS)),
        ("bad-patch", job("ok-cron"), "gnomon.PatchJob",
         {"job_id": job("ok-cron"), "tenant": tenant, "patch_json": "[1, 2]", "expected_version": None,
          "at_ms": now_ms}),
        ("bad-trigger-key", job("ok-once"), "gnomon.TriggerJob",
         {"job_id": job("ok-once"), "tenant": tenant, "idempotency_key": "not a key!", "at_ms": now_ms}),
        ("missing-job", job("missing-job"), "gnomon.PauseJob",
         {"job_id": job("missing-job"), "tenant": tenant, "at_ms": now_ms}),
        reg("bad-at", spec("from the future", cron="0 * * * *"), at_ms=now_ms + 3_600_000),  # the sender's clock
        ("bad-job-id", job("bad@job-id"), "gnomon.PauseJob",  # '@' separates job and slot in a run id
         {"job_id": job("bad@job-id"), "tenant": tenant, "at_ms": now_ms}),
        ("not-avro", job("not-avro"), None, b"not Avro at all"),
        reg("ok-late", spec("batch cron, second half", cron=every_2s, argv=echo("ok-late"))),
    ]


def answer_of(api_url, partition, offset):
    """The processor's answer to the command Kafka wrote at ``partition``/``offset``, as
    the REST API has it for this tenant (docs/job-events.md, "Answers"); None: pending."""
    req = urllib.request.Request(f"{api_url}/v1/commands/{partition}-{offset}",
                                 headers={"Authorization": "Bearer " + os.environ["GNOMON_API_TOKEN"]})
    with urllib.request.urlopen(req, timeout=10) as resp:
        body = json.load(resp)
    return None if body["status"] == "pending" else body


def main(argv):
    flags = {a for a in argv if a.startswith("--")}
    halves = "--halves" in flags
    registry_url, bootstrap, user, password, commands, api_url, prefix, tenant = [a for a in argv if a not in flags]
    user_info = os.environ.get("GNOMON_REGISTRY_USER_INFO")  # the registry's reader, user:password
    sr = SchemaRegistryClient({"url": registry_url, **({"basic.auth.user.info": user_info} if user_info else {})})
    serialize = AvroSerializer(sr, conf={"auto.register.schemas": False, "use.latest.version": True})
    kafka = {"bootstrap.servers": bootstrap, "security.protocol": "SASL_PLAINTEXT",
             "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": user, "sasl.password": password}

    def emit(**event):
        print(json.dumps(event, sort_keys=True), flush=True)

    records = []
    awaited = set()  # the labels of job commands: every one is answered
    for label, job_id, branch, body in batch(prefix, tenant, int(time.time() * 1000)):
        if branch is None:  # what a broken producer might write: the framing, then garbage
            value = records[0][2][:5] + body
        else:  # `body` is a union of records: the tuple names the branch (fastavro's notation)
            value = serialize({"body": (branch, body)}, SerializationContext(commands, MessageField.VALUE))
            awaited.add(label)
        records.append((label, job_id, value))
    emit(event="schema", id=int.from_bytes(records[0][2][1:5], "big"))

    producer = Producer({**kafka, "acks": "all", "enable.idempotence": True, "partitioner": "murmur2_random"})
    acked = {}  # label -> (error, partition, offset)

    def send(part):
        for label, job_id, value in part:
            producer.produce(commands, key=job_id.encode(), value=value,
                             headers=signature(commands, job_id.encode(), value),
                             on_delivery=lambda err, msg, label=label: acked.__setitem__(
                                 label, (err, msg.partition(), msg.offset())))
            producer.poll(0)
        left = producer.flush(30)
        if left:
            emit(event="error", what=f"{left} records not delivered in 30 s")
            sys.exit(1)

    position = {}  # label -> (partition, offset)

    def sent(part):
        for label, job_id, _ in part:
            err, partition, offset = acked[label]
            if err is not None:
                emit(event="error", what=f"{label} not written: {err}")
                sys.exit(1)
            position[label] = (partition, offset)
            emit(event="sent", label=label, job_id=job_id, partition=partition, offset=offset)

    first, second = (records[:len(records) // 2], records[len(records) // 2:]) if halves else (records, [])
    send(first)
    sent(first)
    if halves:
        emit(event="half", sent=[label for label, _, _ in first])
        sys.stdin.readline()
        send(second)
        sent(second)

    pending = set(awaited)
    deadline = time.monotonic() + ANSWER_TIMEOUT_S
    while pending and time.monotonic() < deadline:
        for label in sorted(pending):
            answer = answer_of(api_url, *position[label])
            if answer is not None:
                pending.discard(label)
                emit(event="answer", label=label, answer=answer)
        if pending:
            time.sleep(POLL_S)
    emit(event="done", missing=sorted(pending))
    return 4 if pending else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
