"""The API against its own /openapi.json, in-process (ASGI), with schemathesis.

Every operation is fuzzed (schema-shaped and schema-violating inputs) with a valid
bearer token; each response must not be a 5xx and must match the contract: a declared
status code, the declared media type (problem+json for errors), the declared body
schema and the declared headers. Seeded jobs, runs and logs make the 200 paths answer
real views too (random ids only ever reach the 404s).
"""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from gnomon.core.clock import SystemClock
from gnomon.core.jobs import JobState, JobStatus
from gnomon.core.messages import LogLine, LogStream
from gnomon.core.runs import RunState, RunStatus
from gnomon.core.validation import parse_job_spec

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance, response_headers_conformance]
EXAMPLES_PER_OPERATION_MAX = 20  # x 14 operations x 2 modes: the file stays well under a minute
JOB_ID, RUN_ID, FAILED_RUN_ID = "job_0000000000000001", "job_0000000000000001@manual:k1", \
    "job_0000000000000001@manual:k2"


def _seed(api: Any) -> None:
    """A job of tenant acme with a running and a failed run, and a log line."""
    now = SystemClock().now_ms()
    spec = parse_job_spec({"name": "seeded", "schedule": "0 * * * *", "target": {"type": "http",
                           "url": "https://example.com/hook"}, "payload": {"a": [1, None]}}, now)
    api.history.put_job(JobState(JOB_ID, "acme", spec, JobStatus.ACTIVE, now + 3_600_000, 1, now, now))
    for run_id, status in ((RUN_ID, RunStatus.RUNNING), (FAILED_RUN_ID, RunStatus.FAILED)):
        done = status is RunStatus.FAILED
        api.history.put_run(RunState(run_id, JOB_ID, "acme", spec, now, now, True, status, now, now, attempt=1,
                                     worker_id="w1", started_at_ms=now, attempt_started_at_ms=now,
                                     finished_at_ms=now if done else None, exit_code=1 if done else None,
                                     error="exit status 1" if done else None))
    api.history.put_log(LogLine(RUN_ID, JOB_ID, "acme", 1, 0, LogStream.STDOUT, "hello \x1b[31m", now))


@pytest.fixture
def gnomon_api_schema(gnomon_api: Any) -> Any:
    _seed(gnomon_api)
    return schemathesis.openapi.from_asgi("/openapi.json", gnomon_api.app)


def _operations() -> list[tuple[str, str]]:
    """(path, METHOD) of every documented operation, read from a throwaway app."""
    from gnomon.api.app import CommandSink, create_app
    from gnomon.history.memory import InMemoryHistoryStore
    from gnomon.topology import load_topology
    from gnomon.web.auth import Authenticator

    topo = load_topology()
    app = create_app(history=InMemoryHistoryStore(), commands=CommandSink(None, topo.job_commands),
                     auth=Authenticator(), topology=topo)
    return [(path, method.upper()) for path, item in app.openapi()["paths"].items() for method in item]


