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
