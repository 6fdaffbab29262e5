"""``gnomon jobs ...``, ``gnomon runs ...`` and ``gnomon dead-letters ...``: talk to the API."""

from __future__ import annotations

import json
import time
from typing import Annotated, Any

import typer
from rich import box
from rich.table import Table
from rich.text import Text

from gnomon.cli.common import clean, command, console, print_json, safe
from gnomon.client import Client
from gnomon.core.errors import ValidationError

jobs_app = typer.Typer(help="Register and manage jobs.", no_args_is_help=True)
runs_app = typer.Typer(help="Inspect runs and their logs; cancel or replay a run.", no_args_is_help=True)
dead_app = typer.Typer(help="Failed runs whose retries are exhausted (replay them with `gnomon runs replay`).",
                       no_args_is_help=True)
token_app = typer.Typer(help="API tokens for GNOMON_API_TOKENS.", no_args_is_help=True)

JsonOpt = Annotated[bool, typer.Option("--json", help="machine-readable output")]


@jobs_app.command("create")
@command
def create(
    name: Annotated[str, typer.Argument(help="a human name for the job")],
    cron: Annotated[str | None, typer.Option("--cron", help="cron expression (6 fields = seconds first)")] = None,
    every: Annotated[str | None, typer.Option("--every", help="an interval such as 90m, 1h30m, 7d")] = None,
    from_: Annotated[str | None, typer.Option("--from", help="the interval's first slot (ISO-8601; default: "
                                                             "counted from the Unix epoch)")] = None,
    tz: Annotated[str, typer.Option("--tz", help="IANA time zone of the schedule")] = "UTC",
    at: Annotated[str | None, typer.Option("--at", help="one-time run at this ISO-8601 instant")] = None,
    start_at: Annotated[str | None, typer.Option("--start-at", help="no slot before this instant")] = None,
    end_at: Annotated[str | None, typer.Option("--end-at", help="no slot after this instant; then the job is done")] = None,
    max_runs: Annotated[int | None, typer.Option("--max-runs", help="at most N scheduled runs; then the job is done")] = None,
    exclude_calendar: Annotated[list[str] | None, typer.Option(
        "--exclude-calendar", help="a calendar of this tenant whose dates the job does not run on; repeatable")] = None,
    after: Annotated[list[str] | None, typer.Option(
        "--after", help="an upstream job: JOB (its run for the slot must succeed) or JOB:finished (must end); "
                        "repeatable")] = None,
    wait_max_s: Annotated[int | None, typer.Option("--wait-max-s", help="how long past its slot a run waits for "
                                                   "its upstreams, then it is recorded skipped (default 86400)")] = None,
    cmd: Annotated[str | None, typer.Option("--command", help="shell-free command line, split on spaces")] = None,
    http: Annotated[str | None, typer.Option("--http", help="callback URL to POST to")] = None,
    handler: Annotated[str | None, typer.Option("--handler", help="name of a Python handler in the pool's workers")] = None,
    priority: Annotated[str, typer.Option(help="high, normal or low")] = "normal",
    timeout_s: Annotated[int, typer.Option("--timeout-s", help="attempt timeout in seconds")] = 3600,
    pool: Annotated[str, typer.Option(help="worker pool")] = "default",
    retries: Annotated[int, typer.Option("--max-attempts", help="attempts including the first")] = 3,
    catch_up: Annotated[str, typer.Option("--catch-up", help="once, all or skip")] = "once",
    payload: Annotated[str | None, typer.Option(help="JSON payload")] = None,
    key: Annotated[str | None, typer.Option(
        "--key", help="idempotency key: repeating the command with the same key and job is one job")] = None,
    jitter_s: Annotated[int, typer.Option(
        "--jitter-s", help="start each run at a fixed offset in [slot, slot + N s] (spreads spikes)")] = 0,
    alert_late_s: Annotated[int | None, typer.Option(
        "--alert-late-s", help="alert (gnomon alerts) when a run starts more than N s late "
                               "(default: the tenant's alert config)")] = None,
    late_max_s: Annotated[int | None, typer.Option(
        "--late-max-s", help="under overload, give a slot up (recorded 'overload') when it cannot start "
                             "within N s of its time (default: the misfire grace, 60 s)")] = None,
    json_: JsonOpt = False,
) -> None:
    """Register a job and print its id."""
    given = sum(v is not None for v in (cron, every, at))
    if given != 1 and not (given == 0 and after):
        raise ValidationError("--cron/--every/--at", "give exactly one of --cron, --every or --at (or none, with "
                              "--after: the job runs after each run of its upstreams)")
    targets = [t for t in (cmd, http, handler) if t is not None]
    if len(targets) != 1:
        raise ValidationError("--command/--http/--handler", "give exactly one target")
    body: dict[str, Any] = {"name": name, "timezone": tz, "priority": priority, "timeoutS": timeout_s,
                            "pool": pool, "retry": {"max": retries}, "catchUp": catch_up, "jitterS": jitter_s}
    if alert_late_s is not None:
        body["alertLateS"] = alert_late_s
    if late_max_s is not None:
        body["lateMaxS"] = late_max_s
    if cron is not None:
        body["schedule"] = cron
    elif every is not None:
        body["every"] = every
    elif at is not None:
        body["runAt"] = at
    for field, value in (("from", from_), ("startAt", start_at), ("endAt", end_at), ("maxRuns", max_runs)):
        if value is not None:
            body[field] = value
    if exclude_calendar:
        body["excludeCalendars"] = exclude_calendar
    if after:
        body["after"] = [{"job": a.rsplit(":", 1)[0], "on": a.rsplit(":", 1)[1]} if ":" in a else {"job": a}
                         for a in after]
    if wait_max_s is not None:
        body["waitMaxS"] = wait_max_s
    if cmd is not None:
        import shlex

        body["target"] = {"type": "command", "argv": shlex.split(cmd)}
    elif http is not None:
        body["target"] = {"type": "http", "url": http}
    else:
        body["target"] = {"type": "handler", "name": handler}
    if payload is not None:
        try:
            body["payload"] = json.loads(payload)
        except json.JSONDecodeError as exc:
            raise ValidationError("--payload", f"not valid JSON: {exc.msg}") from None
    job = Client().create_job(body, key)
    if json_:
        print_json(job)
    else:
        typer.echo(clean(job["id"]))


