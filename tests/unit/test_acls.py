"""The Kafka ACL table (gnomon.infra.acls), credential files and client security configs."""

from __future__ import annotations

import stat
import tomllib
from pathlib import Path

import pytest

from gnomon import credentials
from gnomon.adapters import kafka as ka
from gnomon.config import Settings, load
from gnomon.infra import acls
from gnomon.infra import kafka as infra_kafka
from gnomon.infra.topics import topic_specs
from gnomon.topology import load_topology


@pytest.fixture(scope="module")
def table() -> list[acls.Grant]:
    return acls.grants(load_topology())


def test_every_topic_of_the_topology_has_a_writer(table: list[acls.Grant]) -> None:
    for spec in topic_specs(load().topology_path):
        assert acls.roles_with(table, spec.name, "WRITE"), f"no role may write {spec.name}"


def test_every_grant_names_a_topic_of_the_topology(table: list[acls.Grant]) -> None:
    names = {s.name for s in topic_specs(load().topology_path)}
    for g in table:
        if g.resource != acls.TOPIC:
            continue
        if g.pattern == acls.LITERAL:
            assert g.name in names, g
        else:
            assert any(n.startswith(g.name) for n in names), g


def test_processors_read_and_write_what_the_topology_says(table: list[acls.Grant]) -> None:
    data = tomllib.loads(load().topology_path.read_text())
    for name, proc in data["processors"].items():
        for topic in [*proc.get("consumes", []), *proc.get("consumes_also", []), proc["changelog"]]:
            assert "processor" in acls.roles_with(table, topic, "READ"), (name, topic)
        for topic in [*proc.get("produces", []), proc["changelog"]]:
            assert "processor" in acls.roles_with(table, topic, "WRITE"), (name, topic)


def test_roles_are_least_privilege(table: list[acls.Grant]) -> None:
    topo = load_topology()
    # the API's principal and a team's producer write commands (each signed by its tenant's key);
    # only the API's principal writes configuration, only workers (and the processor) report runs
    assert acls.roles_with(table, topo.job_commands, "WRITE") == {"api", "producer"}
    for config_topic in (topo.tenants, topo.alert_configs, topo.calendars):
        assert acls.roles_with(table, config_topic, "WRITE") == {"api"}, config_topic
    assert acls.roles_with(table, topo.run_events, "WRITE") == {"processor", "worker"}
    producer = {(g.resource, g.name, g.operation) for g in table if g.role == "producer"}
    assert producer == {(acls.TOPIC, topo.job_commands, "WRITE")}  # no read: answers come through the API
    assert acls.roles_with(table, topo.jobs, "WRITE") == {"processor"}
    assert acls.roles_with(table, topo.runs, "WRITE") == {"processor"}
    assert acls.roles_with(table, topo.worker_inbox, "WRITE") == {"processor"}
    assert "worker" not in acls.roles_with(table, topo.jobs, "READ")
    assert acls.roles_with(table, topo.worker_inbox, "READ") == {"worker"}
    assert not any(g.pattern == acls.PREFIXED and g.resource == acls.TOPIC for g in table)  # no topic by prefix
    # the API reads only tenants' limits and usage (admission), its commands' results and the
    # alert configs and calendars it writes; never jobs, runs or inboxes
    api_reads = {g.name for g in table if g.role == "api" and g.operation == "READ" and g.resource == acls.TOPIC}
    assert api_reads == {topo.tenants, topo.tenant_usage, topo.command_results, topo.alert_configs,
                         topo.calendars}
    # the alerter reads the ledger and the alert configs, and writes nothing
    assert {g.name for g in table if g.role == "alerter" and g.resource == acls.TOPIC} == {
        topo.runs, topo.alert_configs}
    assert {g.operation for g in table if g.role == "alerter"} == {"READ"}
    assert acls.roles_with(table, topo.command_results, "WRITE") == {"processor"}
    assert {g.role for g in table} <= set(credentials.KAFKA_ROLES) - {"admin"}
    groups = {(g.role, g.name, g.operation) for g in table if g.resource == acls.GROUP}
    assert ("processor", "gnomon-processor", "READ") in groups
    assert ("projector", "gnomon-history", "READ") in groups
    assert ("processor", "gnomon-history", "DESCRIBE") in groups  # read offsets, never commit
    assert ("worker", "gnomon-worker-inbox", "READ") in groups
    txn = [g for g in table if g.resource == acls.TRANSACTIONAL_ID]
    assert [(g.role, g.name, g.pattern) for g in txn] == [("processor", "gnomon-processor-", "PREFIXED")]


