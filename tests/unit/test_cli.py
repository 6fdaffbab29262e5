"""CLI behaviour that needs no services: exit codes and one-line errors."""

from __future__ import annotations

import io
import json

import pytest
import typer
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


# ---- job data is shown, never interpreted (rich markup, terminal escapes) ------------------

HOSTILE = "[bold red]pwned[/bold red] \x1b]0;title\x07\x1b[2J\u202egnp.exe"


class FakeClient:
    """Stands in for gnomon.client.Client: answers with hostile job data."""

    job = {"id": "job_1", "name": HOSTILE, "status": "active", "schedule": "0 * * * *", "nextRunAt": None,
           "timezone": "UTC", "priority": "normal", "pool": "default", "target": {"type": "http", "url": HOSTILE}}
    run = {"id": "job_1@manual:" + HOSTILE, "status": "failed", "attempt": 1, "maxAttempts": 1, "grantedAt": None,
           "startedAt": None, "startLagS": None, "finishedAt": None, "exitCode": 1, "error": HOSTILE,
           "reason": None}

    def get_job(self, _job_id: str) -> dict[str, object]:
        return self.job

    def list_jobs(self, _limit: int) -> dict[str, object]:
        return {"items": [self.job], "cursor": None}

    def get_run(self, _run_id: str) -> dict[str, object]:
        return self.run

    def list_runs(self, *_args: object) -> dict[str, object]:
        return {"items": [self.run], "cursor": None}

    def dead_letters(self, *_args: object) -> dict[str, object]:
        return {"items": [self.run], "cursor": "[red]c"}

    def get_logs(self, _run_id: str) -> dict[str, object]:
        return {"items": [{"attempt": 1, "stream": "stdout", "line": HOSTILE}], "cursor": None}


@pytest.mark.parametrize("args", [["jobs", "get", "job_1"], ["jobs", "list"], ["runs", "get", "r"],
                                  ["runs", "list", "job_1"], ["dead-letters", "list"], ["runs", "logs", "r"]])
def test_job_data_is_printed_literally(monkeypatch: pytest.MonkeyPatch, args: list[str]) -> None:
    from gnomon.cli import jobs as cli_jobs

    monkeypatch.setattr(cli_jobs, "Client", FakeClient)
    # the console's width is fixed when it is made (COLUMNS then): set it, so a wrapped cell
    # cannot split the text looked for
    monkeypatch.setattr(cli_jobs.console, "width", 400)
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "[bold red]pwned[/bold red]" in res.stdout  # markup shown, not applied
    assert "\x1b" not in res.stdout and "\x07" not in res.stdout and "\u202e" not in res.stdout
    assert "\\x1b[2J" in res.stdout and "\\u202e" in res.stdout  # visible as escapes


def test_clean_escapes_controls_and_bidi() -> None:
    from gnomon.cli.common import clean

    assert clean("ok\tname\n\x1b[31m\x9b\u2066") == "ok\\tname\\n\\x1b[31m\\x9b\\u2066"
    assert clean("plain ünïcode ✓") == "plain ünïcode ✓"


def test_errors_are_printed_literally(capsys: pytest.CaptureFixture[str]) -> None:
    from gnomon.cli.common import fail

    with pytest.raises(typer.Exit):
        fail("bad \x1b[2J [red]x[/red]")
    assert capsys.readouterr().err.strip() == "gnomon: bad \\x1b[2J [red]x[/red]"


def test_token_hash_reads_stdin_and_prints_an_entry() -> None:
    from gnomon.cli.jobs import token_app
    from gnomon.web.auth import hash_token, parse_tokens

    res = runner.invoke(token_app, ["--tenant", "acme"], input="s3cret\n")
    assert res.exit_code == 0, res.output
    entry = res.stdout.strip()
    assert entry == f"sha256:{hash_token('s3cret')}:acme" and "s3cret" not in res.stdout
    assert parse_tokens(entry) == {hash_token("s3cret"): "acme"}


# ---- ids are printed whole, to be copied -------------------------------------------------

LONG_JOB = "job_1fa935524c7e4b0f9d2a61c3e8b5d7aa"


