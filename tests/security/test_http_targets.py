"""HTTP targets against real local servers: the SSRF guard, pinning, redirects, the body
cap, signatures, redaction and per-attempt clients. No services needed."""

from __future__ import annotations

import ipaddress
import json
import socket
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from gnomon.core.messages import LogStream
from gnomon.core.model import Target, TargetType
from gnomon.core.runs import Outcome
from gnomon.outbound.http import (
    HttpPolicy,
    pin,
    redact_text,
    redact_url,
    url_secrets,
    verify_signature,
)
from gnomon.outbound.netguard import refusal
from gnomon.outbound.secrets import SecretStore
from gnomon.worker.attempt import AttemptContext, AttemptResult
from gnomon.worker.executors import Dispatcher
from gnomon.worker.http_target import HttpExecutor
from gnomon.worker.policy import PoolPolicy

BIG_BODY_BYTES = 10 * 1024 * 1024
CHUNK = b"x" * 65536


def local(**kwargs: Any) -> HttpPolicy:
    """A policy for this file's test servers: plain http on any port (not by default)."""
    return HttpPolicy(allow_plain_http=True, allowed_ports=("1-65535",), **kwargs)


OPEN = local(allow_private=True)


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Server:
    host: str
    requests: list[Seen] = field(default_factory=list)
    redirect_to: str = ""
    big_sent_bytes: int = 0
    big_error: BaseException | None = None
    big_done: threading.Event = field(default_factory=threading.Event)
    httpd: ThreadingHTTPServer | None = None

    @property
    def port(self) -> int:
        assert self.httpd is not None
        return int(self.httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    app: Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def _serve(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        path = urlsplit(self.path).path
        self.app.requests.append(Seen(self.command, self.path, {k.lower(): v for k, v in self.headers.items()},
                                      body))
        routes: dict[str, Callable[[], None]] = {
            "/ok": lambda: self._reply(200, b"hello from " + path.encode()),
            "/fail": lambda: self._reply(500, b"boom"),
            "/found": lambda: self._reply(302, b"", {"Location": "/ok"}),
            "/redirect": lambda: self._reply(307, b"", {"Location": self.app.redirect_to}),
            "/cookie": lambda: self._reply(200, b"set", {"Set-Cookie": "sid=tenant-a-session; Path=/"}),
            "/slow": self._slow,
            "/trickle": self._trickle,
            "/big": self._big,
        }
        routes.get(path, lambda: self._reply(404, b"no"))()

    def _reply(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _slow(self) -> None:
        time.sleep(2)
        self._reply(200, b"late")

    def _trickle(self) -> None:
        """The status line and headers a byte every 0.2 s (6 s in all): each read is
        quick, the answer is not."""
        answer = b"HTTP/1.1 200 OK\r\nX-Pad: " + b"p" * 10 + b"\r\nContent-Length: 0\r\n\r\n"
        try:
            for i in range(len(answer)):
                self.wfile.write(answer[i:i + 1])
                self.wfile.flush()
                time.sleep(0.2)
        except OSError:
            pass
        self.close_connection = True

    def _big(self) -> None:
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65536)
        self.send_response(200)
        self.send_header("Content-Length", str(BIG_BODY_BYTES))
        self.end_headers()
        try:
            while self.app.big_sent_bytes < BIG_BODY_BYTES:
                self.wfile.write(CHUNK)
                self.app.big_sent_bytes += len(CHUNK)
        except OSError as exc:
            self.app.big_error = exc
            self.close_connection = True
        finally:
            self.app.big_done.set()


@pytest.fixture
def serve() -> Iterator[Callable[..., Server]]:
    started: list[Server] = []

    def start(host: str = "127.0.0.1") -> Server:
        app = Server(host)
        app.httpd = ThreadingHTTPServer((host, 0), type("Handler", (_Handler,), {"app": app}))
        app.httpd.daemon_threads = True
        threading.Thread(target=app.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        started.append(app)
        return app

    yield start
    for app in started:
        assert app.httpd is not None
        app.httpd.shutdown()
        app.httpd.server_close()


@dataclass
class Run:
    result: AttemptResult
    lines: list[tuple[LogStream, str]]

    def text(self, stream: LogStream | None = None) -> list[str]:
        return [line for s, line in self.lines if stream is None or s is stream]


def attempt(executor: HttpExecutor, url: str, *, tenant: str = "acme", timeout_s: float = 5.0,
            payload: Any = None) -> Run:
    lines: list[tuple[LogStream, str]] = []
    ctx = AttemptContext(run_id="job-1@1000", job_id="job-1", tenant=tenant, attempt=1,
                         payload={"n": 1} if payload is None else payload, timeout_s=timeout_s,
                         log=lambda s, line: lines.append((s, line)))
    result = executor.execute(Target(TargetType.HTTP, url=url), ctx)
    return Run(result, lines)


def fixed_resolver(table: dict[str, Sequence[str]], calls: list[str] | None = None) -> Callable[[str, int], list[str]]:
    def resolve(host: str, port: int) -> list[str]:
        if calls is not None:
            calls.append(host)
        if host not in table:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return list(table[host])

    return resolve


def signing_store(tmp_path: Path, tenant: str, key: bytes) -> SecretStore:
    d = tmp_path / tenant
    d.mkdir(mode=0o700)
    f = d / "http-signing-key"
    f.write_bytes(key + b"\n")
    f.chmod(0o600)
    return SecretStore(tmp_path)


# ---- the guard -------------------------------------------------------------------------

def test_loopback_is_refused_by_default(serve: Callable[..., Server]) -> None:
    srv = serve()
    run = attempt(HttpExecutor(local()), srv.url + "/ok")
    assert run.result.outcome is Outcome.FAILED
    expected = "http target refused: 127.0.0.1 is a loopback address (pool policy denies private networks)"
    assert run.result.error == expected
    assert expected in run.text(LogStream.SYSTEM)
    assert srv.requests == []


def test_metadata_address_is_refused_before_any_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_connect(*args: Any, **kwargs: Any) -> socket.socket:
        raise AssertionError("the guard must refuse before connecting")

    monkeypatch.setattr(socket, "create_connection", no_connect)
    for policy in (HttpPolicy(), OPEN):
        run = attempt(HttpExecutor(policy), "https://169.254.169.254/latest/meta-data/iam/")
        assert run.result.outcome is Outcome.FAILED
        assert run.result.error is not None
        assert run.result.error.startswith("http target refused: 169.254.169.254 is a cloud metadata address")


@pytest.mark.parametrize(("url", "why"), [
    ("http://1.1.1.1/", "plain http is not allowed (https only; the policy's allow_plain_http opens it)"),
    ("http://1.1.1.1:25/", "plain http is not allowed"),
    ("https://1.1.1.1:25/", "port 25 is not an allowed port (443, 8443; the policy's allowed_ports opens more)"),
    ("https://u:p@cache.example:6379/", "port 6379 is not an allowed port"),
])
def test_https_to_web_ports_only_by_default(monkeypatch: pytest.MonkeyPatch, url: str, why: str) -> None:
    """Issue 24, finding 10: ``http://1.1.1.1:25/`` and ``http://u:p@host:6379/`` were called."""
    def no_connect(*args: Any, **kwargs: Any) -> socket.socket:
        raise AssertionError("refused before connecting")

    monkeypatch.setattr(socket, "create_connection", no_connect)
    run = attempt(HttpExecutor(HttpPolicy(), resolver=fixed_resolver({"cache.example": ["93.184.216.34"]})), url)
    assert run.result.outcome is Outcome.FAILED
    assert run.result.error is not None and why in run.result.error, run.result.error
    assert "p@" not in run.result.error


def test_a_pool_that_allows_plain_http_and_a_port_reaches_it(serve: Callable[..., Server]) -> None:
    srv = serve()
    http = {"allowed_cidrs": ["127.0.0.1/32"], "allow_plain_http": True}
    pool = PoolPolicy.from_mapping({"tenants": ["acme"], "http": {**http, "allowed_ports": [srv.port]}})
    assert attempt(HttpExecutor(pool.http), srv.url + "/ok").result.outcome is Outcome.SUCCEEDED
    other = PoolPolicy.from_mapping({"tenants": ["acme"], "http": http})
    refused = attempt(HttpExecutor(other.http), srv.url + "/ok").result
    assert refused.error == (f"http target refused: port {srv.port} is not an allowed port (443, 8443, 80, 8080; "
                             "the policy's allowed_ports opens more)")
    assert [r.path for r in srv.requests] == ["/ok"]


def test_metadata_is_reachable_only_through_an_explicit_cidr() -> None:
    metadata = ipaddress.ip_address("169.254.169.254")
    assert refusal(metadata, allow_private=True, allowed=()) is not None
    assert refusal(metadata, allow_private=False, allowed=HttpPolicy(allowed_cidrs=("169.254.169.254/32",)).networks) is None


def test_a_name_resolving_to_loopback_is_refused(serve: Callable[..., Server]) -> None:
    srv = serve()
    executor = HttpExecutor(local(), resolver=fixed_resolver({"evil.test": ["127.0.0.1"]}))
    run = attempt(executor, f"http://evil.test:{srv.port}/ok")
    assert run.result.error == ("http target refused: 127.0.0.1 (resolved from evil.test) is a loopback "
                                "address (pool policy denies private networks)")
    assert srv.requests == []


def test_one_private_answer_among_public_ones_refuses_the_name(serve: Callable[..., Server]) -> None:
    srv = serve()
    executor = HttpExecutor(local(), resolver=fixed_resolver({"mixed.test": ["93.184.216.34", "10.0.0.7"]}))
    run = attempt(executor, f"http://mixed.test:{srv.port}/ok")
    assert run.result.error is not None and "10.0.0.7 (resolved from mixed.test) is a private address" in run.result.error


def test_ipv4_mapped_loopback_is_refused(serve: Callable[..., Server]) -> None:
    srv = serve()
    run = attempt(HttpExecutor(local()), f"http://[::ffff:127.0.0.1]:{srv.port}/ok")
    assert run.result.error is not None
    assert "an IPv6 form of 127.0.0.1, a loopback address" in run.result.error
    assert srv.requests == []


@pytest.mark.parametrize("address", [
    "127.0.0.1", "127.8.9.10", "0.0.0.0", "10.1.2.3", "172.16.0.1", "192.168.1.1", "100.64.0.1",
    "169.254.1.1", "224.0.0.1", "240.0.0.1", "255.255.255.255", "198.18.0.1",
    "::1", "::", "fe80::1", "fc00::1", "fd12:3456::1", "ff02::1",
    "::ffff:10.0.0.1", "::ffff:169.254.169.254", "64:ff9b::a9fe:a9fe", "2002:7f00:1::1", "::127.0.0.1",
])
def test_non_public_addresses_are_refused(address: str) -> None:
    assert refusal(ipaddress.ip_address(address), allow_private=False, allowed=()) is not None


@pytest.mark.parametrize("address", ["93.184.216.34", "1.1.1.1", "2606:4700:4700::1111", "::ffff:8.8.8.8"])
def test_public_addresses_pass(address: str) -> None:
    assert refusal(ipaddress.ip_address(address), allow_private=False, allowed=()) is None


def test_other_schemes_are_refused() -> None:
    run = attempt(HttpExecutor(OPEN), "file:///etc/passwd")
    assert run.result.outcome is Outcome.FAILED
    assert run.result.error == "http target refused: scheme 'file' is not http or https"


# ---- redirects and pinning ---------------------------------------------------------------

def test_a_redirect_to_loopback_is_refused_at_the_hop(serve: Callable[..., Server]) -> None:
    first, inner = serve("127.0.0.2"), serve("127.0.0.1")
    first.redirect_to = inner.url + "/ok"
    run = attempt(HttpExecutor(local(allowed_cidrs=("127.0.0.2/32",))), first.url + "/redirect")
    assert run.result.outcome is Outcome.FAILED
    assert run.result.error == ("http target refused: 127.0.0.1 is a loopback address "
                                "(pool policy denies private networks)")
    assert len(first.requests) == 1
    assert inner.requests == []


def test_allowed_redirects_are_followed_with_the_body_and_capped(serve: Callable[..., Server]) -> None:
    srv = serve("127.0.0.2")
    srv.redirect_to = "/ok"
    executor = HttpExecutor(local(allowed_cidrs=("127.0.0.2/32",)))
    run = attempt(executor, srv.url + "/redirect")
    assert run.result.outcome is Outcome.SUCCEEDED
    assert [r.path for r in srv.requests] == ["/redirect", "/ok"]
    assert srv.requests[0].body == srv.requests[1].body != b""

    srv.requests.clear()
    srv.redirect_to = "/redirect"
    run = attempt(executor, srv.url + "/redirect")
    assert run.result.outcome is Outcome.FAILED
    assert run.result.error == "HTTP 307"
    assert len(srv.requests) == 4


def test_a_302_is_the_final_answer_not_a_bodiless_get(serve: Callable[..., Server]) -> None:
    srv = serve()
    run = attempt(HttpExecutor(OPEN), srv.url + "/found")
    assert run.result.outcome is Outcome.FAILED
    assert run.result.error == "HTTP 302"
    assert [r.path for r in srv.requests] == ["/found"]


def test_the_connection_is_pinned_to_the_checked_address(serve: Callable[..., Server]) -> None:
    """The resolver answers loopback once, then a TEST-NET address: only one lookup per
    hop may happen, and the connection must go to the address that was checked."""
    srv = serve()
    calls: list[str] = []
    answers = iter([["127.0.0.1"], ["127.0.0.1"]])

    def rebinding(host: str, port: int) -> list[str]:
        calls.append(host)
        return next(answers, ["192.0.2.1"])

    srv.redirect_to = f"http://rebind.test:{srv.port}/ok"
    executor = HttpExecutor(local(allowed_cidrs=("127.0.0.1/32",)), resolver=rebinding)
    run = attempt(executor, f"http://rebind.test:{srv.port}/redirect")
    assert run.result.outcome is Outcome.SUCCEEDED, run.result
    assert calls == ["rebind.test", "rebind.test"]
    assert [r.headers["host"] for r in srv.requests] == [f"rebind.test:{srv.port}"] * 2


def test_https_keeps_the_name_for_sni_and_the_certificate() -> None:
    executor = HttpExecutor(resolver=fixed_resolver({"hooks.example.com": ["93.184.216.34"]}))
    pinned = executor._pin(httpx.URL("https://u:p@hooks.example.com:8443/cb?x=1"))
    assert str(pinned.url) == "https://93.184.216.34:8443/cb?x=1"
    assert pinned.headers["Host"] == "hooks.example.com:8443"
    assert pinned.headers["Authorization"].startswith("Basic ")
    assert pinned.extensions == {"sni_hostname": "hooks.example.com"}


# ---- success, signatures, the body cap -------------------------------------------------------

def test_allow_private_succeeds_and_the_signature_verifies(serve: Callable[..., Server], tmp_path: Path) -> None:
    srv = serve()
    key = b"k3y-for-acme"
    run = attempt(HttpExecutor(OPEN, signing_store(tmp_path, "acme", key)), srv.url + "/ok",
                  payload={"greeting": "héllo", "n": [1, 2]})
    assert run.result.outcome is Outcome.SUCCEEDED
    assert run.result.exit_code == 200
    assert run.text(LogStream.STDOUT) == ["hello from /ok"]
    assert not any("unsigned" in line for line in run.text())
    [seen] = srv.requests
    h = seen.headers
    assert json.loads(seen.body) == {"runId": "job-1@1000", "jobId": "job-1", "attempt": 1,
                                     "payload": {"greeting": "héllo", "n": [1, 2]}}
    assert (h["idempotency-key"], h["x-gnomon-run-id"], h["x-gnomon-job-id"]) == ("job-1@1000",) * 2 + ("job-1",)
    assert (h["x-gnomon-attempt"], h["x-gnomon-tenant"], h["content-type"]) == ("1", "acme", "application/json")
    ts, sig = h["x-gnomon-timestamp"], h["x-gnomon-signature"]
    assert sig.startswith("v1=")
    assert verify_signature(key, ts, seen.body, sig, now_s=time.time())
    assert not verify_signature(key, ts, seen.body + b" ", sig, now_s=time.time())
    assert not verify_signature(b"other-key", ts, seen.body, sig, now_s=time.time())
    assert not verify_signature(key, ts, seen.body, sig, now_s=time.time() + 301)
    assert verify_signature(key, ts, seen.body, "v1=deadbeef, " + sig, now_s=time.time())
    assert not verify_signature(key, "-1", seen.body, sig, now_s=time.time())


def test_without_a_key_the_call_is_unsigned_and_says_so_once(serve: Callable[..., Server], tmp_path: Path) -> None:
    srv = serve()
    srv.redirect_to = "/ok"
    run = attempt(HttpExecutor(OPEN, SecretStore(tmp_path)), srv.url + "/redirect")
    assert run.result.outcome is Outcome.SUCCEEDED
    assert run.text(LogStream.SYSTEM).count("unsigned: tenant has no http-signing-key secret") == 1
    assert all("x-gnomon-signature" not in r.headers for r in srv.requests)


def test_non_2xx_fails_and_slow_answers_time_out(serve: Callable[..., Server]) -> None:
    srv = serve()
    run = attempt(HttpExecutor(OPEN), srv.url + "/fail")
    assert (run.result.outcome, run.result.exit_code, run.result.error) == (Outcome.FAILED, 500, "HTTP 500")
    started = time.monotonic()
    run = attempt(HttpExecutor(OPEN), srv.url + "/slow", timeout_s=0.5)
    assert run.result.outcome is Outcome.TIMED_OUT
    assert time.monotonic() - started < 1.9


def test_a_trickling_answer_times_out_at_the_attempt_deadline(serve: Callable[..., Server]) -> None:
    srv = serve()
    started = time.monotonic()
    run = attempt(HttpExecutor(OPEN), srv.url + "/trickle", timeout_s=1.0)
    assert run.result.outcome is Outcome.TIMED_OUT, run.result
    assert time.monotonic() - started < 4.0  # not the 6 s the server takes


def test_a_trickling_webhook_holds_an_alert_delivery_no_longer_than_its_timeout(serve: Callable[..., Server]) -> None:
    """Issue 24, finding 4: httpx's timeout is per read, so a server trickling one byte at a
    time held an alert delivery for as long as it trickled (60 s with ``timeout_s=2``)."""
    from gnomon.alerts.sender import AlertDeliveryError, AlertSender
    from gnomon.core.alerts import Alert, AlertKind

    srv = serve()
    alert = Alert(AlertKind.DEAD_LETTER, "k-1", "acme", "job-1@1000", "job-1", "nightly", "failed", 1000, 1000, 2000)
    started = time.monotonic()
    with pytest.raises(AlertDeliveryError, match="within 1s"):
        AlertSender(OPEN).send(alert, srv.url + "/trickle", timeout_s=1.0)
    assert time.monotonic() - started < 4.0  # not the 6 s the server takes
    assert [r.path for r in srv.requests] == ["/trickle"]


def test_cancel_ends_an_http_attempt_at_once(serve: Callable[..., Server]) -> None:
    srv = serve()
    lines: list[tuple[LogStream, str]] = []
    ctx = AttemptContext(run_id="job-1@1000", job_id="job-1", tenant="acme", attempt=1, payload=None,
                         timeout_s=30, log=lambda s, line: lines.append((s, line)))
    threading.Timer(0.5, ctx.request_stop, args=("cancelled: by the test",)).start()
    started = time.monotonic()
    result = HttpExecutor(OPEN).execute(Target(TargetType.HTTP, url=srv.url + "/trickle"), ctx)
    assert result.outcome is Outcome.FAILED and "cancelled" in (result.error or "")
    assert time.monotonic() - started < 4.0


def test_a_10mb_body_is_not_read_whole(serve: Callable[..., Server]) -> None:
    srv = serve()
    cap = 8192
    tracemalloc.start()
    started = time.monotonic()
    try:
        run = attempt(HttpExecutor(local(allow_private=True, response_max_bytes=cap)), srv.url + "/big")
        _, peak_bytes = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert run.result.outcome is Outcome.SUCCEEDED
    assert sum(len(line.encode()) for line in run.text(LogStream.STDOUT)) == cap
    assert f"response body cut at {cap} bytes" in run.text(LogStream.SYSTEM)
    assert srv.big_done.wait(5), "the server should see the client go away"
    assert srv.big_error is not None
    assert srv.big_sent_bytes < BIG_BODY_BYTES // 2
    assert peak_bytes < 2 * 1024 * 1024
    assert time.monotonic() - started < 5


# ---- redaction ---------------------------------------------------------------------------

SECRETS = ("s3cr3t-pass", "tok-abc123", "hunter-user")


def _assert_clean(run: Run) -> None:
    for text in [*run.text(), run.result.error or ""]:
        for secret in SECRETS:
            assert secret not in text, text


def test_credentials_never_reach_the_log(serve: Callable[..., Server]) -> None:
    srv = serve()
    url = f"http://127.0.0.1:{srv.port}/ok?token=tok-abc123&x=1"
    run = attempt(HttpExecutor(OPEN), url)
    assert run.result.outcome is Outcome.SUCCEEDED
    assert run.text(LogStream.SYSTEM)[0] == f"POST http://127.0.0.1:{srv.port}/ok?token=***&x=***"
    _assert_clean(run)
    # a URL's user and password become Basic auth over https only (pinned to the checked
    # address; the request carries no userinfo)
    pinned = pin(httpx.URL("https://hunter-user:s3cr3t-pass@127.0.0.1:8443/ok"), OPEN)
    assert pinned.headers["Authorization"].startswith("Basic ") and "s3cr3t" not in str(pinned.url)


def test_credentials_over_plain_http_are_refused_unsent(serve: Callable[..., Server]) -> None:
    """Issue 24, finding 10: ``http://u:p@host/`` sent the password in clear text."""
    srv = serve()
    run = attempt(HttpExecutor(OPEN), f"http://hunter-user:s3cr3t-pass@127.0.0.1:{srv.port}/ok")
    assert run.result.outcome is Outcome.FAILED
    assert "credentials in an http:// URL would cross the network in clear text" in (run.result.error or "")
    _assert_clean(run)
    assert srv.requests == []


def test_credentials_are_redacted_from_refusals_and_errors(serve: Callable[..., Server]) -> None:
    srv = serve()
    cred = "hunter-user:s3cr3t-pass@"
    for executor, url in [
        (HttpExecutor(), f"http://{cred}127.0.0.1:{srv.port}/ok?token=tok-abc123"),
        (HttpExecutor(OPEN), f"http://{cred}127.0.0.1:1/ok?token=tok-abc123"),
        (HttpExecutor(OPEN), f"http://{cred}exa mple.test/ok?token=tok-abc123"),
        (HttpExecutor(OPEN, resolver=fixed_resolver({})), f"http://{cred}nowhere.test/ok?token=tok-abc123"),
    ]:
        run = attempt(executor, url)
        assert run.result.outcome is Outcome.FAILED
        _assert_clean(run)


def test_redaction_helpers() -> None:
    url = "https://user:pass@host.example/p?token=abc&plain=1&flag#frag"
    assert redact_url(url) == "https://***@host.example/p?token=***&plain=***&***"
    message = f"Client error for url '{url}' (user pass abc)"
    assert redact_text(message, url_secrets(url)) == (
        "Client error for url 'https://***@host.example/p?token=***&plain=***&***' (*** *** ***)")


# ---- isolation ---------------------------------------------------------------------------

def test_a_cookie_from_tenant_a_is_not_sent_for_tenant_b(serve: Callable[..., Server]) -> None:
    srv = serve()
    executor = HttpExecutor(OPEN)
    assert attempt(executor, srv.url + "/cookie", tenant="tenant-a").result.outcome is Outcome.SUCCEEDED
    assert attempt(executor, srv.url + "/ok", tenant="tenant-b").result.outcome is Outcome.SUCCEEDED
    assert attempt(executor, srv.url + "/ok", tenant="tenant-a").result.outcome is Outcome.SUCCEEDED
    assert [r.headers.get("cookie") for r in srv.requests] == [None, None, None]


def test_constructors_keep_working() -> None:
    HttpExecutor()
    Dispatcher({})
    Dispatcher({}, PoolPolicy(frozenset({"acme"}), http=OPEN), SecretStore(None))
    with pytest.raises(ValueError):
        HttpPolicy(allowed_cidrs=("not-a-network",))


@pytest.mark.parametrize("address", ["fec0::1", "100.100.100.200", "169.254.169.123"])
def test_site_local_and_other_metadata_addresses_are_refused(address: str) -> None:
    ip = ipaddress.ip_address(address)
    assert refusal(ip, allow_private=False, allowed=()) is not None
    if address != "fec0::1":  # metadata stays closed even with allow_private
        assert refusal(ip, allow_private=True, allowed=()) is not None
