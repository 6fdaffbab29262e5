"""``gnomon calendars put|get|list|delete``: the caller's tenant's exclusion calendars
(``/v1/calendars``), and the calendar file ``gnomon schedule next --calendar`` reads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from gnomon.cli.common import command, console, print_json, safe
from gnomon.client import Client
from gnomon.core.calendars import Calendar, parse_calendar
from gnomon.core.errors import ValidationError

app = typer.Typer(help="This tenant's exclusion calendars (dates a job does not run on).", no_args_is_help=True)

JsonOpt = Annotated[bool, typer.Option("--json", help="machine-readable output")]
CALENDAR_FILE_MAX_BYTES = 256 * 1024


def read_calendar_file(path: Path, option: str = "--file") -> tuple[dict[str, Any], Calendar]:
    """A calendar file: JSON ``{"timezone": ..., "dates": [...]}`` (the PUT body), checked
    here so that a mistake names the option and the field; the body and the calendar."""
    try:
        text = path.read_bytes()[:CALENDAR_FILE_MAX_BYTES + 1]
    except OSError as exc:
        raise ValidationError(option, f"cannot read {path}: {exc.strerror}") from None
    if len(text) > CALENDAR_FILE_MAX_BYTES:
        raise ValidationError(option, f"{path} is larger than {CALENDAR_FILE_MAX_BYTES} bytes")
    try:
        body = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ValidationError(option, f"{path} is not JSON: {exc}") from None
    try:
        return body, parse_calendar("cli", "file", body, 0)
    except ValidationError as exc:
        raise ValidationError(option, f"{path}: {exc.field}: {exc.message}") from None


def _show(view: dict[str, Any]) -> None:
    dates = ", ".join(d if isinstance(d, str) else f"{d['from']}..{d['to']}" for d in view["dates"])
    console.print(safe(f"{view['name']}  ({view['timezone']}, {view['days']} days)  {dates}"), highlight=False)


@app.command("put")
@command
def put(
    name: Annotated[str, typer.Argument(help="the calendar's name (a-z 0-9 . _ -)")],
    dates: Annotated[list[str] | None, typer.Argument(help="dates (2026-12-25) or ranges (2026-12-24..2026-12-26)")]
    = None,
    tz: Annotated[str, typer.Option("--tz", help="IANA time zone of the dates")] = "UTC",
    file: Annotated[Path | None, typer.Option("--file", help="a JSON file {timezone, dates} instead")] = None,
    json_: JsonOpt = False,
) -> None:
    """Create or replace a calendar (the whole list of dates)."""
    if file is not None:
        if dates:
            raise ValidationError("--file", "give the dates either as arguments or in --file, not both")
        body, _ = read_calendar_file(file)
    else:
        items: list[Any] = []
        for d in dates or []:
            first, sep, last = d.partition("..")
            items.append({"from": first, "to": last} if sep else d)
        body = {"timezone": tz, "dates": items}
    try:  # the API's rules, here first: a mistake names its argument at once
        parse_calendar("cli", name, body, 0)
    except ValidationError as exc:
        arg = {"name": "NAME", "timezone": "--tz"}.get(exc.field, "DATES" if exc.field.startswith("dates") else exc.field)
        raise ValidationError(arg, f"{exc.field}: {exc.message}" if arg == "DATES" else exc.message) from None
    view = Client().put_calendar(name, body)
    if json_:
        print_json(view)
    else:
        _show(view)


@app.command("get")
@command
def get(name: str, json_: JsonOpt = False) -> None:
    """Show one calendar."""
    view = Client().get_calendar(name)
    if json_:
        print_json(view)
    else:
        _show(view)


@app.command("list")
@command
def list_(json_: JsonOpt = False) -> None:
    """This tenant's calendars."""
    views = Client().list_calendars()
    if json_:
        print_json(views)
        return
    if not views["items"]:
        console.print("no calendars (gnomon calendars put NAME DATE...)", highlight=False)
    for view in views["items"]:
        _show(view)


@app.command("delete")
@command
def delete(name: str, json_: JsonOpt = False) -> None:
    """Delete a calendar no job excludes."""
    out = Client().delete_calendar(name)
    if json_:
        print_json(out)
    else:
        console.print(safe(f"deleted calendar {name}"), highlight=False)
