"""gnomon's schema registry (gnomon.registry) as a private process for a test:
``python -m gnomon.registry --memory`` on a free port serves this tree's checked-in schemas
with their ids and no store, so a test sees exactly the schemas of the code under test
(the shared registry on 8081 serves those of whichever tree started it)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx

from gnomon.config import load
from gnomon.infra import registry


@contextmanager
def private_registry(ready_id: int = 1, timeout_s: float = 30.0) -> Iterator[str]:
    """The base URL of a registry that serves ``/schemas/ids/{ready_id}``, until the block ends."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    proc = subprocess.Popen([sys.executable, "-m", "gnomon.registry", "--memory", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, "GNOMON_KAFKA_BOOTSTRAP": "127.0.0.1:1"})
    url = f"http://127.0.0.1:{port}"
    cred = registry.reader(load())  # it reads the users of this state dir, as Connect's converter does
    auth = (cred.username, cred.password)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if httpx.get(f"{url}/schemas/ids/{ready_id}", timeout=1, auth=auth).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                err = proc.stderr.read().decode()[-2000:] if proc.stderr else ""
                raise AssertionError(f"the private registry did not serve id {ready_id}: {err}")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
