"""A small client of the tenant endpoints (``/v1/tenants``, ``/v1/tenant``).

The admin endpoints need a token with the admin role (``gnomon.web.auth``): the token is
the one given, else ``$GNOMON_ADMIN_TOKEN``, else the dev admin token of the state dir
(``gnomon api --dev`` / ``gnomon dev`` create it), else ``$GNOMON_TOKEN`` (which the API
refuses with 403 unless it is an admin token).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import quote

from gnomon.client import Client
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


class TenantsClient(Client):
    """``Client``'s transport (errors as ``ApiError`` / ``ApiUnavailable``) with the admin token."""

    def __init__(self, url: str | None = None, token: str | None = None, timeout_s: float = 30.0) -> None:
        super().__init__(url, token or admin_token(load()), timeout_s)

    def _call(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        out = super()._call(method, path, **kw)
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
