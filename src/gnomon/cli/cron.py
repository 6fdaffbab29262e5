"""``gnomon cron next``: preview fire times with the scheduler's own code."""

from __future__ import annotations

from typing import Annotated

import typer

from gnomon.cli.common import command, console, print_json
from gnomon.core.clock import SystemClock, iso_to_ms, ms_to_iso
from gnomon.core.cron import CronSchedule
from gnomon.core.errors import ValidationError

app = typer.Typer(help="Check cron expressions before registering them.", no_args_is_help=True)


@app.command("next")
@command
def next_(
    expr: Annotated[str, typer.Argument(help="5 fields, 6 with seconds first, or a macro such as @hourly")],
    tz: Annotated[str, typer.Option("--tz", help="IANA time zone")] = "UTC",
    after: Annotated[str | None, typer.Option(help="ISO-8601 instant with offset; default now")] = None,
    count: Annotated[int, typer.Option(min=1, max=1000)] = 5,
    json_: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Print the next COUNT fire times of EXPR in zone TZ, as UTC instants."""
    sched = CronSchedule.parse(expr, tz)
    if after is None:
        start = SystemClock().now_ms()
    else:
        try:
            start = iso_to_ms(after)
        except ValueError as exc:
            raise ValidationError("--after", str(exc)) from None
    times = sched.next_n(start, count)
    if json_:
        print_json({"expr": sched.expr, "tz": tz, "next": [ms_to_iso(t) for t in times]})
        return
    from datetime import UTC, datetime
    from zoneinfo import ZoneInfo

    for t in times:
        local = datetime.fromtimestamp(t / 1000, tz=UTC).astimezone(ZoneInfo(tz))
        console.print(f"{ms_to_iso(t)}  ({local.isoformat()} {local.tzname()})", highlight=False)
