"""The ``/ui`` routes: sign-in, the pages, their fragments, and ``/ui/api/v1/...``, the
JSON API for the pages' scripts (the API's own routes, with the cookie's token).

Pages read through ``ApiBackend`` and render Jinja2 templates; nothing here decides
anything the API decides. None of these routes is in the OpenAPI document."""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote

import jinja2
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from gnomon.core.clock import Clock, ms_to_iso
from gnomon.history._paging import LOGS, encode_cursor
from gnomon.ui.backend import Answer, ApiBackend, path_id
from gnomon.ui.filters import STATUSES, TARGETS, JobFilter
from gnomon.ui.overload import OverloadProbe, processor_targets
from gnomon.ui.session import (
    COOKIE,
    CSRF_FIELD,
    CSRF_HEADER,
    PREFIX,
    TOKEN_MAX_CHARS,
    csrf_for,
    csrf_ok,
    safe_next,
    same_origin,
)
from gnomon.ui.timeline import COLOURS, layout
from gnomon.web.auth import Authenticator
from gnomon.web.body import BODY_MAX_BYTES, read_bounded
from gnomon.web.problems import Unauthorized

HERE = Path(__file__).parent
STATIC: dict[str, str] = {"ui.js": "text/javascript", "ui.css": "text/css"}
JOBS_PAGE_MAX = 500  # the API's page limit: the filters apply to one page of this many
RUNS_SHOWN = 50
LOGS_PAGE = 500
DEAD_LETTERS_SHOWN = 100
LOGIN_BODY_MAX_BYTES = 4096
_TERMINAL = frozenset({"succeeded", "failed", "cancelled", "skipped"})
_FORWARDED_REQUEST_HEADERS = ("content-type", "idempotency-key", "if-match")
_FORWARDED_ANSWER_HEADERS = ("etag", "retry-after", "location")
# Pages are only ever same-origin; scripts and styles come from /ui/static only.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",  # no-referrer would make Chromium send "Origin: null"
    "Cache-Control": "no-store",
}


@dataclass(frozen=True)
class Session:
    token: str
    tenant: str
    csrf: str


