"""Three hosts on one machine with TLS everywhere (issue 26; `gnomon infra up --hosts 3
--tls`): host i is 127.0.0.i with a KRaft broker+controller and a Cassandra node (one
cluster, replication 3, LOCAL_QUORUM), each bound to its own address; every Kafka
listener SASL_SSL, Cassandra's clients and nodes encrypted, the API on HTTPS. The core
path runs on it: jobs registered through the API, runs started by a processor and a
worker, their history written by the projector and read back through the API, and the
job's page of the web UI."""

from __future__ import annotations

import re
import secrets
import time
from pathlib import Path

import httpx
import pytest
from chaoslib import Scenario, log

from gnomon.client import Client
from gnomon.config import Settings, load
from gnomon.infra import cassandra, fetch, kafka, manager, tls

pytestmark = [pytest.mark.integration, pytest.mark.chaos, pytest.mark.own_brokers]

KAFKA_PORT, CONTROLLER_PORT, CQL_PORT, STORAGE_PORT, API_PORT = 49192, 49193, 49142, 47100, 48787
HOSTS = ("127.0.0.1", "127.0.0.2", "127.0.0.3")


def test_three_hosts_with_tls_run_the_core_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings(state_dir=tmp_path / "hosts3", kafka_port=KAFKA_PORT, kafka_controller_port=CONTROLLER_PORT,
                        cassandra_port=CQL_PORT, cassandra_storage_port=STORAGE_PORT,
                        credentials_path=load().credentials_dir)
    (settings.state_dir / "lib").mkdir(parents=True)
    for component in ("kafka", "cassandra"):
        (settings.state_dir / "lib" / component).symlink_to(fetch.lib_dir(load().state_dir, component))
    began = time.monotonic()
    manager.up(settings, kafka_nodes=3, components=("kafka", "cassandra"), tls=True, cassandra_nodes=3)
    log(f"three hosts with TLS up in {time.monotonic() - began:.0f} s")
    ca = tls.ca_file(settings.state_dir)
    try:
        # each host's servers bound to its own address, TLS only
        for i, node in enumerate(kafka.nodes(settings, 3)):
            props = node.config.read_text()
            assert f"listeners=CLIENT://{HOSTS[i]}:{KAFKA_PORT},CONTROLLER://{HOSTS[i]}:{CONTROLLER_PORT}" in props
            assert "listener.security.protocol.map=CONTROLLER:SASL_SSL,CLIENT:SASL_SSL" in props
        for i, cnode in enumerate(cassandra.nodes(settings, 3)):
            conf = (cnode.home / "cassandra.yaml").read_text()
            assert f"listen_address: {HOSTS[i]}" in conf and f"rpc_address: {HOSTS[i]}" in conf
            assert re.search(r"client_encryption_options:\n  enabled: true\n  optional: false", conf), conf[-800:]

        cert = tls.ensure_host(settings.state_dir, "api-1", ["127.0.0.1"])
        token = secrets.token_hex(16)
        monkeypatch.setenv("GNOMON_KAFKA_BOOTSTRAP", kafka.bootstrap(settings, 3))
        monkeypatch.setenv("GNOMON_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
        monkeypatch.setenv("GNOMON_KAFKA_CA_FILE", str(ca))
        monkeypatch.setenv("GNOMON_CASSANDRA_HOSTS", ",".join(HOSTS))
        monkeypatch.setenv("GNOMON_CASSANDRA_PORT", str(CQL_PORT))
        monkeypatch.setenv("GNOMON_CASSANDRA_TLS", "1")
        monkeypatch.setenv("GNOMON_CASSANDRA_CA_FILE", str(ca))
        monkeypatch.setenv("GNOMON_API_TOKENS", f"{token}:chaos")
        monkeypatch.setenv("GNOMON_API_CA_FILE", str(ca))
        tag = "hosts" + secrets.token_hex(3)
        sc = Scenario(tag, tmp_path)
        client = None
        try:
            sc.processor("p1")
            sc.worker("w1")
            sc.start("projector", "projector")
            sc.start("api", "api", "--port", str(API_PORT), "--workers", "1", "--tls-cert", str(cert.cert),
                     "--tls-key", str(cert.key))
            sc.wait_ready("p1", "w1", "projector", "api", timeout_s=120)
            url = f"https://127.0.0.1:{API_PORT}"
            client = Client(url, token)
            ids = [client.create_job({"name": f"{tag}-{i}", "schedule": "*/2 * * * * *", "timeoutS": 20,
                                      "target": {"type": "command", "argv": ["true"]}})["id"] for i in range(3)]
            deadline = time.monotonic() + 90
            while True:  # history read back through the API: the projector wrote it over TLS
                done = {j: [r for r in client.list_runs(j, status="succeeded")["items"]] for j in ids}
                if all(len(rs) >= 2 for rs in done.values()):
                    break
                assert time.monotonic() < deadline, {j: len(rs) for j, rs in done.items()}
                time.sleep(1)
            log(f"history over three hosts: {sum(len(rs) for rs in done.values())} succeeded runs read back")
            # the web UI's job page, signed in with the token, over HTTPS
            with httpx.Client(base_url=url, verify=str(ca), timeout=10) as ui:
                signed = ui.post("/ui/login", data={"token": token}, headers={"Origin": url})
                assert signed.status_code in (200, 303), signed.text[:300]
                page = ui.get(f"/ui/jobs/{ids[0]}")
                assert page.status_code == 200 and ids[0] in page.text and "succeeded" in page.text, page.text[:300]
            for j in ids:
                client.delete(j)
        finally:
            if client is not None:
                client.close()
            sc.stop_all()
    finally:
        manager.down(settings)
