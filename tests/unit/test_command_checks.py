"""The decider checks a command it reads with the API's own functions (issue 21, point 1):
``core.command_checks``. What the API builds passes unchanged; what it would refuse is
refused with the field it would name."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gnomon.core import jobs as J
from gnomon.core import runs as R
from gnomon.core.command_checks import COMMAND_AGE_MAX_MS, check_command, check_job_id, check_spec
from gnomon.core.errors import ValidationError
from gnomon.core.model import JobSpec, RetryPolicy, Schedule, Target, TargetType
from gnomon.core.validation import parse_job_spec

NOW = 1_780_000_000_000
SPEC = JobSpec(name="n", schedule=Schedule(cron="*/5 * * * *", tz="Europe/Paris"),
               target=Target(TargetType.COMMAND, argv=("echo", "hi")), payload_json='{"a":1}')


def _field(cmd: object) -> str:
    with pytest.raises(ValidationError) as err:
        check_command(cmd, NOW)
    return err.value.field


@pytest.mark.parametrize(("spec", "field"), [
    (replace(SPEC, schedule=Schedule(cron="61 * * * *")), "schedule"),
    (replace(SPEC, schedule=Schedule(cron="* * * * *", tz="Mars/Olympus")), "timezone"),
    (replace(SPEC, schedule=Schedule()), "schedule"),
    (replace(SPEC, schedule=Schedule(cron="* * * * *", run_at_ms=NOW + 60_000)), "schedule"),
    (replace(SPEC, schedule=Schedule(run_at_ms=NOW - 3_600_000)), "runAt"),
    (replace(SPEC, schedule=Schedule(run_at_ms=-1)), "runAt"),
    (replace(SPEC, schedule=Schedule(run_at_ms=2**62)), "runAt"),
    (replace(SPEC, name="   "), "name"),
    (replace(SPEC, name="x" * 10_000), "name"),
    (replace(SPEC, name="evil\u202ename"), "name"),
    (replace(SPEC, timeout_s=-1), "timeoutS"),
    (replace(SPEC, timeout_s=2**40), "timeoutS"),
    (replace(SPEC, payload_json="not json"), "payload"),
    (replace(SPEC, payload_json="[" * 100_000 + "]" * 100_000), "payload"),
    (replace(SPEC, pool="nowhere"), "pool"),
    (replace(SPEC, target=Target(TargetType.COMMAND)), "target.argv"),
    (replace(SPEC, target=Target(TargetType.HANDLER)), "target.name"),
    (replace(SPEC, target=Target(TargetType.HTTP, url="file:///etc/passwd")), "target.url"),
    (replace(SPEC, retry=RetryPolicy(max_attempts=0)), "retry.max"),
    (replace(SPEC, jitter_s=-3), "jitterS"),
    (replace(SPEC, secrets=("UPPER",)), "secrets[0]"),
])
def test_a_spec_the_api_would_refuse_is_refused_with_its_field(spec: JobSpec, field: str) -> None:
    assert _field(J.RegisterJob("j", "acme", spec, NOW)) == field


@pytest.mark.parametrize(("cmd", "field"), [
    (J.RegisterJob("a@b", "acme", SPEC, NOW), "job_id"),
    (J.RegisterJob("", "acme", SPEC, NOW), "job_id"),
    (J.RegisterJob(" j", "acme", SPEC, NOW), "job_id"),
    (J.RegisterJob("j" * 201, "acme", SPEC, NOW), "job_id"),
    (J.PauseJob("j\x1b[31m", "acme", NOW), "job_id"),
    (J.PauseJob("j", "", NOW), "tenant"),
    (J.PauseJob("j", "*", NOW), "tenant"),
    (J.PauseJob("j", "ac me", NOW), "tenant"),
    (J.PauseJob("j", "acme", NOW + 3_600_000), "at_ms"),
    (J.PauseJob("j", "acme", NOW - COMMAND_AGE_MAX_MS - 1), "at_ms"),
    (J.TriggerJob("j", "acme", "", NOW), "idempotencyKey"),
    (J.TriggerJob("j", "acme", "k" * 129, NOW), "idempotencyKey"),
    (J.PatchJob("j", "acme", "{}", -4, NOW), "expected_version"),
    (R.CancelRun("no-slot", "acme", NOW), "run_id"),
    (R.CancelRun("j@2026-01-01T00:00:00Z", "acme", NOW, reason="r" * 5000), "reason"),
    (R.ReplayRun("@x", "acme", NOW), "run_id"),
])
def test_a_command_the_api_would_refuse_is_refused_with_its_field(cmd: object, field: str) -> None:
    assert _field(cmd) == field


def test_what_the_api_builds_passes_unchanged_and_a_sloppy_spec_is_normalised_as_the_api_would() -> None:
    api_spec = parse_job_spec({"name": "n", "schedule": "*/5 * * * *", "timezone": "Europe/Paris",
                               "target": {"type": "command", "argv": ["echo", "hi"]}, "payload": {"a": 1}}, NOW)
    assert check_spec(api_spec, NOW) == api_spec
    sloppy = replace(api_spec, name="  n  ", payload_json='{ "a" : 1 }')
    assert check_spec(sloppy, NOW) == api_spec
    cmd = J.RegisterJob("j", "acme", sloppy, NOW)
    assert check_command(cmd, NOW) == J.RegisterJob("j", "acme", api_spec, NOW)
    assert check_job_id("job_a9bff821b3c257c6") == "job_a9bff821b3c257c6"


_NAMES = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=50).filter(str.strip)


@settings(max_examples=200, deadline=None)
@given(name=_NAMES, cron=st.sampled_from(["* * * * *", "*/7 3-5 * * 1-5", "0 0 29 2 *", "*/2 * * * * *"]),
       tz=st.sampled_from(["UTC", "Europe/London", "America/St_Johns", "Asia/Kolkata"]),
       payload=st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                            lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=5), kids,
                                                                                     max_size=3), max_leaves=10),
       timeout=st.integers(1, 7 * 86_400), priority=st.sampled_from(["high", "normal", "low"]))
def test_every_spec_the_api_accepts_is_accepted_unchanged_by_the_decider(
        name: str, cron: str, tz: str, payload: object, timeout: int, priority: str) -> None:
    data = {"name": name, "schedule": cron, "timezone": tz, "payload": payload, "timeoutS": timeout,
            "priority": priority, "target": {"type": "handler", "name": "h"}}
    try:
        spec = parse_job_spec(data, NOW)
    except ValidationError:
        return  # (a name the API refuses: control characters)
    assert check_spec(spec, NOW) == spec
    assert check_command(J.RegisterJob("j", "acme", spec, NOW), NOW).spec == spec


@given(tenant=st.sampled_from(["acme", "globex", "t-1"]), other=st.sampled_from(["acme", "globex", "t-1"]),
       key=st.from_regex(r"[A-Za-z0-9._-]{1,40}", fullmatch=True))
@settings(max_examples=200, deadline=None)
def test_a_derived_id_registers_only_with_its_own_key_and_tenant(tenant: str, other: str, key: str) -> None:
    """Issue 50, finding 1: ids of the form job_<16 hex> are reserved for the registration
    that carries the key they were derived from, by the tenant they were derived for."""
    from gnomon.core.model import idempotent_job_id, is_derived_job_id, random_job_id

    job_id = idempotent_job_id(tenant, key)
    assert is_derived_job_id(job_id) and not is_derived_job_id(random_job_id())
    assert check_command(J.RegisterJob(job_id, tenant, SPEC, NOW, idempotency_key=key), NOW).job_id == job_id
    assert _field(J.RegisterJob(job_id, tenant, SPEC, NOW)) == "jobId"  # the key left out
    if other != tenant:
        assert _field(J.RegisterJob(job_id, other, SPEC, NOW, idempotency_key=key)) == "jobId"
    assert _field(J.RegisterJob(job_id, tenant, SPEC, NOW, idempotency_key=key + "x")) == "jobId"
    assert _field(J.RegisterJob("my-own-id", tenant, SPEC, NOW, idempotency_key=key)) == "jobId"
    assert check_command(J.RegisterJob("my-own-id", tenant, SPEC, NOW), NOW).job_id == "my-own-id"
