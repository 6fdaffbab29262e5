"""A producer that does not import gnomon (issue 11, point 5): a Java program built from
Maven Central jars registers a job knowing only the job-event contract (the topics, the
key and the framing: docs/job-events.md) and the schemas, taken either from the files
and ids in schemas/avro/ or from gnomon's schema registry (its Confluent REST API: the
subject's latest version and its references; ADR 0009), reads the processor's answer
from the REST API with its tenant's token (docs/adr/0006, decision 4), and the job runs."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
from pathlib import Path
from typing import Any

import pytest
from harness import Stack, outside_producer_env, wait_for

from gnomon import credentials
from gnomon.codec import default_codec
from gnomon.config import REPO_ROOT, load
from gnomon.events import JobEvents
from gnomon.infra import fetch, registry
from gnomon.topology import load_topology

pytestmark = pytest.mark.integration

SOURCE = Path(__file__).parent / "contract_producer" / "ContractProducer.java"


@pytest.fixture(scope="module")
def producer_classpath(tmp_path_factory: pytest.TempPathFactory) -> str:
    lib = fetch.fetch(load().state_dir, "contract-producer", "the contract producer")
    classes = tmp_path_factory.mktemp("contract-producer")
    subprocess.run(["javac", "-cp", f"{lib}/*", "-d", str(classes), str(SOURCE)], check=True, timeout=120)
    return f"{classes}:{lib}/*"


def _answer(stdout: str) -> dict[str, Any]:
    """The answer the program printed (``answer {json}``)."""
    [line] = [x for x in stdout.splitlines() if x.startswith("answer ")] or [None]
    assert line is not None, stdout
    answer: dict[str, Any] = json.loads(line.removeprefix("answer "))
    return answer


def _produce(api_url: str, classpath: str, job_id: str, cron: str, *argv: str, schemas: str | None = None,
             ) -> subprocess.CompletedProcess[str]:
    settings, topo = load(), load_topology()
    cred = credentials.read(settings.credentials_dir, "producer")  # what an operator hands a team's service
    assert cred is not None, "no Kafka credentials for the producer role (gnomon infra up writes them)"
    return subprocess.run(
        ["java", "-cp", classpath, "ContractProducer", settings.kafka_bootstrap, cred.username, cred.password,
         schemas or str(REPO_ROOT / "schemas" / "avro"), topo.job_commands, api_url, job_id, "acme", cron, *argv],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, **outside_producer_env()})


def test_a_java_producer_registers_a_job_reads_the_answer_and_the_job_runs(stack: Stack,
                                                                          producer_classpath: str) -> None:
    job_id = "java-" + secrets.token_hex(6)
    sent = _produce(stack.api_url, producer_classpath, job_id, "*/2 * * * * *", "sh", "-c", "echo from java")
    assert sent.returncode == 0, f"exit {sent.returncode}\n{sent.stdout}\n{sent.stderr[-3000:]}"
    answer = _answer(sent.stdout)
    assert (answer["code"], answer["version"], answer["jobId"]) == ("accepted", 1, job_id), sent.stdout
    try:
        ran = wait_for(lambda: stack.client.list_runs(job_id, status="succeeded", limit=5)["items"], 60,
                       f"a succeeded run of {job_id}")
        logs = stack.client.get_logs(ran[0]["id"])["items"]
        assert any(line["line"] == "from java" for line in logs), logs
        # the same id with another definition: refused, and the answer says why
        again = _produce(stack.api_url, producer_classpath, job_id, "*/3 * * * * *", "true")
        assert again.returncode == 3, f"exit {again.returncode}\n{again.stdout}\n{again.stderr[-3000:]}"
        refused = _answer(again.stdout)
        assert refused["code"] == "refused" and "already exists" in refused["reason"], again.stdout
    finally:
        with JobEvents("acme", load().kafka_bootstrap) as events:
            events.delete(job_id)


def test_a_java_producer_takes_the_schemas_from_the_registry(stack: Stack, producer_classpath: str) -> None:
    settings = load()
    assert registry.status(settings)["state"] == "up", "gnomon infra up starts the registry"
    job_id = "java-sr-" + secrets.token_hex(6)
    sent = _produce(stack.api_url, producer_classpath, job_id, "*/2 * * * * *", "sh", "-c", "echo via the registry",
                    schemas=registry.url(settings))
    assert sent.returncode == 0, f"exit {sent.returncode}\n{sent.stdout}\n{sent.stderr[-3000:]}"
    commands = default_codec.registry.latest(f"{load_topology().job_commands}-value")
    assert f"schema id {commands.id} from http" in sent.stdout, sent.stdout
    assert _answer(sent.stdout)["code"] == "accepted", sent.stdout
    try:
        ran = wait_for(lambda: stack.client.list_runs(job_id, status="succeeded", limit=5)["items"], 60,
                       f"a succeeded run of {job_id}")
        logs = stack.client.get_logs(ran[0]["id"])["items"]
        assert any(line["line"] == "via the registry" for line in logs), logs
    finally:
        with JobEvents("acme", load().kafka_bootstrap) as events:
            events.delete(job_id)
