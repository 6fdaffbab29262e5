"""The UI's overload banner (docs/semantics.md, "Overload"): whether a processor
deferred due jobs in the last 2 s, read from the processors' /metrics endpoints as
``gnomon status`` reads them (``$GNOMON_STATUS_TARGETS``, else this host's default
processor metrics ports), at most every ``ttl_s``. A page never waits for it: a render
uses the last answer and starts a refresh in the background when it is stale."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import httpx

from gnomon.metrics.serve import candidate_ports
from gnomon.metrics.status import Scrape, env_targets, metrics_url, parse, summarize


def processor_targets(port: int | None = None) -> list[str]:
    given = env_targets()
    if given:
        return [metrics_url(t) for t in given]
    return [f"http://127.0.0.1:{p}/metrics" for p in candidate_ports("processor", port)]


def banner_text(scrapes: list[Scrape]) -> str | None:
    """One sentence when any processor is overloaded, else None."""
    busy = [p for p in summarize(scrapes).processors if p.overload_deferred > 0]
    if not busy:
        return None
    deferred = sum(p.overload_deferred for p in busy)
    lag = max(p.overload_lag_s for p in busy)
    return (f"The scheduler is overloaded: {deferred} due normal/low jobs were deferred in the last 2 s "
            f"on {len(busy)} processor(s) (urgent start lag p90 {lag:.1f} s). High-priority runs go "
            "first; slots later than their job's lateMaxS are recorded skipped with reason 'overload'.")


class OverloadProbe:
    def __init__(self, targets: list[str], *, ttl_s: float = 5.0, timeout_s: float = 0.3,
                 now_s: Callable[[], float] = time.monotonic,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.targets = targets
        self.transport = transport  # (tests: httpx.MockTransport)
        self.ttl_s = ttl_s
        self.timeout_s = timeout_s
        self._now_s = now_s
        self._checked_s = -1e18
        self._text: str | None = None
        self._task: asyncio.Task[None] | None = None

    def current(self) -> str | None:
        """The last answer; a refresh is started when it is older than ``ttl_s``."""
        if self._now_s() - self._checked_s >= self.ttl_s and (self._task is None or self._task.done()):
            self._checked_s = self._now_s()
            with contextlib.suppress(RuntimeError):  # no loop (a plain call): keep the last answer
                self._task = asyncio.get_running_loop().create_task(self.refresh())
        return self._text

    async def refresh(self) -> None:
        async with httpx.AsyncClient(timeout=self.timeout_s, transport=self.transport) as client:
            scrapes = await asyncio.gather(*(self._scrape(client, url) for url in self.targets))
        self._text = banner_text([s for s in scrapes if s is not None])

    @staticmethod
    async def _scrape(client: httpx.AsyncClient, url: str) -> Scrape | None:
        try:
            r = await client.get(url)
            r.raise_for_status()
            return Scrape(url, parse(r.text))
        except (httpx.HTTPError, ValueError):
            return None  # (not a processor, or not running: no banner from it)
