"""HTTP targets: POST the payload to a callback URL."""

from __future__ import annotations

import threading

import httpx

from gnomon.core.messages import LogStream
from gnomon.core.model import Target
from gnomon.core.runs import Outcome
from gnomon.worker.attempt import LINE_MAX_CHARS, AttemptContext, AttemptResult


class HttpExecutor:
    """POSTs the payload to the callback URL with ``Idempotency-Key: <run id>``.
    2xx is success; anything else (or a transport error) is a failed attempt."""

    def __init__(self, client: httpx.Client | None = None) -> None:
        self._client = client or httpx.Client()

    def execute(self, target: Target, ctx: AttemptContext) -> AttemptResult:
        assert target.url is not None
        headers = {
            "Idempotency-Key": ctx.run_id,
            "X-Gnomon-Run-Id": ctx.run_id,
            "X-Gnomon-Job-Id": ctx.job_id,
            "X-Gnomon-Attempt": str(ctx.attempt),
        }
        body = {"runId": ctx.run_id, "jobId": ctx.job_id, "attempt": ctx.attempt, "payload": ctx.payload}
        ctx.log(LogStream.SYSTEM, f"POST {target.url}")
        result: list[AttemptResult] = []

        def call() -> None:
            try:
                resp = self._client.post(target.url or "", json=body, headers=headers, timeout=ctx.timeout_s)
            except httpx.TimeoutException:
                result.append(AttemptResult(Outcome.TIMED_OUT, None, f"no response within {ctx.timeout_s:g}s"))
                return
            except httpx.HTTPError as exc:
                result.append(AttemptResult(Outcome.FAILED, None, f"{type(exc).__name__}: {exc}"))
                return
            text = resp.text[:LINE_MAX_CHARS]
            ctx.log(LogStream.SYSTEM, f"HTTP {resp.status_code}")
            if text:
                ctx.log(LogStream.STDOUT, text)
            ok = 200 <= resp.status_code < 300
            result.append(AttemptResult(Outcome.SUCCEEDED if ok else Outcome.FAILED, resp.status_code,
                                        None if ok else f"HTTP {resp.status_code}"))

        t = threading.Thread(target=call, daemon=True)
        t.start()
        t.join(ctx.timeout_s + 1)
        while t.is_alive() and not ctx.stop.wait(0.05):
            t.join(0.05)
        if result:
            return result[0]
        if ctx.stop.is_set():
            return AttemptResult(Outcome.FAILED, None, f"stopped: {ctx.stop_reason}")
        return AttemptResult(Outcome.TIMED_OUT, None, f"no response within {ctx.timeout_s:g}s")


