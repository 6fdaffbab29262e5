"""A producer that does not import gnomon (issue 11, point 5), through the schema registry:
a Python program whose only imports are confluent_kafka (its AvroSerializer) and the
standard library registers a job with the latest schema of the commands topic's subject
as the registry serves it (never registering one), reads the processor's answer from the
REST API with its tenant's token (a team's Kafka credential cannot read the answers
topic: docs/adr/0006, decision 4), and the job runs (docs/job-events.md).

Issue 21: such a program (``registry_producer/mixed_batch.py``) sends one batch that
mixes valid commands with invalid ones (a cron that never parses, an unknown zone and
pool, an empty name, a negative timeout, a payload that is not JSON, a one-time job in
the past, a patch that is not an object, a bad idempotency key, a command made an hour
ahead of the processor's clock, a job id with '@'), a command for a job that does not
exist and a record that is not Avro. Each command gets its answer from the API, and the
answers topic holds exactly one committed answer per command (the test's own
read_committed reader), ``invalid`` with the field as the API names it where the API would
refuse it; the record that is not Avro goes to the poison topic; the processor stays up
and the valid jobs run. Then the same with the processor killed (SIGKILL) while it
applies the first half of the batch (as soon as a first answer to it is written, its
transaction maybe still open) and started again before the second half: the answers a
read_committed reader sees are still exactly one per command."""

from __future__ import annotations

import ast
import json
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from harness import Stack, end_offsets, outside_producer_env, wait_for

from gnomon import codec, credentials
from gnomon.adapters.kafka import consumer_config
from gnomon.client import ApiError
from gnomon.codec import default_codec
from gnomon.config import load
from gnomon.core.messages import PoisonRecord
from gnomon.core.replies import CommandResult
from gnomon.events import JobEvents
from gnomon.infra import registry
from gnomon.topology import load_topology

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).parent / "registry_producer" / "register_job.py"
BATCH = Path(__file__).parent / "registry_producer" / "mixed_batch.py"
PROGRAMS = (SCRIPT, BATCH)
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


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.name)
def test_the_producer_imports_only_confluent_kafka_and_the_standard_library(program: Path) -> None:
    modules = _imported_modules(program)
    tops = {m.split(".")[0] for m in modules}
    assert "gnomon" not in tops
    assert tops - {"confluent_kafka"} <= set(sys.stdlib_module_names), tops
    assert {"confluent_kafka.schema_registry.avro", "confluent_kafka.schema_registry"} <= modules


def _produce(api_url: str, job_id: str, cron: str, *argv: str) -> subprocess.CompletedProcess[str]:
    settings, topo = load(), load_topology()
    cred = credentials.read(settings.credentials_dir, "producer")  # what an operator hands a team's service
    assert cred is not None, "no Kafka credentials for the producer role (gnomon infra up writes them)"
    return subprocess.run(
        [sys.executable, "-c", RUN_WITHOUT_GNOMON, str(SCRIPT), registry.url(settings), settings.kafka_bootstrap,
         cred.username, cred.password, topo.job_commands, api_url, job_id, "acme", cron, *argv],
        capture_output=True, text=True, timeout=120, cwd="/", env={"PATH": "/usr/bin:/bin", **outside_producer_env()})


def test_a_producer_using_only_the_registry_registers_a_job_and_it_runs(stack: Stack) -> None:
    assert registry.status(load())["state"] == "up", "gnomon infra up starts the registry"
    job_id = "sr-" + secrets.token_hex(6)
    sent = _produce(stack.api_url, job_id, "*/2 * * * * *", "sh", "-c", "echo from the registry producer")
    assert sent.returncode == 0, f"exit {sent.returncode}\n{sent.stdout}\n{sent.stderr[-3000:]}"
    latest = default_codec.registry.latest(f"{load_topology().job_commands}-value")
    assert f"schema id {latest.id} from" in sent.stdout, sent.stdout  # the latest version, by the registry
    assert '"code": "accepted"' in sent.stdout and '"version": 1' in sent.stdout, sent.stdout
    try:
        ran = _succeeded(stack, job_id, 60)
        logs = stack.client.get_logs(ran[0]["id"])["items"]
        assert any(line["line"] == "from the registry producer" for line in logs), logs
        # the same id with another definition: refused, and the answer says why
        again = _produce(stack.api_url, job_id, "*/3 * * * * *", "true")
        assert again.returncode == 3, f"exit {again.returncode}\n{again.stdout}\n{again.stderr[-3000:]}"
        assert '"code": "refused"' in again.stdout and "already exists" in again.stdout, again.stdout
    finally:
        with JobEvents("acme", load().kafka_bootstrap) as events:
            events.delete(job_id)


