"""Entry point of the ``gnomon`` command."""

from __future__ import annotations

import os

import typer

from gnomon.cli import (
    alerts,
    calendars,
    cron,
    infra,
    jobs,
    regions,
    schedule,
    services,
    status,
    tenants,
)
from gnomon.infra.perms import PRIVATE_UMASK

app = typer.Typer(
    name="gnomon",
    help="gnomon: a distributed job scheduler event-sourced on Kafka.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.add_typer(infra.app, name="infra")
app.add_typer(jobs.jobs_app, name="jobs")
app.add_typer(jobs.token_app, name="token")
app.add_typer(jobs.runs_app, name="runs")
app.add_typer(jobs.dead_app, name="dead-letters")
app.add_typer(cron.app, name="cron")
app.add_typer(schedule.app, name="schedule")
app.add_typer(calendars.app, name="calendars")
app.add_typer(tenants.app, name="tenants")
app.add_typer(alerts.app, name="alerts")
app.add_typer(regions.app, name="regions")
app.command()(services.processor)
app.command()(services.worker)
app.command()(services.projector)
app.command()(services.alerter)
app.command()(services.api)
app.command()(services.dev)
app.command()(status.status)


def main() -> None:
    # what gnomon's services write (the processor's RocksDB, logs, exports) is the tenants'
    # data: private to this user (gnomon.infra.perms)
    os.umask(PRIVATE_UMASK)
    app()


if __name__ == "__main__":
    main()
