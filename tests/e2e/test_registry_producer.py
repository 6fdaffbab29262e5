"""A producer that does not import gnomon (issue 11, point 5), through the schema registry:
a Python program whose only imports are confluent_kafka (its AvroSerializer and
AvroDeserializer) and the standard library registers a job with the latest schema of
the commands topic's subject as the registry serves it (never registering one), reads
the processor's answer by its schema id, and the job runs (docs/job-events.md)."""

from __future__ import annotations

import ast
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from harness import Stack, wait_for

from gnomon.codec import default_codec
from gnomon.config import load
from gnomon.events import JobEvents
from gnomon.infra import credentials, registry
from gnomon.topology import load_topology

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).parent / "registry_producer" / "register_job.py"
# `import gnomon` fails in the producer's interpreter (sys.modules["gnomon"] = None)
RUN_WITHOUT_GNOMON = ("import runpy, sys; sys.modules['gnomon'] = None; "
                      "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')")


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0 and node.module, "no relative imports"
            names.add(node.module)
    return names


def test_the_producer_imports_only_confluent_kafka_and_the_standard_library() -> None:
    modules = _imported_modules(SCRIPT)
    tops = {m.split(".")[0] for m in modules}
    assert "gnomon" not in tops
    assert tops - {"confluent_kafka"} <= set(sys.stdlib_module_names), tops
    assert {"confluent_kafka.schema_registry.avro", "confluent_kafka.schema_registry"} <= modules


def _produce(job_id: str, cron: str, *argv: str) -> subprocess.CompletedProcess[str]:
    settings, topo = load(), load_topology()
    cred = credentials.read(settings.credentials_dir, "api")  # the principal a tenant's service produces as
    assert cred is not None, "no Kafka credentials for the api role (gnomon infra up writes them)"
    return subprocess.run(
        [sys.executable, "-c", RUN_WITHOUT_GNOMON, str(SCRIPT), registry.url(settings), settings.kafka_bootstrap,
         cred.username, cred.password, topo.job_commands, topo.command_results, job_id, "acme", cron, *argv],
        capture_output=True, text=True, timeout=120, cwd="/", env={"PATH": "/usr/bin:/bin"})


def test_a_producer_using_only_the_registry_registers_a_job_and_it_runs(stack: Stack) -> None:
    assert registry.status(load())["state"] == "up", "gnomon infra up starts the registry"
    job_id = "sr-" + secrets.token_hex(6)
    sent = _produce(job_id, "*/2 * * * * *", "sh", "-c", "echo from the registry producer")
    assert sent.returncode == 0, f"exit {sent.returncode}\n{sent.stdout}\n{sent.stderr[-3000:]}"
    latest = default_codec.registry.latest(f"{load_topology().job_commands}-value")
    assert f"schema id {latest.id} from" in sent.stdout, sent.stdout  # the latest version, by the registry
    assert '"code": "accepted"' in sent.stdout and '"job_version": 1' in sent.stdout, sent.stdout
    try:
        ran = wait_for(lambda: stack.client.list_runs(job_id, status="succeeded", limit=5)["items"], 60,
                       f"a succeeded run of {job_id}")
        logs = stack.client.get_logs(ran[0]["id"])["items"]
        assert any(line["line"] == "from the registry producer" for line in logs), logs
        # the same id with another definition: refused, and the answer (decoded by its id) says why
        again = _produce(job_id, "*/3 * * * * *", "true")
        assert again.returncode == 3, f"exit {again.returncode}\n{again.stdout}\n{again.stderr[-3000:]}"
        assert '"code": "refused"' in again.stdout and "already exists" in again.stdout, again.stdout
    finally:
        with JobEvents("acme", load().kafka_bootstrap) as events:
            events.delete(job_id)
