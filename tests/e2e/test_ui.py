"""The web UI (/ui) in a real headless Chromium (Debian's /usr/bin/chromium, driven by
Playwright) on the real stack: API -> Kafka -> processor -> worker -> projector ->
Cassandra -> API -> the browser.

Tenant A signs in, creates jobs with the UI's form, sees their runs appear on the job
page (timeline and table), opens a run and sees its log lines, follows a running run's
log live, pauses, resumes, backfills and cancels from the buttons, and replays a dead
letter; tenant B sees none of it (an empty listing, 404 on direct URLs). Screenshots of
every page go to the pytest tmp dir (printed); with GNOMON_UI_DOCS_SCREENSHOT=PATH the job
page is also saved there (how docs/img/ui-job.png was made).

The session stack's processor and projector do the work; this module starts its own API
(port 18797, tokens of two tenants new on every run, so their listings hold only what
this module made) and a worker serving tenant A.
"""

from __future__ import annotations

import os
import re
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import NEVER_DUE, Stack, own_stack, wait_for, wait_healthy

from gnomon.client import Client

pytestmark = pytest.mark.integration

CHROMIUM = os.environ.get("GNOMON_CHROMIUM", "/usr/bin/chromium")
RUN_WAIT_S = 45.0  # a run of a new job: registration, staging, the run, history, the page's refresh
VIEWPORT = {"width": 1280, "height": 900}
UI_API_PORT = int(os.environ.get("GNOMON_TEST_UI_API_PORT", "18797"))


class Tenants:
    def __init__(self, url: str, tag: str) -> None:
        self.url = url
        self.a, self.b = f"ui{tag}", f"ui{tag}-b"
        self.token_a, self.token_b = f"test-token-ui-a-{tag}", f"test-token-ui-b-{tag}"
        self.client = Client(url, self.token_a)


@pytest.fixture(scope="module")
def tenants(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tenants]:
    """An API and a worker of this module's own, on the session stack's processor and projector."""

    tag = secrets.token_hex(3)
    logs = tmp_path_factory.mktemp("ui-stack-logs")
    t = Tenants(f"http://127.0.0.1:{UI_API_PORT}", tag)
    policy = logs / "worker-policy.toml"
    policy.write_text(f'tenants = ["{t.a}"]\n\n[commands]\nenabled = true\nexecutables = ["sh", "true"]\n')
    st = own_stack(logs, {"GNOMON_API_TOKENS": f"{t.token_a}:{t.a},{t.token_b}:{t.b}"})
    st.start("api", "api", "--port", str(UI_API_PORT))
    st.start("worker", "worker", "--worker-id", f"e2e-ui-{tag}", "--concurrency", "8", "--tenant", t.a,
             "--policy", str(policy))
    try:
        wait_healthy(st, t.url, "the UI test's API")
        yield t
    finally:
        for name in list(st.procs):
            st.stop(name)
        print(f"\nUI test's API and worker logs in {logs}")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: `make testdeps` (as root) installs Debian's chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-gpu"])
        yield b
        b.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    d = tmp_path_factory.mktemp("ui-screenshots")
    yield d
    print(f"\nUI screenshots in {d}: {', '.join(sorted(p.name for p in d.iterdir()))}")


