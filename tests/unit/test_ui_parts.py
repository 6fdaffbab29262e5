"""The web UI's pure parts: the run timeline's layout, the next fire times in a job's zone,
the jobs page's filters, and the session's CSRF token and redirect checks."""

from __future__ import annotations

from typing import Any

import pytest

from gnomon.core.clock import iso_to_ms
from gnomon.ui.filters import JobFilter
from gnomon.ui.session import csrf_for, csrf_ok, safe_next, same_origin
from gnomon.ui.timeline import BLOCK_WIDTH_MAX_PX, COLOURS, LAG_BAND_PX, WIDTH_PX, layout


def run(i: int, status: str, lag: float | None, staged: bool = False) -> dict[str, Any]:
    return {"id": f"j@{i}", "status": status, "staged": staged, "slot": f"2026-01-01T00:00:{i:02d}Z",
            "startLagS": lag}


def test_timeline_is_oldest_first_coloured_by_status_with_lag_bars() -> None:
    newest_first = [run(3, "running", None, staged=True), run(2, "failed", 0.5), run(1, "succeeded", 0.25),
                    run(0, "skipped", None)]
    tl = layout(newest_first)
    assert [b.run_id for b in tl.blocks] == ["j@0", "j@1", "j@2", "j@3"]
    assert [b.status for b in tl.blocks] == ["skipped", "succeeded", "failed", "staged"]
    assert [b.colour for b in tl.blocks] == [COLOURS[s] for s in ("skipped", "succeeded", "failed", "staged")]
    # the largest lag fills the band; the others are in proportion; no start, no bar
    assert [b.lag_height_px for b in tl.blocks] == [0.0, LAG_BAND_PX / 2, LAG_BAND_PX, 0.0]
    assert tl.lag_scale_s == 0.5 and tl.lag_max_s == 0.5 and tl.lag_p50_s == 0.375
    assert (tl.first_slot, tl.last_slot) == ("2026-01-01T00:00:00Z", "2026-01-01T00:00:03Z")
    assert "start lag 0.500 s" in tl.blocks[2].title and "not started" in tl.blocks[3].title
    xs = [b.x_px for b in tl.blocks]
    assert xs == sorted(xs) and all(b.width_px <= BLOCK_WIDTH_MAX_PX for b in tl.blocks)


def test_timeline_fits_many_runs_and_small_lags_stay_small() -> None:
    tl = layout([run(i % 60, "succeeded", 0.001) for i in range(500)])
    assert tl.blocks[-1].x_px + tl.blocks[-1].width_px <= WIDTH_PX + 0.01
    assert all(b.lag_height_px == 1.0 for b in tl.blocks)  # 1 ms of a 100 ms minimum scale: a 1 px mark
    empty = layout([])
    assert empty.blocks == () and empty.lag_p50_s is None and empty.first_slot is None


JOBS = [{"id": "job_a1", "name": "Nightly billing", "status": "active", "target": {"type": "command"}, "pool": "batch"},
        {"id": "job_b2", "name": "hourly report", "status": "paused", "target": {"type": "http"}, "pool": "default"}]


@pytest.mark.parametrize(("params", "ids"), [
    ({}, ["job_a1", "job_b2"]),
    ({"q": "BILL"}, ["job_a1"]),
    ({"q": "b2"}, ["job_b2"]),
    ({"status": "paused"}, ["job_b2"]),
    ({"target": "command"}, ["job_a1"]),
    ({"pool": "default"}, ["job_b2"]),
    ({"status": "paused", "target": "command"}, []),
    ({"status": "bogus", "target": "nope"}, ["job_a1", "job_b2"]),  # unknown values are dropped
])
def test_job_filters(params: dict[str, str], ids: list[str]) -> None:
    flt = JobFilter.of(params)
    assert [j["id"] for j in flt.apply(JOBS)] == ids
    assert flt.active == (params not in ({}, {"status": "bogus", "target": "nope"}))


def test_csrf_token_is_per_token_and_checked_in_constant_time() -> None:
    assert csrf_for("a") != csrf_for("b") and len(csrf_for("a")) == 64
    assert csrf_ok("a", csrf_for("a"))
    assert not csrf_ok("a", csrf_for("b")) and not csrf_ok("a", None) and not csrf_ok("a", "")


