"""The schema registry that `gnomon infra up` starts (gnomon.registry, docs/adr/0009),
driven with confluent-kafka's own SchemaRegistryClient: every checked-in id is served
with its .avsc file and references, an incompatible schema is refused with 409, a
compatible new version gets an id from 1000 on, and a new registry process reading the
store (what a restart does) serves the same ids."""

from __future__ import annotations

import hashlib
import json
import secrets
import subprocess
import sys
import time

import httpx
import pytest
from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

from gnomon.codec import default_codec
from gnomon.config import Settings
from gnomon.infra import registry
from gnomon.registry.auth import user_info

pytestmark = pytest.mark.integration

OTHER_PORT = 18181  # a second registry process on the same store (tests only)


@pytest.fixture(scope="module")
def client(infra: Settings) -> SchemaRegistryClient:
    assert registry.status(infra)["state"] == "up"
    return SchemaRegistryClient({"url": registry.url(infra), "basic.auth.user.info": user_info(registry.admin(infra))})


def _record(name: str, *fields: dict[str, object]) -> str:
    return json.dumps({"type": "record", "name": name, "namespace": "it", "fields": list(fields)})


def test_every_checked_in_id_is_served_with_its_file_and_references(client: SchemaRegistryClient) -> None:
    for sv in default_codec.registry:
        schema = client.get_schema(sv.id)
        assert schema.schema_str is not None
        assert hashlib.sha256(schema.schema_str.encode()).hexdigest() == sv.sha256, sv.file
        assert [(r.name, r.subject, r.version) for r in schema.references or []] == [
            (r.name, r.subject, r.version) for r in sv.references]
        # and the subject version says the same id
        assert client.get_version(sv.subject, sv.version).schema_id == sv.id
    for subject in default_codec.registry.subjects():
        latest = default_codec.registry.latest(subject)
        assert client.get_latest_version(subject).schema_id == latest.id


def test_compatibility_is_full_transitive_and_outsiders_ids_start_at_1000(infra: Settings,
                                                                          client: SchemaRegistryClient) -> None:
    subject = f"it-{secrets.token_hex(4)}-value"
    assert client.get_compatibility() == "FULL_TRANSITIVE"
    v1 = client.register_schema(subject, Schema(_record("Order", {"name": "id", "type": "string"}), "AVRO"))
    assert v1 >= 1000
    # a field without a default: old records lack it, so the new schema cannot read them
    incompatible = Schema(_record("Order", {"name": "id", "type": "string"}, {"name": "qty", "type": "long"}), "AVRO")
    assert client.test_compatibility(subject, incompatible) is False
    with pytest.raises(SchemaRegistryError) as exc:
        client.register_schema(subject, incompatible)
    assert exc.value.http_status_code == 409 and exc.value.error_code == 409
    compatible = Schema(_record("Order", {"name": "id", "type": "string"},
                                {"name": "qty", "type": "long", "default": 1}), "AVRO")
    v2 = client.register_schema(subject, compatible)
    assert v2 > v1 >= 1000
    assert client.lookup_schema(subject, compatible).version == 2
    assert client.get_versions(subject) == [1, 2]
    # the same schema again: the same id, no new version
    assert SchemaRegistryClient({"url": registry.url(infra), "basic.auth.user.info": user_info(registry.admin(infra))}
                                ).register_schema(subject, compatible) == v2
    # gnomon's own subjects are read-only: their versions come from the checked-in files
    with pytest.raises(SchemaRegistryError) as exc:
        client.register_schema("gnomon.job-commands-value", compatible)
    assert exc.value.http_status_code == 422 and exc.value.error_code == 42205
    # a schema of another service may use gnomon's types by reference
    jobspec = default_codec.registry.latest("gnomon.JobSpec")
    wrapped = Schema(_record("Wrapped", {"name": "job", "type": "gnomon.JobSpec"}), "AVRO",
                     [SchemaReference("gnomon.JobSpec", "gnomon.JobSpec", jobspec.version)])
    assert client.register_schema(f"it-{secrets.token_hex(4)}-value", wrapped) > v2

    restarted = _second_registry(infra)
    try:
        other = SchemaRegistryClient({"url": f"http://127.0.0.1:{OTHER_PORT}",
                                      "basic.auth.user.info": user_info(registry.reader(infra))})
        assert [other.get_version(subject, v).schema_id for v in (1, 2)] == [v1, v2]
        assert other.get_schema(v2).schema_str == compatible.schema_str
        for sv in default_codec.registry:
            assert other.get_version(sv.subject, sv.version).schema_id == sv.id
    finally:
        restarted.terminate()
        restarted.wait(10)


def _second_registry(infra: Settings) -> subprocess.Popen[bytes]:
    """A fresh registry process on the same store: it knows only what it reads there."""
    env = {**registry.environment(infra, OTHER_PORT)}
    proc = subprocess.Popen([sys.executable, "-m", "gnomon.registry", "--port", str(OTHER_PORT)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            out = proc.stdout.read().decode() if proc.stdout else ""
            pytest.fail(f"the second registry exited {proc.returncode}:\n{out[-2000:]}")
        try:
            cred = registry.reader(infra)
            if httpx.get(f"http://127.0.0.1:{OTHER_PORT}/subjects", timeout=1,
                         auth=(cred.username, cred.password)).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    pytest.fail("the second registry did not serve within 30 s")
