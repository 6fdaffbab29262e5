"""The calendar routes (api/calendars.py) over the real app with the processors'
decisions in process: a tenant's calendars are its own, bad input is a problem naming the
field, a job may exclude only calendars its tenant has (the processor decides), the
fire-time preview marks the excluded slots, a calendar in use cannot be deleted, and a
backfill leaves the excluded slots out."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

XMAS = {"timezone": "Europe/London", "dates": ["2099-12-25", {"from": "2099-12-24", "to": "2099-12-26"}]}


def test_a_tenants_calendars_are_its_own_and_bad_input_names_the_field(gnomon_api: Any) -> None:
    client = TestClient(gnomon_api.app)
    put = client.put("/v1/calendars/xmas", json=XMAS, headers=gnomon_api.auth("acme"))
    assert put.status_code == 200, put.text
    assert put.json()["dates"] == [{"from": "2099-12-24", "to": "2099-12-26"}] and put.json()["days"] == 3
    assert client.get("/v1/calendars/xmas", headers=gnomon_api.auth("acme")).json()["timezone"] == "Europe/London"
    assert [c["name"] for c in client.get("/v1/calendars", headers=gnomon_api.auth("acme")).json()["items"]] == [
        "xmas"]
    theirs = client.get("/v1/calendars/xmas", headers=gnomon_api.auth("other"))
    assert theirs.status_code == 404 and theirs.headers["content-type"] == "application/problem+json"
    assert client.get("/v1/calendars", headers=gnomon_api.auth("other")).json()["items"] == []
    for name, body, field in (("xmas", {"dates": ["2099-02-30"]}, "dates[0]"),
                              ("Bad Name", XMAS, "name"),
                              ("xmas", {"dates": [], "tz": "UTC"}, "tz")):
        bad = client.put(f"/v1/calendars/{name}", json=body, headers=gnomon_api.auth("acme"))
        assert bad.status_code == 422 and bad.json()["field"] == field, bad.text
    assert client.get("/v1/calendars/xmas", headers=gnomon_api.auth("acme")).json()["days"] == 3  # unchanged


def test_jobs_exclude_only_known_calendars_and_the_preview_marks_the_excluded_slots(gnomon_api: Any) -> None:
    client = TestClient(gnomon_api.app)
    acme = gnomon_api.auth("acme")
    job = {"name": "daily", "schedule": "0 9 * * *", "timezone": "Europe/London", "excludeCalendars": ["xmas"],
           "target": {"type": "handler", "name": "h"}}
    unknown = client.post("/v1/jobs", json=job, headers=acme)
    assert unknown.status_code == 422 and unknown.json()["field"] == "excludeCalendars[0]", unknown.text
    assert client.put("/v1/calendars/xmas", json=XMAS, headers=acme).status_code == 200
    other = client.put("/v1/calendars/xmas", json={"dates": []}, headers=gnomon_api.auth("other"))
    assert other.status_code == 200  # another tenant's calendar of the same name is another calendar
    created = client.post("/v1/jobs", json=job, headers=acme)
    assert created.status_code == 201, created.text
    job_id = created.json()["id"]
    assert created.json()["excludeCalendars"] == ["xmas"]
    fires = client.get(f"/v1/jobs/{job_id}/fires", params={"after": "2099-12-22T12:00:00Z", "count": 6},
                       headers=acme).json()
    assert [(f["slot"][:10], f["excludedBy"]) for f in fires["fires"]] == [
        ("2099-12-23", None), ("2099-12-24", "xmas"), ("2099-12-25", "xmas"), ("2099-12-26", "xmas"),
        ("2099-12-27", None), ("2099-12-28", None)]
    in_use = client.delete("/v1/calendars/xmas", headers=acme)
    assert in_use.status_code == 409 and job_id in in_use.json()["detail"], in_use.text
    assert client.patch(f"/v1/jobs/{job_id}", json={"excludeCalendars": []}, headers=acme).status_code == 200
    gone = client.delete("/v1/calendars/xmas", headers=acme)
    assert gone.status_code == 200 and gone.json() == {"name": "xmas", "deleted": True}
    assert client.get("/v1/calendars/xmas", headers=acme).status_code == 404
    assert client.get("/v1/calendars/xmas", headers=gnomon_api.auth("other")).status_code == 200
