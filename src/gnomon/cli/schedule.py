"""``gnomon schedule next``: preview a schedule's fire times offline, with the scheduler's
own code (cron, interval or one time, with its bounds), before registering a job."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from gnomon.cli.calendars import read_calendar_file
from gnomon.cli.common import command, console, print_json
from gnomon.core.clock import SystemClock, iso_to_ms, ms_to_iso
from gnomon.core.errors import ValidationError
from gnomon.core.fires import FIRES_MAX, preview
from gnomon.core.jobs import describe_schedule
from gnomon.core.model import JobSpec, Target, TargetType
from gnomon.core.validation import parse_schedule

app = typer.Typer(help="Preview schedules (cron, interval, bounds) before registering them.", no_args_is_help=True)


@app.command("next")
@command
def next_(
    cron: Annotated[str | None, typer.Option("--cron", help="cron expression (6 fields = seconds first)")] = None,
    every: Annotated[str | None, typer.Option("--every", help="an interval such as 90m, 1h30m, 7d")] = None,
    from_: Annotated[str | None, typer.Option("--from", help="the interval's first slot (ISO-8601; without "
                                                             "an offset: in --tz)")] = None,
    at: Annotated[str | None, typer.Option("--at", help="a one-time instant")] = None,
    tz: Annotated[str, typer.Option("--tz", help="IANA time zone")] = "UTC",
    start_at: Annotated[str | None, typer.Option("--start-at", help="no slot before this instant")] = None,
    end_at: Annotated[str | None, typer.Option("--end-at", help="no slot after this instant")] = None,
    max_runs: Annotated[int | None, typer.Option("--max-runs", help="at most N runs")] = None,
    after: Annotated[str | None, typer.Option(help="ISO-8601 instant with offset; default now")] = None,
    count: Annotated[int, typer.Option(min=1, max=FIRES_MAX)] = 5,
    calendar: Annotated[list[Path] | None, typer.Option(
        "--calendar", help="a calendar file (JSON {timezone, dates}) whose dates are excluded; repeatable")] = None,
    json_: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Print the next COUNT fire times of a schedule (one of --cron, --every, --at), in UTC
    and in the zone, and say when its bounds end it."""
    data: dict[str, Any] = {"timezone": tz}
    for field, value in (("schedule", cron), ("every", every), ("from", from_), ("runAt", at),
                         ("startAt", start_at), ("endAt", end_at), ("maxRuns", max_runs)):
        if value is not None:
            data[field] = value
    now = SystemClock().now_ms()
    try:
        schedule = parse_schedule(data, now)
    except ValidationError as exc:
        flag = {"schedule": "--cron", "runAt": "--at", "startAt": "--start-at", "endAt": "--end-at",
                "maxRuns": "--max-runs", "timezone": "--tz"}.get(exc.field, f"--{exc.field}")
        raise ValidationError(flag, exc.message) from None
    if after is None:
        start = now
    else:
        try:
            start = iso_to_ms(after)
        except ValueError as exc:
            raise ValidationError("--after", str(exc)) from None
    cals = tuple(read_calendar_file(path, "--calendar")[1] for path in calendar or [])
    shown = preview(schedule, after_ms=start, count=count, calendars=cals)
    words = describe_schedule(JobSpec("preview", schedule, Target(TargetType.HANDLER, handler="h")))
    if json_:
        print_json({"schedule": words, "timezone": tz, "next": [ms_to_iso(f.slot_ms) for f in shown.fires],
                    "local": [f.local(tz) for f in shown.fires], "ends": shown.ends,
                    "excluded": [ms_to_iso(f.slot_ms) for f in shown.fires if f.excluded_by]})
        return
    console.print(words, highlight=False)
    for fire in shown.fires:
        skipped = "  skipped: on the calendar" if fire.excluded_by else ""
        console.print(f"{ms_to_iso(fire.slot_ms)}  ({fire.local(tz)}){skipped}", highlight=False)
    if shown.ends:
        console.print(f"then no more: {shown.ends}", highlight=False)
