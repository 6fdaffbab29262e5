"""``gnomon tenants ...`` against the in-process API (no Kafka), and the admin token lookup."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from gnomon.api.app import CommandSink, create_app
from gnomon.api.tenants import TenantService
from gnomon.cli import main as cli_main
from gnomon.cli import tenants as cli_tenants
from gnomon.config import Settings
from gnomon.core.errors import ValidationError
from gnomon.core.tenants import TenantBook, TenantLimits
from gnomon.core.usage import TenantUsage, UsageBook
from gnomon.history.memory import InMemoryHistoryStore
from gnomon.tenants_client import ADMIN_TOKEN_ENV, TenantsClient, admin_token
from gnomon.testing import ListProducer
from gnomon.topology import load_topology
from gnomon.web.auth import Authenticator, Principal

TENANTS = "gnomon.tenants"


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> tuple[ListProducer, TenantBook, dict[str, TestClient]]:
    """The app, and TenantsClient() wired to it with the token of ``clients["token"]``."""
    producer, book, usage = ListProducer(), TenantBook(), UsageBook()
    usage.apply("acme/0", TenantUsage("acme", 0, 4, 1, 2, 0, 1_800_000_000_000))
    topo = load_topology()
    app = create_app(history=InMemoryHistoryStore(), commands=CommandSink(producer, topo.job_commands),
                     auth=Authenticator({"tok-admin": Principal("ops", admin=True), "tok-a": "acme"}),
                     topology=topo, tenants=TenantService(book, usage, writer=producer, topic=topo.tenants))
    clients = {"token": "tok-admin"}

    def make() -> TenantsClient:
        c = TenantsClient(url="http://testserver", token=clients["token"])
        test_client = TestClient(app)  # a TestClient is an httpx.Client
        test_client.headers["Authorization"] = f"Bearer {clients['token']}"
        c._http = test_client
        return c

    monkeypatch.setattr(cli_tenants, "TenantsClient", make)
    return producer, book, clients  # type: ignore[return-value]


def run(*args: str) -> Any:
    return CliRunner().invoke(cli_main.app, ["tenants", *args])


def test_set_get_list_reset(api: Any) -> None:
    producer, book, _ = api
    out = run("set", "acme", "--jobs-max", "10", "--backlog-max", "3", "--json")
    assert out.exit_code == 0, out.output
    view = json.loads(out.stdout)
    assert view["limits"]["jobsMax"] == 10 and view["limits"]["backlogMax"] == 3
    assert producer.sent[-1][:2] == (TENANTS, "acme") and book.limits("acme").jobs_max == 10
    out = run("get", "acme")
    assert out.exit_code == 0 and "jobs_max" in out.stdout and "10" in out.stdout
    out = run("set", "acme", "--interval-min-s", "60")  # partial: the others stay
    assert out.exit_code == 0 and book.limits("acme").jobs_max == 10 and book.limits("acme").interval_min_s == 60
    out = run("list", "--json")
    assert out.exit_code == 0 and [v["tenant"] for v in json.loads(out.stdout)["items"]] == ["acme"]
    out = run("list")
    assert out.exit_code == 0 and "acme" in out.stdout and "4/1/2" in out.stdout
    out = run("reset", "acme")
    assert out.exit_code == 0 and "reset: acme" in out.stdout
    assert producer.sent[-1] == (TENANTS, "acme", None) and not book.configured("acme")


def test_set_the_defaults_with_star(api: Any) -> None:
    _, book, _ = api
    assert run("set", "*", "--concurrency-max", "50").exit_code == 0
    assert book.defaults().concurrency_max == 50 and book.limits("anyone").concurrency_max == 50
    out = run("get", "*", "--json")
    assert json.loads(out.stdout)["limits"]["concurrencyMax"] == 50


@pytest.mark.parametrize(("args", "names"), [
    (["set", "acme"], "give at least one limit"),
    (["set", "acme", "--jobs-max", "0"], "--jobs-max"),
    (["set", "acme", "--triggers-per-min-max", "99999999"], "--triggers-per-min-max"),
    (["set", "a/b", "--jobs-max", "1"], "TENANT"),
    (["get", "a b"], "TENANT"),
    (["set", "acme", "--jobs-max", "x"], "x"),
])
def test_bad_input_is_exit_2_with_one_line(api: Any, args: list[str], names: str) -> None:
    producer, _, _ = api
    out = run(*args)
    assert out.exit_code == 2, out.output
    assert names in out.stderr
    if args[-2] != "--jobs-max" or args[-1] != "x":  # typer's own usage error is several lines
        assert len(out.stderr.strip().splitlines()) == 1 and out.stderr.startswith("gnomon: ")
    assert producer.sent == []


def test_a_tenant_token_gets_a_readable_403(api: Any) -> None:
    producer, _, clients = api
    clients["token"] = "tok-a"
    out = run("set", "acme", "--jobs-max", "5")
    assert out.exit_code == 2 and "admin role" in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert producer.sent == []


def test_admin_token_lookup(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings(state_dir=tmp_path)
    for var in (ADMIN_TOKEN_ENV, "GNOMON_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ValidationError) as exc:
        admin_token(settings)
    assert exc.value.field == ADMIN_TOKEN_ENV
    monkeypatch.setenv("GNOMON_TOKEN", "plain")
    assert admin_token(settings) == "plain"
    (tmp_path / "dev-admin-token").write_text("gnomon-dev-admin-x\n")
    assert admin_token(settings) == "gnomon-dev-admin-x"
    monkeypatch.setenv(ADMIN_TOKEN_ENV, "real-admin")
    assert admin_token(settings) == "real-admin"


def test_limits_body_maps_options_to_api_fields() -> None:
    assert cli_tenants.limits_body({"jobs_max": 5, "backlog_max": None, "triggers_per_min_max": 7}) == {
        "jobsMax": 5, "triggersPerMinMax": 7}
    assert {api for _, api, _ in cli_tenants.LIMITS} == {
        "concurrencyMax", "jobsMax", "intervalMinS", "backlogMax", "triggersPerMinMax"}
    assert {field for _, _, field in cli_tenants.LIMITS} == set(TenantLimits("x").limits())
