"""Kafka and Cassandra refuse clients without credentials, and Kafka's ACLs hold per role
(docs/adr/0006-kafka-auth-and-tenant-proof.md). Needs `python -m gnomon.infra up`."""

from __future__ import annotations

import logging
import secrets
import stat
import time
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from gnomon import codec, credentials
from gnomon.adapters.kafka import consumer_config, producer_config, security_config
from gnomon.config import Settings, load
from gnomon.core.jobs import PauseJob
from gnomon.infra import cassandra, kafka, manager
from gnomon.infra.errors import InfraError
from gnomon.topology import load_topology

pytestmark = pytest.mark.integration

SHORT_S = 6.0
REFUSED_S = 3.0  # how long a client that must be refused is given (refusals come in well under 1 s)
QUIET = logging.getLogger("tests.security.librdkafka")
QUIET.addHandler(logging.NullHandler())
QUIET.propagate = False


@pytest.fixture(scope="module")
def infra() -> Settings:
    settings = load()
    try:
        manager.up(settings, kafka_nodes=kafka.running_layout(settings) or 1)
    except InfraError as exc:
        pytest.fail(f"gnomon infra up failed: {exc}", pytrace=False)
    return settings


def _errors_of(conf: dict[str, Any]) -> tuple[dict[str, Any], list[KafkaError]]:
    seen: list[KafkaError] = []
    return {**conf, "error_cb": seen.append, "logger": QUIET}, seen


def _produce(conf: dict[str, Any], topic: str, key: str, value: bytes, timeout_s: float = SHORT_S,
             ) -> KafkaError | None:
    """Deliver one record; the delivery error (None if acknowledged)."""
    result: list[KafkaError | None] = []
    p = Producer({**conf, "message.timeout.ms": int(timeout_s * 1000), "linger.ms": 0, "logger": QUIET})
    p.produce(topic, key=key.encode(), value=value, on_delivery=lambda err, _m: result.append(err))
    p.flush(timeout_s + 5)
    assert result, "no delivery report"
    return result[0]


def _pause(job_id: str) -> bytes:
    return codec.encode(PauseJob(job_id, "authtest", int(time.time() * 1000)))


def test_plaintext_client_without_credentials_is_refused(infra: Settings) -> None:
    topo = load_topology()
    conf = {"bootstrap.servers": infra.kafka_bootstrap, "socket.timeout.ms": 3000, "logger": QUIET}
    started = time.monotonic()
    with pytest.raises(KafkaException):
        AdminClient(conf).list_topics(timeout=REFUSED_S)
    assert time.monotonic() - started < REFUSED_S + 3
    err = _produce({"bootstrap.servers": infra.kafka_bootstrap}, topo.job_commands, "x", b"forged", REFUSED_S)
    assert err is not None and err.code() in (KafkaError._MSG_TIMED_OUT, KafkaError._TRANSPORT), err


def test_wrong_password_fails_authentication(infra: Settings) -> None:
    topo = load_topology()
    base = {"bootstrap.servers": infra.kafka_bootstrap, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "api", "sasl.password": "not-the-password"}
    conf, seen = _errors_of(base)
    client = AdminClient(conf)
    with pytest.raises(KafkaException):
        client.list_topics(timeout=REFUSED_S)
    client.poll(1)  # serves error_cb
    assert any(e.code() == KafkaError._AUTHENTICATION for e in seen), seen
    err = _produce(base, topo.job_commands, "x", b"forged", REFUSED_S)
    assert err is not None, "a client with a wrong password could write"
    conf, seen = _errors_of({**base, "sasl.username": "nobody-" + secrets.token_hex(3)})
    client = AdminClient(conf)
    with pytest.raises(KafkaException):
        client.list_topics(timeout=REFUSED_S)
    client.poll(1)
    assert any(e.code() == KafkaError._AUTHENTICATION for e in seen), seen


