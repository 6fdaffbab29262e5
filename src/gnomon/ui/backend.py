"""The JSON API, called in-process by the UI with the signed-in user's token.

Every UI page and button is a request to the API's own routes (``/v1/...``) through the
app itself (httpx's ASGI transport: no socket, no second copy of the business logic), so
authentication, tenant isolation, validation, limits and problem+json errors are
exactly the API's."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
from starlette.types import ASGIApp

from gnomon.metrics.api import IN_PROCESS_HOST

INTERNAL_BASE_URL = f"http://{IN_PROCESS_HOST}"  # not counted by the API metrics
TIMEOUT_S = 60.0  # a command send may wait for Kafka (the API's delivery timeout)
_ID_FORBIDDEN = frozenset("/?#\\%")


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes
    headers: Mapping[str, str]

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None

    def problem_detail(self) -> str:
        """The problem's detail (and field), for a page to show."""
        try:
            body = self.json()
        except ValueError:
            return self.body.decode(errors="replace")[:500]
        if not isinstance(body, dict):
            return str(body)[:500]
        detail = str(body.get("detail") or body.get("title") or self.status)
        return f"{body['field']}: {detail}" if body.get("field") else detail


def path_id(value: str) -> str | None:
    """``value`` quoted for a path segment, or None if it cannot be a job or run id
    (it would change which route is called)."""
    if not value or len(value) > 1024 or any(c in _ID_FORBIDDEN for c in value):
        return None
    return quote(value, safe="@:")


class ApiBackend:
    def __init__(self, app: ASGIApp) -> None:
        self._transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 0))

    async def call(self, method: str, path: str, token: str, *,
                   params: Mapping[str, str] | str | None = None,
                   content: bytes | None = None, headers: Mapping[str, str] | None = None) -> Answer:
        """``path`` starts with /v1/ (already quoted); ``params`` as a mapping or an encoded query string."""
        if not path.startswith("/v1/"):
            raise ValueError(f"not an API path: {path!r}")
        sent = {**(headers or {}), "Authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(transport=self._transport, base_url=INTERNAL_BASE_URL,
                                     timeout=TIMEOUT_S) as client:
            r = await client.request(method, path, params=params, content=content, headers=sent)
        return Answer(r.status_code, r.content, dict(r.headers))

    async def get(self, path: str, token: str, **params: str | int) -> Answer:
        return await self.call("GET", path, token, params={k: str(v) for k, v in params.items()})
