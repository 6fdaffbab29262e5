"""``gnomon status``: processors and their partitions, workers, consumer lag and start
lag over the last minute, in one screen, from the processes' /metrics endpoints.

Targets: every ``--target`` (or ``$GNOMON_STATUS_TARGETS``, comma-separated), else this
host's defaults: the API's own port and the metrics ports each kind takes by default
(gnomon.metrics.serve), so it finds what ``make run`` / ``gnomon dev`` started.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated

import httpx
import typer

from gnomon.cli.common import console, fail
from gnomon.config import load
from gnomon.metrics.serve import candidate_ports
from gnomon.metrics.status import Scrape, env_targets, metrics_url, parse, render, summarize


def default_targets() -> list[str]:
    s = load()
    urls = [s.api_url.rstrip("/") + "/metrics"]
    for kind, port in (("processor", s.processor_metrics_port), ("projector", s.projector_metrics_port),
                       ("worker", s.worker_metrics_port)):
        urls += [f"http://127.0.0.1:{p}/metrics" for p in candidate_ports(kind, port)]
    return urls


def scrape(url: str, timeout_s: float) -> Scrape:
    try:
        r = httpx.get(url, timeout=timeout_s)
        r.raise_for_status()
        return Scrape(url, parse(r.text))
    except (httpx.HTTPError, ValueError) as exc:
        return Scrape(url, error=type(exc).__name__ if not str(exc) else str(exc).splitlines()[0][:120])


def status(
    target: Annotated[list[str] | None, typer.Option(
        "--target", help="host:port or URL of a /metrics endpoint (repeat); default $GNOMON_STATUS_TARGETS, "
                         "else this host's default ports")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="the summary as JSON")] = False,
    timeout_s: Annotated[float, typer.Option(min=0.1, max=30, help="per endpoint")] = 2.0,
) -> None:
    """One screen: processors and partitions, workers, consumer lag, start lag p50/p99 (last minute)."""
    given = target or env_targets()
    urls = [metrics_url(t) for t in given] if given else default_targets()
    with ThreadPoolExecutor(max_workers=16) as pool:
        scrapes = list(pool.map(lambda u: scrape(u, timeout_s), urls))
    if not given:  # scanning default ports: a closed one is not news
        scrapes = [s for s in scrapes if s.error is None]
    if not any(s.error is None for s in scrapes):
        fail(f"no gnomon /metrics endpoint answered ({', '.join(urls) if given else 'default ports'}); "
             f"name them with --target host:port", 1)
    st = summarize(scrapes)
    if as_json:
        print(json.dumps(st.as_json(), indent=2))
        return
    for line in render(st):
        console.print(line, highlight=False, markup=False, soft_wrap=True)
