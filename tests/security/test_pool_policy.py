"""Which targets a pool runs for which tenant: commands off by default, handlers per
tenant, shared pools sandboxed only, and policy files with clear errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gnomon.core.messages import Grant
from gnomon.core.model import JobSpec, Schedule, Target, TargetType
from gnomon.worker import Worker
from gnomon.worker.policy import PolicyError, PoolPolicy


def grant(tenant: str, target: Target) -> Grant:
    spec = JobSpec(name="j", schedule=Schedule(run_at_ms=0), target=target)
    return Grant("w1", "j@1", "j", tenant, 1, 1, 10_000, 20_000, spec, 0, 0, 0)


def worker(**kw: Any) -> Worker:
    w = Worker("default", bootstrap="unused:1", worker_id="w1", **kw)

    @w.handler("report")
    def report(_ctx: Any) -> None: ...

    @w.handler("billing-only", tenants=["billing"])
    def billing(_ctx: Any) -> None: ...

    return w


SH = Target(TargetType.COMMAND, argv=("sh", "-c", "true"))
HANDLER = Target(TargetType.HANDLER, handler="report")
HTTP = Target(TargetType.HTTP, url="https://example.com/hook")


def test_a_worker_must_name_its_tenants() -> None:
    with pytest.raises(PolicyError, match="--tenant"):
        _ = worker().policy


def test_commands_are_off_by_default() -> None:
    w = worker(tenants=["acme"])
    assert "off on this pool" in (w.refusal(grant("acme", SH)) or "")
    assert w.refusal(grant("acme", HANDLER)) is None
    assert w.refusal(grant("acme", HTTP)) is None


def test_a_pool_refuses_tenants_it_does_not_serve() -> None:
    w = worker(tenants=["acme"])
    for target in (SH, HANDLER, HTTP):
        assert "does not serve tenant 'evil'" in (w.refusal(grant("evil", target)) or "")


def test_a_handler_registered_for_another_tenant_is_refused() -> None:
    w = worker(tenants=["acme", "billing"],
               policy=PoolPolicy.from_mapping({"tenants": ["acme", "billing"]}))
    # shared pool: no in-process handlers at all
    assert "shared" in (w.refusal(grant("billing", Target(TargetType.HANDLER, handler="billing-only"))) or "")
    solo = worker(tenants=["acme"])
    why = solo.refusal(grant("acme", Target(TargetType.HANDLER, handler="billing-only")))
    assert why == "handler 'billing-only' is not registered for tenant 'acme'"


def test_a_shared_pool_runs_only_sandboxed_targets() -> None:
    policy = PoolPolicy.from_mapping({"tenants": ["acme", "globex"],
                                      "commands": {"enabled": True, "executables": ["sh"]}})
    w = worker(policy=policy)
    assert w.refusal(grant("globex", SH)) is None
    assert "shared" in (w.refusal(grant("globex", HANDLER)) or "")


def test_executables_and_entitled_tenants() -> None:
    policy = PoolPolicy.from_mapping({"tenants": ["acme", "globex"],
                                      "commands": {"enabled": True, "executables": ["sh"], "tenants": ["acme"]}})
    w = worker(policy=policy)
    assert w.refusal(grant("acme", SH)) is None
    assert "not entitled" in (w.refusal(grant("globex", SH)) or "")
    bash = Target(TargetType.COMMAND, argv=("/bin/bash", "-c", "true"))
    assert "executable '/bin/bash' is not allowed" in (w.refusal(grant("acme", bash)) or "")


def test_containers_are_allowed_by_image_not_by_argv() -> None:
    policy = PoolPolicy.from_mapping({"tenants": ["acme"],
                                      "containers": {"enabled": True, "images": ["localhost/report:1"]}})
    w = worker(policy=policy)
    ok = Target(TargetType.CONTAINER, image="localhost/report:1", argv=("run",))
    assert w.refusal(grant("acme", ok)) is None
    sneaky = Target(TargetType.CONTAINER, image="docker.io/library/alpine:latest", argv=("localhost/report:1",))
    assert "image 'docker.io/library/alpine:latest' is not allowed" in (w.refusal(grant("acme", sneaky)) or "")
    assert "off on this pool" in (worker(tenants=["acme"]).refusal(grant("acme", ok)) or "")


@pytest.mark.parametrize(("text", "message"), [
    ("tenants = []", "name the tenants"),
    ('tenants = ["a"]\nshell = true', "shell: unknown key"),
    ('tenants = ["a"]\n[commands]\nenabled = "yes"', "commands.enabled: must be true or false"),
    ('tenants = ["a"]\n[commands]\nexecutable = ["sh"]', "commands.executable: unknown key"),
    ('tenants = ["a"]\n[commands]\ntenants = ["b"]', "commands.tenants: b not among"),
    ('tenants = ["a"]\n[limits]\nmemory_mb = -1', "limits.memory_mb: must be a positive integer"),
    ('tenants = ["a"]\n[limits]\nmemory_mb = 1', "memory_max_bytes below 8 MiB"),
    ('tenants = ["a"]\n[http]\nallowed_cidrs = ["nope"]', "http.allowed_cidrs: 'nope' is not a network"),
    ('tenants = ["a"]\n[http]\nallowed_ports = ["25-"]', "http.allowed_ports: '25-' is not a port or a range"),
    ('tenants = ["a"]\n[http]\nallowed_ports = [0]', "http.allowed_ports: '0' is not a port or a range of ports within"),
    ('tenants = ["a"]\n[http]\nallowed_ports = [true]', "http.allowed_ports: must be a list of ports or ranges"),
    ('tenants = ["a"]\n[http]\nallow_plain_http = "yes"', "http.allow_plain_http: must be true or false"),
    ("tenants = [", "not valid TOML"),
])
def test_policy_files_fail_with_the_key_named(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "policy.toml"
    path.write_text(text)
    with pytest.raises(PolicyError, match=message.replace("(", r"\(")):
        PoolPolicy.load(path)


def test_the_shipped_policies_load() -> None:
    from gnomon.config import REPO_ROOT

    dev = PoolPolicy.load(REPO_ROOT / "infra/policies/dev.toml")
    assert dev.tenants == {"dev"} and dev.commands.enabled and not dev.shared
    e2e = PoolPolicy.load(REPO_ROOT / "tests/e2e/worker-policy.toml")
    assert e2e.http.allowed_cidrs == ("127.0.0.1/32",)


def test_cli_worker_without_a_tenant_exits_2(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from gnomon.cli.main import app

    monkeypatch.delenv("GNOMON_WORKER_TENANTS", raising=False)
    result = CliRunner().invoke(app, ["worker"])
    assert result.exit_code == 2
    assert "name the tenants this worker serves" in result.output
