"""Python SDK: a small client of the gnomon REST API.

    from gnomon.client import Client
    c = Client()                       # GNOMON_API_URL / GNOMON_TOKEN, or the dev token
    job = c.create_job({"name": "hi", "schedule": "*/5 * * * * *",
                        "target": {"type": "command", "argv": ["echo", "hi"]}})

Input is validated locally with the same rules as the API (``parse_job_spec``) before
anything is sent, so mistakes fail fast with the same field names.

Every job write returns once the scheduler accepted it, or raises ``ApiError`` with its
refusal. When the API answers 202 (the scheduler's answer did not come within the API's
bound) the client polls the answer's Location for up to ``answer_wait_s`` and then
raises ``ApiPending``: the command is written and will be applied or refused; its
``command_id`` says where to look (``GET /v1/commands/{id}``).
"""

from __future__ import annotations

import os
import time
from typing import Any
from urllib.parse import quote

import httpx

from gnomon.config import Settings, load
from gnomon.core.clock import SystemClock, iso_to_ms
from gnomon.core.errors import GnomonError, ValidationError
from gnomon.core.model import manual_run_id
from gnomon.core.validation import parse_job_spec, validate_idempotency_key
from gnomon.tokens import dev_token


class ApiError(GnomonError):
    """The API answered with an error (a problem+json body)."""

    def __init__(self, status: int, problem: dict[str, Any]) -> None:
        self.status = status
        self.problem = problem
        self.field = problem.get("field")
        # On a 503 of a command: "unknown" (it may have been written: retry with the same
        # idempotency key) or "not-written" (nothing was sent: retrying is safe).
        self.outcome = problem.get("outcome")
        detail = problem.get("detail") or problem.get("title") or f"HTTP {status}"
        super().__init__(f"{self.field}: {detail}" if self.field else str(detail))


class ApiUnavailable(GnomonError):
    pass


class ApiPending(ApiError):
    """A write the scheduler has not answered yet (written: it will be decided)."""

    def __init__(self, answer: dict[str, Any]) -> None:
        self.command_id = answer.get("commandId")
        super().__init__(202, {"detail": f"written, not answered yet (GET /v1/commands/{self.command_id} for the "
                               "answer)", "outcome": "pending", **answer})


ANSWER_WAIT_S_DEFAULT = 30.0
ANSWER_POLL_S = 0.25
_PENDING_KEYS = frozenset({"status", "jobId", "command", "commandId", "detail"})  # what a 202 adds to an answer


def default_token(settings: Settings) -> str:
    token = os.environ.get("GNOMON_TOKEN")
    if token:
        return token
    return dev_token(settings)


