"""How a job command read from Kafka proves its tenant (ADR 0006, decision 3 (b)).

Kafka's ACLs are per topic: every holder of the ``api`` credential may write any
tenant's command to the job-commands topic. So every command record carries a
signature header, ``gnomon-sig: v1:<key id>:<hex HMAC-SHA256>``, made with a key that
belongs to one tenant (or to the operator, ``*``, who may act for any tenant). The MAC
covers the topic, the record key and the record value (the encoded command, with its
tenant and its ``at_ms``), each length-prefixed so no two inputs share a message.

The processor (the one decider) decodes the record (one that does not decode is
poisoned, as before) and then verifies it before it looks at the job the command names,
refusing, with an answer on the command-results topic (code ``refused``, field ``signature``), a command
that is unsigned, signed with a key it does not know, signed wrongly (any byte of the
record changed), or signed by another tenant's key than the command's ``tenant``.

A signed record replayed as it is still verifies. Only the processor's principal may
read the commands topic (ADR 0006's ACL table), so a producer cannot copy another
tenant's signed records; and the commands that would do harm again are bounded by age
already (a manual trigger past the idempotency-key retention, a backfill past the run
retention are refused).

Pure: no files, no clock. ``gnomon.command_keys`` keeps the keys on disk.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from gnomon.core.errors import GnomonError

HEADER = "gnomon-sig"
VERSION = "v1"
OPERATOR = "*"  # the tenant of an operator key: may sign for any tenant
_DOMAIN = b"gnomon-command-v1\0"
KEY_ID_MAX_CHARS = 128
SECRET_MIN_BYTES = 32
MAC_BYTES = 32

Headers = tuple[tuple[str, bytes], ...]


class Unauthenticated(GnomonError):
    """A command whose signature does not prove its tenant: refused naming ``signature``."""

    field = "signature"


@dataclass(frozen=True)
class CommandKey:
    """One signing key: ``key_id`` (unique across tenants; it names the key in the
    header), its ``tenant`` (``OPERATOR`` for an operator's key) and its secret."""

    key_id: str
    tenant: str
    secret: bytes = field(repr=False)

    def __post_init__(self) -> None:  # (not asserts: these hold under python -O too)
        if not self.key_id or len(self.key_id) > KEY_ID_MAX_CHARS or ":" in self.key_id:
            raise ValueError(f"a command key id is 1 to {KEY_ID_MAX_CHARS} characters without ':'")
        if len(self.secret) < SECRET_MIN_BYTES:
            raise ValueError(f"a command key's secret is at least {SECRET_MIN_BYTES} bytes")


class Keyring(Protocol):
    def find(self, key_id: str) -> CommandKey | None:
        """The key of that id; None when there is none (an unknown or revoked key)."""
        ...

    def operator(self) -> CommandKey | None:
        """The operator's newest key (None: there is none): what a processor signs what it
        writes to another region's commands with (a moved job's ``AdoptJob``)."""
        ...


@dataclass(frozen=True)
class MemoryKeyring:
    """Keys held in memory (the simulation, tests)."""

    keys: Mapping[str, CommandKey]

    @classmethod
    def of(cls, keys: Iterable[CommandKey]) -> MemoryKeyring:
        return cls({k.key_id: k for k in keys})

    def find(self, key_id: str) -> CommandKey | None:
        return self.keys.get(key_id)

    def operator(self) -> CommandKey | None:
        return next((k for k in reversed(list(self.keys.values())) if k.tenant == OPERATOR), None)


def _mac(secret: bytes, topic: str, key: bytes | None, value: bytes | None) -> bytes:
    parts = [topic.encode(), key or b"", value or b""]
    msg = _DOMAIN + b"".join(struct.pack(">I", len(p)) + p for p in parts)
    return hmac.new(secret, msg, hashlib.sha256).digest()


def sign(key: CommandKey, topic: str, record_key: bytes | None, value: bytes | None) -> Headers:
    """The headers that prove ``key``'s tenant wrote this record."""
    mac = _mac(key.secret, topic, record_key, value)
    return ((HEADER, f"{VERSION}:{key.key_id}:{mac.hex()}".encode()),)


def verify(keyring: Keyring, topic: str, record_key: bytes | None, value: bytes | None,
           headers: Iterable[tuple[str, bytes | None]]) -> CommandKey:
    """The key that signed this record; ``Unauthenticated`` if none did."""
    sigs = [v for k, v in headers if k == HEADER]
    if not sigs:
        raise Unauthenticated(f"the command is not signed (no {HEADER} header): every job command must be "
                              "signed with its tenant's command key (docs/job-events.md)")
    if len(sigs) > 1:
        raise Unauthenticated(f"the command has {len(sigs)} {HEADER} headers; one is expected")
    raw = sigs[0] or b""
    try:
        version, key_id, mac_hex = raw.decode("ascii").split(":")
        mac = bytes.fromhex(mac_hex)
    except (UnicodeDecodeError, ValueError):
        raise Unauthenticated(f"the {HEADER} header is malformed (expected {VERSION}:<key id>:<hex mac>)") from None
    if version != VERSION:
        raise Unauthenticated(f"the {HEADER} header has version {version[:16]!r}; this processor knows {VERSION}")
    if len(mac) != MAC_BYTES:
        raise Unauthenticated(f"the {HEADER} header's MAC has {len(mac)} bytes, not {MAC_BYTES}")
    key = keyring.find(key_id)
    if key is None:
        raise Unauthenticated(f"the command is signed with an unknown command key {key_id[:KEY_ID_MAX_CHARS]!r} "
                              "(revoked, or never issued here)")
    if not hmac.compare_digest(mac, _mac(key.secret, topic, record_key, value)):
        raise Unauthenticated(f"the command's signature (key {key_id!r}) does not match the record: it was "
                              "changed after signing, or signed for another topic")
    return key


def require(proof: CommandKey | Unauthenticated, tenant: str) -> CommandKey:
    """The signing key, if it may act for ``tenant``; else raises ``Unauthenticated``."""
    if isinstance(proof, Unauthenticated):
        raise proof
    if proof.tenant not in (tenant, OPERATOR):
        raise Unauthenticated(f"the command is for tenant {tenant!r} but is signed with key {proof.key_id!r} of "
                              f"tenant {proof.tenant!r}; a producer may act only for its own tenant")
    return proof


_ORIGIN_DOMAIN = b"gnomon-origin-v1\0"


def _origin_mac(secret: bytes, topic: str, record_key: bytes | None, value: bytes | None, at: str) -> bytes:
    parts = [topic.encode(), record_key or b"", value or b"", at.encode()]
    msg = _ORIGIN_DOMAIN + b"".join(struct.pack(">I", len(p)) + p for p in parts)
    return hmac.new(secret, msg, hashlib.sha256).digest()


def sign_origin(key: CommandKey, topic: str, record_key: bytes | None, value: bytes | None, partition: int,
                offset: int) -> bytes:
    """The ``gnomon-origin`` header's value for a command a processor forwards after a grow
    (where it was first written: its answer goes there), signed with ``key`` (the
    operator's, which only processors and operators hold): ``<p>:<o>:<key id>:<hex mac>``."""
    at = f"{partition}:{offset}"
    return f"{at}:{key.key_id}:{_origin_mac(key.secret, topic, record_key, value, at).hex()}".encode()


def verify_origin(keyring: Keyring, topic: str, record_key: bytes | None, value: bytes | None,
                  header: bytes) -> tuple[int, int] | None:
    """The (partition, offset) a ``gnomon-origin`` header names, if an operator's key
    signed it for this record; None for an unsigned, malformed or forged one (a producer's
    header must not take another command's answer)."""
    try:
        p, o, key_id, mac_hex = header.decode("ascii").split(":")
        at, mac = (int(p), int(o)), bytes.fromhex(mac_hex)
    except (UnicodeDecodeError, ValueError):
        return None
    key = keyring.find(key_id)
    if key is None or key.tenant != OPERATOR or len(mac) != MAC_BYTES:
        return None
    if not hmac.compare_digest(mac, _origin_mac(key.secret, topic, record_key, value, f"{at[0]}:{at[1]}")):
        return None
    return at
