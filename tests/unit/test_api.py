"""The API in-process: validation, problem+json, auth, commands produced (no Kafka)."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from gnomon.api.app import CommandSink, create_app
from gnomon.cli import jobs as cli_jobs
from gnomon.cli import main as cli_main
from gnomon.client import ApiError, Client
from gnomon.core import jobs as J
from gnomon.core.clock import FakeClock, iso_to_ms
from gnomon.core.errors import ValidationError
from gnomon.core.model import job_id_of
from gnomon.core.runs import CancelRun, ReplayRun, RunState, RunStatus
from gnomon.core.validation import parse_job_spec
from gnomon.history.memory import InMemoryHistoryStore
from gnomon.testing import DecidingProducer, ListProducer
from gnomon.topology import load_topology
from gnomon.web.auth import Authenticator

NOW = iso_to_ms("2026-11-29T08:00:00.500Z")
AUTH = {"Authorization": "Bearer tok-a"}


@pytest.fixture
def env() -> tuple[TestClient, DecidingProducer, InMemoryHistoryStore]:
    """The API over the processor's own decisions (``DecidingProducer``) with a history
    that projects them at once."""
    history, clock = InMemoryHistoryStore(), FakeClock(NOW)
    producer = DecidingProducer(history, clock=clock)
    topo = load_topology()
    app = create_app(history=history, commands=CommandSink(producer, topo.job_commands),
                     auth=Authenticator({"tok-a": "acme", "tok-b": "other"}), topology=topo, clock=clock,
                     answers=producer.answers)
    return TestClient(app), producer, history


def body(**over: Any) -> dict[str, Any]:
    b = {"name": "n", "schedule": "0 * * * *", "target": {"type": "command", "argv": ["true"]}}
    b.update(over)
    return b


def test_create_produces_one_register_command(env: Any) -> None:
    client, producer, _ = env
    resp = client.post("/v1/jobs", json=body(), headers=AUTH)
    assert resp.status_code == 201, resp.text
    job = resp.json()
    assert job["id"].startswith("job_") and job["nextRunAt"] == "2026-11-29T09:00:00Z"
    ((topic, key, cmd),) = producer.sent
    assert topic == "gnomon.job-commands" and key == job["id"]
    assert isinstance(cmd, J.RegisterJob) and cmd.tenant == "acme"


@pytest.mark.parametrize(
    ("payload", "field"),
    [(body(schedule="bad"), "schedule"), (body(extra=1), "extra"), (body(timeoutS=-1), "timeoutS"),
     ("[1,2]", "body"), (body(payload={"x": "y" * 70_000}), "payload")],
)
def test_bad_input_problem_json(env: Any, payload: Any, field: str) -> None:
    client, producer, _ = env
    kw = {"content": payload} if isinstance(payload, str) else {"json": payload}
    resp = client.post("/v1/jobs", headers=AUTH, **kw)
    assert resp.status_code == 422
    assert resp.headers["content-type"] == "application/problem+json"
    assert resp.json()["field"] == field
    assert producer.sent == []


def test_not_json_is_a_problem(env: Any) -> None:
    client, producer, _ = env
    resp = client.post("/v1/jobs", content=b"{nope", headers={**AUTH, "Content-Type": "application/json"})
    assert resp.status_code == 422 and resp.json()["field"] == "body" and producer.sent == []


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic abc"}])
def test_auth_required(env: Any, headers: dict[str, str]) -> None:
    client, producer, _ = env
    resp = client.post("/v1/jobs", json=body(), headers=headers)
    assert resp.status_code == 401 and resp.json()["field"] == "Authorization"
    assert producer.sent == []


def _registered(env: Any) -> str:
    client, producer, history = env
    job_id = client.post("/v1/jobs", json=body(), headers=AUTH).json()["id"]
    state = J.evolve(None, J.decide(None, producer.sent[-1][2])[0])
    history.put_job(state)
    return job_id


def test_trigger_is_idempotent_by_key(env: Any) -> None:
    client, _, _ = env
    job_id = _registered(env)
    r1 = client.post(f"/v1/jobs/{job_id}:trigger", json={"idempotencyKey": "k1"}, headers=AUTH)
    r2 = client.post(f"/v1/jobs/{job_id}:trigger", json={"idempotencyKey": "k1"}, headers=AUTH)
    assert r1.json() == r2.json() == {"runId": f"{job_id}@manual:k1"}
    bad = client.post(f"/v1/jobs/{job_id}:trigger", json={"idempotencyKey": "has space"}, headers=AUTH)
    assert bad.status_code == 422 and bad.json()["field"] == "idempotencyKey"


def test_pause_resume_patch_delete_produce_commands(env: Any) -> None:
    client, producer, _ = env
    job_id = _registered(env)
    assert client.post(f"/v1/jobs/{job_id}:pause", headers=AUTH).status_code == 200
    assert producer.job(job_id).status is J.JobStatus.PAUSED
    assert client.post(f"/v1/jobs/{job_id}:resume", headers=AUTH).status_code == 200
    assert client.patch(f"/v1/jobs/{job_id}", json={"priority": "high"}, headers=AUTH).status_code == 200
    assert client.patch(f"/v1/jobs/{job_id}", json={"priority": "x"}, headers=AUTH).json()["field"] == "priority"
    assert client.delete(f"/v1/jobs/{job_id}", headers=AUTH).status_code == 200
    assert producer.job(job_id) is None  # the processor keeps no deleted job
    kinds = [type(c).__name__ for _, _, c in producer.sent]
    assert kinds == ["RegisterJob", "PauseJob", "ResumeJob", "PatchJob", "DeleteJob"]


def test_patch_with_if_match(env: Any) -> None:
    client, producer, _ = env
    job_id = _registered(env)
    version = client.get(f"/v1/jobs/{job_id}", headers=AUTH).json()["version"]
    ok = client.patch(f"/v1/jobs/{job_id}", json={"priority": "high"}, headers={**AUTH, "If-Match": f'"{version}"'})
    assert ok.status_code == 200 and ok.headers["ETag"] == f'"{version + 1}"'
    assert ok.json()["priority"] == "high" and ok.json()["version"] == version + 1
    cmd = producer.sent[-1][2]
    assert type(cmd).__name__ == "PatchJob" and cmd.expected_version == version
    assert cmd.patch_json == '{"priority":"high"}'
    stale = client.patch(f"/v1/jobs/{job_id}", json={"priority": "low"}, headers={**AUTH, "If-Match": '"0"'})
    assert stale.status_code == 412 and stale.json()["field"] == "If-Match"
    assert stale.headers["content-type"] == "application/problem+json"
    bad = client.patch(f"/v1/jobs/{job_id}", json={"priority": "low"}, headers={**AUTH, "If-Match": "abc"})
    assert bad.status_code == 422 and bad.json()["field"] == "If-Match"
    # the stale edit was the processor's to refuse: written, refused, nothing changed
    assert [type(c).__name__ for _, _, c in producer.sent].count("PatchJob") == 2
    assert producer.job(job_id).spec.priority.value == "high" and producer.job(job_id).version == version + 1


def test_other_tenant_gets_404(env: Any) -> None:
    client, _, _ = env
    job_id = _registered(env)
    assert client.get(f"/v1/jobs/{job_id}", headers=AUTH).status_code == 200
    resp = client.get(f"/v1/jobs/{job_id}", headers={"Authorization": "Bearer tok-b"})
    assert resp.status_code == 404 and resp.headers["content-type"] == "application/problem+json"


def test_openapi_is_served(env: Any) -> None:
    client, _, _ = env
    paths = client.get("/openapi.json").json()["paths"]
    assert "/v1/jobs" in paths and "/v1/jobs/{job_id}:trigger" in paths and "/v1/runs/{run_id}/logs" in paths


# ---- runs: cancel, replay, dead letters ------------------------------------------------

OTHER = {"Authorization": "Bearer tok-b"}
SPEC = parse_job_spec({"name": "n", "runAt": "2026-11-29T08:00:05Z", "target": {"type": "command", "argv": ["false"]},
                       "retry": {"max": 3, "backoffS": 1}}, NOW)


def _run(history: InMemoryHistoryStore, run_id: str, status: RunStatus = RunStatus.SCHEDULED,
         tenant: str = "acme", slot: str = "2026-11-29T08:00:05Z", producer: DecidingProducer | None = None,
         **over: Any) -> RunState:
    """A run in history and, with ``producer``, in its processor's store too."""
    slot_ms = iso_to_ms(slot)
    if status is RunStatus.RUNNING:  # what the processor's store holds of a running attempt
        over = {"lease_until_ms": NOW + 30_000, "deadline_ms": NOW + 3_600_000, "worker_id": "w1", "token": 1,
                "attempt": 1, **over}
    run = RunState(run_id, job_id_of(run_id), tenant, SPEC, slot_ms, slot_ms, "@manual:" in run_id, status,
                   NOW, NOW, **over)
    history.put_run(run)
    if producer is not None:
        producer.adopt_run(run)
    return run