class Client:
    def __init__(self, url: str | None = None, token: str | None = None, timeout_s: float = 30.0,
                 answer_wait_s: float = ANSWER_WAIT_S_DEFAULT) -> None:
        self.answer_wait_s = answer_wait_s
        settings = load()
        self.url = (url or settings.api_url).rstrip("/")
        # an API serving HTTPS with a private CA: $GNOMON_API_CA_FILE (else the system's CAs)
        ca = os.environ.get("GNOMON_API_CA_FILE")
        self._http = httpx.Client(base_url=self.url, timeout=timeout_s, verify=ca or True,
                                  headers={"Authorization": f"Bearer {token or default_token(settings)}"})

    def _call(self, method: str, path: str, **kw: Any) -> Any:
        try:
            resp = self._http.request(method, path, **kw)
        except httpx.HTTPError as exc:
            raise ApiUnavailable(f"cannot reach the gnomon API at {self.url}: {exc}") from None
        if resp.status_code >= 400:
            try:
                body = resp.json()
            except ValueError:
                body = {"detail": resp.text[:200]}
            raise ApiError(resp.status_code, body if isinstance(body, dict) else {"detail": str(body)[:200]})
        if resp.status_code == 202 and resp.headers.get("location", "").startswith("/v1/commands/"):
            return self._answer_of(resp.headers["location"], resp.json(), method, path)
        return resp.json() if resp.content else None

    def _accepted_job(self, job_id: str, deadline: float) -> Any:
        """The job the scheduler accepted, once history shows it (the projector may lag
        the processor's answer by a moment: a 404 then means "not yet", until the
        deadline; after it, the id and that the write was accepted)."""
        while True:
            try:
                return self._call("GET", f"/v1/jobs/{quote(job_id)}")
            except ApiError as exc:
                if exc.status != 404:
                    raise
            if time.monotonic() >= deadline:
                return {"id": job_id, "accepted": "register"}
            time.sleep(ANSWER_POLL_S)

    def _answer_of(self, location: str, pending: dict[str, Any], method: str, path: str) -> Any:
        """Poll the scheduler's answer to a write answered 202: the write's own answer
        once accepted (a create reads the job), ``ApiError`` if refused, ``ApiPending``
        if none came within ``answer_wait_s``."""
        deadline = time.monotonic() + self.answer_wait_s
        while True:
            answer = self._call("GET", location)
            if answer.get("status") == "accepted":
                if method == "POST" and path == "/v1/jobs":
                    return self._accepted_job(str(answer["jobId"]), deadline)
                if "accepted" in pending:  # the 202 carried the write's own answer (a backfill's plan)
                    return {k: v for k, v in pending.items() if k not in _PENDING_KEYS}
                return {"id": answer.get("jobId"), "version": answer.get("version")}
            if answer.get("status") == "refused":
                problem = answer.get("problem") or {}
                raise ApiError(int(problem.get("status", 409)), problem)
            if time.monotonic() >= deadline:
                raise ApiPending(pending)
            time.sleep(ANSWER_POLL_S)

    # jobs
    def create_job(self, body: dict[str, Any], idempotency_key: str | None = None) -> dict[str, Any]:
        """Register a job. With ``idempotency_key`` the call is safe to repeat (after a
        timeout or a 503 with outcome "unknown"): the same key and body are the same job."""
        parse_job_spec(body, SystemClock().now_ms())  # same rules as the API, fail fast
        headers = {}
        if idempotency_key is not None:
            headers["Idempotency-Key"] = validate_idempotency_key(idempotency_key, "Idempotency-Key")
        return self._call("POST", "/v1/jobs", json=body, headers=headers)  # type: ignore[no-any-return]

    def create_jobs(self, bodies: list[dict[str, Any]], idempotency_keys: list[str | None] | None = None
                    ) -> dict[str, Any]:
        """Register up to 1,000 jobs in one call (``POST /v1/jobs:batch``): the answer has
        one result per body, in order (``status`` 201/200 with ``job``, or a ``problem``).
        ``idempotency_keys``: one per body (None: that job has none)."""
        keys = idempotency_keys or [None] * len(bodies)
        if len(keys) != len(bodies):
            raise ValueError(f"{len(bodies)} jobs but {len(keys)} idempotency keys")
        items: list[dict[str, Any]] = []
        for i, (body, key) in enumerate(zip(bodies, keys, strict=True)):
            item = dict(body)
            if key is not None:
                item["idempotencyKey"] = validate_idempotency_key(key, f"jobs[{i}].idempotencyKey")
            items.append(item)
        return self._call("POST", "/v1/jobs:batch", json={"jobs": items})  # type: ignore[no-any-return]

    def get_job(self, job_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/jobs/{quote(job_id)}")  # type: ignore[no-any-return]

    def job_fires(self, job_id: str, count: int = 10, after: str | None = None) -> dict[str, Any]:
        """The job's next fire times within its bounds (``GET /v1/jobs/{id}/fires``)."""
        params: dict[str, Any] = {"count": count}
        if after is not None:
            params["after"] = after
        return self._call("GET", f"/v1/jobs/{quote(job_id)}/fires", params=params)  # type: ignore[no-any-return]

    def list_jobs(self, limit: int = 100, cursor: str | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {"limit": limit}
        if cursor:
            params["cursor"] = cursor
        return self._call("GET", "/v1/jobs", params=params)  # type: ignore[no-any-return]

    def update_job(self, job_id: str, patch: dict[str, Any]) -> dict[str, Any]:
        return self._call("PATCH", f"/v1/jobs/{quote(job_id)}", json=patch)  # type: ignore[no-any-return]

    def pause(self, job_id: str) -> None:
        self._call("POST", f"/v1/jobs/{quote(job_id)}:pause")

    def resume(self, job_id: str) -> None:
        self._call("POST", f"/v1/jobs/{quote(job_id)}:resume")

    def delete(self, job_id: str) -> None:
        self._call("DELETE", f"/v1/jobs/{quote(job_id)}")

    def move(self, job_id: str, region: str) -> dict[str, Any]:
        """Move the job to ``region``: its slots from its next one run there (ADR 0013)."""
        return self._call("POST", f"/v1/jobs/{quote(job_id)}:move",  # type: ignore[no-any-return]
                          json={"region": region})

    def trigger(self, job_id: str, idempotency_key: str) -> str:
        validate_idempotency_key(idempotency_key)
        out = self._call("POST", f"/v1/jobs/{quote(job_id)}:trigger", json={"idempotencyKey": idempotency_key})
        return str(out.get("runId") or manual_run_id(job_id, idempotency_key))

    def backfill(self, job_id: str, from_iso: str, to_iso: str) -> dict[str, Any]:
        """Run the slots of the job's schedule in [from_iso, to_iso] (ISO-8601 instants) that
        have no run, and reopen those recorded skipped; slots that ran are left alone. At
        most 1,000 slots per call. Answers ``{"slots", "sent", "runIds", "alreadyRun", ...}``."""
        for name, value in (("from", from_iso), ("to", to_iso)):
            try:
                iso_to_ms(value)
            except (TypeError, ValueError) as exc:
                raise ValidationError(name, f"not an ISO-8601 instant with offset: {exc}") from None
        return self._call("POST", f"/v1/jobs/{quote(job_id)}:backfill",  # type: ignore[no-any-return]
                          json={"from": from_iso, "to": to_iso})

    # runs
    def list_runs(self, job_id: str, status: str | None = None, limit: int = 50, cursor: str | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {"limit": limit}
        if status:
            params["status"] = status
        if cursor:
            params["cursor"] = cursor
        return self._call("GET", f"/v1/jobs/{quote(job_id)}/runs", params=params)  # type: ignore[no-any-return]

    def get_run(self, run_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/runs/{quote(run_id, safe='@:')}")  # type: ignore[no-any-return]

    def get_logs(self, run_id: str, limit: int = 500) -> dict[str, Any]:
        return self._call("GET", f"/v1/runs/{quote(run_id, safe='@:')}/logs", params={"limit": limit})  # type: ignore[no-any-return]

    def cancel(self, run_id: str) -> dict[str, Any]:
        """Cancel a run that has not finished (a running attempt is stopped)."""
        return self._call("POST", f"/v1/runs/{quote(run_id, safe='@:')}:cancel")  # type: ignore[no-any-return]

    def replay(self, run_id: str) -> dict[str, Any]:
        """Run a failed (dead-lettered) run again, with a fresh retry budget."""
        return self._call("POST", f"/v1/runs/{quote(run_id, safe='@:')}:replay")  # type: ignore[no-any-return]

    # dead letters
    def dead_letters(self, limit: int = 50, cursor: str | None = None) -> dict[str, Any]:
        """This tenant's failed runs (retries exhausted), newest first: ``{"items", "cursor"}``."""
        params: dict[str, Any] = {"limit": limit}
        if cursor:
            params["cursor"] = cursor
        return self._call("GET", "/v1/dead-letters", params=params)  # type: ignore[no-any-return]

    # alerts (the caller's own tenant)
    def get_alerts(self) -> dict[str, Any]:
        return self._call("GET", "/v1/alerts")  # type: ignore[no-any-return]

    def set_alerts(self, config: dict[str, Any]) -> dict[str, Any]:
        """Replace the tenant's alert webhook config: ``{"url", "kinds"?, "lateS"?}``."""
        return self._call("PUT", "/v1/alerts", json=config)  # type: ignore[no-any-return]

    def delete_alerts(self) -> dict[str, Any]:
        return self._call("DELETE", "/v1/alerts")  # type: ignore[no-any-return]

    # exclusion calendars
    def list_calendars(self) -> dict[str, Any]:
        return self._call("GET", "/v1/calendars")  # type: ignore[no-any-return]

    def get_calendar(self, name: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/calendars/{quote(name)}")  # type: ignore[no-any-return]

    def put_calendar(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        """Create or replace a calendar: ``{"timezone", "dates": ["2026-12-25", {"from", "to"}]}``."""
        return self._call("PUT", f"/v1/calendars/{quote(name)}", json=body)  # type: ignore[no-any-return]

    def delete_calendar(self, name: str) -> dict[str, Any]:
        return self._call("DELETE", f"/v1/calendars/{quote(name)}")  # type: ignore[no-any-return]

    def close(self) -> None:
        self._http.close()


__all__ = ["ApiError", "ApiUnavailable", "Client", "ValidationError"]
