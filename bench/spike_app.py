"""Handlers for bench/spike.py: each records when it actually started.

    PYTHONPATH=bench SPIKE_STARTS_FILE=/tmp/starts.txt SPIKE_CONCURRENCY=500 \\
        .venv/bin/python -m gnomon.cli.main worker --app spike_app:worker --concurrency 500

The first statement of every handler takes the wall clock (ms) and appends
``run_id start_ms`` to ``$SPIKE_STARTS_FILE`` (one file per worker process). That is the
start as an outside observer sees it: spike.py subtracts the slot from it.

Note: ``gnomon worker --app`` overwrites the Worker's pool and concurrency_max with its
``--pool`` and ``--concurrency`` options, so spike.py passes both as well.
"""

from __future__ import annotations

import os
import threading
import time
from typing import IO

from gnomon.worker import AttemptContext, Worker

worker = Worker(pool="default", tenants=["bench"], concurrency_max=int(os.environ.get("SPIKE_CONCURRENCY", "500")))

_lock = threading.Lock()
_out: IO[str] | None = None


def _record(run_id: str, start_ms: int) -> None:
    global _out
    with _lock:
        if _out is None:
            path = os.environ.get("SPIKE_STARTS_FILE")
            if not path:
                return
            _out = open(path, "a", buffering=1)  # noqa: SIM115 - one per process, lives as long as it
        _out.write(f"{run_id} {start_ms}\n")


@worker.handler("noop")
def noop(ctx: AttemptContext) -> None:
    start_ms = time.time_ns() // 1_000_000
    _record(ctx.run_id, start_ms)


@worker.handler("sleep")
def sleep(ctx: AttemptContext) -> None:
    """Holds a slot for ``payload["sleep_s"]`` seconds (default 600) or until stopped."""
    start_ms = time.time_ns() // 1_000_000
    _record(ctx.run_id, start_ms)
    payload = ctx.payload if isinstance(ctx.payload, dict) else {}
    end = time.monotonic() + float(payload.get("sleep_s", 600))
    while time.monotonic() < end and not ctx.stop.is_set():
        time.sleep(0.1)