class Ui:
    """A browser tab signed in to the UI, failing the test on any script error."""

    def __init__(self, page: Any, base: str, shots: Path) -> None:
        self.page, self.base, self.shots = page, base, shots
        self.errors: list[str] = []
        self.created: list[str] = []  # job ids, deleted after the test (the broker outlives it)
        page.on("pageerror", lambda exc: self.errors.append(str(exc)))
        page.set_default_timeout(15_000)

    def goto(self, path: str) -> Any:
        return self.page.goto(self.base + path)

    def sign_in(self, token: str, tenant: str) -> None:
        self.goto("/ui/jobs")
        assert "/ui/login" in self.page.url, "the UI served a page without signing in"
        self.page.fill("#token", token)
        self.page.click("#sign-in")
        self.page.wait_for_url(re.compile(r".*/ui/jobs$"))
        assert self.page.inner_text("#tenant") == tenant

    def shot(self, name: str) -> Path:
        path = self.shots / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path

    def create_job(self, name: str, argv: list[str], *, schedule: str, attempts: int = 1, tz: str = "UTC",
                   after: list[str] | None = None) -> str:
        """Fill the jobs page's form; the job page it lands on; returns the job id.
        ``schedule`` "" with ``after``: no schedule of its own."""
        self.goto("/ui/jobs")
        if self.page.locator("#new-job[open]").count() == 0:
            self.page.click("#new-job summary")
        form = self.page.locator("#create-job")
        form.locator("input[name=name]").fill(name)
        if after:
            form.locator("input[name=after]").fill(", ".join(after))
        if schedule:
            form.locator("input[name=schedule]").fill(schedule)
        else:
            form.locator("input[name=when][value=after]").check()
        form.locator("input[name=timezone]").fill(tz)
        form.locator("select[name=targetType]").select_option("command")
        form.locator("textarea[name=argv]").fill("\n".join(argv))
        form.locator("input[name=retryMax]").fill(str(attempts))
        form.locator("input[name=timeoutS]").fill("60")
        self.page.click("#create")
        self.page.wait_for_url(re.compile(r".*/ui/jobs/job_[0-9a-f]+$"))
        job_id = self.page.inner_text("#job-id")
        self.created.append(str(job_id))
        assert self.page.inner_text("h1").startswith(name)
        return str(job_id)

    def act(self, target: Any, expect: str) -> str:
        """Click ``target`` (a selector or a locator) and wait for the flash message it
        gives, containing ``expect``; an error message fails the test at once."""
        self.page.evaluate("document.getElementById('flash').hidden = true; document.getElementById('flash').textContent = ''")
        (self.page.locator(target) if isinstance(target, str) else target).click()
        self.page.wait_for_selector("#flash:not([hidden])")
        text = str(self.page.inner_text("#flash"))
        assert expect in text and self.page.locator("#flash.error").count() == 0, text
        return text

    def trigger(self) -> str:
        """Press "Trigger now" on a job page; the manual run's id."""
        found = re.search(r"\((.+@manual:ui-[0-9a-f]+)\)", self.act("#trigger", "triggered"))
        assert found
        return found.group(1)

    def run_rows(self, status: str | None = None) -> Any:
        sel = "#run-table tbody tr[data-run-id]" + (f'[data-status="{status}"]' if status else "")
        return self.page.locator(sel)

    def wait_rows(self, status: str, count: int, timeout_s: float = RUN_WAIT_S) -> None:
        """The job page refreshes its runs by itself: no reload here."""
        wait_for(lambda: self.run_rows(status).count() >= count, timeout_s, f"{count} {status} run(s) on the job page")


@pytest.fixture
def ui(tenants: Tenants, browser: Any, shots: Path) -> Iterator[Ui]:
    context = browser.new_context(viewport=VIEWPORT)
    u = Ui(context.new_page(), tenants.url, shots)
    yield u
    context.close()
    for job_id in u.created:
        tenants.client.delete(job_id)
    assert u.errors == [], f"script errors in the UI: {u.errors}"


