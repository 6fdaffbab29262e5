"""``gnomon alerts set|get|delete``: the caller's tenant's alert webhook (``/v1/alerts``),
with the tenant's own token (``$GNOMON_TOKEN``, or the dev token)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from gnomon.cli.common import command, console, print_json, safe
from gnomon.client import Client
from gnomon.core.alerts import ALL_KINDS, AlertConfig
from gnomon.core.errors import ValidationError
from gnomon.core.validation import check_late_s

app = typer.Typer(help="This tenant's alert webhook: dead letters, skipped slots, late starts.",
                  no_args_is_help=True)

JsonOpt = Annotated[bool, typer.Option("--json", help="machine-readable output")]


def alerts_body(url: str, kinds: str | None, late_s: int | None) -> dict[str, Any]:
    """CLI options -> the PUT body, checked here so that a mistake names the option."""
    try:
        AlertConfig("cli", url)
    except ValidationError as exc:
        raise ValidationError("URL", exc.message) from None
    body: dict[str, Any] = {"url": url}
    if kinds is not None:
        names = [k.strip() for k in kinds.split(",") if k.strip()]
        bad = [k for k in names if k not in ALL_KINDS]
        if bad or len(set(names)) != len(names):
            raise ValidationError("--kinds", f"a comma-separated list of {', '.join(ALL_KINDS)}, got {kinds!r}")
        body["kinds"] = names
    if late_s is not None:
        body["lateS"] = check_late_s(late_s, "--late-s")
    return body


def _show(view: dict[str, Any]) -> None:
    if not view["configured"]:
        console.print(safe(f"tenant {view['tenant']}: no alert webhook (alerts off)"), highlight=False)
        return
    late = "jobs' own alertLateS only" if view["lateS"] is None else f"{view['lateS']} s"
    for line in (f"tenant:  {view['tenant']}", f"url:     {view['url']}", f"kinds:   {', '.join(view['kinds'])}",
                 f"late:    {late}", f"updated: {view['updatedAt']}"):
        console.print(safe(line), highlight=False)


@app.command("set")
@command
def set_(
    url: Annotated[str, typer.Argument(help="the webhook (http or https)")],
    kinds: Annotated[str | None, typer.Option(
        "--kinds", help=f"comma-separated, default all: {','.join(ALL_KINDS)}")] = None,
    late_s: Annotated[int | None, typer.Option(
        "--late-s", help="late threshold, seconds, for jobs without --alert-late-s")] = None,
    json_: JsonOpt = False,
) -> None:
    """Set (replace) this tenant's alert webhook."""
    view = Client().set_alerts(alerts_body(url, kinds, late_s))
    print_json(view) if json_ else _show(view)


@app.command("get")
@command
def get(json_: JsonOpt = False) -> None:
    """Show this tenant's alert webhook."""
    view = Client().get_alerts()
    print_json(view) if json_ else _show(view)


@app.command("delete")
@command
def delete(json_: JsonOpt = False) -> None:
    """Turn this tenant's alerts off."""
    view = Client().delete_alerts()
    print_json(view) if json_ else _show(view)
