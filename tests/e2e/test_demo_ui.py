"""The newcomer path (issue 23): the demo started as ``make run`` starts it
(``python -m gnomon.demo.run``: ``gnomon dev`` and its six jobs), then every page of the
web UI over the demo's own jobs in Chromium, signed in with the dev token the demo prints:
the jobs list, the page of each job (a command, a one-time handler job, an HTTP callback,
a job that fails, an interval with maxRuns), a run with its log, the dead letters, the
calendars. Any answer of 500 or more, any
script error and any console error fails the test. A run granted to a worker ahead of
its slot shows "staged", not "running".

The demo runs on an API port of its own; its processor joins the session stack's
consumer group like any other. Its jobs are deleted at the end (the broker outlives the
test).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from harness import Stack, wait_for

from gnomon.client import ApiError, Client
from gnomon.config import load
from gnomon.core.clock import iso_to_ms
from gnomon.tokens import dev_token

pytestmark = pytest.mark.integration

CHROMIUM = os.environ.get("GNOMON_CHROMIUM", "/usr/bin/chromium")
DEMO_API_PORT = int(os.environ.get("GNOMON_TEST_DEMO_API_PORT", "18807"))
DEMO_WAIT_S = 120.0  # the demo up, its jobs registered and their first runs (the failing one: 3 attempts)


class Pages:
    """One signed-in tab; every response and console message is checked."""

    def __init__(self, page: Any, base: str) -> None:
        self.page, self.base = page, base
        self.errors: list[str] = []
        page.on("pageerror", lambda exc: self.errors.append(f"script error: {exc}"))
        page.on("console", lambda m: self.errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
        page.on("response", lambda r: self.errors.append(f"{r.status} from {r.url}") if r.status >= 500 else None)
        page.set_default_timeout(15_000)

    def open(self, path: str) -> str:
        resp = self.page.goto(self.base + path)
        assert resp is not None and resp.status == 200, (path, resp and resp.status)
        self.page.wait_for_load_state("networkidle")
        return str(self.page.content())


@pytest.fixture
def demo(stack: Stack, tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """The demo as `make run` starts it; (its API's URL, demo job name -> job id)."""
    env = {k: v for k, v in os.environ.items() if k not in ("GNOMON_API_TOKENS", "GNOMON_API_URL", "GNOMON_TOKEN")}
    env.update({"GNOMON_API_PORT": str(DEMO_API_PORT), "PYTHONUNBUFFERED": "1", "COLUMNS": "200"})
    out = tmp_path / "demo.log"
    with open(out, "wb") as f:
        proc = subprocess.Popen([sys.executable, "-m", "gnomon.demo.run", "--duration-s", "600"], env=env,
                                stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{DEMO_API_PORT}"
    ids: dict[str, str] = {}
    try:
        def registered() -> bool:
            if proc.poll() is not None:
                pytest.fail("the demo exited:\n" + out.read_text(errors="replace")[-3000:])
            found = re.search(r"registered 6 demo jobs: (\S+), (\S+), (\S+), (\S+), (\S+), (\S+)",
                              out.read_text(errors="replace"))
            if found:
                names = ("command", "one-time", "http", "fails", "interval", "dependency")
                ids.update(zip(names, found.groups(), strict=True))
            return bool(found)

        wait_for(registered, 90, "the demo's jobs")
        yield url, ids
    finally:
        # as a terminal's Ctrl-C (to the demo's process group; `gnomon dev` runs in a group
        # of its own): the demo deletes its jobs while the API still answers, then stops
        interrupted = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(45)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        stopped_s = time.monotonic() - interrupted
        print(f"\ndemo stopped {stopped_s:.1f} s after Ctrl-C; its output in {out}; "
              f"`gnomon dev` logs in {load().state_dir / 'logs'}")
        said = out.read_text(errors="replace")
        if ids and "deleted the 6 demo jobs" not in said:
            pytest.fail("Ctrl-C did not delete the demo's jobs:\n" + said[-1500:])


def test_every_ui_page_over_the_demos_own_jobs(demo: tuple[str, dict[str, str]]) -> None:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: `make testdeps` (as root) installs Debian's chromium")
    from playwright.sync_api import sync_playwright

    url, ids = demo
    token = dev_token(load())
    client = Client(url, token)

    def runs(job: str) -> list[dict[str, Any]]:
        try:
            return list(client.list_runs(ids[job], limit=20)["items"])
        except ApiError:  # history has not caught up with a new job yet
            return []

    # what the pages must show: a finished run of each repeating job, the failing one's dead
    # letter, and the one-time job's run granted ahead of its slot (lookahead 30 s)
    wait_for(lambda: any(r["status"] == "succeeded" for r in runs("command")), DEMO_WAIT_S, "a command run")
    wait_for(lambda: any(r["status"] == "succeeded" for r in runs("http")), DEMO_WAIT_S, "an HTTP run")
    wait_for(lambda: any(r["status"] == "failed" for r in runs("fails")), DEMO_WAIT_S, "a dead letter")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-gpu"])
        try:
            tab = Pages(browser.new_context(viewport={"width": 1280, "height": 900}).new_page(), url)
            tab.open("/ui/jobs")
            assert "/ui/login" in tab.page.url
            tab.page.fill("#token", token)
            tab.page.click("#sign-in")
            tab.page.wait_for_url(re.compile(r".*/ui/jobs$"))
            listing = tab.open("/ui/jobs")
            for job_id in ids.values():
                assert job_id in listing, f"{job_id} is not on the jobs list"
            for job, job_id in ids.items():
                page = tab.open(f"/ui/jobs/{job_id}")
                assert job_id in page, job
            # the one-time job's run, granted ahead of its slot: "staged" on its job page, not
            # "running" (checked while the API still says so after the page was read)
            before = wait_for(lambda: runs("one-time"), 60, "the one-time job's run (granted 30 s ahead)")
            tab.open(f"/ui/jobs/{ids['one-time']}")
            rows = tab.page.locator("#run-table tbody tr[data-run-id]")
            shown = [str(rows.nth(i).inner_text()) for i in range(rows.count())]
            after = runs("one-time")
            if before[0]["staged"] and after and after[0]["staged"]:  # staged all along the page's read
                assert shown and "staged" in shown[0] and "running" not in shown[0], shown
            print(f"one-time job's run: API {before[0]['status']} (staged {before[0]['staged']}), "
                  f"on its page {shown[:1]}")
            done = next(r for r in runs("command") if r["status"] == "succeeded")
            page = tab.open(f"/ui/runs/{done['id']}")
            assert done["id"] in page
            wait_for(lambda: "tick" in tab.open(f"/ui/runs/{done['id']}"), 30, "the run's log lines on its page")
            dead = tab.open("/ui/dead-letters")
            assert ids["fails"] in dead, "the failing job's dead letter is not listed"
            # the interval job's page: its schedule in words and its bounded fire times
            tab.open(f"/ui/jobs/{ids['interval']}")
            words = str(tab.page.locator("#schedule-words").inner_text())
            assert "every 20s" in words and "at most 6 runs" in words, words
            fires = tab.page.locator("#fires tbody tr").count()
            assert 1 <= fires <= 6, fires
            # the dependency's page links its upstream; a run of it ran after the command's
            dep = tab.open(f"/ui/jobs/{ids['dependency']}")
            assert f"/ui/jobs/{ids['command']}" in dep and "runs after" in dep, "the upstream is not linked"
            ran = wait_for(lambda: [r for r in runs("dependency") if r["status"] == "succeeded"], 60,
                           "a run of the dependent job")
            up = next(r for r in runs("command") if r["slot"] == ran[0]["slot"])
            assert up["status"] == "succeeded" and iso_to_ms(up["finishedAt"]) <= iso_to_ms(ran[0]["startedAt"]), (
                up, ran[0])
            cal = tab.open("/ui/calendars")
            assert "Calendars" in cal
            assert tab.errors == [], tab.errors
        finally:
            browser.close()
    assert httpx.get(url + "/healthz", timeout=5).status_code == 200
