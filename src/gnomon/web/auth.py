"""Bearer tokens -> tenant (and role).

Tokens come from ``GNOMON_API_TOKENS``, comma-separated entries of either form:

* ``token:tenant`` -- hashed when loaded; the plaintext is not kept;
* ``sha256:<64 hex>:tenant`` -- the SHA-256 of the token (``gnomon token hash``), so
  the deployment's configuration holds no usable secret.

Either form may end with ``:admin`` (``sha256:<hex>:ops:admin``): the token then also
has the **admin role**, which may read and change every tenant's limits
(``/v1/tenants``, ``gnomon tenants``). An admin token still acts as its own tenant on
the job endpoints. Other roles are refused at start.

Without ``GNOMON_API_TOKENS`` the API refuses to start, except in dev mode
(``GNOMON_DEV=1`` or ``dev=True``, as ``gnomon dev`` does): then a dev token is created
once in the state dir (mode 0600, ``gnomon dev`` prints it) and maps to tenant ``dev``,
and a dev admin token (``<state dir>/dev-admin-token``, tenant ``dev``, role admin) is
created next to it; ``gnomon tenants`` uses it when ``GNOMON_ADMIN_TOKEN`` is unset.
Presented tokens are hashed and compared with ``hmac.compare_digest``.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from gnomon.config import Settings
from gnomon.tokens import (  # noqa: F401  (re-exported: the dev tokens live with the clients)
    DEV_ADMIN_TOKEN_FILE,
    DEV_TOKEN_FILE,
    dev_admin_token,
    dev_token,
    hash_token,
)
from gnomon.web.problems import Unauthorized

DEV_TENANT = "dev"
DEV_ENV = "GNOMON_DEV"
TOKENS_ENV = "GNOMON_API_TOKENS"
HASH_PREFIX = "sha256:"
ADMIN_ROLE = "admin"
_HEX64_RE = re.compile(r"^[0-9a-f]{64}$")
_TENANT_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


@dataclass(frozen=True)
class Principal:
    """Who a token is: its tenant, and whether it has the admin role."""

    tenant: str
    admin: bool = False


def dev_mode(dev: bool | None = None) -> bool:
    """``dev`` if given, else ``GNOMON_DEV=1``."""
    return dev if dev is not None else os.environ.get(DEV_ENV, "").strip() == "1"


def parse_tokens(raw: str) -> dict[str, str]:
    """``GNOMON_API_TOKENS`` -> {sha256 hex: tenant}; ``SystemExit`` naming a bad entry."""
    return {digest: p.tenant for digest, p in parse_principals(raw).items()}


def parse_principals(raw: str) -> dict[str, Principal]:
    """``GNOMON_API_TOKENS`` -> {sha256 hex: Principal}; ``SystemExit`` naming a bad entry."""
    hashes: dict[str, Principal] = {}
    for index, item in enumerate(raw.split(",")):
        entry = item.strip()
        if entry.startswith(HASH_PREFIX):
            digest, sep, tenant = entry[len(HASH_PREFIX):].partition(":")
            if not sep or not _HEX64_RE.match(digest.lower()):
                raise SystemExit(f"gnomon: {TOKENS_ENV} entry {index + 1}: want 'sha256:<64 hex digits>:tenant'")
            digest = digest.lower()
        else:
            token, sep, tenant = entry.partition(":")
            if not sep or not token.strip():
                raise SystemExit(f"gnomon: {TOKENS_ENV} must look like 'token1:tenant1,sha256:<hex>:tenant2' "
                                 f"(entry {index + 1} is not)")
            digest = hash_token(token)
        tenant, sep, role = tenant.strip().partition(":")
        tenant, role = tenant.strip(), role.strip()
        if not _TENANT_RE.match(tenant):
            raise SystemExit(f"gnomon: {TOKENS_ENV} entry {index + 1}: tenant must be 1-64 of A-Z a-z 0-9 . _ -")
        if sep and role != ADMIN_ROLE:
            raise SystemExit(f"gnomon: {TOKENS_ENV} entry {index + 1}: the only role is '{ADMIN_ROLE}' "
                             f"(':{ADMIN_ROLE}' after the tenant), got {role!r}")
        hashes[digest] = Principal(tenant, admin=bool(sep))
    return hashes


def load_tokens(settings: Settings, *, dev: bool | None = None) -> dict[str, str]:
    """{sha256 hex: tenant} from ``GNOMON_API_TOKENS``; the dev token only in dev mode."""
    raw = os.environ.get(TOKENS_ENV, "").strip()
    if raw:
        return parse_tokens(raw)
    if not dev_mode(dev):
        raise SystemExit(f"gnomon: {TOKENS_ENV} is not set; the API will not start without tokens. Set "
                         f"{TOKENS_ENV}='sha256:<hash>:tenant,...' (`gnomon token hash` prints a hash), "
                         f"or {DEV_ENV}=1 for a local dev token.")
    return {hash_token(dev_token(settings)): DEV_TENANT}


def load_principals(settings: Settings, *, dev: bool | None = None) -> dict[str, Principal]:
    """{sha256 hex: Principal} from ``GNOMON_API_TOKENS``; in dev mode (variable unset)
    the dev token and the dev admin token."""
    raw = os.environ.get(TOKENS_ENV, "").strip()
    if raw:
        return parse_principals(raw)
    out = {digest: Principal(tenant) for digest, tenant in load_tokens(settings, dev=dev).items()}
    out[hash_token(dev_admin_token(settings))] = Principal(DEV_TENANT, admin=True)
    return out


TokenTable = Mapping[str, str | Principal]


def _principal(who: str | Principal) -> Principal:
    return who if isinstance(who, Principal) else Principal(who)


class Authenticator:
    """Maps a bearer token to its tenant and role. Holds only hashes of the tokens."""

    def __init__(self, tokens: TokenTable | None = None, *, hashes: TokenTable | None = None) -> None:
        """``tokens``: {plaintext: tenant or Principal} (tests; hashed at once);
        ``hashes``: {sha256 hex: tenant or Principal}."""
        table = {hash_token(token): _principal(who) for token, who in (tokens or {}).items()}
        table.update({digest.lower(): _principal(who) for digest, who in (hashes or {}).items()})
        self._hashes = [(bytes.fromhex(digest), who) for digest, who in table.items()]

    @classmethod
    def from_hashes(cls, hashes: TokenTable) -> Authenticator:
        return cls(hashes=hashes)

    def tenant_for(self, authorization: str | None) -> str:
        return self.principal_for(authorization).tenant

    def principal_for(self, authorization: str | None) -> Principal:
        if not authorization:
            raise Unauthorized("missing Authorization header; send 'Authorization: Bearer <token>'")
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthorized("Authorization must be 'Bearer <token>'")
        presented = hashlib.sha256(token.strip().encode()).digest()
        found: Principal | None = None
        for digest, who in self._hashes:  # no early exit: the time does not depend on which
            if hmac.compare_digest(digest, presented):
                found = who
        if found is None:
            raise Unauthorized("unknown or revoked token")
        return found
