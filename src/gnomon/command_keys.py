"""Command keys on disk: each tenant's keys that sign its job commands (ADR 0006 (b)).

``<command keys dir>/tenants/<tenant>.json`` (0600, in a 0700 directory; the directory is
``$GNOMON_COMMAND_KEYS_DIR``, default ``<credentials dir>/command-keys``)::

    {"tenant": "acme", "keys": [{"id": "acme.3f9a0c1d2b", "secret": "<64 hex>"}, ...]}

The newest key (the last) signs; every listed key verifies, so a rotation adds a key,
and the old one is removed (``revoke_old``) once its producers have the new file.
``operator.json`` holds the operator's key (tenant ``*``: it may sign for any tenant),
for the operators' tools, tests and benches, like the Kafka ``admin`` role.

Who holds what: the processor reads every file (``DirKeyring``: it verifies); the API
signs the commands of the tenant it authenticated and issues a tenant's first key when
that tenant first writes (``Signer(issue=True)``); a team's own producer gets its
tenant's file only (``$GNOMON_COMMAND_KEY_FILE``, ``gnomon.events``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from gnomon import credentials
from gnomon.config import Settings
from gnomon.core.command_auth import OPERATOR, CommandKey, Headers, sign
from gnomon.core.errors import ValidationError
from gnomon.core.tenants import check_tenant_name
from gnomon.credentials import CredentialError

log = logging.getLogger("gnomon.command_keys")

KEYS_PER_TENANT_MAX = 4  # the signing key and the ones still accepted during a rotation
RELOAD_MIN_S = 1.0  # a key id not found re-reads the directory at most this often
OPERATOR_FILE = "operator.json"
KEY_FILE_ENV = "GNOMON_COMMAND_KEY_FILE"


def keys_dir(settings: Settings) -> Path:
    return Path(p) if (p := os.environ.get("GNOMON_COMMAND_KEYS_DIR")) else settings.credentials_dir / "command-keys"


def tenant_file(directory: Path, tenant: str) -> Path:
    check_tenant_name(tenant)
    return directory / "tenants" / f"{tenant}.json"


def _new_key(tenant: str) -> CommandKey:
    prefix = "operator" if tenant == OPERATOR else tenant[:64]
    return CommandKey(f"{prefix}.{secrets.token_hex(5)}", tenant, secrets.token_bytes(32))


def read_file(path: Path) -> list[CommandKey]:
    """The keys of one file, oldest first; [] when there is no file."""
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        raise CredentialError(f"cannot read command keys {path}: {exc}") from exc
    try:
        tenant = str(doc["tenant"])
        keys = [CommandKey(str(k["id"]), tenant, bytes.fromhex(str(k["secret"]))) for k in doc["keys"]]
    except (KeyError, TypeError, ValueError, AssertionError) as exc:
        raise CredentialError(f"{path} must hold {{\"tenant\": ..., \"keys\": [{{\"id\": ..., \"secret\": "
                              f"<64+ hex>}}]}}: {exc!r}") from exc
    if not keys:
        raise CredentialError(f"{path} lists no key")
    return keys


def _write(path: Path, tenant: str, keys: list[CommandKey]) -> None:
    credentials.ensure_dir(path.parent.parent)
    credentials.ensure_dir(path.parent)
    doc = {"tenant": tenant, "keys": [{"id": k.key_id, "secret": k.secret.hex()} for k in keys]}
    credentials.write_secret(path, json.dumps(doc, indent=2) + "\n")


_lock = threading.Lock()  # the threads of one process; ``_locked`` adds the other processes


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """One writer of the keys directory at a time, across processes (the API's workers, the
    CLI): two first commands of a tenant make one key, and a rotation loses no key."""
    credentials.ensure_dir(directory)
    with _lock:
        fd = os.open(directory / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # (releases the lock)


def _mtime_ns(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return -1


def ensure(directory: Path, tenant: str) -> CommandKey:
    """The signing key of ``tenant`` (``OPERATOR``: the operator's), made if it has none."""
    path = directory / OPERATOR_FILE if tenant == OPERATOR else tenant_file(directory, tenant)
    keys = read_file(path)
    if keys:
        return keys[-1]
    with _locked(directory):
        keys = read_file(path)  # another process may have made it meanwhile
        if not keys:
            keys = [_new_key(tenant)]
            _write(path, tenant, keys)
    return keys[-1]


def rotate(directory: Path, tenant: str, *, revoke_old: bool = False) -> CommandKey:
    """Add a new signing key for ``tenant``; ``revoke_old``: drop every other key."""
    path = directory / OPERATOR_FILE if tenant == OPERATOR else tenant_file(directory, tenant)
    with _locked(directory):
        keys = [] if revoke_old else read_file(path)
        keys = [*keys, _new_key(tenant)][-KEYS_PER_TENANT_MAX:]
        _write(path, tenant, keys)
    return keys[-1]


def operator_key(settings: Settings | None = None) -> CommandKey:
    """The operator's key of this machine's state dir, made on first use (tests, benches)."""
    return ensure(keys_dir(settings or Settings()), OPERATOR)


def operator_headers(topic: str, record_key: bytes | None, value: bytes | None,
                     settings: Settings | None = None) -> list[tuple[str, bytes]]:
    """The operator's signature of one job-command record, as confluent-kafka's
    ``produce(..., headers=...)`` takes it (the tests' and benches' raw producers)."""
    return list(sign(operator_key(settings), topic, record_key, value))


def key_for_producer(settings: Settings, tenant: str) -> CommandKey:
    """The key a team's own producer signs with: ``$GNOMON_COMMAND_KEY_FILE`` (the file
    the operator handed over), else the tenant's file under the local keys directory.
    Never issues one: a producer that could make its own key would prove nothing."""
    env = os.environ.get(KEY_FILE_ENV)
    path = Path(env) if env else tenant_file(keys_dir(settings), tenant)
    keys = read_file(path)
    if not keys:
        raise CredentialError(f"no command key for tenant {tenant!r} at {path}: an operator makes one with "
                              f"`gnomon tenants command-key {tenant}` and hands over that file "
                              f"(${KEY_FILE_ENV} names it)")
    if keys[-1].tenant not in (tenant, OPERATOR):
        raise ValidationError("tenant", f"the command key in {path} is tenant {keys[-1].tenant!r}'s, not {tenant!r}'s")
    return keys[-1]


class DirKeyring:
    """The processor's view of every key in the directory. A key id it does not know
    re-reads the directory when it changed (its files are replaced by rename, which
    changes the directory's mtime: a stat, at most every ``RELOAD_MIN_S`` for a known id)
    or, unchanged, at most every ``RELOAD_MIN_S``: a new tenant's first command verifies
    without a restart, a revoked key stops verifying within a second, and a flood of
    forged ids costs a stat each, no re-read."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._keys: dict[str, CommandKey] = {}
        self._loaded_at = -RELOAD_MIN_S
        self._checked_at = -RELOAD_MIN_S
        self._stamp: tuple[int, int] | None = None
        self.reloads = 0

    def _dir_stamp(self) -> tuple[int, int]:
        return _mtime_ns(self.directory), _mtime_ns(self.directory / "tenants")

    def _load(self) -> None:
        self._stamp = self._dir_stamp()
        self._loaded_at = time.monotonic()
        keys: dict[str, CommandKey] = {}
        files = [self.directory / OPERATOR_FILE, *sorted((self.directory / "tenants").glob("*.json"))]
        for path in files:
            try:
                found = read_file(path)
            except CredentialError as exc:  # one bad file refuses its tenant's commands, not everyone's
                log.error("command keys: %s (its keys are not loaded)", exc)
                continue
            for key in found:
                if key.tenant == OPERATOR and path.name != OPERATOR_FILE:
                    continue  # only operator.json may hold the operator's key
                keys[key.key_id] = key
        self._keys = keys
        self.reloads += 1

    def operator(self) -> CommandKey | None:
        try:
            keys = read_file(self.directory / OPERATOR_FILE)
        except CredentialError as exc:
            log.error("command keys: %s (no operator key)", exc)
            return None
        return next((k for k in reversed(keys) if k.tenant == OPERATOR), None)

    def find(self, key_id: str) -> CommandKey | None:
        now = time.monotonic()
        known = key_id in self._keys
        if not known or now - self._checked_at >= RELOAD_MIN_S:
            self._checked_at = now
            if self._dir_stamp() != self._stamp or (not known and now - self._loaded_at >= RELOAD_MIN_S):
                self._load()
        return self._keys.get(key_id)


@dataclass
class _Cached:
    key: CommandKey
    mtime_ns: int


class Signer:
    """Signs job commands with their tenant's newest key. ``issue``: make a tenant's
    first key when it has none (the API, which authenticated the tenant); otherwise a
    tenant without a key is a ``CredentialError``."""

    def __init__(self, directory: Path, *, issue: bool) -> None:
        self.directory = directory
        self.issue = issue
        self._cache: dict[str, _Cached] = {}

    def key(self, tenant: str) -> CommandKey:
        """The tenant's signing key; its file is re-read when it changed (a stat per call)."""
        path = tenant_file(self.directory, tenant)
        hit = self._cache.get(tenant)
        if hit is not None and hit.mtime_ns == _mtime_ns(path):
            return hit.key
        if self.issue:
            key = ensure(self.directory, tenant)
        else:
            keys = read_file(path)
            if not keys:
                raise CredentialError(f"no command key for tenant {tenant!r} under {self.directory}")
            key = keys[-1]
        self._cache[tenant] = _Cached(key, _mtime_ns(path))
        return key

    def headers(self, tenant: str, topic: str, record_key: bytes | None, value: bytes | None) -> Headers:
        return sign(self.key(tenant), topic, record_key, value)
