"""Issue 2 acceptance on the real stack: API -> Kafka -> processor -> worker -> Cassandra."""

from __future__ import annotations

import itertools
import json
import secrets
import time
from typing import Any

import httpx
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from harness import NEVER_DUE, OTHER_TOKEN, TOKEN, Recorder, Stack, wait_for

from gnomon import codec
from gnomon.adapters.kafka import consumer_config, producer_config
from gnomon.client import ApiError, Client
from gnomon.config import load
from gnomon.core.clock import iso_to_ms, ms_to_iso
from gnomon.core.jobs import RunTriggered
from gnomon.topology import load_topology

pytestmark = pytest.mark.integration


def job_body(**over: Any) -> dict[str, Any]:
    b: dict[str, Any] = {"name": "e2e-" + secrets.token_hex(3), "schedule": "*/5 * * * * *",
                         "target": {"type": "command", "argv": ["sh", "-c", "echo hello from $GNOMON_RUN_ID"]},
                         "timeoutS": 30, "retry": {"max": 1}}
    b.update(over)
    return b


def create(client: Client, **over: Any) -> str:
    job_id = client.create_job(job_body(**over))["id"]
    wait_for(lambda: _exists(client, job_id), 30, f"job {job_id} to be readable")
    return job_id


def _exists(client: Client, job_id: str) -> bool:
    try:
        client.get_job(job_id)
        return True
    except ApiError as exc:
        if exc.status == 404:
            return False
        raise


def runs(client: Client, job_id: str, status: str | None = None) -> list[dict[str, Any]]:
    return client.list_runs(job_id, status=status, limit=100)["items"]


def lag_s(run: dict[str, Any]) -> float:
    return (iso_to_ms(run["startedAt"]) - iso_to_ms(run["slot"])) / 1000


def test_cron_every_5s_runs_consecutive_slots_exactly_once(stack: Stack) -> None:
    c = stack.client
    job_id = create(c)
    done = wait_for(lambda: (r := runs(c, job_id, "succeeded")) and len(r) >= 3 and r, 60, "3 succeeded runs")
    slots = [iso_to_ms(r["slot"]) for r in done]
    assert slots == sorted(slots, reverse=True), "newest first"
    assert len(set(slots)) == len(slots), "each slot once"
    last3 = sorted(slots)[-3:]
    assert [b - a for a, b in itertools.pairwise(last3)] == [5000, 5000], "consecutive slots"
    for r in done:
        assert r["id"] == f"{job_id}@{r['slot']}"
        assert r["attempt"] == 1
        assert 0 <= lag_s(r) <= 2.0, f"{r['id']} started {lag_s(r)}s after its slot"
    logs = c.get_logs(done[0]["id"])["items"]
    assert any(f"hello from {done[0]['id']}" in line["line"] for line in logs), logs
    c.delete(job_id)


def test_one_time_job_runs_once_at_its_time(stack: Stack) -> None:
    c = stack.client
    at = int(time.time() + 8) * 1000
    job_id = create(c, schedule=None, runAt=ms_to_iso(at))
    run = wait_for(lambda: (r := runs(c, job_id, "succeeded")) and r[0], 40, "the one-time run")
    assert run["slot"] == ms_to_iso(at) and 0 <= lag_s(run) <= 2.0
    time.sleep(3)
    assert len(runs(c, job_id)) == 1
    assert c.get_job(job_id)["status"] == "done"


