"""Per-tenant secrets kept on the worker host.

A secret is one file, ``<root>/<tenant>/<name>``; the operator creates them (mode 0600,
directories 0700). Jobs name the secrets they need (``"secrets": ["db-password"]``); the
worker injects their values into the attempt's sandbox as environment variables
(``GNOMON_SECRET_DB_PASSWORD``). Values never travel on Kafka, so they never appear in
the job record, the ledger, history, logs or exports.

``signing_key(tenant)`` is the HMAC key that signs the tenant's HTTP callbacks: the
secret named ``http-signing-key``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from gnomon.core.errors import InfraError

SECRET_NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,62}$")
SIGNING_KEY_NAME = "http-signing-key"
SECRET_MAX_BYTES = 64 * 1024


class SecretError(InfraError):
    """A secret is missing, unreadable or too loosely protected."""


def env_name(secret: str) -> str:
    """``db-password`` -> ``GNOMON_SECRET_DB_PASSWORD``."""
    return "GNOMON_SECRET_" + secret.upper().replace("-", "_")


class SecretStore:
    def __init__(self, root: Path | None) -> None:
        self.root = root

    def get(self, tenant: str, name: str) -> str:
        if not SECRET_NAME_RE.match(name) or not re.match(r"^[A-Za-z0-9._-]{1,128}$", tenant) or tenant in {".", ".."}:
            raise SecretError(f"invalid secret reference {name!r} for tenant {tenant!r}")
        if self.root is None:
            raise SecretError(f"secret {name!r}: this worker has no secrets directory (--secrets-dir)")
        path = self.root / tenant / name
        try:
            st = path.stat()
            if st.st_mode & 0o077:
                raise SecretError(f"secret {name!r} of tenant {tenant!r} is readable by others; chmod 600 {path}")
            if st.st_size > SECRET_MAX_BYTES:
                raise SecretError(f"secret {name!r} is larger than {SECRET_MAX_BYTES} bytes")
            return path.read_text().rstrip("\n")
        except FileNotFoundError:
            raise SecretError(f"tenant {tenant!r} has no secret {name!r} on this worker") from None
        except OSError as exc:
            raise SecretError(f"secret {name!r} of tenant {tenant!r}: {exc.strerror}") from None

    def signing_key(self, tenant: str) -> bytes | None:
        """The tenant's HTTP signing key, or None if it has none."""
        try:
            return self.get(tenant, SIGNING_KEY_NAME).encode()
        except SecretError:
            return None

    def env_for(self, ctx: Any) -> dict[str, str]:
        """The sandbox variables of the secrets ``ctx.secrets`` names, for ``ctx.tenant``.
        Raises SecretError naming the first one that is missing."""
        return {env_name(name): self.get(ctx.tenant, name) for name in ctx.secrets}


def redactor(values: Iterable[str]) -> Callable[[str], str]:
    """A function that replaces each secret value (of 4+ characters) in a log line with ***.

    Logs are cut into lines, so each line of a multi-line secret (a PEM key) is redacted
    on its own too. A secret shorter than 4 characters is not redacted (it would blank
    out ordinary words), nor is a part of a secret cut by the 8 KiB line limit."""
    pieces = {v for v in values} | {line.strip() for v in values for line in v.splitlines()}
    secrets = sorted({p for p in pieces if len(p) >= 4}, key=len, reverse=True)
    if not secrets:
        return lambda line: line

    def redact(line: str) -> str:
        for value in secrets:
            if value in line:
                line = line.replace(value, "***")
        return line

    return redact