def test_create_a_job_see_runs_and_logs_pause_resume_backfill(ui: Ui, tenants: Tenants) -> None:
    ui.sign_in(tenants.token_a, tenants.a)
    tag = secrets.token_hex(3)
    job_id = ui.create_job(f"ui-every-2s-{tag}", ["sh", "-c", f"echo ui-hello-{tag}; echo ui-bye-{tag} >&2"],
                           schedule="*/2 * * * * *", tz="America/New_York")
    # the definition, and the next 10 fire times in the job's zone (every 2 s)
    assert f'"id": "{job_id}"' in ui.page.inner_text("#definition")
    fires = ui.page.locator("#fires tbody tr").all_inner_texts()
    assert len(fires) == 10, fires
    stamps = [re.search(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)", f) for f in fires]
    seconds = [int(m.group(1)[17:19]) for m in stamps if m]
    assert len(seconds) == 10 and all(s % 2 == 0 for s in seconds), fires
    assert all(re.search(r" E[SD]T\t", f) for f in fires), fires  # wall time in New York

    # runs appear on their own: the table and the timeline, coloured by status, with start lags
    ui.wait_rows("succeeded", 4)
    assert ui.page.locator('#timeline g.run[data-status="succeeded"]').count() >= 4
    assert ui.page.locator("#timeline g.run rect.lag").count() >= 4  # a lag bar per started run
    assert re.search(r"p50 \d+\.\d{3} s", ui.page.inner_text("figcaption"))
    lag = ui.run_rows("succeeded").first.locator("td").nth(4).inner_text()
    assert re.fullmatch(r"-?\d+\.\d{3} s", lag), lag
    ui.shot("job")
    if os.environ.get("GNOMON_UI_DOCS_SCREENSHOT"):  # the picture in docs/ui.md: more runs, one screen
        ui.wait_rows("succeeded", 12)
        ui.page.screenshot(path=os.environ["GNOMON_UI_DOCS_SCREENSHOT"])

    # a run's page and its log lines, both streams
    ui.run_rows("succeeded").first.locator("a").first.click()
    ui.page.wait_for_url(re.compile(r".*/ui/runs/.+"))
    assert ui.page.inner_text("#run-status") == "succeeded"
    wait_for(lambda: f"ui-bye-{tag}" in ui.page.inner_text("#logs"), 10, "the run's stderr line")
    logs = ui.page.inner_text("#logs")
    assert f"stdout ui-hello-{tag}" in logs and f"stderr ui-bye-{tag}" in logs, logs
    ui.shot("run")

    # pause: the job page shows it paused, and no new run starts
    ui.page.click("#job-link")
    ui.page.click("#pause")
    ui.page.wait_for_selector("#resume", timeout=20_000)  # reloaded once history shows it paused
    assert ui.page.inner_text("#job-status") == "paused"
    time.sleep(1.5)  # runs already staged may still finish
    ui.page.reload()
    before = {r.get_attribute("data-run-id") for r in ui.run_rows().all()}
    time.sleep(5)
    ui.page.reload()
    started = {r.get_attribute("data-run-id") for r in ui.run_rows().all()} - before
    new_succeeded = [rid for rid in started
                     if ui.page.locator(f'#run-table tr[data-run-id="{rid}"]').get_attribute("data-status") == "succeeded"]
    assert new_succeeded == [], f"runs succeeded while paused: {new_succeeded}"
    ui.shot("job-paused")
    ui.page.click("#resume")
    ui.page.wait_for_selector("#pause", timeout=20_000)
    assert ui.page.inner_text("#job-status") == "active"


def test_a_job_after_its_upstream_only_is_made_and_runs_from_the_form(ui: Ui, tenants: Tenants) -> None:
    """The form's "after its upstreams only": a job with no schedule of its own, listed
    as such, whose runs follow its upstream's slot by slot."""
    ui.sign_in(tenants.token_a, tenants.a)
    tag = secrets.token_hex(3)
    up = ui.create_job(f"ui-up-{tag}", ["true"], schedule="*/2 * * * * *")
    down = ui.create_job(f"ui-down-{tag}", ["sh", "-c", f"echo after-{tag}"], schedule="", after=[up])
    words = ui.page.inner_text("#schedule-words")
    assert f"after each run of {up}" in words, words
    ui.wait_rows("succeeded", 2)
    slots = [r.get_attribute("data-run-id") for r in ui.run_rows("succeeded").all()]
    assert all(str(s).startswith(f"{down}@") for s in slots), slots
    ui.goto("/ui/jobs")
    row = ui.page.locator("tr", has_text=f"ui-down-{tag}").first.inner_text()
    assert f"after each run of {up}" in row, row


def test_backfill_trigger_cancel_and_a_live_log_tail(ui: Ui, tenants: Tenants) -> None:
    ui.sign_in(tenants.token_a, tenants.a)
    tag = secrets.token_hex(3)
    # backfill from the job page's form: a job paused at once and resumed some seconds
    # later has slots of its own, recorded skipped, which the backfill reopens (a backfill
    # reaches no slot before the job existed: issue 24)
    ui.create_job(f"ui-backfill-{tag}", ["sh", "-c", f"echo backfilled-{tag}"], schedule="*/3 * * * * *")
    created = int(time.time()) - 1
    ui.page.click("#pause")
    ui.page.wait_for_selector("#resume", timeout=20_000)
    time.sleep(8)  # two or three slots of the job's, skipped while it is paused
    ui.page.click("#resume")
    ui.page.wait_for_selector("#pause", timeout=20_000)
    resumed = int(time.time())
    ui.wait_rows("skipped", 1)  # the paused slots, once history has them
    skipped = {r.get_attribute("data-run-id") for r in ui.run_rows("skipped").all()}
    ui.page.fill("#backfill input[name=from]", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(created)))
    ui.page.fill("#backfill input[name=to]", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(resumed)))
    flash = ui.act("#backfill button", "backfill:")
    found = re.search(r"backfill: (\d+) slots, (\d+) new runs, (\d+) already run", flash)
    assert found, flash
    slots, new, already = map(int, found.groups())
    assert new >= 1 and slots == new + already, flash
    # a slot recorded skipped ran once reopened
    wait_for(lambda: any(ui.page.locator(f'#run-table tr[data-run-id="{rid}"][data-status="succeeded"]').count()
                         for rid in skipped), 60, "a reopened slot succeeded")
    ui.page.click("#pause")  # (its every-3-seconds runs are done with)
    ui.page.wait_for_selector("#resume", timeout=20_000)

    job_id = ui.create_job(f"ui-hourly-{tag}", ["sh", "-c", f"echo first-{tag}; sleep 8; echo second-{tag}"],
                           schedule="0 * * * *")

    # trigger now, open the run while it runs: its log follows without a reload
    run_id = ui.trigger()
    row = ui.page.locator(f'#run-table tr[data-run-id="{run_id}"]')
    wait_for(lambda: row.count() == 1 and row.get_attribute("data-status") == "running", RUN_WAIT_S,
             "the manual run running on the job page")
    row.locator("a").first.click()
    ui.page.wait_for_url(re.compile(r".*/ui/runs/.+"))
    wait_for(lambda: f"stdout first-{tag}" in ui.page.inner_text("#logs"), 10, "the first line, live")
    assert ui.page.inner_text("#run-status") == "running" and f"stdout second-{tag}" not in ui.page.inner_text("#logs")
    ui.shot("run-live")
    wait_for(lambda: f"stdout second-{tag}" in ui.page.inner_text("#logs"), 20, "the second line, live")
    wait_for(lambda: ui.page.inner_text("#run-status") == "succeeded", 20, "the run's end, live")

    # cancel a run from the run page
    ui.page.click("#job-link")
    second = ui.trigger()
    row = ui.page.locator(f'#run-table tr[data-run-id="{second}"]')
    wait_for(lambda: row.count() == 1, RUN_WAIT_S, "the second manual run on the job page")
    ui.act(row.locator("button", has_text="Cancel"), "cancel requested")
    wait_for(lambda: row.get_attribute("data-status") == "cancelled", 30, "the run cancelled")
    assert job_id in ui.page.url


