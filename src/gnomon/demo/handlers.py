"""Python handlers that the default worker serves (used by the demo and the tests)."""

from __future__ import annotations

from typing import Any

from gnomon.core.messages import LogStream
from gnomon.worker import AttemptContext, Worker


def register(worker: Worker) -> None:
    @worker.handler("echo")
    def echo(ctx: AttemptContext) -> Any:
        ctx.log(LogStream.STDOUT, f"echo handler: run {ctx.run_id} payload {ctx.payload!r}")
        return None

    @worker.handler("fail")
    def fail(ctx: AttemptContext) -> Any:
        raise RuntimeError(f"demo failure for {ctx.run_id}")

    @worker.handler("noop")
    def noop(ctx: AttemptContext) -> Any:
        return None

    @worker.handler("sleep")
    def sleep(ctx: AttemptContext) -> Any:
        """Hold a worker slot for payload["s"] seconds (at most an hour); stops on cancel."""
        seconds = ctx.payload.get("s", 1) if isinstance(ctx.payload, dict) else 1
        ctx.stop.wait(min(max(float(seconds), 0.0), 3600.0))
        return None
