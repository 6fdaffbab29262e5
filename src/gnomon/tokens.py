"""API tokens on the client side: their hash and the dev tokens of a state dir.

No server dependency (the SDK, the CLI and a worker-only install use it); the API's
token table and authenticator (``gnomon.web.auth``) build on it.

In dev mode (``gnomon api --dev``, ``gnomon dev``) the API creates a dev token once in
the state dir (``<state dir>/dev-token``, mode 0600, tenant ``dev``) and a dev admin
token next to it (``dev-admin-token``); clients on the same machine read them from there.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
from pathlib import Path

from gnomon.config import Settings

DEV_TOKEN_FILE = "dev-token"
DEV_ADMIN_TOKEN_FILE = "dev-admin-token"


def hash_token(token: str) -> str:
    """The hex SHA-256 of a token: what ``GNOMON_API_TOKENS`` may hold instead of it.
    (Tokens are random and long, so a fast hash is enough: there is nothing to brute-force.)"""
    return hashlib.sha256(token.strip().encode()).hexdigest()


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


def _dev_file_token(settings: Settings, name: str, prefix: str) -> str:
    path = Path(settings.state_dir) / name
    if not path.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):  # lost the race: use the winner's token
            _create_exclusively(path, prefix + secrets.token_urlsafe(18) + "\n")
    return path.read_text().strip()


def dev_token(settings: Settings) -> str:
    """The dev token of this state dir, created on first use."""
    return _dev_file_token(settings, DEV_TOKEN_FILE, "gnomon-dev-")


def dev_admin_token(settings: Settings) -> str:
    """The dev admin token of this state dir (tenant ``dev``, role admin), created on first use."""
    return _dev_file_token(settings, DEV_ADMIN_TOKEN_FILE, "gnomon-dev-admin-")
