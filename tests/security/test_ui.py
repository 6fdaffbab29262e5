"""The web UI (/ui) as an attacker sees it: sign-in by cookie only (never a bearer
header on /ui, never the cookie on /v1), CSRF on everything the pages' scripts send,
tenant isolation on every page, fragment and the pages' JSON API, escaping, headers, no
open redirect. The real app over the in-memory history (conftest.py); the browser test
on the real stack is tests/e2e/test_ui.py."""

from __future__ import annotations

import re
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gnomon.core.clock import SystemClock
from gnomon.core.messages import LogLine, LogStream
from gnomon.core.runs import RunState, RunStatus
from gnomon.ui.session import COOKIE, csrf_for

JOB = {"name": "acme-<script>alert(1)</script>", "schedule": "*/5 * * * * *", "timezone": "Europe/Paris",
       "target": {"type": "command", "argv": ["true"]}}

# Every /ui route, by what guards it. Checked against app.routes below.
PUBLIC = {("GET", "/ui/login"), ("POST", "/ui/login"), ("GET", "/ui/static/{name}"), ("GET", "/ui")}
PAGES_BY_ID = {("GET", "/ui/jobs/{job_id}"): "job", ("GET", "/ui/jobs/{job_id}/runs"): "job",
               ("GET", "/ui/runs/{run_id}"): "run", ("GET", "/ui/runs/{run_id}/tail"): "run"}
LISTINGS = {("GET", "/ui/jobs"), ("GET", "/ui/dead-letters"), ("GET", "/ui/calendars")}
SESSION = {("POST", "/ui/logout")}
PROXY = {(m, "/ui/api/v1/{rest:path}") for m in ("GET", "POST", "PUT", "PATCH", "DELETE")}


def _ui_routes(app: Any) -> set[tuple[str, str]]:
    return {(m, r.path) for r in app.routes for m in (getattr(r, "methods", None) or ()) if r.path.startswith("/ui")}


class Browser:
    """A TestClient as a browser: cookies kept, Origin of the site itself."""

    def __init__(self, app: Any, token: str | None = None) -> None:
        self.client = TestClient(app, base_url="http://testserver", follow_redirects=False)
        self.token = token
        if token is not None:
            r = self.client.post("/ui/login", data={"token": token}, headers={"Origin": "http://testserver"})
            assert r.status_code == 303, r.text

    @property
    def csrf(self) -> str:
        assert self.token is not None
        return csrf_for(self.token)

    def api(self, method: str, path: str, **kwargs: Any) -> Any:
        headers = {"X-CSRF-Token": self.csrf, "Origin": "http://testserver", **kwargs.pop("headers", {})}
        return self.client.request(method, "/ui/api" + path, headers=headers, **kwargs)


@pytest.fixture
def world(gnomon_api: Any) -> dict[str, Any]:
    """acme's job (created through the UI's JSON API), a failed run of it with a log line."""
    acme = Browser(gnomon_api.app, gnomon_api.tokens["acme"])
    r = acme.api("POST", "/v1/jobs", json=JOB, headers={"Idempotency-Key": "ui-1"})
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    spec = gnomon_api.history.get_job(job_id).spec
    now = SystemClock().now_ms()
    run_id = f"{job_id}@manual:k"
    gnomon_api.history.put_run(RunState(run_id, job_id, "acme", spec, now, now, True, RunStatus.FAILED, now, now,
                                        attempt=1, started_at_ms=now + 7, finished_at_ms=now + 9,
                                        error="secret error"))
    gnomon_api.history.put_log(LogLine(run_id, job_id, "acme", 1, 1, LogStream.STDOUT, "secret line", now))
    gnomon_api.producer.sent.clear()
    return {"acme": acme, "other": Browser(gnomon_api.app, gnomon_api.tokens["other"]), "job": job_id, "run": run_id}


def _url(path: str, world: dict[str, Any]) -> str:
    return path.replace("{job_id}", world["job"]).replace("{run_id}", world["run"])


def test_every_ui_route_is_in_the_matrix(gnomon_api: Any) -> None:
    covered = PUBLIC | set(PAGES_BY_ID) | LISTINGS | SESSION | PROXY
    assert _ui_routes(gnomon_api.app) == covered


