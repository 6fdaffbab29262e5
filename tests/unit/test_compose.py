"""docker-compose.yml is true to the security model (issue 26): it runs the very
`gnomon infra up` of the host (so its listeners, ports, credentials, ACLs and TLS are
what infra generates, by construction) and defines no broker, node or listener of its
own that could drift from it (the old file ran a plaintext Kafka without credentials).
No Docker engine runs here: this reads the file; docs/deploy.md says so."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from gnomon.config import Settings
from gnomon.infra import kafka

ROOT = Path(__file__).resolve().parents[2]


def _compose() -> dict[str, Any]:
    data = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert isinstance(data, dict)
    return data


def test_compose_runs_gnomon_infra_up_and_nothing_of_its_own() -> None:
    services = _compose()["services"]
    assert list(services) == ["infra"], list(services)
    svc = services["infra"]
    # no Kafka or Cassandra image, no listener or security setting of its own
    assert not re.search(r"kafka|cassandra", svc["image"]), svc["image"]
    env = svc.get("environment", {})
    assert not [k for k in env if k.startswith(("KAFKA_", "CASSANDRA_"))], env
    assert "ports" not in svc and svc["network_mode"] == "host"  # infra's own addresses and ports
    script = "\n".join(svc["command"])
    assert "gnomon infra up $$GNOMON_INFRA_FLAGS" in script and "gnomon infra down" in script
    # the state (credentials, TLS CA) where the host's clients look: the mounted repo's .gnomon
    assert "./:/gnomon" in svc["volumes"] and env["GNOMON_STATE_DIR"] == "/gnomon/.gnomon"


def test_the_ports_and_security_the_file_promises_are_infras(tmp_path: Path) -> None:
    head = (ROOT / "docker-compose.yml").read_text().split("services:")[0]
    s = Settings(state_dir=tmp_path, credentials_path=tmp_path / "credentials")
    promised = {int(p) for p in re.findall(r"(?:Kafka|Cassandra|registry) (\d{4})", head)}
    assert promised == {s.kafka_port, s.cassandra_port, s.registry_port}, promised
    node = kafka.nodes(s, 1)[0]
    props = dict(line.split("=", 1) for line in kafka.render_config(s, 1, node).splitlines()
                 if "=" in line and not line.startswith("#"))
    protocols = {p.split(":")[1] for p in props["listener.security.protocol.map"].split(",")}
    assert protocols == {"SASL_PLAINTEXT"}, protocols  # SASL on every listener, as the file says
    assert props["authorizer.class.name"].endswith("StandardAuthorizer")
    assert props["allow.everyone.if.no.acl.found"] == "false"
    assert props["listeners"].count("127.0.0.1") == 2  # loopback only, like the container's host network
    # with GNOMON_INFRA_FLAGS=--tls: every listener SASL_SSL
    from gnomon.infra import tls

    tls.enable(tmp_path, True)
    props = dict(line.split("=", 1) for line in kafka.render_config(s, 1, node).splitlines()
                 if "=" in line and not line.startswith("#"))
    assert {p.split(":")[1] for p in props["listener.security.protocol.map"].split(",")} == {"SASL_SSL"}
    assert "--tls" in (ROOT / "src" / "gnomon" / "cli" / "infra.py").read_text()
