"""A service outside gnomon sends one batch of job commands, valid and invalid mixed, and
reads the answer to each (issue 21). It knows only docs/job-events.md and the schema
registry: no gnomon import, no schema file; confluent-kafka's AvroSerializer writes the
latest version of the commands topic's subject, AvroDeserializer reads the answers.

Arguments: registry_url bootstrap username password commands_topic results_topic
prefix tenant [--halves | --halves-after-answer]

The batch is produced back to back and flushed. With ``--halves`` the first half is
produced and flushed and the line ``{"event": "half", ...}`` is printed; the second half
waits for a line on stdin (the test kills and restarts the processor in between). With
``--halves-after-answer`` the line is printed once an answer to one of the first half's
commands is written (seen by a read_uncommitted reader: the processor is applying the
half, its transaction maybe still open).

Output, one JSON object per line: ``schema`` (the id the serializer took), ``sent`` per
record (label, job id, partition, offset), ``answer`` per answer read (read_committed)
that names one of the records, and ``done`` with the labels left unanswered, those
answered more than once, and those a read_uncommitted reader saw answered more than once
(answers of a transaction that was aborted: a processor killed while applying). The
reader keeps reading ``GRACE_S`` after the last awaited answer, so a repeated answer
would be seen.
Exit 0: every command answered exactly once; 4: some unanswered; 5: some answered twice.
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

ANSWER_TIMEOUT_S = 150
GRACE_S = 5
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


def main(argv):
    flags = {a for a in argv if a.startswith("--")}
    halves, after_answer = bool(flags & {"--halves", "--halves-after-answer"}), "--halves-after-answer" in flags
    registry_url, bootstrap, user, password, commands, results, prefix, tenant = [a for a in argv if a not in flags]
    user_info = os.environ.get("GNOMON_REGISTRY_USER_INFO")  # the registry's reader, user:password
    sr = SchemaRegistryClient({"url": registry_url, **({"basic.auth.user.info": user_info} if user_info else {})})
    serialize = AvroSerializer(sr, conf={"auto.register.schemas": False, "use.latest.version": True})
    deserialize = AvroDeserializer(sr)
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

    # the answers are read from each partition's end *before* anything is sent; no group
    # is joined and nothing is committed (the producer role has no group for this topic)
    consumer = Consumer({**kafka, "group.id": "gnomon-events", "enable.auto.commit": False,
                         "isolation.level": "read_committed"})
    parts = consumer.list_topics(results, timeout=10).topics[results].partitions
    tps = []
    for p in sorted(parts):
        _, high = consumer.get_watermark_offsets(TopicPartition(results, p), timeout=10)
        tps.append(TopicPartition(results, p, high))
    consumer.assign(tps)
    # the same from a read_uncommitted reader: it also sees answers of aborted transactions
    # (a processor killed mid-batch), which the contract's readers never see
    raw = Consumer({**kafka, "group.id": "gnomon-events", "enable.auto.commit": False,
                    "isolation.level": "read_uncommitted"})
    raw.assign([TopicPartition(results, tp.partition, tp.offset) for tp in tps])

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

    by_position = {}  # (partition, offset) -> label
    counts = {label: 0 for label, _, _ in records}
    raw_counts = {label: 0 for label, _, _ in records}

    def sent(part):
        for label, job_id, _ in part:
            err, partition, offset = acked[label]
            if err is not None:
                emit(event="error", what=f"{label} not written: {err}")
                sys.exit(1)
            by_position[(partition, offset)] = label
            emit(event="sent", label=label, job_id=job_id, partition=partition, offset=offset)

    def read(c, timeout_s):
        """The label and answer of one record of ``c`` naming one of ours, or None."""
        rec = c.poll(timeout_s)
        if rec is None or rec.error() is not None:  # e.g. GROUP_AUTHORIZATION_FAILED for the unused group id
            return None
        answer = deserialize(rec.value(), SerializationContext(results, MessageField.VALUE))
        label = by_position.get((answer["source_partition"], answer["source_offset"]))
        return None if label is None else (label, answer)  # None: another producer's command

    first, second = (records[:len(records) // 2], records[len(records) // 2:]) if halves else (records, [])
    send(first)
    sent(first)
    if halves:
        # the processor is applying the first half once its first answer is written (maybe
        # not committed yet): that is when the test kills it
        until = time.monotonic() + (30 if after_answer else 0)
        while not any(raw_counts.values()) and time.monotonic() < until:
            got = read(raw, 0.05)
            if got is not None:
                raw_counts[got[0]] += 1
        emit(event="half", sent=[label for label, _, _ in first], answers_written=sum(raw_counts.values()))
        sys.stdin.readline()
        send(second)
        sent(second)

    deadline = time.monotonic() + ANSWER_TIMEOUT_S
    quiet_until = None
    while time.monotonic() < (quiet_until or deadline):
        got = read(raw, 0)
        if got is not None:
            raw_counts[got[0]] += 1
        got = read(consumer, 0.1)
        if got is None:
            continue
        label, answer = got
        counts[label] += 1
        emit(event="answer", label=label, answer=answer)
        if quiet_until is None and all(counts[a] for a in awaited):
            quiet_until = time.monotonic() + GRACE_S
    drained = time.monotonic() + 2
    while time.monotonic() < drained:
        got = read(raw, 0.2)
        if got is not None:
            raw_counts[got[0]] += 1
    consumer.close()
    raw.close()
    missing = sorted(a for a in awaited if not counts[a])
    twice = sorted(label for label, n in counts.items() if n > 1)
    # answers a read_uncommitted reader saw more than once: the aborted transaction's
    aborted = {label: n - 1 for label, n in sorted(raw_counts.items()) if n > 1}
    emit(event="done", missing=missing, twice=twice, seen_uncommitted_again=aborted)
    return 4 if missing else 5 if twice else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