class ManyRunsClient:
    """Answers with runs of a long job id, and counts the pages asked for."""

    calls = 0

    def list_runs(self, job_id: str, *_args: object) -> dict[str, object]:
        ManyRunsClient.calls += 1
        return {"items": [{"id": f"{job_id}@2026-12-01T10:0{i}:00Z", "status": "succeeded", "attempt": 1,
                           "grantedAt": "2026-12-01T10:00:00Z", "startedAt": "2026-12-01T10:00:00.004Z",
                           "startLagS": 0.004, "finishedAt": "2026-12-01T10:00:01Z", "exitCode": 0}
                          for i in range(3)], "cursor": None}

    def list_jobs(self, _limit: int) -> dict[str, object]:
        return {"items": [{"id": LONG_JOB, "name": "nightly billing close", "status": "active",
                           "schedule": "0 2 * * *", "nextRunAt": "2026-12-02T02:00:00Z"}], "cursor": None}

    def dead_letters(self, *_args: object) -> dict[str, object]:
        return {"items": [{"id": f"{LONG_JOB}@2026-12-01T10:00:00Z", "attempt": 3, "maxAttempts": 3,
                           "finishedAt": "2026-12-01T10:05:00Z", "exitCode": 1, "error": "boom", "reason": None}],
                "cursor": None}


@pytest.mark.parametrize("args", [["runs", "list", LONG_JOB], ["jobs", "list"], ["dead-letters", "list"]])
def test_ids_are_whole_on_an_80_column_terminal(monkeypatch: pytest.MonkeyPatch, args: list[str]) -> None:
    from gnomon.cli import jobs as cli_jobs

    monkeypatch.setattr(cli_jobs, "Client", ManyRunsClient)
    monkeypatch.setattr(cli_jobs.console, "width", 80)  # (fixed when the console was made)
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert max(len(line) for line in res.stdout.splitlines()) <= 80
    ids = [f"{LONG_JOB}@2026-12-01T10:0{i}:00Z" for i in range(3)] if args[0] == "runs" else (
        [LONG_JOB] if args[0] == "jobs" else [f"{LONG_JOB}@2026-12-01T10:00:00Z"])
    for run_id in ids:
        assert run_id in res.stdout, res.stdout  # on one line, uncut: it can be pasted
    if args[0] == "jobs":
        assert "2026-12-02T02:00:00Z" in res.stdout, res.stdout  # the next run whole, not "2026-12-02T0…"
    assert "…" not in res.stdout, res.stdout  # nothing cut: what does not fit folds


@pytest.mark.parametrize("columns", [200, 80])
def test_a_staged_run_reads_staged_with_its_start_not_running(monkeypatch: pytest.MonkeyPatch, columns: int) -> None:
    from gnomon.cli import jobs as cli_jobs

    class StagedClient(ManyRunsClient):
        def list_runs(self, job_id: str, *_args: object) -> dict[str, object]:
            return {"items": [{"id": f"{job_id}@2026-12-01T10:00:30Z", "status": "running", "staged": True,
                               "attempt": 1, "grantedAt": "2026-12-01T10:00:00Z", "startAt": "2026-12-01T10:00:30Z",
                               "startedAt": None, "startLagS": None, "finishedAt": None, "exitCode": None}],
                    "cursor": None}

    monkeypatch.setattr(cli_jobs, "Client", StagedClient)
    res = runner.invoke(app, ["runs", "list", "job_1"], env={"COLUMNS": str(columns)})
    assert res.exit_code == 0, res.output
    assert "staged" in res.stdout and "running" not in res.stdout, res.stdout
    # the table itself, at a width of our choosing (the console's may be fixed by an earlier test)
    from rich.console import Console

    out = Console(width=columns, record=True, file=io.StringIO())
    out.print(cli_jobs._runs_table(StagedClient().list_runs("job_1")["items"], columns))  # type: ignore[arg-type]
    text = out.export_text()
    assert "staged" in text and "running" not in text, text
    assert ("starts" in text) is (columns >= cli_jobs.WIDE_COLUMNS), text  # the start time, when there is room