@jobs_app.command("get")
@command
def get(job_id: str, json_: JsonOpt = False) -> None:
    """Show one job."""
    job = Client().get_job(job_id)
    if json_:
        print_json(job)
        return
    for k in ("id", "name", "status", "endedBecause", "schedule", "every", "from", "runAt", "timezone", "startAt",
              "endAt", "maxRuns", "scheduledRuns", "excludeCalendars", "after", "waitMaxS", "downstreams", "nextRunAt",
              "priority", "pool", "target"):
        if job.get(k) is not None and (k != "scheduledRuns" or job.get("maxRuns") is not None):
            value = job[k]
            if k == "after":  # job (on), ...
                value = ", ".join(f"{u['job']} ({u['on']})" for u in value)
            elif k == "downstreams":
                value = ", ".join(value)
            _field(k, value)


@jobs_app.command("fires")
@command
def fires(job_id: str, count: Annotated[int, typer.Option(min=1, max=100)] = 10,
          after: Annotated[str | None, typer.Option(help="ISO-8601 instant with offset; default now")] = None,
          json_: JsonOpt = False) -> None:
    """The job's next fire times, within its bounds (startAt, endAt, maxRuns)."""
    shown = Client().job_fires(job_id, count, after)
    if json_:
        print_json(shown)
        return
    console.print(Text.assemble(("schedule", "bold"), ": ", safe(shown["schedule"])), highlight=False)
    if shown.get("endedBecause"):
        _field("done", shown["endedBecause"])
    for fire in shown["fires"]:
        start = f"  starts {fire['start']}" if fire["start"] != fire["slot"] else ""
        if fire.get("excludedBy"):
            start = f"  skipped: calendar {fire['excludedBy']}"
        console.print(safe(f"{fire['slot']}  ({fire['local']}){start}"), highlight=False)
    if shown.get("ends"):
        _field("then no more", shown["ends"])


@jobs_app.command("list")
@command
def list_(limit: int = 100, json_: JsonOpt = False) -> None:
    """List this tenant's jobs."""
    page = Client().list_jobs(limit)
    if json_:
        print_json(page)
        return
    table = Table()
    table.add_column("id", no_wrap=True, min_width=max((len(clean(j["id"])) for j in page["items"]), default=2))
    table.add_column("name", overflow="fold")
    table.add_column("status", no_wrap=True)
    table.add_column("schedule", overflow="fold")
    # a time cut to "2026-12-06T1…" says nothing: the name and schedule wrap instead
    table.add_column("next run (UTC)", no_wrap=True, min_width=len("2026-12-06T17:02:30Z"))
    for j in page["items"]:
        when = j.get("schedule") or (f"every {j['every']}" if j.get("every") else j.get("runAt")) or (
            "after " + ", ".join(u["job"] for u in j.get("after") or []))
        _row(table, j["id"], j["name"], j["status"], when, j.get("nextRunAt"))
    console.print(table)