SCHEDULED_ID = "job_ab@2026-11-29T08:00:05Z"
MANUAL_ID = "job_ab@manual:key"
COLON_ID = "job_ab@manual:x:cancel"  # an idempotency key may contain ':' (and end with an action name)


def _run_commands(producer: ListProducer) -> list[tuple[str, str, Any]]:
    return [s for s in producer.sent if isinstance(s[2], CancelRun | ReplayRun)]


@pytest.mark.parametrize("run_id", [SCHEDULED_ID, MANUAL_ID, COLON_ID])
def test_get_run_by_id_with_at_and_colons(env: Any, run_id: str) -> None:
    client, producer, history = env
    _run(history, run_id)
    resp = client.get(f"/v1/runs/{run_id}", headers=AUTH)
    assert resp.status_code == 200, resp.text
    assert resp.json()["id"] == run_id and resp.json()["jobId"] == "job_ab"
    quoted = client.get(f"/v1/runs/{quote(run_id, safe='')}", headers=AUTH)  # %40 / %3A work too
    assert quoted.status_code == 200 and quoted.json()["id"] == run_id
    assert client.get(f"/v1/runs/{run_id}/logs", headers=AUTH).status_code == 200
    assert producer.sent == []


@pytest.mark.parametrize("run_id", [SCHEDULED_ID, MANUAL_ID, COLON_ID])
@pytest.mark.parametrize("status", [RunStatus.SCHEDULED, RunStatus.READY, RunStatus.RUNNING, RunStatus.RETRY_WAIT])
def test_cancel_produces_cancel_run_keyed_by_job_id(env: Any, run_id: str, status: RunStatus) -> None:
    client, producer, history = env
    _run(history, run_id, status, producer=producer)
    resp = client.post(f"/v1/runs/{run_id}:cancel", headers=AUTH)
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"runId": run_id, "accepted": "cancel"}
    assert producer.sent == [("gnomon.job-commands", "job_ab", CancelRun(run_id, "acme", NOW))]
    assert producer.run(run_id).status is RunStatus.CANCELLED
    again = client.post(f"/v1/runs/{run_id}:cancel", headers=AUTH)  # it has finished (cancelled): 409
    assert again.status_code == 409 and "cancelled" in again.json()["detail"]


