"""Bulk registration over REST: ``POST /v1/jobs`` one job a call against
``POST /v1/jobs:batch`` (up to 1,000 a call), in one run, so the ratio is fair.

    .venv/bin/python bench/register_rest.py [--jobs 10000] [--clients 32] [--batch 1000]

Starts Kafka + Cassandra if needed (gnomon infra up), one processor (the decider: every
create waits for its answer; ``--no-processor`` when one runs already) and one API
process of its own on port 18799 (tenant ``bench-rest``), then registers N jobs each way
(cron jobs whose first slot is next new year, so nothing runs) and prints jobs/s as the
API answered them (201: the processor accepted each). ``--clients`` concurrent HTTP clients send the
single creates; the batches go ``--batch-clients`` at a time. The jobs are deleted after
(over Kafka, ``gnomon.events``). Prints a progress line every 5 s.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from gnomon.command_keys import operator_key
from gnomon.config import load
from gnomon.events import JobEvents

REPO = Path(__file__).resolve().parent.parent
TENANT = "bench-rest"
TOKEN = "bench-rest-token"
PORT = 18799
SPEC = {"name": "bulk", "schedule": "0 0 1 1 *", "target": {"type": "handler", "name": "noop"}}
PROGRESS_EVERY_S = 5.0


class Progress:
    def __init__(self, label: str, total: int) -> None:
        self.label, self.total, self.done = label, total, 0
        self.t0 = self.last = time.monotonic()

    def add(self, n: int) -> None:
        self.done += n
        if time.monotonic() - self.last >= PROGRESS_EVERY_S:
            self.last = time.monotonic()
            print(f"  {self.label}: {self.done:,}/{self.total:,}", flush=True)


async def singles(client: httpx.AsyncClient, n: int, clients: int) -> list[str]:
    ids: list[str] = []
    todo = iter(range(n))
    progress = Progress("single", n)

    async def one_client() -> None:
        for _ in todo:
            r = await client.post("/v1/jobs", json=SPEC)
            if r.status_code != 201:
                sys.exit(f"POST /v1/jobs answered {r.status_code}: {r.text[:300]}")
            ids.append(r.json()["id"])
            progress.add(1)

    await asyncio.gather(*(one_client() for _ in range(clients)))
    return ids


async def batches(client: httpx.AsyncClient, n: int, size: int, clients: int) -> list[str]:
    ids: list[str] = []
    chunks = iter([min(size, n - start) for start in range(0, n, size)])
    progress = Progress("batch", n)

    async def one_client() -> None:
        for count in chunks:
            r = await client.post("/v1/jobs:batch", json={"jobs": [SPEC] * count})
            if r.status_code != 200:
                sys.exit(f"POST /v1/jobs:batch answered {r.status_code}: {r.text[:300]}")
            results = r.json()["results"]
            bad = [x for x in results if x["status"] != 201]
            if bad:
                sys.exit(f"POST /v1/jobs:batch refused {len(bad)} items, e.g. {bad[0]}")
            ids.extend(x["job"]["id"] for x in results)
            progress.add(count)

    await asyncio.gather(*(one_client() for _ in range(clients)))
    return ids


def wait_healthy(url: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    sys.exit(f"the API on {url} did not answer /healthz in {timeout_s}s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--clients", type=int, default=32, help="concurrent clients of the single creates")
    ap.add_argument("--batch", type=int, default=1000, help="jobs per batch call (at most 1000)")
    ap.add_argument("--batch-clients", type=int, default=4, help="batch calls in flight")
    ap.add_argument("--no-processor", action="store_true", help="a processor runs already (gnomon dev)")
    args = ap.parse_args()
    settings = load()
    subprocess.run([sys.executable, "-m", "gnomon.infra", "up"], check=True)
    logs = settings.state_dir / "bench-logs"
    logs.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "GNOMON_KAFKA_ROLE": "api",
           "GNOMON_API_TOKENS": f"{TOKEN}:{TENANT}"}
    with open(logs / "register-rest-api.log", "ab") as out:
        api = subprocess.Popen([sys.executable, "-m", "gnomon.cli.main", "api", "--port", str(PORT),
                                "--no-access-log"], cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                               start_new_session=True)
    proc = None
    if not args.no_processor:
        with open(logs / "register-rest-processor.log", "ab") as out:
            proc = subprocess.Popen([sys.executable, "-m", "gnomon.cli.main", "processor", "--instance-id",
                                     "bench-rest"], cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{PORT}"
    ids: list[str] = []
    try:
        wait_healthy(url)
        time.sleep(5)  # the processor's group settles (assignment, restore)

        async def run() -> None:
            limits = httpx.Limits(max_connections=max(args.clients, args.batch_clients))
            async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"},
                                         timeout=120, limits=limits) as client:
                t0 = time.monotonic()
                ids.extend(await singles(client, args.jobs, args.clients))
                single_s = time.monotonic() - t0
                print(f"POST /v1/jobs       : {args.jobs:,} jobs in {single_s:.2f}s = {args.jobs / single_s:,.0f} "
                      f"jobs/s ({args.clients} clients)", flush=True)
                t0 = time.monotonic()
                ids.extend(await batches(client, args.jobs, args.batch, args.batch_clients))
                batch_s = time.monotonic() - t0
                print(f"POST /v1/jobs:batch : {args.jobs:,} jobs in {batch_s:.2f}s = {args.jobs / batch_s:,.0f} "
                      f"jobs/s ({args.batch} a call, {args.batch_clients} calls in flight)", flush=True)
                print(f"ratio batch/single  : {single_s / batch_s:.1f}x")

        asyncio.run(run())
    finally:
        os.killpg(api.pid, signal.SIGTERM)
        api.wait(60)
        with JobEvents(TENANT, settings.kafka_bootstrap, command_key=operator_key()) as events:
            for job_id in ids:
                events.delete(job_id)
        print(f"deleted {len(ids)} jobs")
        if proc is not None:
            time.sleep(3)  # the deletes are applied
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(60)


if __name__ == "__main__":
    main()