def test_ui_routes_are_not_in_the_openapi_contract(gnomon_api: Any) -> None:
    assert not [p for p in gnomon_api.app.openapi()["paths"] if p.startswith("/ui")]


def test_sign_in_sets_a_strict_httponly_cookie_for_ui_only(gnomon_api: Any) -> None:
    client = TestClient(gnomon_api.app, follow_redirects=False)
    r = client.post("/ui/login", data={"token": gnomon_api.tokens["acme"], "next": "/ui/dead-letters"})
    assert r.status_code == 303 and r.headers["location"] == "/ui/dead-letters"
    cookie = r.headers["set-cookie"]
    assert cookie.startswith(f"{COOKIE}=") and "HttpOnly" in cookie and "Path=/ui" in cookie
    assert "samesite=strict" in cookie.lower()


@pytest.mark.parametrize("token", ["", "nope", "x" * 600])
def test_a_wrong_token_does_not_sign_in(gnomon_api: Any, token: str) -> None:
    r = TestClient(gnomon_api.app, follow_redirects=False).post("/ui/login", data={"token": token})
    assert r.status_code == 401 and "set-cookie" not in r.headers
    assert 'id="login-error"' in r.text


def test_sign_in_from_another_origin_is_refused(gnomon_api: Any) -> None:
    r = TestClient(gnomon_api.app, follow_redirects=False).post(
        "/ui/login", data={"token": gnomon_api.tokens["acme"]}, headers={"Origin": "http://evil.example"})
    assert r.status_code == 403 and "set-cookie" not in r.headers


@pytest.mark.parametrize("target", ["//evil.example/x", "https://evil.example/", "/v1/jobs", "/ui\\..\\x",
                                    "/ui/jobs\r\nSet-Cookie: a=b"])
def test_no_open_redirect_after_sign_in(gnomon_api: Any, target: str) -> None:
    r = TestClient(gnomon_api.app, follow_redirects=False).post(
        "/ui/login", data={"token": gnomon_api.tokens["acme"], "next": target})
    assert r.status_code == 303 and r.headers["location"] == "/ui/jobs"


def test_pages_need_the_cookie_not_a_bearer_header(gnomon_api: Any, world: dict[str, Any]) -> None:
    client = TestClient(gnomon_api.app, follow_redirects=False)
    bearer = gnomon_api.auth("acme")
    for method, path in sorted(set(PAGES_BY_ID) | LISTINGS):
        r = client.request(method, _url(path, world), headers=bearer)
        if path.endswith("/tail"):
            assert r.status_code == 401, path
        else:
            assert r.status_code == 303 and r.headers["location"].startswith("/ui/login?next="), path
        assert "secret" not in r.text
    for method, _ in sorted(PROXY):
        r = client.request(method, f"/ui/api/v1/jobs/{world['job']}", headers=bearer)
        assert r.status_code == 401
    assert gnomon_api.producer.sent == []


def test_the_cookie_is_not_a_credential_for_the_json_api(gnomon_api: Any, world: dict[str, Any]) -> None:
    acme = world["acme"]
    assert acme.client.cookies.get(COOKIE)
    r = acme.client.get(f"/v1/jobs/{world['job']}")  # the cookie is Path=/ui; sent here anyway, it is ignored
    assert r.status_code == 401
    bare = TestClient(gnomon_api.app, cookies={COOKIE: gnomon_api.tokens["acme"]})
    assert bare.get(f"/v1/jobs/{world['job']}").status_code == 401


def test_a_revoked_token_signs_the_session_out(gnomon_api: Any, world: dict[str, Any]) -> None:
    from gnomon.web.auth import Authenticator

    gnomon_api.app.state.auth = Authenticator({gnomon_api.tokens["other"]: "other"})  # acme's token revoked
    r = world["acme"].client.get("/ui/jobs")
    assert r.status_code == 303 and r.headers["location"].startswith("/ui/login")