@pytest.mark.parametrize("status", [RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.SKIPPED])
def test_cancel_of_a_finished_run_is_409(env: Any, status: RunStatus) -> None:
    client, producer, history = env
    before = _run(history, MANUAL_ID, status, producer=producer)
    resp = client.post(f"/v1/runs/{MANUAL_ID}:cancel", headers=AUTH)
    assert resp.status_code == 409 and resp.headers["content-type"] == "application/problem+json"
    assert status.value in resp.json()["detail"]
    assert producer.run(MANUAL_ID) == before  # the processor refused it: nothing changed


def test_replay_of_a_failed_run_produces_replay_run(env: Any) -> None:
    client, producer, history = env
    _run(history, COLON_ID, RunStatus.FAILED, attempt=3, token=3, finished_at_ms=NOW, producer=producer)
    resp = client.post(f"/v1/runs/{COLON_ID}:replay", headers=AUTH)
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"runId": COLON_ID, "accepted": "replay"}
    assert producer.sent == [("gnomon.job-commands", "job_ab", ReplayRun(COLON_ID, "acme", NOW))]
    assert producer.run(COLON_ID).replays == 1
    assert client.post(f"/v1/runs/{COLON_ID}:replay", headers=AUTH).status_code == 200  # under way: a repeat


def test_replay_of_a_dead_letter_past_its_retention_is_409(env: Any) -> None:
    client, producer, history = env
    before = _run(history, COLON_ID, RunStatus.FAILED, attempt=3, token=3, finished_at_ms=NOW - 8 * 86_400_000,
                  producer=producer)
    resp = client.post(f"/v1/runs/{COLON_ID}:replay", headers=AUTH)
    assert resp.status_code == 409 and "replayable" in resp.json()["detail"]
    assert producer.run(COLON_ID) == before


