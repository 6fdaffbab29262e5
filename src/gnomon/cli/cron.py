"""``gnomon cron next``: preview fire times with the scheduler's own code."""

from __future__ import annotations

from typing import Annotated

import typer

from gnomon.cli.common import command, console, print_json
from gnomon.core.clock import SystemClock, iso_to_ms, ms_to_iso
from gnomon.core.cron import CronSchedule
from gnomon.core.errors import ValidationError
from gnomon.core.model import jitter_offset_ms
from gnomon.core.validation import JITTER_MAX_S

app = typer.Typer(help="Check cron expressions before registering them.", no_args_is_help=True)


@app.command("next")
@command
def next_(
    expr: Annotated[str, typer.Argument(help="5 fields, 6 with seconds first, or a macro such as @hourly")],
    tz: Annotated[str, typer.Option("--tz", help="IANA time zone")] = "UTC",
    after: Annotated[str | None, typer.Option(help="ISO-8601 instant with offset; default now")] = None,
    count: Annotated[int, typer.Option(min=1, max=1000)] = 5,
    jitter_s: Annotated[int, typer.Option("--jitter-s", min=0, max=JITTER_MAX_S,
                                          help="the job's jitterS: also print each run's start")] = 0,
    job_id: Annotated[str | None, typer.Option(
        "--job", help="the job id (jitter is a hash of job and slot; required with --jitter-s)")] = None,
    json_: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Print the next COUNT fire times of EXPR in zone TZ, as UTC instants (with
    --jitter-s and --job, also when each run starts)."""
    if jitter_s and not job_id:
        raise ValidationError("--job", "the jittered start depends on the job id: pass --job with --jitter-s")
    sched = CronSchedule.parse(expr, tz)
    if after is None:
        start = SystemClock().now_ms()
    else:
        try:
            start = iso_to_ms(after)
        except ValueError as exc:
            raise ValidationError("--after", str(exc)) from None
    times = sched.next_n(start, count)
    starts = [t + jitter_offset_ms(job_id or "", t, jitter_s) for t in times]
    if json_:
        out: dict[str, object] = {"expr": sched.expr, "tz": tz, "next": [ms_to_iso(t) for t in times]}
        if jitter_s:
            out["starts"] = [_iso_ms(t) for t in starts]
        print_json(out)
        return
    from datetime import UTC, datetime
    from zoneinfo import ZoneInfo

    for t, begin in zip(times, starts, strict=True):
        local = datetime.fromtimestamp(t / 1000, tz=UTC).astimezone(ZoneInfo(tz))
        started = f"  starts {_iso_ms(begin)} (+{(begin - t) / 1000:.3f} s jitter)" if jitter_s else ""
        console.print(f"{ms_to_iso(t)}  ({local.isoformat()} {local.tzname()}){started}", highlight=False)


def _iso_ms(ms: int) -> str:
    """UTC ISO-8601 with milliseconds (jittered starts are not whole seconds)."""
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