def test_bindings_build(table: list[acls.Grant]) -> None:
    for g in table:
        b = acls._binding(g)
        assert acls._grant_of(b) == g


def test_credentials_are_written_private_and_kept(tmp_path: Path) -> None:
    d = tmp_path / "creds"
    first = credentials.ensure_all(d)
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    for f in d.iterdir():
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    assert not [f for f in d.iterdir() if f.name.startswith(".")]  # no temp file left
    again = credentials.ensure_all(d)
    assert again == first  # never regenerated
    assert first["cassandra"].username == "gnomon" and first["api"].username == "api"
    assert len({c.password for c in first.values()}) == len(first)
    assert first["api"].password not in repr(first["api"])


def test_malformed_credentials_are_refused(tmp_path: Path) -> None:
    credentials.ensure_dir(tmp_path)
    credentials.write_secret(tmp_path / "api.json", '{"username": "api"}')
    with pytest.raises(credentials.CredentialError):
        credentials.read(tmp_path, "api")


def test_security_config_by_role(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in (ka.ROLE_ENV, ka.USERNAME_ENV, ka.PASSWORD_ENV, ka.PROTOCOL_ENV, ka.MECHANISM_ENV):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("GNOMON_CREDENTIALS_DIR", str(tmp_path))
    creds = credentials.ensure_all(tmp_path)
    conf = ka.producer_config("b:1", role="worker")
    assert conf["sasl.username"] == "worker" and conf["sasl.password"] == creds["worker"].password
    assert conf["security.protocol"] == "SASL_PLAINTEXT" and conf["sasl.mechanism"] == "SCRAM-SHA-512"
    assert ka.consumer_config("b:1", "g")["sasl.username"] == "admin"  # development default
    with ka.kafka_role("processor"):
        assert ka.consumer_config("b:1", "g")["sasl.username"] == "processor"
        assert ka.consumer_config("b:1", "g", role="api")["sasl.username"] == "api"
    monkeypatch.setenv(ka.ROLE_ENV, "api")
    assert ka.producer_config("b:1")["sasl.username"] == "api"
    monkeypatch.setenv(ka.USERNAME_ENV, "prod-api")
    monkeypatch.setenv(ka.PASSWORD_ENV, "s3cret")
    monkeypatch.setenv(ka.PROTOCOL_ENV, "SASL_SSL")
    conf = ka.producer_config("b:1", role="worker")
    assert (conf["sasl.username"], conf["sasl.password"], conf["security.protocol"]) == (
        "prod-api", "s3cret", "SASL_SSL")


def test_no_credentials_means_no_sasl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in (ka.ROLE_ENV, ka.USERNAME_ENV, ka.PASSWORD_ENV, ka.PROTOCOL_ENV):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("GNOMON_CREDENTIALS_DIR", str(tmp_path / "none"))
    conf = ka.producer_config("b:1")
    assert not any(k.startswith(("sasl.", "security.")) for k in conf)


def test_server_properties_enable_sasl_and_the_authorizer(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path)
    creds = credentials.ensure_all(settings.credentials_dir)
    node = infra_kafka.nodes(settings, 3)[1]
    text = infra_kafka.render_config(settings, 3, node)
    props = dict(ln.split("=", 1) for ln in text.splitlines() if ln and not ln.startswith("#"))
    assert props["listener.security.protocol.map"] == "CONTROLLER:SASL_PLAINTEXT,CLIENT:SASL_PLAINTEXT"
    assert props["authorizer.class.name"] == "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
    assert props["super.users"] == "User:admin;User:broker;User:controller"
    assert props["allow.everyone.if.no.acl.found"] == "false"
    assert creds["kafka-broker"].password in props["listener.name.client.scram-sha-512.sasl.jaas.config"]
    assert "PLAINTEXT://" not in props["listeners"]
    assert infra_kafka._scram_arg(creds["admin"]).startswith("SCRAM-SHA-512=[name=admin,")
