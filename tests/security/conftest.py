"""Fixtures of the API security tests (test_openapi_contract, test_generated_client,
test_tenant_isolation, test_api_hardening): the real app over an in-memory history
store, a producer that records commands and has the partitions' real deciders answer
job commands and project what they wrote into that store (``gnomon.testing``'s
``DecidingProducer``), and uvicorn on a random port.
All fixture names start with ``gnomon_api`` so they do not collide with other tests here."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from gnomon.api.alerts import AlertService
from gnomon.api.app import CommandSink, create_app
from gnomon.api.calendars import CalendarService
from gnomon.history.memory import InMemoryHistoryStore
from gnomon.outbound.http import HttpPolicy
from gnomon.testing import DecidingProducer
from gnomon.topology import load_topology
from gnomon.web.auth import Authenticator

SERVER_START_TIMEOUT_S = 10.0


@dataclass
class GnomonApi:
    app: Any
    history: InMemoryHistoryStore
    producer: DecidingProducer
    tokens: dict[str, str] = field(default_factory=dict)  # tenant -> token

    def auth(self, tenant: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[tenant]}"}


@pytest.fixture
def gnomon_api() -> GnomonApi:
    """The app for tenants ``acme`` and ``other``."""
    topo = load_topology()
    history = InMemoryHistoryStore()
    producer = DecidingProducer(history, topology=topo)
    tokens = {"acme": "tok-acme-0123456789", "other": "tok-other-0123456789"}
    app = create_app(history=history, commands=CommandSink(producer, topo.job_commands),
                     auth=Authenticator({token: tenant for tenant, token in tokens.items()}), topology=topo,
                     alerts=AlertService(writer=producer, topic=topo.alert_configs, policy=HttpPolicy()),
                     calendars=CalendarService(writer=producer, topic=topo.calendars), answers=producer.answers)
    return GnomonApi(app, history, producer, tokens)


@pytest.fixture
def gnomon_api_server(gnomon_api: GnomonApi) -> Iterator[str]:
    """``gnomon_api`` served by uvicorn on 127.0.0.1:<random port> in a thread; its base URL."""
    import uvicorn

    config = uvicorn.Config(gnomon_api.app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="gnomon-api-test", daemon=True)
    thread.start()
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(SERVER_START_TIMEOUT_S)
