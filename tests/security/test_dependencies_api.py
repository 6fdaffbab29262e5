"""``after`` through the real app with the processors' decisions in process (issue 25):
upstreams must be jobs of the tenant (another tenant's is "no job"), a cycle is refused
naming it, bad input names the field, a batch refuses dependencies, and the job view
shows a job's upstreams and (once its partition has heard) its downstreams."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient


def job(name: str, **more: Any) -> dict[str, Any]:
    return {"name": name, "schedule": "0 9 * * *", "target": {"type": "handler", "name": "h"}, **more}


def test_upstreams_are_the_tenants_jobs_and_a_cycle_is_refused_naming_it(gnomon_api: Any) -> None:
    client = TestClient(gnomon_api.app)
    acme, other = gnomon_api.auth("acme"), gnomon_api.auth("other")
    extract = client.post("/v1/jobs", json=job("extract"), headers=acme).json()["id"]
    theirs = client.post("/v1/jobs", json=job("theirs"), headers=other).json()["id"]
    load = client.post("/v1/jobs", json=job("load", after=[{"job": extract}], waitMaxS=7200), headers=acme)
    assert load.status_code == 201, load.text
    assert load.json()["after"] == [{"job": extract, "on": "succeeded"}] and load.json()["waitMaxS"] == 7200
    load_id = load.json()["id"]
    for body, field in ((job("x", after=[{"job": theirs}]), "after[0].job"),  # not acme's: no such job
                        (job("x", after=[{"job": "nope"}]), "after[0].job"),
                        (job("x", after=[{"job": extract, "on": "sometimes"}]), "after[0].on"),
                        (job("x", after=[extract, extract]), "after[1].job"),
                        (job("x", after=[{"job": extract, "when": 1}]), "after[0].when"),
                        (job("x", after=[extract], waitMaxS=0), "waitMaxS")):
        bad = client.post("/v1/jobs", json=body, headers=acme)
        assert bad.status_code == 422 and bad.headers["content-type"] == "application/problem+json", bad.text
        assert bad.json()["field"] == field, bad.text
    cycle = client.patch(f"/v1/jobs/{extract}", json={"after": [{"job": load_id}]}, headers=acme)
    assert cycle.status_code == 422 and cycle.json()["field"] == "after[0].job", cycle.text
    assert f"closes a cycle: {extract} -> {load_id} -> {extract}" in cycle.json()["detail"]
    batch = client.post("/v1/jobs:batch", json={"jobs": [job("b", after=[extract])]}, headers=acme)
    assert batch.status_code in (200, 207), batch.text
    assert "after" in batch.text and "POST /v1/jobs" in batch.text
    # the upstream's partition heard of its downstream (processors in process: at once)
    assert client.get(f"/v1/jobs/{extract}", headers=acme).json().get("downstreams") == [load_id]


def test_the_job_page_links_its_upstreams_and_downstreams(gnomon_api: Any) -> None:
    from test_ui import Browser

    acme = Browser(gnomon_api.app, gnomon_api.tokens["acme"])
    up = acme.api("POST", "/v1/jobs", json=job("up")).json()["id"]
    down = acme.api("POST", "/v1/jobs", json=job("down", after=[{"job": up, "on": "finished"}], waitMaxS=600))
    assert down.status_code == 201, down.text
    page = acme.client.get(f"/ui/jobs/{down.json()['id']}")
    assert page.status_code == 200 and 'id="upstreams"' in page.text
    assert f'href="/ui/jobs/{up}">{up}</a> (finished)' in page.text and "at most 600 s" in page.text
    page = acme.client.get(f"/ui/jobs/{up}")
    assert f'href="/ui/jobs/{down.json()["id"]}"' in page.text and 'id="downstreams"' in page.text


def test_a_job_with_no_schedule_of_its_own_runs_after_its_upstreams(gnomon_api: Any) -> None:
    """No schedule, every nor runAt, with ``after``: the job runs after each run of its
    upstreams. Bounds and a backfill need a schedule of its own (4xx naming the field);
    no schedule and no ``after`` is refused naming ``schedule``; the view, the page and a
    patch that gives it a schedule all agree."""
    from test_ui import Browser

    client = TestClient(gnomon_api.app)
    acme = gnomon_api.auth("acme")
    extract = client.post("/v1/jobs", json=job("extract"), headers=acme).json()["id"]
    bare = {"name": "load", "target": {"type": "handler", "name": "h"}}
    made = client.post("/v1/jobs", json={**bare, "after": [{"job": extract}]}, headers=acme)
    assert made.status_code == 201, made.text
    view = made.json()
    assert not {"schedule", "every", "runAt"} & set(view), view
    assert view["status"] == "active" and view["nextRunAt"] is None, view
    got = client.get(f"/v1/jobs/{view['id']}", headers=acme).json()
    assert got["after"] == [{"job": extract, "on": "succeeded"}] and "schedule" not in got, got
    fires = client.get(f"/v1/jobs/{view['id']}/fires", headers=acme).json()
    assert fires["fires"] == [] and "no schedule of its own" in fires["ends"], fires
    assert fires["schedule"] == f"after each run of {extract} (no schedule of its own)", fires
    for body, field in (({**bare}, "schedule"),  # neither a schedule nor after
                        ({**bare, "after": [extract], "maxRuns": 3}, "maxRuns"),
                        ({**bare, "after": [extract], "from": "2026-01-01T00:00:00Z"}, "schedule")):
        bad = client.post("/v1/jobs", json=body, headers=acme)
        assert bad.status_code == 422 and bad.headers["content-type"] == "application/problem+json", bad.text
        assert bad.json()["field"] == field, bad.text
    backfill = client.post(f"/v1/jobs/{view['id']}:backfill",
                           json={"from": "2026-01-01T00:00:00Z", "to": "2026-01-02T00:00:00Z"}, headers=acme)
    assert backfill.status_code in (409, 422) and "no schedule of its own" in backfill.text, backfill.text
    page = Browser(gnomon_api.app, gnomon_api.tokens["acme"]).client.get(f"/ui/jobs/{view['id']}")
    assert page.status_code == 200 and f"after each run of {extract}" in page.text, page.text[:2000]
    patched = client.patch(f"/v1/jobs/{view['id']}", json={"schedule": "30 9 * * *"}, headers=acme)
    assert patched.status_code == 200 and patched.json()["schedule"] == "30 9 * * *", patched.text
