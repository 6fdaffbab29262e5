"""The UI's sign-in cookie and CSRF token (pure; no I/O).

The cookie holds the API token the user signed in with (HttpOnly, SameSite=Strict,
Path=/ui): only the ``/ui`` routes read it, the JSON API under ``/v1`` never does. Its
CSRF token is derived from it (an HMAC keyed by the API token), so it needs no server
state and every API process (``--workers N``) agrees on it; a page carries it in a
``<meta>`` tag and the UI's scripts send it as ``X-CSRF-Token``. SameSite=Strict already
keeps the cookie off cross-site requests; the CSRF token and the Origin check are a
second lock on every request that changes something.
"""

from __future__ import annotations

import hashlib
import hmac
from urllib.parse import urlsplit

COOKIE = "gnomon_ui"
CSRF_HEADER = "X-CSRF-Token"
CSRF_FIELD = "csrf"
PREFIX = "/ui"
TOKEN_MAX_CHARS = 512
_CSRF_CONTEXT = b"gnomon-ui-csrf-v1"


def csrf_for(token: str) -> str:
    """The CSRF token of a session signed in with ``token``."""
    return hmac.new(token.encode(), _CSRF_CONTEXT, hashlib.sha256).hexdigest()


def csrf_ok(token: str, presented: str | None) -> bool:
    return presented is not None and hmac.compare_digest(csrf_for(token).encode(), presented.encode())


def same_origin(origin: str | None, host: str | None) -> bool:
    """False when the browser says the request comes from another origin than ``host``
    (the Host header); no Origin header (curl, an old browser) is accepted, and then
    the CSRF token alone decides."""
    if origin is None:
        return True
    if origin == "null" or not host:
        return False
    return urlsplit(origin).netloc.lower() == host.lower()


def safe_next(target: str | None) -> str:
    """Where to go after signing in: a path under /ui, else the jobs page (no open redirect)."""
    if target and target.startswith(PREFIX + "/") and not target.startswith("//") and "\\" not in target \
            and not any(c in target for c in "\r\n"):
        return target
    return PREFIX + "/jobs"