def _field(key: str, value: Any) -> None:
    """One ``key: value`` line; the value is data, shown literally (no markup, no escapes)."""
    console.print(Text.assemble((key, "bold"), ": ", safe(value)), highlight=False)


def _row(table: Table, *cells: Any) -> None:
    """A table row of data cells: None shows empty; str cells would be parsed as markup."""
    table.add_row(*(safe("" if cell is None else cell) for cell in cells))


def _simple(action: str) -> Any:
    def run(job_id: str) -> None:
        getattr(Client(), action)(job_id)
        typer.echo(f"{action}: {clean(job_id)}")

    run.__doc__ = f"{action.capitalize()} a job."
    return command(run)


jobs_app.command("pause")(_simple("pause"))
jobs_app.command("resume")(_simple("resume"))
jobs_app.command("delete")(_simple("delete"))


@jobs_app.command("move")
@command
def move(job_id: str,
         to: Annotated[str, typer.Option("--to", help="the region to move it to (a name of $GNOMON_REGIONS)")],
         json_: JsonOpt = False) -> None:
    """Move a job to another region: its slots from its next one run there.

    Send it to the API of the job's region now. The slots before its next one (the lookahead's, already staged) still run here; then the job is done here, and the other region's API answers for it."""
    from gnomon.core.command_checks import check_region

    check_region(to, "--to")
    out = Client().move(job_id, to)
    if json_:
        print_json(out)
    else:
        typer.echo(f"move: {clean(job_id)} -> region {clean(to)} (version {out.get('version')})")


@jobs_app.command("trigger")
@command
def trigger(job_id: str, key: Annotated[str | None, typer.Option("--key", help="idempotency key; default random")] = None,
            json_: JsonOpt = False) -> None:
    """Run a job now. The same --key always means the same single run."""
    import secrets

    run_id = Client().trigger(job_id, key or secrets.token_hex(8))
    if json_:
        print_json({"runId": run_id})
    else:
        typer.echo(clean(run_id))


@jobs_app.command("backfill")
@command
def backfill(
    job_id: str,
    from_: Annotated[str, typer.Option("--from", help="first instant of the range (ISO-8601, e.g. 2026-11-30T00:00:00Z)")],
    to: Annotated[str, typer.Option("--to", help="last instant of the range (ISO-8601, not in the future)")],
    json_: JsonOpt = False,
) -> None:
    """Run the past slots of a job's schedule in [--from, --to]: slots without a run get
    one, slots recorded skipped are reopened, slots that ran are left alone (at most 1,000)."""
    out = Client().backfill(job_id, from_, to)
    if json_:
        print_json(out)
        return
    _field("slots in range", out["slots"])
    _field("sent", out["sent"])
    _field("left alone (already run)", len(out["alreadyRun"]))
    for run_id in out["runIds"]:
        typer.echo(clean(run_id))


@runs_app.command("list")
@command
def runs_list(
    job_id: str, status: str | None = None, limit: int = 20, json_: JsonOpt = False,
    watch: Annotated[bool, typer.Option("--watch", "-w", help="refresh until Ctrl-C")] = False,
    interval_s: Annotated[float, typer.Option("--interval-s", min=0.5, help="seconds between refreshes")] = 2.0,
    rounds_max: Annotated[int, typer.Option("--rounds-max", hidden=True, help="stop after N refreshes (tests)")] = 0,
) -> None:
    """Runs of a job, newest first. Run ids are printed whole (never cut), to paste into
    ``gnomon runs logs`` and the other run commands."""
    client = Client()
    if not watch:
        page = client.list_runs(job_id, status, limit)
        if json_:
            print_json(page)
            return
        console.print(_runs_table(page["items"], console.width))
        return
    if json_:
        raise ValidationError("--watch", "--watch shows a live table; leave out --json")
    from rich.live import Live

    rounds = 0
    with Live(console=console, auto_refresh=False) as live:
        while True:
            page = client.list_runs(job_id, status, limit)
            live.update(_runs_table(page["items"], console.width,
                                    title=f"runs of {clean(job_id)} (every {interval_s:g} s; Ctrl-C stops)"),
                        refresh=True)
            rounds += 1
            if rounds_max and rounds >= rounds_max:
                return
            try:
                time.sleep(interval_s)
            except KeyboardInterrupt:
                return


WIDE_COLUMNS = 120  # narrower terminals show the run id, its status and start lag only