@pytest.mark.parametrize("method", ["POST", "PATCH", "DELETE", "GET"])
def test_the_pages_json_api_needs_the_csrf_token(gnomon_api: Any, world: dict[str, Any], method: str) -> None:
    acme = world["acme"]
    path = f"/v1/jobs/{world['job']}" + (":pause" if method == "POST" else "")
    kwargs: dict[str, Any] = {"json": {"priority": "high"}} if method == "PATCH" else {}
    wrong = {"missing": {}, "wrong": {"X-CSRF-Token": "0" * 64}, "another session's": {"X-CSRF-Token": world["other"].csrf},
             "cross-origin": {"X-CSRF-Token": acme.csrf, "Origin": "http://evil.example"}}
    for why, headers in wrong.items():
        r = acme.client.request(method, "/ui/api" + path, headers=headers, **kwargs)
        assert r.status_code == 403, (why, r.text)
    assert gnomon_api.producer.sent == []
    ok = acme.api(method, path, **kwargs)
    assert ok.status_code in (200, 202), ok.text


def test_sign_out_needs_the_csrf_token_and_clears_the_cookie(gnomon_api: Any, world: dict[str, Any]) -> None:
    acme = world["acme"]
    r = acme.client.post("/ui/logout", data={"csrf": "nope"})
    assert r.status_code == 403
    assert acme.client.get("/ui/jobs").status_code == 200
    r = acme.client.post("/ui/logout", data={"csrf": acme.csrf})
    assert r.status_code == 303 and f'{COOKIE}=""' in r.headers["set-cookie"]


@pytest.mark.parametrize(("method", "path"), sorted(PAGES_BY_ID))
def test_another_tenant_gets_404_on_every_page(gnomon_api: Any, world: dict[str, Any], method: str,
                                               path: str) -> None:
    other, acme = world["other"], world["acme"]
    headers = {"X-CSRF-Token": other.csrf}
    theirs = other.client.request(method, _url(path, world), headers=headers)
    assert theirs.status_code == 404, theirs.text
    assert "acme" not in theirs.text and "secret" not in theirs.text
    # exactly as for an id that does not exist (so ids cannot be probed)
    nobody = "job_ffffffffffffffff"
    missing = other.client.request(method, _url(path, world).replace(world["job"], nobody), headers=headers)
    assert missing.status_code == 404
    assert theirs.text.replace(world["job"], nobody) == missing.text
    mine = acme.client.request(method, _url(path, world), headers={"X-CSRF-Token": acme.csrf})
    assert mine.status_code == 200, mine.text


@pytest.mark.parametrize(("method", "path", "body"), [
    ("GET", "/v1/jobs/{job_id}", None), ("PATCH", "/v1/jobs/{job_id}", {"priority": "high"}),
    ("DELETE", "/v1/jobs/{job_id}", None), ("POST", "/v1/jobs/{job_id}:pause", None),
    ("POST", "/v1/jobs/{job_id}:resume", None), ("POST", "/v1/jobs/{job_id}:trigger", {"idempotencyKey": "x"}),
    ("POST", "/v1/jobs/{job_id}:backfill", {"from": "2026-01-01T00:00:00Z", "to": "2026-01-01T01:00:00Z"}),
    ("GET", "/v1/jobs/{job_id}/runs", None), ("GET", "/v1/runs/{run_id}", None),
    ("GET", "/v1/runs/{run_id}/logs", None), ("POST", "/v1/runs/{run_id}:cancel", None),
    ("POST", "/v1/runs/{run_id}:replay", None)])
def test_another_tenant_gets_404_through_the_pages_json_api(gnomon_api: Any, world: dict[str, Any], method: str,
                                                            path: str, body: Any) -> None:
    kwargs = {} if body is None else {"json": body}
    job_before, answers_before = gnomon_api.producer.job(world["job"]), len(gnomon_api.producer.results)
    r = world["other"].api(method, _url(path, world), **kwargs)
    assert r.status_code == 404, r.text
    assert r.headers["content-type"] == "application/problem+json" and "secret" not in r.text
    # a job write reached the processor, which refused it: acme's job is as it was
    assert gnomon_api.producer.job(world["job"]) == job_before
    assert not any(r.accepted for r in list(gnomon_api.producer.results.values())[answers_before:])


