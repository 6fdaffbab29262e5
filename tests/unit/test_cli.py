"""CLI behaviour that needs no services: exit codes and one-line errors."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from gnomon.cli.main import app

runner = CliRunner()


def test_cron_next_json_uses_the_scheduler_code() -> None:
    res = runner.invoke(app, ["cron", "next", "30 2 * * *", "--tz", "America/New_York",
                              "--after", "2026-03-07T12:00:00Z", "--count", "2", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["next"] == ["2026-03-08T07:00:00Z", "2026-03-09T06:30:00Z"]


def test_bad_cron_exits_2_with_one_line() -> None:
    res = runner.invoke(app, ["cron", "next", "61 * * * *"])
    assert res.exit_code == 2
    lines = [x for x in res.output.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("gnomon: schedule:")


def test_jobs_create_needs_exactly_one_target() -> None:
    res = runner.invoke(app, ["jobs", "create", "x", "--cron", "* * * * *"])
    assert res.exit_code == 2
    assert "exactly one target" in res.output