# ---- issue 21: one batch of valid and invalid commands ---------------------------------

# label (tests/e2e/registry_producer/mixed_batch.py) -> (code, field): the API's field name
EXPECTED: dict[str, tuple[str, str | None]] = {
    "ok-cron": ("accepted", None),
    "bad-cron": ("invalid", "schedule"),  # 61 * * * *
    "ok-once": ("accepted", None),
    "bad-tz": ("invalid", "timezone"),  # Mars/Olympus
    "ok-patch": ("accepted", None),
    "bad-pool": ("invalid", "pool"),
    "bad-name": ("invalid", "name"),  # ""
    "ok-trigger": ("accepted", None),
    "bad-timeout": ("invalid", "timeoutS"),  # -5
    "bad-payload": ("invalid", "payload"),  # "{not json"
    "bad-run-at": ("invalid", "runAt"),  # a one-time job 30 days before its command
    "bad-patch": ("invalid", "body"),  # patch_json "[1, 2]": not an object
    "bad-trigger-key": ("invalid", "idempotencyKey"),  # "not a key!"
    "missing-job": ("refused", "jobId"),  # a PauseJob for a job never registered: the field is the job id
    "bad-at": ("invalid", "at_ms"),  # made an hour ahead of the processor's clock
    "bad-job-id": ("invalid", "job_id"),  # an '@' in the job id
    "ok-late": ("accepted", None),
}
NOT_AVRO = "not-avro"  # no answer: it goes to the poison topic
RUNS = ("ok-cron", "ok-once", "ok-late")  # valid jobs whose runs must succeed
PROCESSOR_ARGS = ("processor", "--instance-id", "e2e-0")  # as the session stack starts it (harness.py)