def test_handler_command_and_http_targets_run_and_report(stack: Stack, callback_server: str) -> None:
    c = stack.client
    soon = ms_to_iso(int(time.time() + 4) * 1000)
    ids = {
        "handler": create(c, schedule=None, runAt=soon, target={"type": "handler", "name": "echo"}, payload={"x": 1}),
        "command": create(c, schedule=None, runAt=soon, target={"type": "command", "argv": ["true"]}),
        "http": create(c, schedule=None, runAt=soon, target={"type": "http", "url": callback_server + "/ok"}),
    }
    for kind, job_id in ids.items():
        run = wait_for(lambda j=job_id: (r := runs(c, j)) and r[0]["status"] == "succeeded" and r[0], 40, kind)
        assert run["status"] == "succeeded"
    call = next(x for x in Recorder.calls if json.loads(x["body"])["jobId"] == ids["http"])
    body = json.loads(call["body"])
    assert call["headers"]["Idempotency-Key"] == body["runId"]
    assert body["runId"].startswith(ids["http"] + "@")
    logs = c.get_logs(runs(c, ids["handler"])[0]["id"])["items"]
    assert any("echo handler" in x["line"] and "{'x': 1}" in x["line"] for x in logs)


def test_failing_command_ends_failed_with_exit_code_and_stderr(stack: Stack) -> None:
    c = stack.client
    job_id = create(c, schedule=None, runAt=ms_to_iso(int(time.time() + 3) * 1000),
                    target={"type": "command", "argv": ["sh", "-c", "echo boom-on-stderr >&2; exit 3"]})
    run = wait_for(lambda: (r := runs(c, job_id, "failed")) and r[0], 40, "the failed run")
    assert run["exitCode"] == 3 and run["status"] == "failed"
    logs = c.get_logs(run["id"])["items"]
    assert any(x["stream"] == "stderr" and "boom-on-stderr" in x["line"] for x in logs), logs


def test_trigger_is_idempotent_and_replayed_trigger_makes_no_second_run(stack: Stack) -> None:
    c = stack.client
    job_id = create(c, schedule=NEVER_DUE, target={"type": "command", "argv": ["true"]})
    a = c.trigger(job_id, "nightly-rerun-1")
    b = c.trigger(job_id, "nightly-rerun-1")
    assert a == b == f"{job_id}@manual:nightly-rerun-1"
    run = wait_for(lambda: (r := runs(c, job_id, "succeeded")) and r[0], 30, "manual run")
    # replay the exact RunTriggered for that run onto the run-events topic
    s, topo = load(), load_topology()
    spec_state = c.get_job(job_id)
    from gnomon.core.validation import parse_job_spec

    spec = parse_job_spec({k: spec_state[k] for k in ("name", "schedule", "timezone", "target", "payload", "priority",
                                                      "timeoutS", "retry", "catchUp", "pool")}, 0)
    replay = RunTriggered(a, job_id, "acme", spec, iso_to_ms(run["slot"]), iso_to_ms(run["slot"]), True,
                          int(time.time() * 1000))
    p = Producer(producer_config(s.kafka_bootstrap))
    p.produce(topo.run_events, key=job_id.encode(), value=codec.encode(replay))
    p.flush(10)
    time.sleep(4)
    all_runs = runs(c, job_id)
    assert len(all_runs) == 1
    assert all_runs[0]["attempt"] == 1 and all_runs[0]["createdAt"] == run["createdAt"]


def _topic_end_offsets(topic: str) -> int:
    s = load()
    cons = Consumer(consumer_config(s.kafka_bootstrap, "e2e-offsets"))
    try:
        md = cons.list_topics(topic, timeout=10)
        return sum(cons.get_watermark_offsets(TopicPartition(topic, p), 10)[1] for p in md.topics[topic].partitions)
    finally:
        cons.close()


@pytest.mark.parametrize(
    ("over", "field", "status"),
    [
        ({"schedule": "61 * * * *"}, "schedule", 422),
        ({"timezone": "Mars/Base"}, "timezone", 422),
        ({"schedule": None, "runAt": "2001-01-01T00:00:00Z"}, "runAt", 422),
        ({"timeoutS": -5}, "timeoutS", 422),
        ({"frequency": "often"}, "frequency", 422),
        ({"payload": {"blob": "x" * 70_000}}, "payload", 422),
    ],
)
def test_bad_input_is_a_problem_naming_the_field_and_nothing_reaches_kafka(
    stack: Stack, over: dict[str, Any], field: str, status: int
) -> None:
    topic = load_topology().job_commands
    before = _topic_end_offsets(topic)
    body = job_body(**over)
    body = {k: v for k, v in body.items() if v is not None}
    resp = httpx.post(stack.api_url + "/v1/jobs", json=body, headers={"Authorization": f"Bearer {TOKEN}"})
    assert resp.status_code == status
    assert resp.headers["content-type"].startswith("application/problem+json")
    assert resp.json()["field"] == field
    assert _topic_end_offsets(topic) == before


