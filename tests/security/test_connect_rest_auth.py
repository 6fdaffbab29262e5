"""Issue 50, finding 9: Kafka Connect's REST API answered anyone who could reach
127.0.0.1:8083, so any local process, or a web page in a local browser through DNS
rebinding (it needs no credential and Connect does not check ``Host``), could read, change
or delete the connectors. Now the worker runs Kafka's ``BasicAuthSecurityRestExtension``:
without the credential gnomon makes for it, or with a wrong one, every request is refused
with 401, whatever the ``Host``; gnomon's own calls (``connect.wait_ready``) send it.

A real Connect worker with no connectors, on a free port, in a state dir of its own (the
jars come from the real state dir; no plugins: none is needed to serve the REST API)."""

from __future__ import annotations

import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gnomon.config import Settings, load
from gnomon.infra import connect, fetch

pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[connect.Worker]:
    real = load()
    state = tmp_path_factory.mktemp("connect-auth")
    settings = Settings(state_dir=state, credentials_path=real.credentials_dir)
    lib = fetch.fetch(real.state_dir, connect.COMPONENT, connect.LABEL)
    plugins = state / "no-plugins"
    plugins.mkdir()
    port = _free_port()
    connect.start(settings, port=port, connectors=[], lib=lib, plugins=plugins)
    try:
        connect.wait_ready(settings, port=port, timeout_s=120)  # (with the credential: it must get in)
        yield connect.worker(settings, port)
    finally:
        connect.stop(settings)


def test_the_rest_api_refuses_requests_without_the_credential(worker: connect.Worker) -> None:
    for method, path in (("GET", "/connectors"), ("GET", "/connector-plugins"), ("GET", "/"),
                         ("POST", "/connectors"), ("DELETE", "/connectors/runs-postgres-sink"),
                         ("PUT", "/admin/loggers/root")):
        r = httpx.request(method, worker.url + path, json={"name": "x", "config": {}}, timeout=10)
        assert r.status_code == 401, (method, path, r.status_code, r.text[:200])
    # a DNS-rebinding page's request: another Host, no credential (a browser has none to send)
    r = httpx.get(worker.url + "/connectors", headers={"Host": "attacker.example:8083"}, timeout=10)
    assert r.status_code == 401, r.text[:200]


def test_a_wrong_password_is_refused_and_gnomons_credential_gets_in(worker: connect.Worker) -> None:
    user, password = connect.rest_auth(worker)
    assert len(password) >= 24
    assert httpx.get(worker.url + "/connectors", auth=(user, password + "x"), timeout=10).status_code == 401
    assert httpx.get(worker.url + "/connectors", auth=("admin", password), timeout=10).status_code == 401
    r = httpx.get(worker.url + "/connectors", auth=(user, password), timeout=10)
    assert r.status_code == 200 and r.json() == [], r.text[:200]


def test_the_credential_files_are_private_to_their_user(worker: connect.Worker) -> None:
    for path in (worker.rest_users, worker.rest_jaas):
        mode = stat.S_IMODE(Path(path).stat().st_mode)
        assert mode == 0o600, (path, oct(mode))
    assert str(worker.rest_users) in worker.rest_jaas.read_text()