@pytest.mark.parametrize("status", [s for s in RunStatus if s is not RunStatus.FAILED])
def test_replay_of_a_run_that_is_not_failed_is_409(env: Any, status: RunStatus) -> None:
    client, producer, history = env
    before = _run(history, SCHEDULED_ID, status, producer=producer)
    resp = client.post(f"/v1/runs/{SCHEDULED_ID}:replay", headers=AUTH)
    assert resp.status_code == 409 and resp.json()["type"].endswith("/conflict")
    assert producer.run(SCHEDULED_ID) == before


@pytest.mark.parametrize("action", ["cancel", "replay"])
def test_run_actions_404_for_unknown_or_other_tenants_run(env: Any, action: str) -> None:
    client, producer, history = env
    before = _run(history, SCHEDULED_ID, RunStatus.FAILED, tenant="other", producer=producer)
    for headers, run_id in ((AUTH, SCHEDULED_ID), (AUTH, "job_ab@manual:nope"), (OTHER, MANUAL_ID)):
        resp = client.post(f"/v1/runs/{run_id}:{action}", headers=headers)
        assert resp.status_code == 404, (run_id, resp.text)
        assert resp.headers["content-type"] == "application/problem+json"
        assert resp.json()["detail"] == f"no run {run_id!r}"
    assert producer.run(SCHEDULED_ID) == before
    producer.sent.clear()
    assert client.get(f"/v1/runs/{SCHEDULED_ID}", headers=AUTH).status_code == 404
    assert client.post(f"/v1/runs/{SCHEDULED_ID}:{action}", headers={}).status_code == 401
    bad = client.post(f"/v1/runs/no-at-sign:{action}", headers=AUTH)
    assert bad.status_code == 422 and bad.json()["field"] == "runId"
    assert client.post(f"/v1/runs/{SCHEDULED_ID}:explode", headers=OTHER).status_code in (404, 405)
    assert producer.sent == []


def test_cancel_and_replay_go_to_the_api_only_topic(env: Any) -> None:
    """gnomon.job-commands is writable by the API alone; the processor refuses cancel and
    replay read from gnomon.run-events (which workers write)."""
    client, producer, history = env
    _run(history, SCHEDULED_ID, producer=producer)
    assert client.post(f"/v1/runs/{SCHEDULED_ID}:cancel", headers=AUTH).status_code == 200
    assert [(t, type(c)) for t, _, c in producer.sent] == [("gnomon.job-commands", CancelRun)]


def test_dead_letters_newest_first_paged_and_per_tenant(env: Any) -> None:
    client, _, history = env
    for i in range(5):
        _run(history, f"job_ab@2026-11-29T08:0{i}:00Z", RunStatus.FAILED, slot=f"2026-11-29T08:0{i}:00Z",
             attempt=3, error="exit status 1")
    _run(history, "job_ab@2026-11-29T09:00:00Z", RunStatus.RETRY_WAIT, slot="2026-11-29T09:00:00Z")
    _run(history, "job_cd@2026-11-29T08:30:00Z", RunStatus.FAILED, tenant="other", slot="2026-11-29T08:30:00Z")
    first = client.get("/v1/dead-letters", params={"limit": 3}, headers=AUTH).json()
    assert [r["id"] for r in first["items"]] == [f"job_ab@2026-11-29T08:0{i}:00Z" for i in (4, 3, 2)]
    assert first["cursor"]
    second = client.get("/v1/dead-letters", params={"limit": 3, "cursor": first["cursor"]}, headers=AUTH).json()
    assert [r["id"] for r in second["items"]] == [f"job_ab@2026-11-29T08:0{i}:00Z" for i in (1, 0)]
    assert second["cursor"] is None
    item = first["items"][0]
    assert (item["status"], item["attempt"], item["maxAttempts"], item["replays"], item["error"]) == (
        "failed", 3, 3, 0, "exit status 1")
    other = client.get("/v1/dead-letters", headers=OTHER).json()
    assert [r["id"] for r in other["items"]] == ["job_cd@2026-11-29T08:30:00Z"]
    assert client.get("/v1/dead-letters", params={"limit": 0}, headers=AUTH).json()["field"] == "limit"
    assert client.get("/v1/dead-letters").status_code == 401


