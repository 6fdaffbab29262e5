"""Who may use the schema registry: HTTP Basic, two users (issue 24, finding 7).

``registry-admin`` may read and write (register a schema, set a compatibility level);
``registry-reader`` may only read. Producers, Kafka Connect's converter and the operators'
tools read as the reader; the admin user is for whoever evolves the schemas by hand
(the registry imports gnomon's own schemas itself at start, with no HTTP call).
Both are credential files (``gnomon.credentials``: ``registry-admin.json``,
``registry-reader.json``, 0600) that ``gnomon infra up`` writes; the registry reads them
at start. ``GET /`` (an empty object: a health probe) needs no credential; every other
path does. Wrong or missing credentials: 401 with ``WWW-Authenticate``; the reader
writing: 403. Confluent clients send them as ``basic.auth.user.info`` = ``user:password``.
"""

from __future__ import annotations

import base64
import binascii
import hmac
from dataclasses import dataclass, field
from pathlib import Path

from gnomon import credentials
from gnomon.credentials import Credential
from gnomon.registry.errors import ApiError

REALM = 'Basic realm="gnomon schema registry", charset="UTF-8"'
HEADER_MAX_CHARS = 1024


@dataclass(frozen=True)
class RegistryUsers:
    admin: Credential
    reader: Credential = field(repr=False)

    @classmethod
    def ensure(cls, directory: Path) -> RegistryUsers:
        """The two users of ``directory``, made if missing (as ``gnomon infra up`` does)."""
        return cls(credentials.ensure(directory, credentials.REGISTRY_ADMIN),
                   credentials.ensure(directory, credentials.REGISTRY_READER))

    def may(self, authorization: str | None, *, write: bool) -> None:
        """Nothing if the ``Authorization`` header allows it; else ApiError 401 or 403."""
        user = self._user(authorization)
        if user is None:
            raise ApiError(401, 40101, "authentication required: HTTP Basic with a registry user "
                                       "(credentials/registry-reader.json reads, registry-admin.json writes)")
        if write and user is not self.admin:
            raise ApiError(403, 40301, f"user {user.username!r} may only read; writes need the registry's admin user")

    def _user(self, authorization: str | None) -> Credential | None:
        if not authorization or len(authorization) > HEADER_MAX_CHARS:
            return None
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "basic":
            return None
        try:
            username, sep, password = base64.b64decode(token.strip(), validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError, ValueError):
            return None
        if not sep:
            return None
        found = None
        for cred in (self.admin, self.reader):  # compare both, whichever matches: no timing on which
            ok = hmac.compare_digest(username.encode(), cred.username.encode()) & \
                hmac.compare_digest(password.encode(), cred.password.encode())
            if ok and found is None:
                found = cred
        return found


def user_info(cred: Credential) -> str:
    """``user:password``: Confluent clients' ``basic.auth.user.info``."""
    return f"{cred.username}:{cred.password}"


def basic_header(cred: Credential) -> str:
    return "Basic " + base64.b64encode(user_info(cred).encode()).decode()
