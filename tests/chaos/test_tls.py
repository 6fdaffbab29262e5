"""Kafka and Cassandra with TLS on every connection (issue 26; `gnomon infra up
--tls`), on a broker and a node of their own:

* the broker offers only SASL_SSL listeners (clients, inter-broker, the controller
  quorum): a SASL_PLAINTEXT client with good credentials is refused, and a TLS client
  that does not trust the stack's CA is refused too; the keys are 0600;
* Cassandra refuses a plaintext client (client encryption, ``optional: false``);
* gnomon's processes configured for TLS (``GNOMON_KAFKA_SECURITY_PROTOCOL=SASL_SSL``,
  ``GNOMON_KAFKA_CA_FILE``, ``GNOMON_CASSANDRA_TLS=1``, ``GNOMON_CASSANDRA_CA_FILE``) run
  the core path over it: jobs registered, every slot run once (the history checker),
  every finished run in Cassandra's history (the projector over TLS);
* the broker's certificate is rotated without downtime: a new certificate is issued, the
  broker reloads its keystore through a dynamic config change, new connections see the
  new certificate, and the processes connected before it keep running slots meanwhile.
"""

from __future__ import annotations

import secrets
import socket
import ssl
import stat
import time
from pathlib import Path

import pytest
from chaoslib import Scenario, log
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

from gnomon.adapters.kafka import security_config
from gnomon.config import Settings, load
from gnomon.core.errors import HistoryStoreError
from gnomon.core.jobs import PauseJob, RegisterJob
from gnomon.core.model import JobSpec, RetryPolicy, Schedule, Target, TargetType
from gnomon.core.runs import RunStatus
from gnomon.history.cassandra import CassandraHistoryStore
from gnomon.history.session import connect
from gnomon.infra import fetch, kafka, manager, tls

pytestmark = [pytest.mark.integration, pytest.mark.chaos, pytest.mark.own_brokers]

# below the ephemeral range (32768-60999), where a fixed port may be some connection's own end
PORT, CONTROLLER_PORT = 30092, 30093
CQL_PORT, STORAGE_PORT = 30042, 30000


def _peer_serial(port: int, ca: Path) -> int:
    """The serial number of the certificate the broker presents to a new connection."""
    ctx = ssl.create_default_context(cafile=str(ca))
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
            ctx.wrap_socket(raw, server_hostname="127.0.0.1") as conn:
        der = conn.getpeercert(binary_form=True)
    from cryptography import x509

    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def _refused(config: dict[str, object]) -> str:
    try:
        AdminClient(config).list_topics(timeout=6)
    except KafkaException as exc:
        return str(exc)
    raise AssertionError(f"a client was served: {config.get('security.protocol')}")