def test_run_view_shows_retry_state_and_replays(env: Any) -> None:
    client, _, history = env
    _run(history, SCHEDULED_ID, RunStatus.RETRY_WAIT, attempt=2, token=2,
         next_attempt_at_ms=iso_to_ms("2026-11-29T08:00:07Z"), error="exit status 1")
    view = client.get(f"/v1/runs/{SCHEDULED_ID}", headers=AUTH).json()
    assert (view["status"], view["attempt"], view["maxAttempts"], view["nextAttemptAt"], view["replays"]) == (
        "retry_wait", 2, 3, "2026-11-29T08:00:07Z", 0)
    # replayed once after 3 attempts: a fresh budget of 3 on top, now on attempt 4
    _run(history, SCHEDULED_ID, RunStatus.RUNNING, attempt=4, token=4, replays=1, attempts_before_replay=3)
    view = client.get(f"/v1/runs/{SCHEDULED_ID}", headers=AUTH).json()
    assert (view["status"], view["attempt"], view["maxAttempts"], view["nextAttemptAt"], view["replays"]) == (
        "running", 4, 6, None, 1)


def test_openapi_lists_run_actions_and_dead_letters(env: Any) -> None:
    client, _, _ = env
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/v1/runs/{run_id}:cancel", "/v1/runs/{run_id}:replay", "/v1/dead-letters"} <= set(paths)


# ---- the SDK and the CLI against the in-process API ------------------------------------