def test_listings_never_show_another_tenants_items(gnomon_api: Any, world: dict[str, Any]) -> None:
    other, acme = world["other"], world["acme"]
    for path in ("/ui/jobs", "/ui/dead-letters"):
        theirs = other.client.get(path)
        assert theirs.status_code == 200
        assert world["job"] not in theirs.text and "secret" not in theirs.text and "acme-" not in theirs.text
        assert world["job"] in acme.client.get(path).text
    assert 'id="no-jobs"' in other.client.get("/ui/jobs").text
    assert 'id="no-dead-letters"' in other.client.get("/ui/dead-letters").text
    listed = other.api("GET", "/v1/jobs").json()
    assert listed == {"items": [], "cursor": None}


def test_names_and_logs_are_escaped(world: dict[str, Any]) -> None:
    acme = world["acme"]
    for path in ("/ui/jobs", f"/ui/jobs/{world['job']}"):
        html = acme.client.get(path).text
        assert "<script>alert(1)</script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_pages_carry_a_strict_content_security_policy(world: dict[str, Any]) -> None:
    r = world["acme"].client.get("/ui/jobs")
    csp = r.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and "unsafe-inline" not in csp
    assert r.headers["x-frame-options"] == "DENY" and r.headers["cache-control"] == "no-store"
    assert not re.search(r"<script>(?!alert)", r.text), "inline scripts would be blocked by the CSP"
    assert not re.search(r' style="', r.text), "inline styles would be blocked by the CSP"


def test_ids_that_would_reach_another_route_are_not_found(world: dict[str, Any]) -> None:
    acme = world["acme"]
    # (a "/" never reaches an id: the router decodes %2F and matches it as a path)
    for bad in (f"{world['job']}%3Fstatus=failed", f"{world['job']}%23x", "x%25y", "x%5Cy"):
        assert acme.client.get(f"/ui/jobs/{bad}").status_code == 404
        assert acme.client.get(f"/ui/runs/{bad}").status_code == 404


def test_the_job_page_shows_fires_in_its_zone_and_the_run_timeline(world: dict[str, Any]) -> None:
    html = world["acme"].client.get(f"/ui/jobs/{world['job']}").text
    fires = re.findall(r"<tr><td>(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) (CES?T)</td><td>([^<]+)</td>", html)
    assert len(fires) == 10, html
    assert all(int(local[-2:]) % 5 == 0 for local, _, _ in fires)
    assert all(int(local[11:13]) != int(utc[11:13]) for local, _, utc in fires)  # Paris is not UTC
    assert html.count('<g class="run" data-status="failed">') == 1
    assert "p50 <b id=\"lag-p50\">0.007 s</b>" in html


def test_the_live_tail_reads_after_a_position(world: dict[str, Any], gnomon_api: Any) -> None:
    acme = world["acme"]
    now = SystemClock().now_ms()
    for seq in (2, 3):
        gnomon_api.history.put_log(LogLine(world["run"], world["job"], "acme", 1, seq, LogStream.STDERR, f"l{seq}", now))
    url = f"/ui/runs/{world['run']}/tail"
    assert acme.client.get(url).status_code == 403  # the script sends the CSRF token
    body = acme.client.get(url + "?attempt=1&seq=1", headers={"X-CSRF-Token": acme.csrf}).json()
    assert [line["line"] for line in body["lines"]] == ["l2", "l3"]
    assert body["terminal"] is True and body["run"]["status"] == "failed" and body["more"] is False
    everything = acme.client.get(url, headers={"X-CSRF-Token": acme.csrf}).json()
    assert [line["seq"] for line in everything["lines"]] == [1, 2, 3]


def test_only_the_uis_own_static_files_are_served(gnomon_api: Any) -> None:
    client = TestClient(gnomon_api.app)
    assert client.get("/ui/static/ui.js").headers["content-type"].startswith("text/javascript")
    for bad in ("routes.py", "..%2Froutes.py", "%2e%2e%2f__init__.py", "ui.js%00.png"):
        assert client.get(f"/ui/static/{bad}").status_code == 404, bad