def test_tls_only_listeners_the_core_path_over_tls_and_a_live_certificate_rotation(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings(state_dir=tmp_path / "stack-tls", kafka_port=PORT, kafka_controller_port=CONTROLLER_PORT,
                        cassandra_port=CQL_PORT, cassandra_storage_port=STORAGE_PORT,
                        credentials_path=load().credentials_dir)  # the processes' credentials work there
    (settings.state_dir / "lib").mkdir(parents=True)
    for component in ("kafka", "cassandra"):
        (settings.state_dir / "lib" / component).symlink_to(fetch.lib_dir(load().state_dir, component))
    manager.up(settings, kafka_nodes=1, components=("kafka", "cassandra"), tls=True)
    ca = tls.ca_file(settings.state_dir)
    bootstrap = kafka.bootstrap(settings, 1)
    try:
        # only SASL_SSL listeners, the keys private
        props = (kafka.layout_dir(settings, 1) / "node-1" / "server.properties").read_text()
        assert "listener.security.protocol.map=CONTROLLER:SASL_SSL,CLIENT:SASL_SSL" in props, props
        for key in tls.tls_dir(settings.state_dir).glob("*.key"):
            assert stat.S_IMODE(key.stat().st_mode) == 0o600, key
        # production's configuration: the protocol and the CA from the environment
        monkeypatch.setenv("GNOMON_KAFKA_BOOTSTRAP", bootstrap)
        monkeypatch.setenv("GNOMON_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
        monkeypatch.setenv("GNOMON_KAFKA_CA_FILE", str(ca))
        good = {"bootstrap.servers": bootstrap, **security_config("admin")}
        assert good["security.protocol"] == "SASL_SSL" and good["ssl.ca.location"] == str(ca)
        assert "gnomon.jobs" in AdminClient(good).list_topics(timeout=10).topics
        plain = {**good, "security.protocol": "SASL_PLAINTEXT"}
        plain.pop("ssl.ca.location")
        log(f"plaintext refused: {_refused(plain)[:120]}")
        untrusted = {k: v for k, v in good.items() if k != "ssl.ca.location"}  # the system's CAs only
        log(f"untrusted CA refused: {_refused(untrusted)[:120]}")
        # Cassandra: a plaintext client is refused; the processes get TLS from the environment
        monkeypatch.setenv("GNOMON_CASSANDRA_PORT", str(CQL_PORT))
        monkeypatch.setenv("GNOMON_CASSANDRA_TLS", "0")
        with pytest.raises(HistoryStoreError):
            connect(["127.0.0.1"], CQL_PORT)
        monkeypatch.setenv("GNOMON_CASSANDRA_TLS", "1")
        monkeypatch.setenv("GNOMON_CASSANDRA_CA_FILE", str(ca))
        cluster, _ = connect(["127.0.0.1"], CQL_PORT)
        cluster.shutdown()

        tag = "tls" + secrets.token_hex(3)
        sc = Scenario(tag, tmp_path)
        try:
            sc.processor("p1")
            sc.worker("w1")
            sc.start("projector", "projector")
            sc.wait_ready("p1", "w1", "projector")
            now = int(time.time() * 1000)
            spec = JobSpec(name="tls", schedule=Schedule(cron="*/2 * * * * *"),
                           target=Target(TargetType.COMMAND, argv=("true",)), timeout_s=20,
                           retry=RetryPolicy(max_attempts=5, backoff_base_s=0.5, backoff_cap_s=2))
            jobs = [f"{tag}-{i:02d}" for i in range(10)]
            for job_id in jobs:
                sc.send(RegisterJob(job_id, "chaos", spec, now))
            sc.flush()
            sc.wait_runs(succeeded=2 * len(jobs))

            # rotate the broker's certificate while the processes run
            before = _peer_serial(PORT, ca)
            node = kafka.nodes(settings, 1)[0]
            cert = tls.ensure_host(settings.state_dir, node.name, ["127.0.0.1"], force=True)
            keystore = tls.tls_dir(settings.state_dir) / f"{node.name}.keystore.pem"
            keystore.write_text(cert.key.read_text() + cert.cert.read_text())
            res = ConfigResource(ConfigResource.Type.BROKER, "1", incremental_configs=[
                ConfigEntry("listener.name.client.ssl.keystore.location", str(keystore),
                            incremental_operation=AlterConfigOpType.SET)])
            client = AdminClient(good)  # (held: a collected client fails its futures)
            client.incremental_alter_configs([res])[res].result(timeout=30)
            rotated_at = int(time.time() * 1000)
            deadline = time.monotonic() + 20  # (KRaft applies the config record a moment later)
            while (after := _peer_serial(PORT, ca)) == before and time.monotonic() < deadline:
                time.sleep(0.2)
            assert after != before, "the broker still presents the old certificate"
            log(f"certificate rotated: serial {before:x} -> {after:x}")
            done_before = len(sc.wait_runs(succeeded=1))
            sc.wait_runs(succeeded=done_before + 2 * len(jobs), timeout_s=60)  # slots go on after it
            now = int(time.time() * 1000)
            for job_id in jobs:
                sc.send(PauseJob(job_id, "chaos", now))
            sc.flush()
            time.sleep(sc.lookahead_s + 4)
            report, runs, _ = sc.check(int(time.time() * 1000))
            after_rotation = {r.run_id for r in runs if r.slot_ms > rotated_at and r.started_at_ms is not None}
            log(f"checker: {report.summary()}; {len(after_rotation)} runs started after the rotation")
            assert report.ok and not report.problems, report.verdict()
            assert set(report.jobs) == set(jobs) and not report.jobs_short_of(2), report.jobs_short_of(2)
            assert after_rotation, "no slot ran after the rotation"
            # history over TLS: every finished run of the ledger is in Cassandra, finished
            done = {r.run_id for r in runs if r.status is RunStatus.SUCCEEDED}
            store = CassandraHistoryStore(["127.0.0.1"], CQL_PORT)
            try:
                deadline, missing = time.monotonic() + 60, sorted(done)
                while missing and time.monotonic() < deadline:
                    missing = [rid for rid in missing
                               if (h := store.get_run(rid)) is None or h.status is not RunStatus.SUCCEEDED]
                    time.sleep(1 if missing else 0)
            finally:
                store.close()
            log(f"history over TLS: {len(done) - len(missing)} of {len(done)} finished runs")
            assert done and not missing, f"history misses {len(missing)} runs, e.g. {missing[:3]}"
        finally:
            sc.stop_all()
    finally:
        manager.down(settings)
