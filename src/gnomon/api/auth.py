"""Bearer tokens -> tenant. Tokens come from ``GNOMON_API_TOKENS`` ("token:tenant,...");
with none configured, a dev token is created in the state dir (``gnomon dev`` prints it)
and maps to tenant ``dev``."""

from __future__ import annotations

import hmac
import os
import secrets
from pathlib import Path

from gnomon.api.problems import Unauthorized
from gnomon.config import Settings

DEV_TENANT = "dev"


def dev_token(settings: Settings) -> str:
    path = Path(settings.state_dir) / "dev-token"
    if path.exists():
        return path.read_text().strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    token = "gnomon-dev-" + secrets.token_urlsafe(18)
    path.write_text(token + "\n")
    path.chmod(0o600)
    return token


def load_tokens(settings: Settings) -> dict[str, str]:
    raw = os.environ.get("GNOMON_API_TOKENS", "").strip()
    if not raw:
        return {dev_token(settings): DEV_TENANT}
    tokens: dict[str, str] = {}
    for item in raw.split(","):
        token, sep, tenant = item.strip().partition(":")
        if not sep or not token or not tenant:
            raise SystemExit("gnomon: GNOMON_API_TOKENS must look like 'token1:tenant1,token2:tenant2'")
        tokens[token] = tenant
    return tokens


class Authenticator:
    def __init__(self, tokens: dict[str, str]) -> None:
        self._tokens = tokens

    def tenant_for(self, authorization: str | None) -> str:
        if not authorization:
            raise Unauthorized("missing Authorization header; send 'Authorization: Bearer <token>'")
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise Unauthorized("Authorization must be 'Bearer <token>'")
        for known, tenant in self._tokens.items():
            if hmac.compare_digest(known.encode(), token.strip().encode()):
                return tenant
        raise Unauthorized("unknown or revoked token")