def test_runs_list_watch_refreshes(monkeypatch: pytest.MonkeyPatch) -> None:
    from gnomon.cli import jobs as cli_jobs

    monkeypatch.setattr(cli_jobs, "Client", ManyRunsClient)
    monkeypatch.setattr(cli_jobs.time, "sleep", lambda _s: None)
    ManyRunsClient.calls = 0
    res = runner.invoke(app, ["runs", "list", LONG_JOB, "--watch", "--rounds-max", "3"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert ManyRunsClient.calls == 3
    assert f"runs of {LONG_JOB}" in res.stdout and f"{LONG_JOB}@2026-12-01T10:02:00Z" in res.stdout


def test_runs_list_watch_refuses_json() -> None:
    res = runner.invoke(app, ["runs", "list", "j", "--watch", "--json"])
    assert res.exit_code == 2 and "--watch" in res.output


def test_infra_only_names_one_component_or_exits_2(monkeypatch: pytest.MonkeyPatch) -> None:
    from gnomon.cli import infra as infra_cli
    from gnomon.infra import manager

    assert infra_cli.ONLY == manager.ALL_COMPONENTS  # the CLI and `python -m gnomon.infra` agree
    calls: list[tuple[str, tuple[str, ...]]] = []
    monkeypatch.setattr(manager, "up", lambda _s, kafka_nodes=1, components=(), tls=None, cassandra_nodes=1: calls.append(("up", components)))
    monkeypatch.setattr(manager, "down", lambda _s, components=(): calls.append(("down", components)))
    res = runner.invoke(app, ["infra", "up", "--only", "nope"])
    assert res.exit_code == 2
    lines = [x for x in res.output.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("gnomon: --only:"), res.output
    assert runner.invoke(app, ["infra", "up", "--only", "connect"]).exit_code == 0
    assert runner.invoke(app, ["infra", "up"]).exit_code == 0
    assert runner.invoke(app, ["infra", "down", "--only", "postgres"]).exit_code == 0
    assert runner.invoke(app, ["infra", "down"]).exit_code == 0
    assert calls == [("up", ("connect",)), ("up", manager.COMPONENTS), ("down", ("postgres",)),
                     ("down", manager.ALL_COMPONENTS)]


def test_jobs_create_sends_after_and_get_prints_upstreams_and_downstreams(monkeypatch: pytest.MonkeyPatch) -> None:
    from gnomon.cli import jobs as cli_jobs

    sent: list[dict[str, object]] = []

    class Recording(FakeClient):
        job = {**FakeClient.job, "name": "load", "after": [{"job": "job_t", "on": "succeeded"},
                                                            {"job": "job_e", "on": "finished"}],
               "waitMaxS": 600, "downstreams": ["job_r"]}

        def create_job(self, body: dict[str, object], idempotency_key: str | None = None) -> dict[str, object]:
            sent.append(body)
            return self.job

    monkeypatch.setattr(cli_jobs, "Client", Recording)
    res = runner.invoke(app, ["jobs", "create", "load", "--cron", "0 6 * * *", "--handler", "h", "--after", "job_t",
                              "--after", "job_e:finished", "--wait-max-s", "600"])
    assert res.exit_code == 0, res.output
    assert sent[0]["after"] == [{"job": "job_t"}, {"job": "job_e", "on": "finished"}] and sent[0]["waitMaxS"] == 600
    res = runner.invoke(app, ["jobs", "get", "job_1"], env={"COLUMNS": "200"})
    assert "after: job_t (succeeded), job_e (finished)" in res.stdout and "downstreams: job_r" in res.stdout
    # no schedule of its own: --after alone; nothing at all is exit 2 with one line
    res = runner.invoke(app, ["jobs", "create", "report", "--handler", "h", "--after", "job_t"])
    assert res.exit_code == 0, res.output
    assert sent[1]["after"] == [{"job": "job_t"}] and not {"schedule", "every", "runAt"} & set(sent[1])
    res = runner.invoke(app, ["jobs", "create", "report", "--handler", "h"])
    assert res.exit_code == 2 and "give exactly one of --cron, --every or --at" in res.output, res.output