def test_worker_cannot_read_jobs_or_write_commands(infra: Settings) -> None:
    topo = load_topology()
    job_id = "authtest-" + secrets.token_hex(4)
    err = _produce(producer_config(infra.kafka_bootstrap, role="worker"), topo.job_commands, job_id,
                   _pause(job_id))
    assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, err

    c = Consumer({**consumer_config(infra.kafka_bootstrap, "gnomon-worker-inbox", role="worker"),
                  "logger": QUIET})
    try:
        md = c.list_topics(topo.jobs, timeout=SHORT_S)
        err = md.topics[topo.jobs].error
        assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, err
        c.subscribe([topo.jobs])
        assert _first_error(c) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    finally:
        c.close()


def _first_error(c: Consumer) -> int | None:
    deadline = time.monotonic() + SHORT_S
    while time.monotonic() < deadline:
        msg = c.poll(0.5)
        if msg is not None:
            assert msg.error() is not None, f"read {msg.topic()}@{msg.offset()}"
            return int(msg.error().code())
    return None


def test_worker_cannot_use_the_processor_group(infra: Settings) -> None:
    topo = load_topology()
    c = Consumer({**consumer_config(infra.kafka_bootstrap, "gnomon-processor", role="worker"),
                  "logger": QUIET})
    try:
        c.subscribe([topo.worker_inbox])  # a topic it may read, in a group it may not join
        assert _first_error(c) == KafkaError.GROUP_AUTHORIZATION_FAILED
    finally:
        c.close()


def test_api_can_write_commands_but_not_state(infra: Settings) -> None:
    topo = load_topology()
    job_id = "authtest-" + secrets.token_hex(4)  # no such job: the processor ignores the pause
    conf = producer_config(infra.kafka_bootstrap, role="api")
    assert _produce(conf, topo.job_commands, job_id, _pause(job_id)) is None
    err = _produce(conf, topo.jobs, job_id, b"forged state")
    assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, err


def test_roles_authenticate_as_themselves(infra: Settings) -> None:
    for role in credentials.KAFKA_ROLES:
        sec = security_config(role, credentials_dir=infra.credentials_dir)
        assert sec["sasl.username"] == role and sec["security.protocol"] == "SASL_PLAINTEXT"
        md = AdminClient({"bootstrap.servers": infra.kafka_bootstrap, **sec}).list_topics(timeout=10)
        assert md.brokers, role


def test_cassandra_refuses_sessions_without_credentials(infra: Settings) -> None:
    bad = [None, cassandra.DEFAULT_SUPERUSER, credentials.Credential("gnomon", "wrong")]
    for cred in bad:
        started = time.monotonic()
        with pytest.raises(Exception) as caught:
            cassandra.release_version(infra, cred)
        assert cassandra.auth_failed(caught.value), (cred, caught.value)
        assert time.monotonic() - started < 15
    app = credentials.read(infra.credentials_dir, credentials.CASSANDRA)
    assert app is not None and app.username == "gnomon"
    assert cassandra.release_version(infra, app).startswith("5.")


def test_cassandra_app_role_is_not_a_superuser(infra: Settings) -> None:
    from gnomon.history.cassandra import connect

    app = credentials.read(infra.credentials_dir, credentials.CASSANDRA)
    assert app is not None
    cluster, session = connect(infra.cassandra_hosts, infra.cassandra_port, auth=(app.username, app.password))
    try:
        from cassandra import Unauthorized

        with pytest.raises(Unauthorized):
            session.execute("CREATE ROLE IF NOT EXISTS authtest_intruder WITH SUPERUSER = true")
    finally:
        cluster.shutdown()


def test_credential_files_are_private(infra: Settings) -> None:
    d = infra.credentials_dir
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    files = sorted(d.glob("*.json"))
    names = {f.stem for f in files}
    assert {*credentials.KAFKA_ROLES, credentials.CASSANDRA, credentials.CASSANDRA_ADMIN} <= names
    for f in files:
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    count = kafka.running_layout(infra) or 1
    for node in kafka.nodes(infra, count):  # holds the broker's and controller's passwords
        assert stat.S_IMODE(node.config.stat().st_mode) == 0o600, node.config
