"""Bearer tokens -> tenant.

Tokens come from ``GNOMON_API_TOKENS``, comma-separated entries of either form:

* ``token:tenant`` -- hashed when loaded; the plaintext is not kept;
* ``sha256:<64 hex>:tenant`` -- the SHA-256 of the token (``gnomon token hash``), so
  the deployment's configuration holds no usable secret.

Without ``GNOMON_API_TOKENS`` the API refuses to start, except in dev mode
(``GNOMON_DEV=1`` or ``dev=True``, as ``gnomon dev`` does): then a dev token is created
once in the state dir (mode 0600, ``gnomon dev`` prints it) and maps to tenant ``dev``.
Presented tokens are hashed and compared with ``hmac.compare_digest``.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import re
import secrets
from collections.abc import Mapping
from pathlib import Path

from gnomon.api.problems import Unauthorized
from gnomon.config import Settings

DEV_TENANT = "dev"
DEV_ENV = "GNOMON_DEV"
TOKENS_ENV = "GNOMON_API_TOKENS"
HASH_PREFIX = "sha256:"
_HEX64_RE = re.compile(r"^[0-9a-f]{64}$")
_TENANT_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


def hash_token(token: str) -> str:
    """The hex SHA-256 of a token: what ``GNOMON_API_TOKENS`` may hold instead of it.
    (Tokens are random and long, so a fast hash is enough: there is nothing to brute-force.)"""
    return hashlib.sha256(token.strip().encode()).hexdigest()


def dev_mode(dev: bool | None = None) -> bool:
    """``dev`` if given, else ``GNOMON_DEV=1``."""
    return dev if dev is not None else os.environ.get(DEV_ENV, "").strip() == "1"


def _create_exclusively(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` only if it does not exist, born 0600 (never chmod-ed
    later: no window where another user can read it), atomically (a reader sees the
    whole token or no file). ``FileExistsError`` if another process won the race."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        try:
            os.link(tmp, path)  # atomic, and fails if the file exists (os.replace would not)
        except FileExistsError:
            raise
        except OSError:  # a file system without hard links
            os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def dev_token(settings: Settings) -> str:
    """The dev token of this state dir, created on first use."""
    path = Path(settings.state_dir) / "dev-token"
    if not path.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):  # lost the race: use the winner's token
            _create_exclusively(path, "gnomon-dev-" + secrets.token_urlsafe(18) + "\n")
    return path.read_text().strip()


def parse_tokens(raw: str) -> dict[str, str]:
    """``GNOMON_API_TOKENS`` -> {sha256 hex: tenant}; ``SystemExit`` naming a bad entry."""
    hashes: dict[str, str] = {}
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
        tenant = tenant.strip()
        if not _TENANT_RE.match(tenant):
            raise SystemExit(f"gnomon: {TOKENS_ENV} entry {index + 1}: tenant must be 1-64 of A-Z a-z 0-9 . _ -")
        hashes[digest] = tenant
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


class Authenticator:
    """Maps a bearer token to its tenant. Holds only hashes of the tokens."""

    def __init__(self, tokens: Mapping[str, str] | None = None, *, hashes: Mapping[str, str] | None = None) -> None:
        """``tokens``: {plaintext: tenant} (tests; hashed at once); ``hashes``: {sha256 hex: tenant}."""
        table = {hash_token(token): tenant for token, tenant in (tokens or {}).items()}
        table.update({digest.lower(): tenant for digest, tenant in (hashes or {}).items()})
        self._hashes = [(bytes.fromhex(digest), tenant) for digest, tenant in table.items()]

    @classmethod
    def from_hashes(cls, hashes: Mapping[str, str]) -> Authenticator:
        return cls(hashes=hashes)

    def tenant_for(self, authorization: str | None) -> str:
        if not authorization:
            raise Unauthorized("missing Authorization header; send 'Authorization: Bearer <token>'")
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthorized("Authorization must be 'Bearer <token>'")
        presented = hashlib.sha256(token.strip().encode()).digest()
        found: str | None = None
        for digest, tenant in self._hashes:  # no early exit: the time does not depend on which
            if hmac.compare_digest(digest, presented):
                found = tenant
        if found is None:
            raise Unauthorized("unknown or revoked token")
        return found
