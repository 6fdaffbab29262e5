"""The API over HTTPS (issue 26; `gnomon api --tls-cert --tls-key`): with a certificate
from the stack's private CA (gnomon.infra.tls) it answers HTTPS to a client that trusts
that CA (the CLI's ``Client`` with ``GNOMON_API_CA_FILE``), refuses plain HTTP, and a
client that does not trust the CA is refused by its own verification."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from gnomon.client import Client
from gnomon.config import Settings
from gnomon.infra import tls

pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_api_serves_https_only_with_the_private_cas_certificate(infra: Settings, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    cert = tls.ensure_host(tmp_path, "api-1", ["127.0.0.1"])
    port, token = _free_port(), secrets.token_hex(16)
    env = {**os.environ, "GNOMON_API_TOKENS": f"{token}:acme", "GNOMON_KAFKA_ROLE": "api", "PYTHONUNBUFFERED": "1"}
    log = tmp_path / "api.log"
    proc = subprocess.Popen([sys.executable, "-m", "gnomon.cli.main", "api", "--port", str(port), "--workers", "1",
                             "--tls-cert", str(cert.cert), "--tls-key", str(cert.key)],
                            env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
    url = f"https://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/healthz", verify=str(cert.ca), timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, log.read_text()[-2000:]
            assert time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.5)
        # the CLI's client, trusting the CA through the environment
        monkeypatch.setenv("GNOMON_API_CA_FILE", str(cert.ca))
        client = Client(url, token)
        assert client.list_jobs(5)["items"] is not None
        client.close()
        # plain HTTP on the same port: no answer a client could take for the API's
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
        # a client that does not trust the private CA refuses the server
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            httpx.get(url + "/healthz", timeout=5)
        assert "API listening on https" in log.read_text() or "https://" in log.read_text()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
            pytest.fail("the API did not stop within 30 s of SIGTERM: " + log.read_text()[-1500:])


def test_a_certificate_without_its_key_is_refused_with_exit_2(tmp_path: Path) -> None:
    cert = tls.ensure_host(tmp_path, "api-1", ["127.0.0.1"])
    res = subprocess.run([sys.executable, "-m", "gnomon.cli.main", "api", "--tls-cert", str(cert.cert)],
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "GNOMON_API_TOKENS": "t" * 32 + ":acme"})
    assert res.returncode == 2 and "--tls-cert/--tls-key" in res.stderr + res.stdout, res.stderr + res.stdout