def test_a_dead_letter_is_replayed_from_the_ui(ui: Ui, tenants: Tenants) -> None:
    ui.sign_in(tenants.token_a, tenants.a)
    tag = secrets.token_hex(3)
    ui.create_job(f"ui-failing-{tag}", ["sh", "-c", f"echo failing-{tag}; exit 1"], schedule=NEVER_DUE)
    run_id = ui.trigger()
    ui.wait_rows("failed", 1)

    def dead_row() -> Any:
        ui.goto("/ui/dead-letters")
        row = ui.page.locator(f'#dead-letters tr[data-run-id="{run_id}"]')
        return row if row.count() == 1 else None

    row = wait_for(dead_row, 30, "the failed run among the dead letters", interval_s=1)
    assert row.locator("td.replays").inner_text() == "0"
    assert "exit" in row.inner_text().lower(), row.inner_text()
    ui.shot("dead-letters")
    ui.act(row.locator("button", has_text="Replay"), "replay requested")
    # the replay ran (and failed again, with a fresh budget): back in the list, replayed once
    replayed = wait_for(lambda: (r := dead_row()) is not None and r.locator("td.replays").inner_text() == "1" and r,
                        45, "the replayed run dead-lettered again", interval_s=1)
    assert replayed
    ui.goto(f"/ui/runs/{run_id}")
    assert ui.page.inner_text('#run-fields td[data-field="replays"]') == "1"
    assert ui.page.inner_text('#run-fields td[data-field="attempt"]') == "2"
    assert ui.page.locator("#logs").inner_text().count(f"stdout failing-{tag}") == 2  # one line per attempt


def test_tenant_b_cannot_see_tenant_a(ui: Ui, tenants: Tenants, browser: Any) -> None:
    ui.sign_in(tenants.token_a, tenants.a)
    tag = secrets.token_hex(3)
    job_id = ui.create_job(f"ui-secret-{tag}", ["true"], schedule=NEVER_DUE)
    run_id = ui.trigger()
    ui.wait_rows("succeeded", 1)

    other = browser.new_context(viewport=VIEWPORT)
    try:
        b = Ui(other.new_page(), tenants.url, ui.shots)
        b.sign_in(tenants.token_b, tenants.b)
        listing = b.page.inner_text("#jobs")
        assert job_id not in listing and f"ui-secret-{tag}" not in listing
        assert b.page.locator("#no-jobs").count() == 1, listing  # none of A's jobs: B has none
        b.shot("tenant-other-jobs")
        for path in (f"/ui/jobs/{job_id}", f"/ui/jobs/{job_id}/runs", f"/ui/runs/{run_id}"):
            resp = b.goto(path)
            assert resp.status == 404, (path, resp.status)
            assert f"ui-secret-{tag}" not in b.page.content()
        b.goto("/ui/dead-letters")
        assert run_id not in b.page.inner_text("#dead-letters")
        assert b.page.locator("#no-dead-letters").count() == 1
        # the pages' JSON API with B's own cookie and CSRF token: A's job is not found
        status = b.page.evaluate(
            """async (path) => (await fetch(path, {method: "POST", headers: {"X-CSRF-Token":
                 document.querySelector('meta[name="csrf"]').content}})).status""",
            f"/ui/api/v1/jobs/{job_id}:pause")
        assert status == 404
        assert b.errors == []
    finally:
        other.close()
    # and A still has it, active (B's pause did nothing)
    ui.goto(f"/ui/jobs/{job_id}")
    assert ui.page.inner_text("#job-status") == "active"
