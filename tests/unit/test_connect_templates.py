"""The shipped Kafka Connect templates (connectors/): each renders with the variables
gnomon.infra.connect fills in, reads only topics of the topology that the `connect` role
may read, and the run-exports sinks are wired to the registry converter. Pure: no Connect."""

from __future__ import annotations

from pathlib import Path

import pytest

from gnomon.infra import acls, connect
from gnomon.infra.errors import InfraError
from gnomon.topology import load_topology

VARIABLES = {
    "bootstrap": "127.0.0.1:9092", "rest_port": 8083, "offsets_file": "/s/connect/connect.offsets",
    "exports_dir": "/s/exports", "state_dir": "/s", "plugin_path": "/s/connect-plugins",
    "registry_url": "http://127.0.0.1:8081", "postgres_url": "jdbc:postgresql://127.0.0.1:15432/gnomon",
    "postgres_user": "gnomon_export",
    "postgres_password": "${file:/s/connect/secrets.properties:postgres.password}", "security_protocol": "SASL_PLAINTEXT",
    "sasl_mechanism": "SCRAM-SHA-512", "sasl_jaas_config": "x required;", "tls_config": "# TLS off",
    "registry_user_info": "${file:/s/connect/secrets.properties:registry.user.info}",
}
TEMPLATES = connect.connector_templates()


def _rendered(path: Path) -> dict[str, str]:
    return connect.parse_properties(connect.render_properties(path.read_text(), VARIABLES))


def test_the_run_exports_sinks_are_started_but_not_the_examples() -> None:
    names = {p.name for p in TEMPLATES}
    assert names == {"runs-postgres-sink.properties", "runs-jsonl-file-sink.properties"}
    assert not any("s3" in n for n in names)  # connectors/examples/ is documentation only


@pytest.mark.parametrize("path", [*TEMPLATES, connect.WORKER_TEMPLATE], ids=lambda p: p.name)
def test_every_template_renders_without_leftover_placeholders(path: Path) -> None:
    props = _rendered(path)
    # (a config provider's ${file:...} reference is resolved by Connect itself)
    assert not any("$" in v and "Cast$Value" not in v and not v.startswith("${file:") for v in props.values()), props
    with pytest.raises(InfraError, match=r"no value for \$postgres_user"):
        connect.render_properties("user=$postgres_user\n", {})
    with pytest.raises(InfraError, match=r"no value for \$postgres_user"):
        connect.render_properties("user=${postgres_user}\n", {})


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.name)
def test_connectors_read_declared_topics_the_connect_role_may_read(path: Path) -> None:
    topo = load_topology()
    topics = _rendered(path)["topics"].split(",")
    declared = {t.name for t in topo.topics}
    for topic in topics:
        assert topic in declared, f"{path.name} reads {topic}, not in streams/topology.toml"
        assert "connect" in acls.roles_with(acls.grants(topo), topic, "READ"), topic


def test_the_run_exports_sinks_use_the_registry_converter() -> None:
    topo = load_topology()
    pg = _rendered(connect.CONNECTORS_DIR / "runs-postgres-sink.properties")
    lines = _rendered(connect.CONNECTORS_DIR / "runs-jsonl-file-sink.properties")
    for props, output in ((pg, "struct"), (lines, "json")):
        assert props["topics"] == topo.run_exports
        assert props["value.converter"] == "gnomon.connect.RegistryAvroConverter"
        assert props["value.converter.registry.url"] == VARIABLES["registry_url"]
        assert props["value.converter.output"] == output
        # the registry's reader, as a FileConfigProvider reference (never the password itself)
        assert props["value.converter.basic.auth.user.info"] == "${file:/s/connect/secrets.properties:registry.user.info}"
    assert pg["insert.mode"] == "upsert" and pg["primary.key.fields"] == "run_id"
    assert pg["connection.password"] == "${file:/s/connect/secrets.properties:postgres.password}"
    assert pg["connection.username"] == "gnomon_export" and pg["collection.name.format"] == "gnomon_runs"
    worker = _rendered(connect.WORKER_TEMPLATE)
    assert worker["config.providers"] == "file"
    assert worker["config.providers.file.class"] == "org.apache.kafka.common.config.provider.FileConfigProvider"
    assert lines["file"] == "/s/exports/runs.jsonl"
    assert _rendered(connect.WORKER_TEMPLATE)["plugin.path"] == "/s/connect-plugins"


def test_the_export_roles_scram_verifier_matches_rfc_7677() -> None:
    """The verifier PostgreSQL stores (the export role's password is sent as one, never in
    clear): its server key signs RFC 7677's example exchange as the RFC says."""
    import base64
    import hashlib
    import hmac

    from gnomon.infra import postgres

    salt = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
    verifier = postgres.scram_verifier("pencil", salt=salt, iterations=4096)
    head, keys = verifier.split("$", 1)[1].split("$")
    assert verifier.startswith("SCRAM-SHA-256$4096:") and head == "4096:W22ZaJ0SNY7soEsUEjb6gQ=="
    stored_key, server_key = (base64.b64decode(k) for k in keys.split(":"))
    nonce = "rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
    auth = f"n=user,r=rOprNGfwEbeRWgbNEkqO,r={nonce},s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096,c=biws,r={nonce}".encode()
    server_signature = hmac.new(server_key, auth, hashlib.sha256).digest()
    assert base64.b64encode(server_signature).decode() == "6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
    proof = base64.b64decode("dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
    client_signature = hmac.new(stored_key, auth, hashlib.sha256).digest()
    client_key = bytes(a ^ b for a, b in zip(proof, client_signature, strict=True))
    assert hashlib.sha256(client_key).digest() == stored_key  # what the server checks at login
