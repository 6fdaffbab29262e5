"""A small client of the tenant endpoints (``/v1/tenants``, ``/v1/tenant``).

The admin endpoints need a token with the admin role (``gnomon.api.auth``): the token is
the one given, else ``$GNOMON_ADMIN_TOKEN``, else the dev admin token of the state dir
(``gnomon api --dev`` / ``gnomon dev`` create it), else ``$GNOMON_TOKEN`` (which the API
refuses with 403 unless it is an admin token).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from gnomon.client import ApiError, ApiUnavailable
from gnomon.config import Settings, load
from gnomon.core.errors import ValidationError
from gnomon.tokens import DEV_ADMIN_TOKEN_FILE

ADMIN_TOKEN_ENV = "GNOMON_ADMIN_TOKEN"


def admin_token(settings: Settings) -> str:
    token = os.environ.get(ADMIN_TOKEN_ENV, "").strip()
    if token:
        return token
    dev_file = Path(settings.state_dir) / DEV_ADMIN_TOKEN_FILE
    if dev_file.exists():
        return dev_file.read_text().strip()
    token = os.environ.get("GNOMON_TOKEN", "").strip()
    if token:
        return token
    raise ValidationError(ADMIN_TOKEN_ENV, "no admin token: set GNOMON_ADMIN_TOKEN to a token whose "
                          "GNOMON_API_TOKENS entry ends in ':admin' (or run `gnomon dev`)")


class TenantsClient:
    def __init__(self, url: str | None = None, token: str | None = None, timeout_s: float = 30.0) -> None:
        settings = load()
        self.url = (url or settings.api_url).rstrip("/")
        self._http = httpx.Client(base_url=self.url, timeout=timeout_s,
                                  headers={"Authorization": f"Bearer {token or admin_token(settings)}"})

    def _call(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
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
        out = resp.json()
        return out if isinstance(out, dict) else {}

    def list(self) -> dict[str, Any]:
        """``{"defaults": limits, "items": [tenant views]}``."""
        return self._call("GET", "/v1/tenants")

    def get(self, tenant: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/tenants/{quote(tenant, safe='*')}")

    def set(self, tenant: str, limits: dict[str, int]) -> dict[str, Any]:
        """Set some limits (camelCase names: jobsMax...); the others keep their value."""
        return self._call("PUT", f"/v1/tenants/{quote(tenant, safe='*')}", json=limits)

    def reset(self, tenant: str) -> dict[str, Any]:
        """Back to the defaults."""
        return self._call("DELETE", f"/v1/tenants/{quote(tenant, safe='*')}")

    def own(self) -> dict[str, Any]:
        """The token's own tenant (no admin role needed)."""
        return self._call("GET", "/v1/tenant")

    def close(self) -> None:
        self._http.close()
