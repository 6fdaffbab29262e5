"""The shipped Kafka Connect templates (connectors/): each renders with the variables
gnomon.infra.connect fills in, reads only topics of the topology that the `connect` role
may read, and the run-exports sinks are wired to the registry converter. Pure: no Connect."""

from __future__ import annotations

from pathlib import Path

import pytest

from gnomon.infra import acls, connect
from gnomon.topology import load_topology

VARIABLES = {
    "bootstrap": "127.0.0.1:9092", "rest_port": 8083, "offsets_file": "/s/connect/connect.offsets",
    "exports_dir": "/s/exports", "state_dir": "/s", "plugin_path": "/s/connect-plugins",
    "registry_url": "http://127.0.0.1:8081", "postgres_url": "jdbc:postgresql://127.0.0.1:15432/gnomon",
    "postgres_user": "gnomon", "postgres_password": "pw", "security_protocol": "SASL_PLAINTEXT",
    "sasl_mechanism": "SCRAM-SHA-512", "sasl_jaas_config": "x required;",
}
TEMPLATES = connect.connector_templates()


def _rendered(path: Path) -> dict[str, str]:
    return connect.parse_properties(connect.render_properties(path.read_text(), VARIABLES))


def test_the_run_exports_sinks_and_the_history_sink_are_started_but_not_the_examples() -> None:
    names = {p.name for p in TEMPLATES}
    assert {"runs-postgres-sink.properties", "runs-jsonl-file-sink.properties",
            "history-runs-file-sink.properties"} <= names
    assert not any("s3" in n for n in names)  # connectors/examples/ is documentation only


@pytest.mark.parametrize("path", [*TEMPLATES, connect.WORKER_TEMPLATE], ids=lambda p: p.name)
def test_every_template_renders_without_leftover_placeholders(path: Path) -> None:
    props = _rendered(path)
    assert not any("$" in v and "Cast$Value" not in v for v in props.values()), props


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
    assert pg["insert.mode"] == "upsert" and pg["primary.key.fields"] == "run_id"
    assert pg["connection.password"] == "pw" and pg["collection.name.format"] == "gnomon_runs"
    assert lines["file"] == "/s/exports/runs.jsonl"
    assert _rendered(connect.WORKER_TEMPLATE)["plugin.path"] == "/s/connect-plugins"