@pytest.fixture
def sdk(env: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[Client, ListProducer, InMemoryHistoryStore]:
    client, producer, history = env
    sdk = Client(url="http://testserver", token="tok-a")
    sdk._http = client  # a TestClient is an httpx.Client
    client.headers.update(AUTH)
    monkeypatch.setattr(cli_jobs, "Client", lambda: sdk)
    return sdk, producer, history


def test_sdk_cancel_replay_dead_letters(sdk: Any) -> None:
    c, producer, history = sdk
    _run(history, COLON_ID, producer=producer)
    _run(history, SCHEDULED_ID, RunStatus.FAILED, attempt=3, finished_at_ms=NOW, producer=producer)
    assert c.cancel(COLON_ID) == {"runId": COLON_ID, "accepted": "cancel"}
    assert [r["id"] for r in c.dead_letters(limit=10)["items"]] == [SCHEDULED_ID]
    assert c.replay(SCHEDULED_ID) == {"runId": SCHEDULED_ID, "accepted": "replay"}
    assert c.dead_letters(limit=10)["items"] == []  # replayed: under way again
    assert [type(cmd) for _, _, cmd in _run_commands(producer)] == [CancelRun, ReplayRun]
    with pytest.raises(ApiError) as info:
        c.replay(COLON_ID)  # cancelled, not failed
    assert info.value.status == 409


def test_cli_runs_cancel_replay_and_dead_letters_list(sdk: Any) -> None:
    _, producer, history = sdk
    runner = CliRunner()
    _run(history, MANUAL_ID, RunStatus.RUNNING, producer=producer)
    _run(history, SCHEDULED_ID, RunStatus.FAILED, attempt=3, error="exit status 1", finished_at_ms=NOW,
         producer=producer)
    out = runner.invoke(cli_main.app, ["runs", "cancel", MANUAL_ID])
    assert out.exit_code == 0 and MANUAL_ID in out.stdout
    out = runner.invoke(cli_main.app, ["dead-letters", "list", "--json"])
    assert out.exit_code == 0 and [r["id"] for r in json.loads(out.stdout)["items"]] == [SCHEDULED_ID]
    out = runner.invoke(cli_main.app, ["dead-letters", "list"])
    assert out.exit_code == 0 and "exit status 1" in out.stdout
    out = runner.invoke(cli_main.app, ["runs", "replay", SCHEDULED_ID, "--json"])
    assert out.exit_code == 0 and json.loads(out.stdout) == {"runId": SCHEDULED_ID, "accepted": "replay"}
    assert [type(cmd) for _, _, cmd in _run_commands(producer)] == [CancelRun, ReplayRun]
    out = runner.invoke(cli_main.app, ["runs", "replay", MANUAL_ID])  # cancelled, not failed: 409
    assert out.exit_code == 2 and "gnomon:" in out.stderr and len(out.stderr.strip().splitlines()) == 1
    out = runner.invoke(cli_main.app, ["runs", "cancel", "job_zz@manual:nope"])
    assert out.exit_code == 2


def test_sdk_and_cli_create_with_an_idempotency_key(sdk: Any) -> None:
    c, producer, _ = sdk
    first = c.create_job(body(), idempotency_key="deploy-7")
    assert c.create_job(body(), idempotency_key="deploy-7")["id"] == first["id"]
    out = CliRunner().invoke(cli_main.app, ["jobs", "create", "n", "--cron", "0 * * * *", "--command", "true",
                                            "--key", "deploy-7", "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["id"] == first["id"]  # the id is derived from tenant and key
    with pytest.raises(ValidationError) as info:
        c.create_job(body(), idempotency_key="bad key")
    assert info.value.field == "Idempotency-Key"
    assert {key for _, key, _ in producer.sent} >= {first["id"]}


def test_503_outcome_reaches_the_sdk(sdk: Any) -> None:
    c, producer, _ = sdk

    def down(*_: Any) -> None:
        from gnomon.core.errors import EventLogError

        raise EventLogError("Kafka did not acknowledge")

    producer.send = down
    with pytest.raises(ApiError) as info:
        c.create_job(body(), idempotency_key="k")
    assert (info.value.status, info.value.outcome) == (503, "unknown")


# ---- one decider: every job write answers the processor's decision (issue 23) ----------


def decider_env(*, api_limits: Any = None, processor_limits: Any = None,
                history: InMemoryHistoryStore | None = None) -> tuple[TestClient, DecidingProducer]:
    """The API whose view of tenant limits (``api_limits``) may differ from the
    processor's (``processor_limits``); ``history`` None: a history the projector has
    not reached (empty)."""
    from gnomon.api.tenants import TenantService
    from gnomon.core.tenants import TenantBook, TenantLimits
    from gnomon.core.usage import UsageBook

    def book(limits: Any) -> TenantBook:
        b = TenantBook()
        if limits is not None:
            b.apply("acme", TenantLimits("acme", **limits))
        return b

    clock = FakeClock(NOW)
    producer = DecidingProducer(None, clock=clock, tenants=book(processor_limits))
    topo = load_topology()
    app = create_app(history=history or InMemoryHistoryStore(), commands=CommandSink(producer, topo.job_commands),
                     auth=Authenticator({"tok-a": "acme", "tok-b": "other"}), topology=topo, clock=clock,
                     tenants=TenantService(book(api_limits), UsageBook(), topic=topo.tenants),
                     answers=producer.answers)
    return TestClient(app), producer


def test_a_create_the_processor_refuses_answers_its_problem_not_201() -> None:
    # the API's view says 10 jobs; the processor's (the one that decides) says 1
    client, producer = decider_env(api_limits={"jobs_max": 10}, processor_limits={"jobs_max": 1})
    assert client.post("/v1/jobs", json=body(), headers=AUTH).status_code == 201
    refused = client.post("/v1/jobs", json=body(name="second"), headers=AUTH)
    assert refused.status_code == 422, refused.text
    problem = refused.json()
    assert problem["limit"] == "jobs_max" and not problem["detail"].startswith("jobs_max:")
    assert refused.headers["content-type"] == "application/problem+json"
    second = producer.sent[-1][1]
    assert producer.job(second) is None  # nothing registered
    assert client.get(f"/v1/jobs/{second}", headers=AUTH).status_code == 404


def test_get_right_after_201_finds_the_job_before_history_has_it() -> None:
    client, producer = decider_env()  # history stays empty: a projector far behind
    job = client.post("/v1/jobs", json=body(), headers=AUTH).json()
    got = client.get(f"/v1/jobs/{job['id']}", headers=AUTH)
    assert got.status_code == 200 and got.json() == job
    assert client.get(f"/v1/jobs/{job['id']}", headers={"Authorization": "Bearer tok-b"}).status_code == 404
    listed = client.get(f"/v1/jobs/{job['id']}/runs", headers=AUTH)
    assert listed.status_code == 200 and listed.json()["items"] == []
    # the writes that follow are decided by the processor, which has the job
    paused = client.post(f"/v1/jobs/{job['id']}:pause", headers=AUTH)
    assert paused.status_code == 200 and paused.json() == {"id": job["id"], "accepted": "pause", "version": 2}
    assert client.get(f"/v1/jobs/{job['id']}", headers=AUTH).json()["status"] == "paused"
    patched = client.patch(f"/v1/jobs/{job['id']}", json={"name": "renamed"}, headers={**AUTH, "If-Match": '"2"'})
    assert patched.status_code == 200 and patched.json()["name"] == "renamed" and patched.json()["version"] == 3
    assert producer.job(job["id"]).spec.name == "renamed"


def test_writes_on_a_job_the_tenant_cannot_see_are_404_alike() -> None:
    client, producer = decider_env()
    job_id = client.post("/v1/jobs", json=body(), headers=AUTH).json()["id"]
    other = {"Authorization": "Bearer tok-b"}
    answers = [client.post(f"/v1/jobs/{job_id}:pause", headers=other),
               client.post("/v1/jobs/job_missing:pause", headers=AUTH),
               client.patch(f"/v1/jobs/{job_id}", json={"name": "x"}, headers=other),
               client.delete(f"/v1/jobs/{job_id}", headers=other),
               client.post(f"/v1/jobs/{job_id}:trigger", json={"idempotencyKey": "k"}, headers=other)]
    assert [a.status_code for a in answers] == [404] * 5, [a.text for a in answers]
    assert answers[0].json()["detail"] == f"no job {job_id!r}"  # nothing about who owns it
    assert producer.job(job_id).status is J.JobStatus.ACTIVE


def test_a_retried_create_is_200_and_another_body_with_the_key_is_409() -> None:
    client, producer = decider_env()
    first = client.post("/v1/jobs", json=body(), headers={**AUTH, "Idempotency-Key": "k1"})
    again = client.post("/v1/jobs", json=body(), headers={**AUTH, "Idempotency-Key": "k1"})
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"] and again.headers["Location"] == f"/v1/jobs/{first.json()['id']}"
    other = client.post("/v1/jobs", json=body(name="other"), headers={**AUTH, "Idempotency-Key": "k1"})
    assert other.status_code == 409 and "Idempotency-Key" in other.json()["detail"]
    assert producer.job(first.json()["id"]).spec.name == "n"


def test_no_answer_in_time_is_202_with_a_location_that_answers_later() -> None:
    client, producer = decider_env(processor_limits={"jobs_max": 1})
    producer.hold()  # the processor is away: commands are written, not decided
    first = client.post("/v1/jobs", json=body(), headers=AUTH)
    second = client.post("/v1/jobs", json=body(name="second"), headers=AUTH)
    assert first.status_code == second.status_code == 202, first.text
    pending = first.json()
    assert pending["status"] == "pending" and pending["command"] == "RegisterJob"
    where = first.headers["Location"]
    assert where == f"/v1/commands/{pending['commandId']}"
    assert client.get(where, headers=AUTH).json() == {"commandId": pending["commandId"], "status": "pending"}
    producer.release()
    accepted = client.get(where, headers=AUTH).json()
    assert accepted["status"] == "accepted" and accepted["version"] == 1 and accepted["jobId"] == pending["jobId"]
    refused = client.get(second.headers["Location"], headers=AUTH).json()
    assert refused["status"] == "refused" and refused["problem"]["status"] == 422
    assert refused["problem"]["limit"] == "jobs_max"
    # another tenant learns nothing of it
    assert client.get(where, headers={"Authorization": "Bearer tok-b"}).json()["status"] == "pending"
    assert client.get("/v1/commands/x-1", headers=AUTH).json()["field"] == "commandId"


def test_the_sdk_waits_out_a_202_for_the_schedulers_answer(sdk: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import gnomon.client as client_mod
    from gnomon.client import ApiPending

    c, producer, _ = sdk
    producer.hold()  # no answer in the API's bound: 202, then the SDK polls the Location
    polls: list[float] = []

    def poll_sleep(s: float) -> None:
        polls.append(s)
        if len(polls) == 2:
            producer.release()  # the processor is back

    monkeypatch.setattr(client_mod.time, "sleep", poll_sleep)
    job = c.create_job(body(), idempotency_key="late-1")
    assert job["id"] == producer.sent[0][1] and job["version"] == 1 and len(polls) == 2
    producer.hold()
    c.answer_wait_s = 0.0
    with pytest.raises(ApiPending) as pending:
        c.pause(job["id"])
    assert pending.value.status == 202 and pending.value.command_id
    producer.release()
    assert c._call("GET", f"/v1/commands/{pending.value.command_id}")["status"] == "accepted"
    producer.hold()
    c.answer_wait_s = 30.0
    polls.clear()
    with pytest.raises(ApiError) as refused:  # refused once answered: the problem, not a 2xx
        c.create_job(body(name="other"), idempotency_key="late-1")
    assert refused.value.status == 409


def test_the_sdk_waits_for_history_to_show_a_job_accepted_after_a_202(
        sdk: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Accepted after a 202, the job is read from history, which may lag the processor's
    answer: a 404 then means "not yet" (found once the projector wrote it)."""
    import gnomon.client as client_mod

    c, producer, _ = sdk
    producer.hold()
    original, misses = c._call, []

    def lagging(method: str, path: str, **kw: Any) -> Any:
        if method == "GET" and path.startswith("/v1/jobs/") and len(misses) < 2:
            misses.append(path)
            raise ApiError(404, {"detail": "no job"})
        return original(method, path, **kw)

    monkeypatch.setattr(c, "_call", lagging)
    monkeypatch.setattr(client_mod.time, "sleep", lambda s: producer.release())
    job = c.create_job(body(), idempotency_key="lag-1")
    assert len(misses) == 2 and job["id"] == producer.sent[0][1] and job["version"] == 1


def test_a_backfill_is_the_processors_decision_and_the_sdk_returns_its_plan(
        sdk: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Accepted: 200 with the plan; the processor away: 202 with the plan and a Location,
    which the SDK polls and then returns the plan; refused (paused): the processor's 409."""
    import gnomon.client as client_mod

    c, producer, _ = sdk
    producer.clock.set(NOW - 9 * 3_600_000)  # created at 23:00 the day before, paused until now
    job = c.create_job(body(name="hourly"))
    c.pause(job["id"])
    producer.clock.set(NOW)
    c.resume(job["id"])
    with pytest.raises(ApiError) as before:  # no slot before the job existed (issue 24)
        c.backfill(job["id"], "2026-11-28T20:30:00Z", "2026-11-28T22:30:00Z")
    assert before.value.status == 422 and before.value.problem["field"] == "from"
    window = ("2026-11-29T03:30:00Z", "2026-11-29T05:30:00Z")  # two past slots it skipped while paused
    plan = c.backfill(job["id"], *window)
    assert (plan["slots"], plan["sent"], len(plan["runIds"])) == (2, 2, 2)
    producer.hold()
    http = c._http.post(f"/v1/jobs/{job['id']}:backfill", json={"from": "2026-11-29T01:00:00Z",
                                                               "to": "2026-11-29T01:30:00Z"})
    assert http.status_code == 202 and http.json()["sent"] == 1 and http.headers["Location"].startswith(
        "/v1/commands/"), http.text
    assert int(http.headers["content-length"]) == len(http.content)  # the merged body's own length
    producer.release()
    polls: list[float] = []
    monkeypatch.setattr(client_mod.time, "sleep", lambda s: (polls.append(s), producer.release()))
    producer.hold()
    plan = c.backfill(job["id"], "2026-11-29T00:00:00Z", "2026-11-29T00:30:00Z")
    assert plan == {"id": job["id"], "accepted": "backfill", "slots": 1, "sent": 1,
                    "runIds": [f"{job['id']}@2026-11-29T00:00:00Z"], "alreadyRun": [], "excluded": []}, plan
    assert polls and "status" not in plan and "commandId" not in plan
    c.pause(job["id"])
    with pytest.raises(ApiError) as refused:
        c.backfill(job["id"], "2026-11-28T20:30:00Z", "2026-11-28T21:30:00Z")
    assert refused.value.status == 409 and "paused" in refused.value.problem["detail"]
