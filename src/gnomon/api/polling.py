"""A feed polled on a daemon thread: the API's tenant limits and alert configs are
compacted topics it reads whole at start, then follows by polling."""

from __future__ import annotations

import logging
import threading
from typing import Protocol

log = logging.getLogger("gnomon.api")
POLL_INTERVAL_S = 0.5
JOIN_TIMEOUT_S = 5.0


class Pollable(Protocol):
    def poll(self) -> object: ...


class FeedPoller:
    """Calls ``service.poll()`` every ``interval_s`` on a daemon thread named ``name``;
    an error is logged (``what`` says what failed) and polling goes on: the feeds are
    soft state, a bad moment must not stop them."""

    def __init__(self, service: Pollable, *, name: str, what: str, interval_s: float = POLL_INTERVAL_S) -> None:
        self.service = service
        self.interval_s = interval_s
        self.what = what
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> FeedPoller:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=JOIN_TIMEOUT_S)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.service.poll()
            except Exception:
                log.exception("polling %s failed", self.what)