class PageError(Exception):
    """Rendered as the error page with this status (a 404 from the API is a 404 here)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class SignInNeeded(Exception):
    pass


def templates() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"),
                             autoescape=jinja2.select_autoescape(["html"]), undefined=jinja2.StrictUndefined)
    env.filters["q"] = lambda value: quote(str(value), safe="@:")
    env.filters["pretty"] = lambda value: json.dumps(value, indent=2, ensure_ascii=False)
    return env


def install(app: FastAPI, clock: Clock) -> None:
    """Add the /ui routes to ``app`` (the API built by ``create_app``), on the app itself
    (not an included router), so ``app.routes`` lists them (tests/security's matrix)."""
    env = templates()
    backend = ApiBackend(app)
    probe: OverloadProbe = getattr(app.state, "overload_probe", None) or OverloadProbe(processor_targets())

    def auth() -> Authenticator:
        found: Authenticator = app.state.auth
        return found

    def session_of(request: Request) -> Session | None:
        token = request.cookies.get(COOKIE)
        if not token:
            return None
        try:
            principal = auth().principal_for(f"Bearer {token}")
        except Unauthorized:
            return None
        return Session(token, principal.tenant, csrf_for(token))

    def signed_in(request: Request) -> Session:
        session = session_of(request)
        if session is None:
            raise SignInNeeded()
        return session

    def render(name: str, session: Session | None, status: int = 200, **context: Any) -> HTMLResponse:
        overload = probe.current() if session is not None else None
        html = env.get_template(name).render(session=session, prefix=PREFIX, colours=COLOURS, overload=overload,
                                             **context)
        return HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)

    def answer_or_raise(answer: Answer, what: str) -> Any:
        if answer.status == 401:
            raise SignInNeeded()
        if answer.status == 404:
            raise PageError(404, f"no {what}")
        if not answer.ok:
            raise PageError(answer.status, answer.problem_detail())
        return answer.json()

    async def read(session: Session, path: str, what: str, **params: str | int) -> Any:
        return answer_or_raise(await backend.get(path, session.token, **params), what)

    def quoted(value: str, what: str) -> str:
        found = path_id(value)
        if found is None:
            raise PageError(404, f"no {what} {value!r}")
        return found

    @app.exception_handler(PageError)
    async def _page_error(request: Request, exc: PageError) -> HTMLResponse:
        return render("error.html", session_of(request), status=exc.status, code=exc.status,
                      message=exc.message)

    @app.exception_handler(SignInNeeded)
    async def _sign_in(request: Request, _: SignInNeeded) -> Response:
        if request.method != "GET" or request.url.path.endswith("/tail"):
            return JSONResponse({"detail": "sign in again"}, status_code=401, headers=SECURITY_HEADERS)
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return RedirectResponse(f"{PREFIX}/login?next={quote(target)}", status_code=303)

    # ---- sign-in ---------------------------------------------------------------------

    @app.get(PREFIX, include_in_schema=False)
    async def ui_root() -> RedirectResponse:
        return RedirectResponse(f"{PREFIX}/jobs", status_code=303)

    @app.get(PREFIX + "/login", include_in_schema=False)
    async def ui_login_form(request: Request) -> HTMLResponse:
        return render("login.html", None, next=safe_next(request.query_params.get("next")), error=None)

    @app.post(PREFIX + "/login", include_in_schema=False)
    async def ui_login(request: Request) -> Response:
        if not same_origin(request.headers.get("origin"), request.headers.get("host")):
            raise PageError(403, "cross-origin sign-in refused")
        form = parse_qs((await read_bounded(request, LOGIN_BODY_MAX_BYTES)).decode(errors="replace"))
        token = (form.get("token") or [""])[0].strip()
        target = safe_next((form.get("next") or [""])[0])
        try:
            if not token or len(token) > TOKEN_MAX_CHARS:
                raise Unauthorized("enter an API token")
            auth().principal_for(f"Bearer {token}")
        except Unauthorized as exc:
            return render("login.html", None, status=401, next=target, error=exc.detail)
        out = RedirectResponse(target, status_code=303)
        out.set_cookie(COOKIE, token, httponly=True, samesite="strict", path=PREFIX,
                       secure=request.url.scheme == "https")
        return out

    @app.post(PREFIX + "/logout", include_in_schema=False)
    async def ui_logout(request: Request) -> Response:
        session = signed_in(request)
        form = parse_qs((await read_bounded(request, LOGIN_BODY_MAX_BYTES)).decode(errors="replace"))
        if not csrf_ok(session.token, next(iter(form.get(CSRF_FIELD) or []), None)):
            raise PageError(403, "missing or wrong CSRF token")
        out = RedirectResponse(f"{PREFIX}/login", status_code=303)
        out.delete_cookie(COOKIE, path=PREFIX, httponly=True, samesite="strict")
        return out

    static = {name: (HERE / "static" / name).read_bytes() for name in STATIC}  # read once, not on the loop

    @app.get(PREFIX + "/static/{name}", include_in_schema=False)
    async def ui_static(name: str) -> Response:
        if name not in static:
            raise PageError(404, "no such file")
        return Response(static[name], media_type=STATIC[name],
                        headers={"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"})

    # ---- pages -----------------------------------------------------------------------

    @app.get(PREFIX + "/jobs", include_in_schema=False)
    async def ui_jobs(request: Request) -> HTMLResponse:
        session = signed_in(request)
        params = {"limit": JOBS_PAGE_MAX}
        cursor = request.query_params.get("cursor")
        if cursor:
            params["cursor"] = cursor  # type: ignore[assignment]
        page = await read(session, "/v1/jobs", "jobs", **params)
        flt = JobFilter.of(request.query_params)
        return render("jobs.html", session, jobs=flt.apply(page["items"]), total=len(page["items"]),
                      cursor=page["cursor"], filter=flt, statuses=STATUSES, targets=TARGETS,
                      create_key="ui-" + secrets.token_hex(8))

    async def job_and_runs(session: Session, job_id: str, status: str | None) -> tuple[Any, Any]:
        jid = quoted(job_id, "job")
        job = await read(session, f"/v1/jobs/{jid}", f"job {job_id!r}")
        params: dict[str, str | int] = {"limit": RUNS_SHOWN}
        if status:
            params["status"] = status
        runs = await read(session, f"/v1/jobs/{jid}/runs", f"job {job_id!r}", **params)
        return job, runs

    def runs_context(job: Any, runs: Any, status: str | None) -> dict[str, Any]:
        return {"job": job, "runs": runs["items"], "timeline": layout(runs["items"]), "status_filter": status or "",
                "terminal": _TERMINAL}

    @app.get(PREFIX + "/jobs/{job_id}", include_in_schema=False)
    async def ui_job(job_id: str, request: Request) -> HTMLResponse:
        session = signed_in(request)
        status = request.query_params.get("status") or None
        job, runs = await job_and_runs(session, job_id, status)
        now = clock.now_ms()
        fires = await read(session, f"/v1/jobs/{quoted(job_id, 'job')}/fires", f"job {job_id!r}")
        return render("job.html", session, fires=fires, definition=job,
                      backfill_from=ms_to_iso((now - 3_600_000) // 1000 * 1000),
                      backfill_to=ms_to_iso(now // 1000 * 1000), **runs_context(job, runs, status))

    @app.get(PREFIX + "/jobs/{job_id}/runs", include_in_schema=False)
    async def ui_job_runs(job_id: str, request: Request) -> HTMLResponse:
        """The job page's runs (timeline and table), which its script reloads."""
        session = signed_in(request)
        status = request.query_params.get("status") or None
        job, runs = await job_and_runs(session, job_id, status)
        return render("_runs.html", session, **runs_context(job, runs, status))

    @app.get(PREFIX + "/runs/{run_id}", include_in_schema=False)
    async def ui_run(run_id: str, request: Request) -> HTMLResponse:
        session = signed_in(request)
        rid = quoted(run_id, "run")
        run = await read(session, f"/v1/runs/{rid}", f"run {run_id!r}")
        logs = await read(session, f"/v1/runs/{rid}/logs", f"run {run_id!r}", limit=LOGS_PAGE)
        return render("run.html", session, run=run, logs=logs["items"], more=logs["cursor"] is not None,
                      terminal=run["status"] in _TERMINAL)

    @app.get(PREFIX + "/runs/{run_id}/tail", include_in_schema=False)
    async def ui_run_tail(run_id: str, request: Request) -> JSONResponse:
        """The run's state and its log lines after (attempt, seq): the run page's live tail."""
        session = signed_in(request)
        if not csrf_ok(session.token, request.headers.get(CSRF_HEADER)):
            return JSONResponse({"detail": "missing or wrong CSRF token"}, status_code=403)
        rid = quoted(run_id, "run")
        run = await read(session, f"/v1/runs/{rid}", f"run {run_id!r}")
        params: dict[str, str | int] = {"limit": LOGS_PAGE}
        attempt, seq = request.query_params.get("attempt", ""), request.query_params.get("seq", "")
        if attempt.isdigit() and seq.isdigit() and len(attempt) < 10 and len(seq) < 19:
            params["cursor"] = encode_cursor(LOGS, (int(attempt), int(seq)))
        logs = await read(session, f"/v1/runs/{rid}/logs", f"run {run_id!r}", **params)
        return JSONResponse({"run": run, "terminal": run["status"] in _TERMINAL, "lines": logs["items"],
                             "more": logs["cursor"] is not None}, headers={"Cache-Control": "no-store"})

    @app.get(PREFIX + "/dead-letters", include_in_schema=False)
    async def ui_dead_letters(request: Request) -> HTMLResponse:
        session = signed_in(request)
        params: dict[str, str | int] = {"limit": DEAD_LETTERS_SHOWN}
        cursor = request.query_params.get("cursor")
        if cursor:
            params["cursor"] = cursor
        page = await read(session, "/v1/dead-letters", "dead letters", **params)
        return render("dead_letters.html", session, runs=page["items"], cursor=page["cursor"])

    @app.get(PREFIX + "/calendars", include_in_schema=False)
    async def ui_calendars(request: Request) -> HTMLResponse:
        session = signed_in(request)
        page = await read(session, "/v1/calendars", "calendars")
        return render("calendars.html", session, calendars=page["items"])

    # ---- the JSON API for the pages' scripts -------------------------------------------

    @app.api_route(PREFIX + "/api/v1/{rest:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"],
                   include_in_schema=False)
    async def ui_api(rest: str, request: Request) -> Response:
        """``/ui/api/v1/X`` is ``/v1/X`` with the cookie's token; it needs the CSRF token."""
        session = session_of(request)
        if session is None:
            return JSONResponse({"detail": "sign in again"}, status_code=401)
        if not csrf_ok(session.token, request.headers.get(CSRF_HEADER)) or \
                not same_origin(request.headers.get("origin"), request.headers.get("host")):
            return JSONResponse({"detail": "missing or wrong CSRF token"}, status_code=403)
        body = await read_bounded(request, BODY_MAX_BYTES)
        headers = _pick(request.headers, _FORWARDED_REQUEST_HEADERS)
        answer = await backend.call(request.method, "/v1/" + quote(rest, safe="/@:,"), session.token,
                                    params=request.url.query, content=body or None,
                                    headers=headers)
        return Response(answer.body, status_code=answer.status, media_type=answer.headers.get("content-type"),
                        headers=_pick(answer.headers, _FORWARDED_ANSWER_HEADERS))



def _pick(headers: Mapping[str, str], names: tuple[str, ...]) -> dict[str, str]:
    return {name: headers[name] for name in names if name in headers}