def test_origin_and_redirect_checks() -> None:
    assert same_origin(None, "h:1") and same_origin("http://h:1", "h:1") and same_origin("https://H:1", "h:1")
    assert not same_origin("http://evil:1", "h:1") and not same_origin("null", "h:1")
    assert safe_next("/ui/runs/j@x?y=1") == "/ui/runs/j@x?y=1"
    for bad in (None, "", "//evil", "https://evil/ui/", "/v1/jobs", "/ui\\evil", "/ui/x\r\nSet-Cookie: a"):
        assert safe_next(bad) == "/ui/jobs"


def test_the_jobs_list_and_page_of_a_one_time_job_answer_200() -> None:
    """The demo's one-time job has no ``schedule`` key: the list and its page answered 500
    (StrictUndefined) until the templates asked for it with ``get``."""
    from fastapi.testclient import TestClient

    from gnomon.api.app import CommandSink, create_app
    from gnomon.core import jobs as J
    from gnomon.core.clock import FakeClock
    from gnomon.core.model import JobSpec, Schedule, Target, TargetType
    from gnomon.history.memory import InMemoryHistoryStore
    from gnomon.testing import ListProducer
    from gnomon.topology import load_topology
    from gnomon.web.auth import Authenticator

    now = iso_to_ms("2026-05-01T08:00:00Z")
    history, topo = InMemoryHistoryStore(), load_topology()
    spec = JobSpec(name="once", schedule=Schedule(run_at_ms=now + 3_600_000),
                   target=Target(TargetType.HANDLER, handler="h"))
    history.put_job(J.JobState("job_1", "acme", spec, J.JobStatus.ACTIVE, now + 3_600_000, 1, now, now))
    app = create_app(history=history, commands=CommandSink(ListProducer(), topo.job_commands),
                     auth=Authenticator({"tok": "acme"}), topology=topo, clock=FakeClock(now))
    client = TestClient(app, base_url="http://127.0.0.1:8787")
    page = client.post("/ui/login", data={"token": "tok", "next": "/ui/jobs"}, follow_redirects=True)
    assert page.status_code == 200 and "once at 2026-05-01T09:00:00Z" in page.text, page.text[-500:]
    assert client.get("/ui/jobs/job_1").status_code == 200


def test_a_staged_run_is_shown_as_staged_not_as_running() -> None:
    """A run granted ahead of its slot has not started: its badge says ``staged`` (it said
    "running (staged)", issue 23)."""
    from fastapi.testclient import TestClient

    from gnomon.api.app import CommandSink, create_app
    from gnomon.core import jobs as J
    from gnomon.core import runs as R
    from gnomon.core.clock import FakeClock
    from gnomon.core.model import JobSpec, Schedule, Target, TargetType
    from gnomon.history.memory import InMemoryHistoryStore
    from gnomon.testing import ListProducer
    from gnomon.topology import load_topology
    from gnomon.web.auth import Authenticator

    now = iso_to_ms("2026-05-01T08:00:00Z")
    history, topo = InMemoryHistoryStore(), load_topology()
    spec = JobSpec(name="every-minute", schedule=Schedule(cron="* * * * *"), target=Target(TargetType.HANDLER, handler="h"))
    history.put_job(J.JobState("job_1", "acme", spec, J.JobStatus.ACTIVE, now + 60_000, 1, now, now))
    for slot, started in ((now, now + 5), (now + 60_000, None)):
        history.put_run(R.RunState(
            run_id=f"job_1@{slot}", job_id="job_1", tenant="acme", spec=spec, slot_ms=slot, not_before_ms=slot,
            manual=False, status=R.RunStatus.RUNNING, created_at_ms=now - 30_000, updated_at_ms=now, attempt=1,
            token=1, worker_id="w1", lease_until_ms=slot + 30_000, deadline_ms=slot + 90_000,
            started_at_ms=started, attempt_started_at_ms=started))
    app = create_app(history=history, commands=CommandSink(ListProducer(), topo.job_commands),
                     auth=Authenticator({"tok": "acme"}), topology=topo, clock=FakeClock(now + 10))
    client = TestClient(app, base_url="http://127.0.0.1:8787")
    client.post("/ui/login", data={"token": "tok", "next": "/ui/jobs"})
    page = client.get("/ui/jobs/job_1")
    assert page.status_code == 200
    assert '<span class="badge staged"' in page.text and '<span class="badge running">running</span>' in page.text
    assert "(staged)" not in page.text
