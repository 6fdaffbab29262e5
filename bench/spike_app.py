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
import sys
import threading
import time

from gnomon.worker import AttemptContext, Worker

worker = Worker(pool="default", tenants=["bench"], concurrency_max=int(os.environ.get("SPIKE_CONCURRENCY", "500")))

# Starts are appended to a list (atomic under the GIL, no lock, no system call in the
# handler) and written out by one thread every FLUSH_EVERY_S: a line-buffered file
# written under a lock by thousands of handler threads at once made the bench's own
# bookkeeping most of a worker's profile in a spike.
FLUSH_EVERY_S = 0.1
_pending: list[str] = []
_flusher: threading.Thread | None = None
_started = threading.Lock()


def _flush_forever(path: str) -> None:
    try:
        out = open(path, "a")  # noqa: SIM115 - lives as long as the process
    except OSError as exc:
        print(f"spike_app: cannot write the starts to {path}: {exc}", file=sys.stderr)
        os._exit(70)  # a bench that cannot record its starts measures nothing
    with out:
        while True:
            time.sleep(FLUSH_EVERY_S)
            n = len(_pending)
            if n:
                lines = _pending[:n]
                del _pending[:n]  # (appends after the snapshot stay for the next round)
                out.write("".join(lines))
                out.flush()


def _record(run_id: str, start_ms: int) -> None:
    global _flusher
    if _flusher is None:
        path = os.environ.get("SPIKE_STARTS_FILE")
        if not path:
            return
        with _started:
            if _flusher is None:
                _flusher = threading.Thread(target=_flush_forever, args=(path,), daemon=True, name="starts-file")
                _flusher.start()
    _pending.append(f"{run_id} {start_ms}\n")


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
