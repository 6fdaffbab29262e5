"""The handler of bench/dependencies.py: ``step`` appends ``run_id start_ms end_ms`` (its
own wall clock, ms) to ``$DEPS_TIMES_FILE`` once it has worked ``payload["work_ms"]``
(default 50). A downstream's start lag after its upstream is its start minus the
upstream's end, both as the handlers saw them: what an outside observer sees.

    PYTHONPATH=bench DEPS_TIMES_FILE=/tmp/times.txt \\
        .venv/bin/python -m gnomon.cli.main worker --app deps_app:worker
"""

from __future__ import annotations

import os
import threading
import time

from gnomon.worker import AttemptContext, Worker

worker = Worker(pool="default", tenants=["bench"], concurrency_max=200)
_lock = threading.Lock()


@worker.handler("step")
def step(ctx: AttemptContext) -> None:
    start_ms = time.time_ns() // 1_000_000
    payload = ctx.payload if isinstance(ctx.payload, dict) else {}
    time.sleep(float(payload.get("work_ms", 50)) / 1000)
    end_ms = time.time_ns() // 1_000_000
    path = os.environ.get("DEPS_TIMES_FILE")
    if path:
        with _lock, open(path, "a") as out:
            out.write(f"{ctx.run_id} {start_ms} {end_ms}\n")
