"""HTTP targets: POST the payload to a callback URL, safely.

The URL is the tenant's, the network is the operator's. So every hop goes through the
SSRF guard (``gnomon.outbound``) and connects to the address the guard checked;
each attempt gets its own client (no cookies cross tenants); the response body is read
up to ``response_max_bytes`` and no further; URLs and transport errors are logged with
credentials redacted; and the request is signed with the tenant's ``http-signing-key``
so the receiver can tell gnomon's calls from forgeries (see ``verify_signature``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import httpx

from gnomon.core.messages import LogStream
from gnomon.core.model import Target
from gnomon.core.runs import Outcome
from gnomon.outbound.http import (
    REDIRECT_STATUSES,
    CallAborted,
    HttpPolicy,
    Pinned,
    pin,
    redact_text,
    redact_url,
    sign,
    url_secrets,
    within_deadline,
)
from gnomon.outbound.netguard import Resolver, TargetRefused, system_resolver
from gnomon.outbound.secrets import SecretStore
from gnomon.worker.attempt import LINE_MAX_CHARS, AttemptContext, AttemptResult


class HttpExecutor:
    """POSTs ``{runId, jobId, attempt, payload}`` to the callback URL with
    ``Idempotency-Key: <run id>``. 2xx is success; anything else, a refused
    destination or a transport error is a failed attempt."""

    def __init__(self, policy: HttpPolicy | None = None, secrets: SecretStore | None = None,
                 resolver: Resolver = system_resolver) -> None:
        self.policy = policy or HttpPolicy()
        self._secrets = secrets
        self._resolver = resolver
        # Shared by the per-attempt clients: CA certificates only, no per-tenant state;
        # loading the CA bundle for every attempt would cost ~30 ms.
        self._tls = httpx.create_ssl_context()

    def execute(self, target: Target, ctx: AttemptContext) -> AttemptResult:
        assert target.url is not None
        url = target.url

        def call(on_client: Callable[[httpx.Client], None]) -> AttemptResult:
            try:
                return self.attempt(url, ctx, on_client)
            except Exception as exc:
                return AttemptResult(Outcome.FAILED, None, f"http target: {type(exc).__name__}")

        # one overall deadline, and cancel honoured at once (within_deadline)
        try:
            return within_deadline(call, ctx.timeout_s, ctx.stop, name=f"http-{ctx.run_id}")
        except CallAborted as aborted:
            if aborted.stopped:
                ctx.log(LogStream.SYSTEM, f"stopped: {ctx.stop_reason}; connection closed")
                return AttemptResult(Outcome.FAILED, None, f"stopped: {ctx.stop_reason}")
            ctx.log(LogStream.SYSTEM, f"no complete answer within {ctx.timeout_s:g}s; connection closed")
            return AttemptResult(Outcome.TIMED_OUT, None, f"no response within {ctx.timeout_s:g}s")

    def attempt(self, url: str, ctx: AttemptContext,
                on_client: Callable[[httpx.Client], None] = lambda _c: None) -> AttemptResult:
        """One attempt, start to end, in the calling thread. ``on_client`` gets the
        attempt's client, so a supervisor can close it to abort the exchange."""
        secrets = url_secrets(url)
        deadline = time.monotonic() + ctx.timeout_s
        ctx.log(LogStream.SYSTEM, f"POST {redact_url(url)}")
        try:
            body = self._body(ctx)
            headers = self._headers(ctx, body)
            # trust_env=False: an HTTP(S)_PROXY from the environment would connect to
            # whatever it resolves, not to the address the guard checked.
            with httpx.Client(verify=self._tls, trust_env=False, follow_redirects=False,
                              timeout=ctx.timeout_s) as client:
                on_client(client)
                return self._exchange(client, httpx.URL(url), body, headers, ctx, deadline)
        except TargetRefused as exc:
            msg = redact_text(f"http target refused: {exc}", secrets)
            ctx.log(LogStream.SYSTEM, msg)
            return AttemptResult(Outcome.FAILED, None, msg)
        except httpx.TimeoutException:
            return AttemptResult(Outcome.TIMED_OUT, None, f"no response within {ctx.timeout_s:g}s")
        except (httpx.HTTPError, httpx.InvalidURL, ValueError) as exc:
            return AttemptResult(Outcome.FAILED, None, redact_text(f"{type(exc).__name__}: {exc}", secrets))

    @staticmethod
    def _body(ctx: AttemptContext) -> bytes:
        """Serialised here, not by httpx, because the signature covers these exact bytes."""
        doc = {"runId": ctx.run_id, "jobId": ctx.job_id, "attempt": ctx.attempt, "payload": ctx.payload}
        return json.dumps(doc, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()

    def _headers(self, ctx: AttemptContext, body: bytes) -> dict[str, str]:
        headers = {
            "Content-Type": "application/json",
            "Accept-Encoding": "identity",
            "Idempotency-Key": ctx.run_id,
            "X-Gnomon-Run-Id": ctx.run_id,
            "X-Gnomon-Job-Id": ctx.job_id,
            "X-Gnomon-Attempt": str(ctx.attempt),
            "X-Gnomon-Tenant": ctx.tenant,
        }
        key = self._secrets.signing_key(ctx.tenant) if self._secrets is not None else None
        if key is None:
            ctx.log(LogStream.SYSTEM, "unsigned: tenant has no http-signing-key secret")
            return headers
        timestamp = str(int(time.time()))
        return {**headers, "X-Gnomon-Timestamp": timestamp, "X-Gnomon-Signature": sign(key, timestamp, body)}

    def _exchange(self, client: httpx.Client, url: httpx.URL, body: bytes, headers: dict[str, str],
                  ctx: AttemptContext, deadline: float) -> AttemptResult:
        """Send, and follow up to ``redirects_max`` 307/308 hops, each one guarded anew."""
        hops = 0
        while True:
            if ctx.stop.is_set():
                return AttemptResult(Outcome.FAILED, None, f"stopped: {ctx.stop_reason}")
            pinned = self._pin(url)
            timeout = max(deadline - time.monotonic(), 0.001)
            with client.stream("POST", pinned.url, content=body, headers={**headers, **pinned.headers},
                               extensions=pinned.extensions, timeout=timeout) as resp:
                location = resp.headers.get("location")
                if resp.status_code in REDIRECT_STATUSES and location and hops < self.policy.redirects_max:
                    hops += 1
                    url = url.join(location)
                    ctx.log(LogStream.SYSTEM, f"HTTP {resp.status_code} redirect to {redact_url(str(url))}")
                    continue
                return self._finish(resp, ctx, deadline)

    def _pin(self, url: httpx.URL) -> Pinned:
        return pin(url, self.policy, self._resolver)

    def _finish(self, resp: httpx.Response, ctx: AttemptContext, deadline: float) -> AttemptResult:
        ctx.log(LogStream.SYSTEM, f"HTTP {resp.status_code}")
        self._log_body(resp, ctx, deadline)
        ok = 200 <= resp.status_code < 300
        return AttemptResult(Outcome.SUCCEEDED if ok else Outcome.FAILED, resp.status_code,
                             None if ok else f"HTTP {resp.status_code}")

    def _log_body(self, resp: httpx.Response, ctx: AttemptContext, deadline: float) -> None:
        encoding = resp.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            ctx.log(LogStream.SYSTEM, f"response body is {encoding}-encoded; not logged")
            return
        head, cut = self._read_head(resp, ctx, deadline)
        text = head.decode(_charset(resp), errors="replace")
        for i in range(0, len(text), LINE_MAX_CHARS):
            ctx.log(LogStream.STDOUT, text[i:i + LINE_MAX_CHARS])
        if cut:
            ctx.log(LogStream.SYSTEM, f"response body cut at {len(head)} bytes")

    def _read_head(self, resp: httpx.Response, ctx: AttemptContext, deadline: float) -> tuple[bytes, bool]:
        """At most ``response_max_bytes`` of the body, and whether more was left unread.
        Raw bytes: decoding a compressed body could expand one chunk without bound."""
        cap = self.policy.response_max_bytes
        head = bytearray()
        seen = 0
        for chunk in resp.iter_raw():
            seen += len(chunk)
            head += chunk[: cap - len(head)]
            if seen > cap or ctx.stop.is_set() or time.monotonic() > deadline:
                return bytes(head), True
        return bytes(head), False


def _charset(resp: httpx.Response) -> str:
    name = resp.charset_encoding or "utf-8"
    try:
        "".encode(name)
    except LookupError:
        return "utf-8"
    return name