def test_wrong_token_is_401_problem(stack: Stack) -> None:
    resp = httpx.post(stack.api_url + "/v1/jobs", json=job_body(), headers={"Authorization": "Bearer nope"})
    assert resp.status_code == 401 and resp.json()["field"] == "Authorization"
    assert resp.headers["content-type"].startswith("application/problem+json")


def test_other_tenant_cannot_see_the_job(stack: Stack) -> None:
    job_id = create(stack.client, schedule=NEVER_DUE)
    with pytest.raises(ApiError) as err:
        Client(stack.api_url, OTHER_TOKEN).get_job(job_id)
    assert err.value.status == 404


def test_pause_stops_triggers_and_resume_continues_from_next_slot(stack: Stack) -> None:
    c = stack.client
    job_id = create(c, schedule="*/2 * * * * *", target={"type": "command", "argv": ["true"]})
    wait_for(lambda: len(runs(c, job_id, "succeeded")) >= 1, 30, "a first run")
    c.pause(job_id)
    wait_for(lambda: c.get_job(job_id)["status"] == "paused", 15, "paused")
    paused_at_ms = int(time.time() * 1000)
    time.sleep(8)
    now_ms = int(time.time() * 1000)
    later = [r for r in runs(c, job_id) if paused_at_ms < iso_to_ms(r["slot"]) < now_ms - 1500]
    # runs already triggered inside the lookahead are withdrawn at their slot, recorded skipped
    assert later, "slots during the pause are recorded"
    assert all(r["status"] == "skipped" and r["reason"] == "paused" for r in later), later
    resumed_at = time.time()
    c.resume(job_id)
    wait_for(lambda: any(iso_to_ms(r["slot"]) >= resumed_at * 1000 and r["status"] == "succeeded"
                         for r in runs(c, job_id)), 30, "a run after resume")
    c.delete(job_id)


def test_malformed_event_goes_to_poison_and_the_processor_keeps_going(stack: Stack) -> None:
    s, topo = load(), load_topology()
    cons = Consumer(consumer_config(s.kafka_bootstrap, "e2e-poison-" + secrets.token_hex(3)))
    md = cons.list_topics(topo.poison, timeout=10)
    starts = [TopicPartition(topo.poison, p, cons.get_watermark_offsets(TopicPartition(topo.poison, p), 10)[1])
              for p in md.topics[topo.poison].partitions]
    cons.assign(starts)
    garbage = b"\x00\x00\x00\x00\x63not avro at all " + secrets.token_bytes(8)
    p = Producer(producer_config(s.kafka_bootstrap))
    p.produce(topo.job_commands, key=b"job_poisoned", value=garbage)
    p.produce(topo.run_events, key=b"job_poisoned", value=b"")
    p.flush(10)
    found = []
    deadline = time.monotonic() + 30
    while len(found) < 2 and time.monotonic() < deadline:
        msg = cons.poll(0.5)
        if msg is not None and not msg.error():
            rec = codec.decode(msg.value())
            if rec.value in (garbage, b"") and rec.key == b"job_poisoned":
                found.append(rec)
    cons.close()
    assert {r.source_topic for r in found} == {topo.job_commands, topo.run_events}
    assert all("Decode" in r.reason for r in found), [r.reason for r in found]
    # and the processor is still scheduling
    c = stack.client
    job_id = create(c, schedule=None, runAt=ms_to_iso(int(time.time() + 3) * 1000),
                    target={"type": "command", "argv": ["true"]})
    wait_for(lambda: (r := runs(c, job_id, "succeeded")) and r, 30, "a run after the poison records")
