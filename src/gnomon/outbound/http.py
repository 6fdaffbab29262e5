"""Calls to a tenant's URL, made safely: the policy, the SSRF check and pinning, signing
and redaction. Used by the workers' HTTP targets (``gnomon.worker.http_target``) and the
alerter's webhooks (``gnomon.alerts.sender``).

The URL is the tenant's, the network is the operator's: every hop goes through the SSRF
guard (``gnomon.outbound.netguard``) and connects to the address the guard checked; URLs
and transport errors are logged with credentials redacted; requests are signed with the
tenant's ``http-signing-key`` so the receiver can tell gnomon's calls from forgeries (see
``verify_signature``).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit, urlunsplit

import httpx

from gnomon.core.errors import InfraError
from gnomon.outbound.netguard import (
    IPNetwork,
    Resolver,
    TargetRefused,
    literal_address,
    parse_networks,
    resolve_checked,
    system_resolver,
)

T = TypeVar("T")

SIGNATURE_VERSION = "v1"
SIGNATURE_TOLERANCE_S = 300
REDIRECT_STATUSES = frozenset({307, 308})
"""Only these keep the method and body. Following a 301/302/303 would turn the POST into
a bodiless GET: the payload would not be delivered, yet a 200 would count as success."""
REDACTED = "***"
SECRET_MIN_CHARS = 3
URL_IN_TEXT_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")


DEFAULT_PORTS = ("443", "8443")
"""https's ports. Not 25 (mail), 6379 (Redis) and the like: a callback reaches web servers."""
PLAIN_HTTP_PORTS = ("80", "8080")
"""Added to ``DEFAULT_PORTS`` by ``allow_plain_http`` when no ports are named."""
PORT_MAX = 65535


def parse_ports(items: Iterable[str]) -> tuple[tuple[int, int], ...]:
    """``["443", "8000-8999"]`` as inclusive ranges; ValueError on anything else."""
    ranges: list[tuple[int, int]] = []
    for item in items:
        lo_s, sep, hi_s = item.strip().partition("-")
        if not lo_s.isdigit() or (sep and not hi_s.isdigit()):
            raise ValueError(f"{item!r} is not a port or a range of ports (like 443 or 8000-8999)")
        lo, hi = int(lo_s), int(hi_s) if sep else int(lo_s)
        if not 1 <= lo <= hi <= PORT_MAX:
            raise ValueError(f"{item!r} is not a port or a range of ports within 1-{PORT_MAX}")
        ranges.append((lo, hi))
    return tuple(ranges)


@dataclass(frozen=True)
class HttpPolicy:
    """What a pool's HTTP targets (or the alerter's webhooks) may reach and how much of the
    answer is kept.

    ``allow_private`` opens loopback, private, link-local, CGNAT and the other
    non-public ranges (not the cloud metadata addresses); ``allowed_cidrs`` opens
    exactly the listed networks, metadata included. Calls are https only unless
    ``allow_plain_http``; a URL's port must be in ``allowed_ports`` (default: https's
    ports, and 80 and 8080 too with ``allow_plain_http``); credentials in a URL are
    refused over plain http (they would cross the network in clear text)."""

    allow_private: bool = False
    allowed_cidrs: tuple[str, ...] = ()
    response_max_bytes: int = 8192
    redirects_max: int = 3
    allow_plain_http: bool = False
    allowed_ports: tuple[str, ...] = ()  # empty: the defaults above
    networks: tuple[IPNetwork, ...] = field(init=False, repr=False, compare=False)
    port_ranges: tuple[tuple[int, int], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.response_max_bytes < 0 or self.redirects_max < 0:
            raise ValueError("response_max_bytes and redirects_max must be >= 0")
        object.__setattr__(self, "networks", parse_networks(self.allowed_cidrs))
        ports = self.allowed_ports or (DEFAULT_PORTS + (PLAIN_HTTP_PORTS if self.allow_plain_http else ()))
        object.__setattr__(self, "port_ranges", parse_ports(ports))

    def port_allowed(self, port: int) -> bool:
        return any(lo <= port <= hi for lo, hi in self.port_ranges)

    def ports_text(self) -> str:
        return ", ".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in self.port_ranges)

    def describe(self) -> str:
        """One line for a process's start: what its outbound calls may reach."""
        scheme = "http and https" if self.allow_plain_http else "https only (plain http refused)"
        where = "private networks too" if self.allow_private else "public addresses"
        opened = f" and {', '.join(self.allowed_cidrs)}" if self.allowed_cidrs else ""
        return f"{scheme}, ports {self.ports_text()}, {where}{opened}"

    def url_refusal(self, url: httpx.URL) -> str | None:
        """Why ``url``'s scheme, port or credentials are refused under this policy (a
        sentence naming the setting that would open it), or None. The address is the SSRF
        guard's (``pin``)."""
        if url.scheme not in ("http", "https"):
            return f"scheme {url.scheme!r} is not http or https"
        if url.scheme == "http" and not self.allow_plain_http:
            return "plain http is not allowed (https only; the policy's allow_plain_http opens it)"
        port = url.port or (443 if url.scheme == "https" else 80)
        if not self.port_allowed(port):
            return f"port {port} is not an allowed port ({self.ports_text()}; the policy's allowed_ports opens more)"
        if url.scheme == "http" and (url.username or url.password):
            return "credentials in an http:// URL would cross the network in clear text; use https"
        return None


# ---- signatures ------------------------------------------------------------------------

