from __future__ import annotations

from typing import Any

import pytest

from gnomon.core.clock import iso_to_ms
from gnomon.core.errors import ValidationError
from gnomon.core.model import CatchUp, Priority, TargetType
from gnomon.core.validation import (
    PAYLOAD_MAX_BYTES,
    apply_patch,
    job_spec_to_json,
    parse_job_spec,
    validate_idempotency_key,
)

NOW = iso_to_ms("2026-11-29T08:00:00Z")


def body(**over: Any) -> dict[str, Any]:
    b: dict[str, Any] = {"name": "report", "schedule": "*/5 * * * * *", "target": {"type": "command", "argv": ["echo", "hi"]}}
    b.update(over)
    return b


def test_minimal_job_gets_defaults() -> None:
    spec = parse_job_spec(body(), NOW)
    assert spec.schedule.cron == "*/5 * * * * *" and spec.schedule.tz == "UTC"
    assert spec.priority is Priority.NORMAL and spec.catch_up is CatchUp.ONCE
    assert spec.target.type is TargetType.COMMAND and spec.target.argv == ("echo", "hi")
    assert spec.retry.max_attempts == 3 and spec.pool == "default" and spec.timeout_s == 3600


def test_containers_and_secrets_round_trip() -> None:
    spec = parse_job_spec(body(target={"type": "container", "image": "registry.local/team/app:1.2",
                                       "argv": ["report", "--day"]}, secrets=["db-password", "api-key"]), NOW)
    assert spec.target.type is TargetType.CONTAINER and spec.target.image == "registry.local/team/app:1.2"
    assert spec.secrets == ("db-password", "api-key")
    assert parse_job_spec(job_spec_to_json(spec), NOW) == spec


def test_round_trip_through_json_shape() -> None:
    spec = parse_job_spec(body(timezone="Europe/London", priority="high", payload={"a": [1, 2]},
                               retry={"max": 5, "backoffS": 2, "backoffCapS": 60}, catchUp="all"), NOW)
    assert parse_job_spec(job_spec_to_json(spec), NOW) == spec


@pytest.mark.parametrize(
    ("over", "field"),
    [
        ({"schedule": "not a cron"}, "schedule"),
        ({"timezone": "Nowhere/Land"}, "timezone"),
        ({"schedule": None, "runAt": "2020-01-01T00:00:00Z"}, "runAt"),
        ({"schedule": None, "runAt": "2026-12-01T09:00:00"}, "runAt"),
        ({"timeoutS": -1}, "timeoutS"),
        ({"timeoutS": 1.5}, "timeoutS"),
        ({"colour": "blue"}, "colour"),
        ({"payload": "x" * (PAYLOAD_MAX_BYTES + 1)}, "payload"),
        ({"priority": "urgent"}, "priority"),
        ({"catchUp": "sometimes"}, "catchUp"),
        ({"retry": {"max": 0}}, "retry.max"),
        ({"retry": {"max": 3, "jitter": True}}, "retry.jitter"),
        ({"retry": {"backoffS": 10, "backoffCapS": 5}}, "retry.backoffCapS"),
        ({"target": {"type": "http", "url": "ftp://x"}}, "target.url"),
        ({"target": {"type": "command", "argv": []}}, "target.argv"),
        ({"target": {"type": "container"}}, "target.image"),
        ({"target": {"type": "container", "image": "Bad Image!", "argv": ["x"]}}, "target.image"),
        ({"target": {"type": "container", "image": "app:1", "argv": []}}, "target.argv"),
        ({"target": {"type": "vm"}}, "target.type"),
        ({"target": {"type": "command", "argv": ["sh", "a\x00b"]}}, "target.argv[1]"),
        ({"secrets": "db"}, "secrets"),
        ({"secrets": ["DB"]}, "secrets[0]"),
        ({"secrets": ["db", "db"]}, "secrets"),
        ({"secrets": [f"s{i}" for i in range(17)]}, "secrets"),
        ({"target": {"type": "handler", "name": "a b"}}, "target.name"),
        ({"pool": "gpu"}, "pool"),
        ({"name": ""}, "name"),
    ],
)
def test_bad_input_names_the_field(over: dict[str, Any], field: str) -> None:
    b = body(**over)
    if b.get("schedule") is None:
        b.pop("schedule", None)
    with pytest.raises(ValidationError) as err:
        parse_job_spec(b, NOW)
    assert err.value.field == field


def test_cron_and_run_at_are_exclusive() -> None:
    with pytest.raises(ValidationError) as err:
        parse_job_spec(body(runAt="2026-12-01T09:00:00Z"), NOW)
    assert err.value.field == "schedule"


def test_one_time_job_is_truncated_to_whole_seconds() -> None:
    b = body(runAt="2026-12-01T09:00:00.750+01:00")
    del b["schedule"]
    spec = parse_job_spec(b, NOW)
    assert spec.schedule.run_at_ms == iso_to_ms("2026-12-01T08:00:00Z")


def test_patch_merges_and_revalidates() -> None:
    spec = parse_job_spec(body(), NOW)
    patched = apply_patch(spec, {"priority": "low", "schedule": "0 * * * *"}, NOW)
    assert patched.priority is Priority.LOW and patched.schedule.cron == "0 * * * *"
    assert patched.target == spec.target
    with pytest.raises(ValidationError) as err:
        apply_patch(spec, {"schedule": "nope"}, NOW)
    assert err.value.field == "schedule"


@pytest.mark.parametrize("key", ["", "a" * 129, "has space", None, 5])
def test_bad_idempotency_keys(key: Any) -> None:
    with pytest.raises(ValidationError):
        validate_idempotency_key(key)