def _run_batch(stack: Stack, prefix: str, kill_at: str | None) -> tuple[int, list[dict[str, Any]], str, int | None]:
    """Run mixed_batch.py (gnomon unimportable in its interpreter); with ``kill_at``, kill
    the session stack's processor (SIGKILL) once the first half is flushed ("flushed") or
    once a first answer to it is written ("answered": seen on the answers topic by a
    read_uncommitted reader of the test's own, the processor's transaction maybe still
    open), and start it again before the second half. Returns (exit code, its events, its
    stderr, when the processor was killed (epoch ms) or None)."""
    settings, topo = load(), load_topology()
    cred = credentials.read(settings.credentials_dir, "producer")  # what an operator hands a team's service
    assert cred is not None, "no Kafka credentials for the producer role (gnomon infra up writes them)"
    args = [sys.executable, "-c", RUN_WITHOUT_GNOMON, str(BATCH), registry.url(settings), settings.kafka_bootstrap,
            cred.username, cred.password, topo.job_commands, stack.api_url, prefix, "acme"]
    flag = [] if kill_at is None else ["--halves"]
    since = end_offsets(settings.kafka_bootstrap, topo.command_results, committed=False)
    proc = subprocess.Popen([*args, *flag], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/",
                            env={"PATH": "/usr/bin:/bin", **outside_producer_env()})
    assert proc.stdout is not None and proc.stdin is not None
    events: list[dict[str, Any]] = []
    killed_ms = None
    try:
        for line in proc.stdout:
            event = json.loads(line)
            events.append(event)
            if event["event"] == "half":
                if kill_at == "answered":
                    first = {(e["partition"], e["offset"]) for e in events if e["event"] == "sent"}
                    _answers_on_topic(since, first, "read_uncommitted", 30, first_only=True)
                killed_ms = int(time.time() * 1000)
                stack.stop("processor", signal.SIGKILL)  # mid-application: its open transaction is lost
                stack.start("processor", *PROCESSOR_ARGS)
                proc.stdin.write("go\n")
                proc.stdin.flush()
        code = proc.wait(240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.stderr is not None
    events.append({"event": "since", "offsets": [(tp.partition, tp.offset) for tp in since]})
    return code, events, proc.stderr.read(), killed_ms


def _answers_on_topic(since: list[Any], positions: set[tuple[int, int]], isolation: str, timeout_s: float, *,
                      first_only: bool = False) -> dict[tuple[int, int], list[CommandResult]]:
    """The answers on the answers topic (read from ``since``, as the test's own admin
    reader, ``isolation``) to the commands at ``positions``: every one, read until each
    has one and 2 s more (so a repeated answer shows), or the first one found."""
    consumer = Consumer({**consumer_config(load().kafka_bootstrap, "e2e-answers-read"),
                         "isolation.level": isolation})
    consumer.assign(since)
    found: dict[tuple[int, int], list[CommandResult]] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            if len(found) >= len(positions):
                deadline = min(deadline, time.monotonic() + 2)
            for msg in consumer.consume(100, 0.2):
                value = msg.value()
                if msg.error() or value is None:
                    continue
                res = codec.decode(value)
                if isinstance(res, CommandResult) and (at := (res.source_partition, res.source_offset)) in positions:
                    found.setdefault(at, []).append(res)
                    if first_only:
                        return found
    finally:
        consumer.close()
    return found


def _poison_of(topic: str, since: list[Any], positions: set[tuple[int, int]], timeout_s: float) -> list[PoisonRecord]:
    """Poison records of ``topic``'s records at ``positions`` (partition, offset), read from
    the offsets ``since`` (read_committed)."""
    consumer = Consumer(consumer_config(load().kafka_bootstrap, "e2e-poison-read"))
    consumer.assign(since)
    found: list[PoisonRecord] = []
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            if len(found) >= len(positions):  # read on a little: a repeated poison record would show
                deadline = min(deadline, time.monotonic() + 2)
            for msg in consumer.consume(100, 0.5):
                value = msg.value()
                if msg.error() or value is None:
                    continue
                rec = codec.decode(value)
                if isinstance(rec, PoisonRecord) and rec.source_topic == topic and (rec.partition, rec.offset) in positions:
                    found.append(rec)
    finally:
        consumer.close()
    return found


def _runs(stack: Stack, job_id: str, status: str | None = None) -> list[dict[str, Any]]:
    """The job's runs in history; none while history does not know the job yet (the
    projector writes it a moment after the processor: the API answers 404 until then)."""
    try:
        items: list[dict[str, Any]] = stack.client.list_runs(job_id, status=status, limit=20)["items"]
    except ApiError as exc:
        if exc.status != 404:
            raise
        return []
    return items


def _succeeded(stack: Stack, job_id: str, timeout_s: float, run_id_part: str = "") -> list[dict[str, Any]]:
    """The succeeded runs of ``job_id`` (whose id holds ``run_id_part``), once there is
    one; on timeout, the error shows every run of the job with its status."""
    try:
        runs: list[dict[str, Any]] = wait_for(
            lambda: [r for r in _runs(stack, job_id, "succeeded") if run_id_part in r["id"]], timeout_s,
            f"a succeeded run of {job_id}")
        return runs
    except AssertionError as exc:
        seen = [(r["id"], r["status"], r.get("reason")) for r in _runs(stack, job_id)]
        raise AssertionError(f"{exc}; its runs: {seen}") from None


def _check_batch(stack: Stack, kill_at: str | None = None) -> None:
    topo = load_topology()
    restart = kill_at is not None
    prefix = ("mbr-" if restart else "mb-") + secrets.token_hex(4)
    job = {label: f"{prefix}-{label}" for label in RUNS}  # (the program's ids, for the clean-up)
    poison_since = end_offsets(load().kafka_bootstrap, topo.poison)
    processor_pid = stack.procs["processor"].pid
    t0 = time.monotonic()
    try:
        code, events, stderr, killed_ms = _run_batch(stack, prefix, kill_at)
        answered_s = time.monotonic() - t0
        said = "\n".join(json.dumps(e) for e in events) + "\n" + stderr[-3000:]
        latest = default_codec.registry.latest(f"{topo.job_commands}-value")
        assert {"event": "schema", "id": latest.id} in events, said  # the registry's latest version
        done = [e for e in events if e["event"] == "done"]
        assert done and done[0]["missing"] == [], said
        assert code == 0, f"exit {code}\n{said}"
        job.update({e["label"]: e["job_id"] for e in events if e["event"] == "sent"})
        assert set(job) == {*EXPECTED, NOT_AVRO}, said
        [half] = [e["sent"] for e in events if e["event"] == "half"] or [[]]
        assert bool(half) == restart, said

        answers: dict[str, list[dict[str, Any]]] = {}  # what the program read from the API
        for e in events:
            if e["event"] == "answer":
                answers.setdefault(e["label"], []).append(e["answer"])
        assert set(answers) == set(EXPECTED), said  # and none for the record that is not Avro
        for label, (want_code, want_field) in EXPECTED.items():
            [answer] = answers[label]
            assert (answer["code"], answer.get("field")) == (want_code, want_field), (label, answer)
            assert answer["jobId"] == job[label], (label, answer)
            if want_code == "invalid":
                assert answer["reason"], (label, answer)
        assert answers["ok-cron"][0]["version"] == 1 and answers["ok-patch"][0]["version"] == 2, answers
        assert "does not exist" in answers["missing-job"][0]["reason"], answers
        # the answers topic itself: exactly one committed answer per command (read_committed),
        # the processor killed mid-batch included; the same as the API said
        [since] = [[TopicPartition(topo.command_results, p, o) for p, o in e["offsets"]]
                   for e in events if e["event"] == "since"]
        at = {e["label"]: (e["partition"], e["offset"]) for e in events if e["event"] == "sent"}
        committed = _answers_on_topic(since, {at[label] for label in EXPECTED}, "read_committed", 60)
        for label in EXPECTED:
            [res] = committed.get(at[label], [])  # exactly one
            assert (res.code.value, res.job_id, res.tenant) == (answers[label][0]["code"], job[label], "acme"), res
        raw = _answers_on_topic(since, {at[label] for label in EXPECTED}, "read_uncommitted", 10)
        aborted = {label: len(raw.get(at[label], [])) - 1 for label in EXPECTED if len(raw.get(at[label], [])) > 1}
        after_kill = 0
        if killed_ms is not None:  # the second half was answered by the processor started again
            late = [label for label in EXPECTED if label not in half]
            assert all(committed[at[label]][0].at_ms >= killed_ms for label in late), committed
            after_kill = sum(committed[at[label]][0].at_ms >= killed_ms for label in EXPECTED if label in half)

        # the record that is not Avro: in the poison topic, with where it was and why
        [sent] = [e for e in events if e["event"] == "sent" and e["label"] == NOT_AVRO]
        poisoned = _poison_of(topo.job_commands, poison_since, {(sent["partition"], sent["offset"])}, 60)
        assert len(poisoned) == 1 and poisoned[0].reason, poisoned
        assert poisoned[0].key == job[NOT_AVRO].encode(), poisoned

        # the processor stayed up: the same process (or, with the restart, the one started again)
        assert stack.procs["processor"].poll() is None, "the processor exited"
        assert (stack.procs["processor"].pid != processor_pid) == restart
        # the invalid registrations changed nothing; the valid jobs run
        for label in ("bad-cron", "bad-tz", "bad-pool", "bad-name", "bad-timeout", "bad-payload", "bad-run-at",
                      "bad-at"):
            with pytest.raises(ApiError) as missing:
                stack.client.get_job(job[label])
            assert missing.value.status == 404, (label, missing.value)
        assert stack.client.get_job(job["ok-cron"])["priority"] == "high"  # the valid patch applied
        for label in RUNS:
            ran = _succeeded(stack, job[label], 90)
            logs = stack.client.get_logs(ran[0]["id"])["items"]
            assert any(line["line"] == job[label] for line in logs), logs
        _succeeded(stack, job["ok-once"], 60, "@manual:deploy-1")  # the valid trigger's run
        assert stack.procs["processor"].poll() is None, "the processor exited"
        print(f"\n{f'killed once {kill_at}' if restart else 'batch'}: {len(EXPECTED)} commands answered in "
              f"{answered_s:.1f} s"
              + (f"; {after_kill} of the first half's {len([h for h in half if h in EXPECTED])} answered after "
                 "the kill; answers of aborted transactions (seen only read_uncommitted): "
                 f"{aborted or 'none'}" if killed_ms is not None else ""))
    finally:
        if "processor" not in stack.procs or stack.procs["processor"].poll() is not None:
            stack.procs.pop("processor", None)
            stack.start("processor", *PROCESSOR_ARGS)  # leave the session stack as it was
        with JobEvents("acme", load().kafka_bootstrap) as sender:
            for label in RUNS:
                sender.delete(job[label])


def test_a_mixed_batch_from_an_outside_producer_gets_one_answer_per_command(stack: Stack) -> None:
    _check_batch(stack)


# "flushed": killed between the halves, before or while it reads the first (its answers
# then come from the processor started again); "answered": killed as soon as a first
# answer to the first half is written, while it applies it (its transaction open, or
# just committed: then the processor started again must not answer those again)
@pytest.mark.parametrize("kill_at", ["flushed", "answered"])
def test_the_same_batch_with_the_processor_killed_and_restarted_in_the_middle(stack: Stack, kill_at: str) -> None:
    _check_batch(stack, kill_at)