def _runs_table(runs: list[dict[str, Any]], width: int, title: str | None = None) -> Table:
    """Runs as a table whose run id column is never wrapped or cut (the id is meant to be
    copied); on a narrow terminal only the status and the start lag stay beside it
    (``gnomon runs get ID`` shows the rest)."""
    wide = width >= WIDE_COLUMNS
    table = Table(title=title, title_justify="left", box=None if not wide else box.HEAVY_HEAD,
                  pad_edge=wide)
    table.add_column("run", no_wrap=True, min_width=max((len(clean(r["id"])) for r in runs), default=3))
    names = ("status", "attempt", "granted", "started", "lag s", "finished", "exit") if wide else ("status", "lag s")
    for name in names:
        table.add_column(name, no_wrap=not wide, overflow="fold")
    for r in runs:
        lag = r.get("startLagS")
        # a run granted ahead of its slot, not started yet: "staged (starts at ...)", not "running"
        status = r["status"] if not r.get("staged") else f"staged (starts {r.get('startAt')})" if wide else "staged"
        cell = {"status": status, "attempt": r["attempt"], "granted": r.get("grantedAt"),
                "started": r["startedAt"], "lag s": None if lag is None else f"{lag:.3f}",
                "finished": r["finishedAt"], "exit": r["exitCode"]}
        _row(table, r["id"], *(cell[n] for n in names))
    return table


@runs_app.command("get")
@command
def runs_get(run_id: str, json_: JsonOpt = False) -> None:
    """Show one run."""
    run = Client().get_run(run_id)
    if json_:
        print_json(run)
        return
    for k, v in run.items():
        # output is JSON: objects and arrays print as JSON; a command's last lines as text
        _field(k, json.dumps(v, ensure_ascii=False) if isinstance(v, dict | list) else v)


@runs_app.command("logs")
@command
def runs_logs(run_id: str, json_: JsonOpt = False) -> None:
    """Print a run's log lines."""
    page = Client().get_logs(run_id)
    if json_:
        print_json(page)
        return
    for line in page["items"]:  # a program's output: its escape sequences are shown, not run
        typer.echo(f"[{line['attempt']}:{clean(line['stream'])}] {clean(line['line'])}")


@runs_app.command("cancel")
@command
def runs_cancel(run_id: str, json_: JsonOpt = False) -> None:
    """Cancel a run that has not finished (a running attempt is stopped)."""
    out = Client().cancel(run_id)
    if json_:
        print_json(out)
    else:
        typer.echo(f"cancel: {clean(run_id)}")


@runs_app.command("replay")
@command
def runs_replay(run_id: str, json_: JsonOpt = False) -> None:
    """Run a failed (dead-lettered) run again with a fresh retry budget."""
    out = Client().replay(run_id)
    if json_:
        print_json(out)
    else:
        typer.echo(f"replay: {clean(run_id)}")


@dead_app.command("list")
@command
def dead_list(limit: int = 50, cursor: Annotated[str | None, typer.Option(help="from a previous page")] = None,
              json_: JsonOpt = False) -> None:
    """This tenant's failed runs, newest first."""
    page = Client().dead_letters(limit, cursor)
    if json_:
        print_json(page)
        return
    # on a narrow terminal the finish time is left out (`gnomon runs get ID` shows it) and
    # the error folds over lines, rather than every column ending in "…"
    wide = console.width >= WIDE_COLUMNS
    table = Table(box=None if not wide else box.HEAVY_HEAD, pad_edge=wide)
    table.add_column("run", no_wrap=True, min_width=max((len(clean(r["id"])) for r in page["items"]), default=3))
    table.add_column("attempt", no_wrap=True, min_width=len("attempt"))
    if wide:
        table.add_column("finished", no_wrap=True)
    table.add_column("exit", no_wrap=True)
    table.add_column("error", overflow="fold")
    for r in page["items"]:
        finished = [r["finishedAt"]] if wide else []
        _row(table, r["id"], f"{r['attempt']}/{r['maxAttempts']}", *finished, r["exitCode"], r["error"] or r["reason"])
    console.print(table)
    if page.get("cursor"):
        console.print(Text.assemble("more: --cursor ", safe(page["cursor"])), highlight=False)


@token_app.command("hash")
@command
def token_hash(
    tenant: Annotated[str | None, typer.Option(help="print a whole GNOMON_API_TOKENS entry for this tenant")] = None,
) -> None:
    """Hash a token (read from stdin or a hidden prompt, never from argv: argv shows in
    `ps` and shell history) for GNOMON_API_TOKENS='sha256:<hash>:<tenant>'."""
    import sys

    from gnomon.tokens import hash_token

    token = sys.stdin.readline() if not sys.stdin.isatty() else typer.prompt("token", hide_input=True)
    if not token.strip():
        raise ValidationError("token", "is empty")
    entry = f"sha256:{hash_token(token)}"
    typer.echo(f"{entry}:{clean(tenant)}" if tenant else entry)
