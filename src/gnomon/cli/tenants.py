"""``gnomon tenants ...``: each tenant's limits, through the API's admin endpoints.

Needs an admin token (``$GNOMON_ADMIN_TOKEN``, or the dev admin token under ``gnomon
dev``; see ``gnomon.tenants_client``). ``*`` names the defaults of every tenant without
limits of its own: ``gnomon tenants set '*' --jobs-max 1000``.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from gnomon.cli.common import clean, command, console, print_json, safe
from gnomon.core.errors import ValidationError
from gnomon.core.tenants import LIMIT_BOUNDS, check_tenant_name
from gnomon.tenants_client import TenantsClient

app = typer.Typer(help="Tenants' limits (admin token: GNOMON_ADMIN_TOKEN).", no_args_is_help=True)

JsonOpt = Annotated[bool, typer.Option("--json", help="machine-readable output")]
TenantArg = Annotated[str, typer.Argument(help="the tenant; '*' for the defaults")]

# (CLI option, API field, TenantLimits field)
LIMITS: tuple[tuple[str, str, str], ...] = (
    ("--concurrency-max", "concurrencyMax", "concurrency_max"),
    ("--jobs-max", "jobsMax", "jobs_max"),
    ("--interval-min-s", "intervalMinS", "interval_min_s"),
    ("--backlog-max", "backlogMax", "backlog_max"),
    ("--triggers-per-min-max", "triggersPerMinMax", "triggers_per_min_max"),
)
LIST_COLUMNS = (("conc.", "concurrencyMax"), ("jobs", "jobsMax"), ("int. s", "intervalMinS"),
                ("backlog", "backlogMax"), ("trig/min", "triggersPerMinMax"))
USAGE_OF = {"jobsMax": "jobs", "backlogMax": "backlog", "concurrencyMax": "running",
            "triggersPerMinMax": "triggersLastMin"}


def _tenant(tenant: str) -> str:
    try:
        check_tenant_name(tenant)
    except ValidationError as exc:
        raise ValidationError("TENANT", exc.message) from None
    return tenant


def limits_body(values: dict[str, int | None]) -> dict[str, int]:
    """CLI option values (by TenantLimits field) -> the PUT body; checks the bounds here
    so that a mistake names the option."""
    body: dict[str, int] = {}
    for option, api_name, field in LIMITS:
        value = values.get(field)
        if value is None:
            continue
        low, high = LIMIT_BOUNDS[field]
        if not low <= value <= high:
            raise ValidationError(option, f"must be from {low} to {high}, got {value}")
        body[api_name] = value
    if not body:
        raise ValidationError("options", "give at least one limit: " + ", ".join(o for o, _, _ in LIMITS))
    return body


def _show(view: dict[str, Any]) -> None:
    who = view["tenant"] + ("" if view["configured"] else " (defaults)")
    console.print(safe(f"tenant: {who}", "bold"), highlight=False)
    table = Table("limit", "value", "in use")
    usage = view.get("usage", {})
    for _, api_name, field in LIMITS:
        used = usage.get(USAGE_OF.get(api_name, ""), "")
        table.add_row(field, safe(view["limits"][api_name]), safe(used))
    console.print(table)
    if usage.get("countedAt"):
        console.print(safe(f"usage counted at {usage['countedAt']}"), highlight=False)


@app.command("set")
@command
def set_(
    tenant: TenantArg,
    concurrency_max: Annotated[int | None, typer.Option("--concurrency-max", help="runs at once, per pool")] = None,
    jobs_max: Annotated[int | None, typer.Option("--jobs-max", help="registered jobs")] = None,
    interval_min_s: Annotated[int | None, typer.Option(
        "--interval-min-s", help="shortest gap between two cron fire times, seconds")] = None,
    backlog_max: Annotated[int | None, typer.Option(
        "--backlog-max", help="one-off runs queued and not started")] = None,
    triggers_per_min_max: Annotated[int | None, typer.Option(
        "--triggers-per-min-max", help="manual triggers per minute")] = None,
    json_: JsonOpt = False,
) -> None:
    """Set some of a tenant's limits; the others keep their current value."""
    body = limits_body({"concurrency_max": concurrency_max, "jobs_max": jobs_max, "interval_min_s": interval_min_s,
                        "backlog_max": backlog_max, "triggers_per_min_max": triggers_per_min_max})
    tenant = _tenant(tenant)
    view = TenantsClient().set(tenant, body)
    print_json(view) if json_ else _show(view)


@app.command("get")
@command
def get(tenant: TenantArg, json_: JsonOpt = False) -> None:
    """Show a tenant's limits and usage."""
    tenant = _tenant(tenant)
    view = TenantsClient().get(tenant)
    print_json(view) if json_ else _show(view)


@app.command("list")
@command
def list_(json_: JsonOpt = False) -> None:
    """The defaults, and every tenant with limits of its own or with usage."""
    out = TenantsClient().list()
    if json_:
        print_json(out)
        return
    table = Table("tenant", *(short for short, _ in LIST_COLUMNS), "used j/b/r",
                  caption="*: the defaults; (d): on the defaults; used: jobs/backlog/running")
    table.add_row("*", *(safe(out["defaults"][api]) for _, api in LIST_COLUMNS), "")
    for v in out["items"]:
        u = v["usage"]
        table.add_row(safe(v["tenant"] + ("" if v["configured"] else " (d)")),
                      *(safe(v["limits"][api]) for _, api in LIST_COLUMNS),
                      safe(f"{u['jobs']}/{u['backlog']}/{u['running']}"))
    console.print(table)


@app.command("reset")
@command
def reset(tenant: TenantArg, json_: JsonOpt = False) -> None:
    """Return a tenant to the defaults ('*': the defaults to the built-in ones)."""
    tenant = _tenant(tenant)
    view = TenantsClient().reset(tenant)
    if json_:
        print_json(view)
    else:
        typer.echo(f"reset: {clean(tenant)}")


@app.command("command-key")
@command
def command_key(
    tenant: Annotated[str, typer.Argument(help="the tenant whose Kafka producers sign job commands with it")],
    rotate: Annotated[bool, typer.Option(help="add a new signing key; the old ones still verify")] = False,
    revoke_old: Annotated[bool, typer.Option(
        "--revoke-old", help="with --rotate: remove every other key (their producers are refused from then)")] = False,
    json_: JsonOpt = False,
) -> None:
    """Make (or rotate) a tenant's command key and print its file: hand that file to the
    tenant's own Kafka producers ($GNOMON_COMMAND_KEY_FILE). Runs on a host that holds the
    keys directory (the processors and the API read it); needs no API token."""
    from gnomon import command_keys
    from gnomon.config import load

    if revoke_old and not rotate:
        raise ValidationError("--revoke-old", "only with --rotate")
    if tenant == "*":
        raise ValidationError("TENANT", "a tenant's name; the operator's key is made by the tools that use it")
    tenant = _tenant(tenant)
    directory = command_keys.keys_dir(load())
    key = (command_keys.rotate(directory, tenant, revoke_old=revoke_old) if rotate
           else command_keys.ensure(directory, tenant))
    path = command_keys.tenant_file(directory, tenant)
    keys = command_keys.read_file(path)
    out = {"tenant": tenant, "file": str(path), "signingKey": key.key_id, "keys": [k.key_id for k in keys]}
    if json_:
        print_json(out)
    else:
        typer.echo(f"{clean(tenant)}: signing key {key.key_id} ({len(keys)} key(s) verify)\n{path}")