OPERATIONS = _operations()


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=str)
@pytest.mark.parametrize(("path", "method"), OPERATIONS, ids=[f"{m} {p}" for p, m in OPERATIONS])
def test_every_operation_conforms(gnomon_api_schema: Any, gnomon_api: Any, path: str, method: str,
                                  mode: GenerationMode) -> None:
    """Schema-shaped (positive) and schema-violating (negative) requests, authenticated."""
    headers = gnomon_api.auth("acme")

    @given(case=gnomon_api_schema[path][method].as_strategy(mode))
    @settings(max_examples=EXAMPLES_PER_OPERATION_MAX, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    def conforms(case: Any) -> None:
        case.call_and_validate(headers=headers, checks=CHECKS)

    conforms()


SEEDED_CALLS = [
    ("/v1/jobs", "GET", {}, None),
    ("/v1/jobs", "POST", {}, {"name": "x", "schedule": "*/5 * * * *", "target": {"type": "command",
                                                                              "argv": ["true"]}}),
    ("/v1/jobs", "POST", {}, {"name": "c", "runAt": "2099-01-01T00:00:00Z", "secrets": ["db-password"],
                              "target": {"type": "container", "image": "registry.local/app:1", "argv": ["run"]}}),
    ("/v1/jobs", "POST", {}, {"name": "i", "every": "90m", "from": "2099-01-01T09:00", "timezone": "Europe/London",
                              "endAt": "2099-03-01T00:00:00Z", "maxRuns": 10,
                              "target": {"type": "handler", "name": "h"}}),
    ("/v1/calendars/{name}", "PUT", {"name": "xmas"}, {"timezone": "Europe/London",
                                                       "dates": ["2099-12-25", {"from": "2099-12-28", "to": "2099-12-29"}]}),
    ("/v1/calendars/{name}", "GET", {"name": "xmas"}, None),
    ("/v1/calendars", "GET", {}, None),
    ("/v1/jobs/{job_id}", "GET", {"job_id": JOB_ID}, None),
    ("/v1/jobs/{job_id}/fires", "GET", {"job_id": JOB_ID}, None),
    ("/v1/jobs/{job_id}", "PATCH", {"job_id": JOB_ID}, {"priority": "high"}),
    ("/v1/jobs/{job_id}/runs", "GET", {"job_id": JOB_ID}, None),
    ("/v1/jobs/{job_id}:pause", "POST", {"job_id": JOB_ID}, None),
    ("/v1/jobs/{job_id}:resume", "POST", {"job_id": JOB_ID}, None),
    ("/v1/jobs/{job_id}:trigger", "POST", {"job_id": JOB_ID}, {"idempotencyKey": "k9"}),
    ("/v1/runs/{run_id}", "GET", {"run_id": RUN_ID}, None),
    ("/v1/runs/{run_id}/logs", "GET", {"run_id": RUN_ID}, None),
    ("/v1/runs/{run_id}:cancel", "POST", {"run_id": RUN_ID}, None),
    ("/v1/runs/{run_id}:replay", "POST", {"run_id": FAILED_RUN_ID}, None),
    ("/v1/runs/{run_id}:cancel", "POST", {"run_id": FAILED_RUN_ID}, None),  # 409
    ("/v1/dead-letters", "GET", {}, None),
    ("/v1/jobs/{job_id}", "DELETE", {"job_id": JOB_ID}, None),
]


@pytest.mark.parametrize(("path", "method", "params", "body"), SEEDED_CALLS)
def test_real_views_match_the_contract(gnomon_api_schema: Any, gnomon_api: Any, path: str, method: str,
                                       params: dict[str, str], body: Any) -> None:
    operation = gnomon_api_schema[path][method]
    kwargs: dict[str, Any] = {"path_parameters": params}
    if body is not None:
        kwargs["body"] = body
        kwargs["media_type"] = "application/json"
    response = operation.Case(**kwargs).call_and_validate(headers=gnomon_api.auth("acme"), checks=CHECKS)
    assert response.status_code < 500


def test_unauthenticated_calls_match_the_contract(gnomon_api_schema: Any) -> None:
    for path, method, params, _ in SEEDED_CALLS:
        response = gnomon_api_schema[path][method].Case(path_parameters=params).call_and_validate(checks=CHECKS)
        assert response.status_code == 401, (path, method)


def test_the_contract_is_real(gnomon_api: Any) -> None:
    """No empty body schemas, bearer auth instead of an Authorization parameter."""
    from fastapi.testclient import TestClient

    doc = TestClient(gnomon_api.app).get("/openapi.json").json()
    assert doc["components"]["securitySchemes"]["bearerAuth"] == {
        "type": "http", "scheme": "bearer", "description": "an API token"}
    for path, item in doc["paths"].items():
        for method, op in item.items():
            names = [p["name"].lower() for p in op.get("parameters", [])]
            assert "authorization" not in names, (path, method)
            assert op["security"] == [{"bearerAuth": []}], (path, method)
            for status, response in op["responses"].items():
                content = response.get("content", {})
                if status.startswith(("4", "5")):
                    assert list(content) == ["application/problem+json"], (path, method, status)
                else:
                    assert content["application/json"]["schema"] != {}, (path, method, status)
            if method in ("post", "patch") and "requestBody" in op:
                assert op["requestBody"]["content"]["application/json"]["schema"]["$ref"], (path, method)
    create = doc["paths"]["/v1/jobs"]["post"]
    assert create["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/JobSpecInput"}
    spec_input = doc["components"]["schemas"]["JobSpecInput"]
    assert {"name", "schedule", "timezone", "runAt", "target", "payload", "priority", "timeoutS", "retry",
            "catchUp", "pool", "secrets", "jitterS", "overlap", "alertLateS", "lateMaxS",
            "every", "from", "startAt", "endAt", "maxRuns", "excludeCalendars", "after", "waitMaxS"} == set(
        spec_input["properties"])
    kinds = {ref["$ref"].rsplit("/", 1)[1] for ref in spec_input["properties"]["target"]["oneOf"]}
    assert kinds == {"HandlerTarget", "HttpTarget", "CommandTarget", "ContainerTarget"}
    assert {"401", "409", "413", "422", "503"} <= set(create["responses"])
