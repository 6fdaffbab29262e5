"""What `make run`'s demo says when it stops: its jobs deleted, a job already gone (404)
counted as deleted, and only the jobs it could not reach named as left behind."""

from __future__ import annotations

from typing import Any

import pytest

from gnomon.client import ApiError
from gnomon.demo import run


class FakeClient:
    def __init__(self, answers: dict[str, Exception | None]) -> None:
        self.answers = answers
        self.deleted: list[str] = []

    def delete(self, job_id: str) -> None:
        self.deleted.append(job_id)
        exc = self.answers.get(job_id)
        if exc is not None:
            raise exc


def said(capsys: pytest.CaptureFixture[str], client: Any, ids: dict[str, str]) -> str:
    run._delete_demo(client, ids)
    return " ".join(capsys.readouterr().out.split())


def test_every_job_deleted(capsys: pytest.CaptureFixture[str]) -> None:
    client = FakeClient({})
    assert said(capsys, client, {"a": "j1", "b": "j2"}) == "deleted the 2 demo jobs"
    assert client.deleted == ["j1", "j2"]


def test_a_job_already_deleted_counts_as_deleted(capsys: pytest.CaptureFixture[str]) -> None:
    client = FakeClient({"j1": ApiError(404, {"status": 404, "title": "Not Found"})})
    assert said(capsys, client, {"a": "j1", "b": "j2"}) == "deleted the 2 demo jobs"


def test_jobs_it_could_not_delete_are_named(capsys: pytest.CaptureFixture[str]) -> None:
    client = FakeClient({"j2": ApiError(503, {"status": 503, "title": "Unavailable"}), "j3": OSError("refused")})
    out = said(capsys, client, {"a": "j1", "b": "j2", "c": "j3"})
    assert out.startswith("could not delete the demo jobs j2, j3")


def test_nothing_registered_says_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    assert said(capsys, None, {}) == ""


def test_ctrl_c_stops_gnomon_dev_even_when_sigint_came_in_ignored() -> None:
    """A non-interactive shell starts background jobs (`make run &`, CI's lanes) with SIGINT
    ignored; `gnomon dev` (and the demo) must stop on it all the same."""
    import signal
    import subprocess
    import sys

    code = ("import os, signal, time\n"
            "from gnomon.cli.services import _interrupt_on_signals\n"
            "_interrupt_on_signals()\n"
            "try:\n"
            "    os.kill(os.getpid(), signal.SIGINT)\n"
            "    time.sleep(5)\n"
            "    print('ignored')\n"
            "except KeyboardInterrupt:\n"
            "    print('interrupted')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert out.stdout.strip() == "interrupted", out.stderr[-2000:]