def sign(key: bytes, timestamp: str, body: bytes) -> str:
    """The ``X-Gnomon-Signature`` value: ``v1=<hex HMAC-SHA256(key, "<timestamp>.<body>")>``.
    The timestamp is inside the MAC so a captured request cannot be replayed later."""
    mac = hmac.new(key, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"{SIGNATURE_VERSION}={mac}"


def verify_signature(key: bytes, timestamp: str, body: bytes, header: str, now_s: float,
                     tolerance_s: int = SIGNATURE_TOLERANCE_S) -> bool:
    """What a receiver runs: True if ``header`` (``X-Gnomon-Signature``; several
    comma-separated ``v1=`` values are accepted, for key rotation) signs ``body`` at
    ``timestamp`` (``X-Gnomon-Timestamp``) and the timestamp is within ``tolerance_s``."""
    if not (timestamp.isascii() and timestamp.isdigit()) or abs(now_s - int(timestamp)) > tolerance_s:
        return False
    expected = sign(key, timestamp, body).encode()
    return any(hmac.compare_digest(expected, part.strip().encode()) for part in header.split(","))


# ---- redaction -------------------------------------------------------------------------

def redact_url(url: str) -> str:
    """``https://user:pass@host/p?token=abc`` -> ``https://***@host/p?token=***``: the
    userinfo and every query value go, since any of them may be a credential."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable url>"
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{REDACTED}@{netloc.rpartition('@')[2]}"
    query = "&".join(_redact_query_item(item) for item in parts.query.split("&")) if parts.query else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def _redact_query_item(item: str) -> str:
    key, sep, _ = item.partition("=")
    return f"{key}={REDACTED}" if sep else REDACTED


def url_secrets(url: str) -> list[str]:
    """The credential-like pieces of ``url`` (userinfo, query values), raw and decoded,
    longest first so a value is replaced before any shorter value inside it."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return []
    found = set(parts.netloc.rpartition("@")[0].split(":")) if "@" in parts.netloc else set()
    found.update(item.partition("=")[2] or item for item in parts.query.split("&") if item)
    found |= {unquote(s) for s in found}
    return sorted((s for s in found if len(s) >= SECRET_MIN_CHARS), key=len, reverse=True)


def redact_text(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every URL in it redacted and every known secret replaced: httpx's
    error messages quote the request URL."""
    text = URL_IN_TEXT_RE.sub(lambda m: redact_url(m.group()), text)
    for secret in secrets:
        text = text.replace(secret, REDACTED)
    return text


# ---- pinning ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Pinned:
    """One hop's request as sent: the URL with the checked IP in place of the name (and
    no userinfo), the Host header and TLS name kept on the name."""

    url: httpx.URL
    headers: dict[str, str]
    extensions: dict[str, Any]


def pin(url: httpx.URL, policy: HttpPolicy, resolver: Resolver = system_resolver) -> Pinned:
    """``url`` checked by the SSRF guard under ``policy`` and pinned to the address it
    checked (raises ``TargetRefused``). Also what the alerter's webhook calls go through."""
    why = policy.url_refusal(url)
    if why is not None:
        raise TargetRefused(why)
    host = url.raw_host.decode("ascii")
    if not host:
        raise TargetRefused("the URL has no host")
    port = url.port or (443 if url.scheme == "https" else 80)
    dest = resolve_checked(host, port, resolver, allow_private=policy.allow_private, allowed=policy.networks)
    headers = {"Host": url.netloc.decode("ascii")}
    if url.username or url.password:
        token = base64.b64encode(f"{url.username}:{url.password}".encode()).decode()
        headers["Authorization"] = f"Basic {token}"
    named_tls = url.scheme == "https" and literal_address(host) is None
    return Pinned(url=url.copy_with(host=str(dest.address), username=None, password=None, fragment=None),
                   headers=headers, extensions={"sni_hostname": host} if named_tls else {})


class CallAborted(InfraError):
    """``within_deadline`` closed the call's connection: ``stopped`` says whether a stop
    request did (else the deadline passed)."""

    def __init__(self, stopped: bool) -> None:
        super().__init__("stopped" if stopped else "deadline passed")
        self.stopped = stopped


ABORT_JOIN_S = 1.0  # after closing its client, how long the aborted call may take to unwind


def within_deadline(call: Callable[[Callable[[httpx.Client], None]], T], timeout_s: float,
                    stop: threading.Event | None = None, name: str = "outbound-call") -> T:
    """``call(on_client)`` with one overall deadline. httpx's timeouts are per read: a
    server trickling its status line a byte a second would hold the call for as long as it
    likes. The call runs in a thread and hands its client to ``on_client``; at
    ``timeout_s`` (or once ``stop`` is set) that client is closed, its socket under the
    reader, and ``CallAborted`` raised. Whatever ``call`` raises is raised here."""
    result: list[T] = []
    error: list[BaseException] = []
    clients: list[httpx.Client] = []

    def run() -> None:
        try:
            result.append(call(clients.append))
        except BaseException as exc:  # handed to the caller's thread
            error.append(exc)

    t = threading.Thread(target=run, daemon=True, name=name)
    t.start()
    deadline = time.monotonic() + timeout_s
    while t.is_alive() and time.monotonic() < deadline and not (stop is not None and stop.is_set()):
        t.join(0.05)
    if not t.is_alive():
        if error:
            raise error[0]
        return result[0]
    for client in clients:  # abort the exchange: its socket closes under the reader
        with contextlib.suppress(Exception):
            client.close()
    t.join(ABORT_JOIN_S)
    raise CallAborted(stopped=stop is not None and stop.is_set())
