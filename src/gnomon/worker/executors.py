"""How an attempt is executed: a command, an HTTP callback or a registered handler.

Each executor gets an ``AttemptContext``: the run id (the idempotency key), the
payload, a ``log`` function that streams lines to gnomon.run-logs, and ``stop`` (set
when the attempt must end: timeout, cancel, stale token). Executors return an
``AttemptResult``; they never raise for the job's own failures.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from gnomon.core.messages import LogStream
from gnomon.core.model import Target, TargetType
from gnomon.core.runs import Outcome

LINE_MAX_CHARS = 8192
KILL_GRACE_S = 5.0


@dataclass
class AttemptContext:
    run_id: str
    job_id: str
    attempt: int
    payload: Any
    timeout_s: float
    log: Callable[[LogStream, str], None]
    stop: threading.Event = field(default_factory=threading.Event)
    stop_reason: str = ""

    def request_stop(self, reason: str) -> None:
        if not self.stop.is_set():
            self.stop_reason = reason
            self.stop.set()


@dataclass(frozen=True)
class AttemptResult:
    outcome: Outcome
    exit_code: int | None = None
    error: str | None = None


class Executor(Protocol):
    def execute(self, target: Target, ctx: AttemptContext) -> AttemptResult: ...


def _env_for(ctx: AttemptContext) -> dict[str, str]:
    env = dict(os.environ)
    env["GNOMON_RUN_ID"] = ctx.run_id
    env["GNOMON_JOB_ID"] = ctx.job_id
    env["GNOMON_ATTEMPT"] = str(ctx.attempt)
    env["GNOMON_PAYLOAD"] = json.dumps(ctx.payload)
    return env


class CommandExecutor:
    """Runs argv in its own process group; at timeout/stop the whole group is killed."""

    def execute(self, target: Target, ctx: AttemptContext) -> AttemptResult:
        try:
            proc = subprocess.Popen(
                list(target.argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                env=_env_for(ctx), start_new_session=True, text=True, errors="replace",
            )
        except OSError as exc:
            ctx.log(LogStream.SYSTEM, f"cannot start {target.argv[0]!r}: {exc}")
            return AttemptResult(Outcome.FAILED, 127, f"cannot start command: {exc}")
        pumps = [
            threading.Thread(target=self._pump, args=(proc.stdout, LogStream.STDOUT, ctx), daemon=True),
            threading.Thread(target=self._pump, args=(proc.stderr, LogStream.STDERR, ctx), daemon=True),
        ]
        for t in pumps:
            t.start()
        deadline = time.monotonic() + ctx.timeout_s
        timed_out = False
        while proc.poll() is None:
            if time.monotonic() >= deadline:
                timed_out = True
                break
            if ctx.stop.wait(0.05):
                break
        if proc.poll() is None:
            self._kill_group(proc)
        for t in pumps:
            t.join(timeout=2)
        code = proc.returncode
        if timed_out:
            ctx.log(LogStream.SYSTEM, f"timed out after {ctx.timeout_s:g}s; process group killed")
            return AttemptResult(Outcome.TIMED_OUT, code, f"timed out after {ctx.timeout_s:g}s")
        if ctx.stop.is_set():
            ctx.log(LogStream.SYSTEM, f"stopped: {ctx.stop_reason}")
            return AttemptResult(Outcome.FAILED, code, f"stopped: {ctx.stop_reason}")
        ctx.log(LogStream.SYSTEM, f"exit code {code}")
        if code == 0:
            return AttemptResult(Outcome.SUCCEEDED, 0)
        return AttemptResult(Outcome.FAILED, code, f"exit code {code}")

    @staticmethod
    def _kill_group(proc: subprocess.Popen[str]) -> None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=KILL_GRACE_S)
        except (ProcessLookupError, PermissionError):
            pass
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    @staticmethod
    def _pump(stream: Any, kind: LogStream, ctx: AttemptContext) -> None:
        for line in stream:
            ctx.log(kind, line.rstrip("\n")[:LINE_MAX_CHARS])


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


Handler = Callable[[AttemptContext], Any]


class HandlerExecutor:
    """Calls a Python function registered with ``@worker.handler(name)``. The function
    gets the context (``ctx.run_id`` is the idempotency key; ``ctx.stop`` is set on
    timeout/cancel: long handlers should check it). Raising = failed attempt."""

    def __init__(self, handlers: dict[str, Handler]) -> None:
        self.handlers = handlers

    def execute(self, target: Target, ctx: AttemptContext) -> AttemptResult:
        fn = self.handlers.get(target.handler or "")
        if fn is None:
            msg = f"no handler named {target.handler!r} in this worker (known: {', '.join(sorted(self.handlers)) or 'none'})"
            ctx.log(LogStream.SYSTEM, msg)
            return AttemptResult(Outcome.FAILED, None, msg)
        result: list[AttemptResult] = []

        def call() -> None:
            try:
                value = fn(ctx)
                if value is not None:
                    ctx.log(LogStream.STDOUT, str(value)[:LINE_MAX_CHARS])
                result.append(AttemptResult(Outcome.SUCCEEDED))
            except Exception as exc:
                ctx.log(LogStream.STDERR, f"{type(exc).__name__}: {exc}")
                result.append(AttemptResult(Outcome.FAILED, None, f"{type(exc).__name__}: {exc}"))

        t = threading.Thread(target=call, daemon=True, name=f"handler-{ctx.run_id}")
        t.start()
        t.join(ctx.timeout_s)
        if result:
            return result[0]
        ctx.request_stop("timeout")
        t.join(KILL_GRACE_S)
        return AttemptResult(Outcome.TIMED_OUT, None, f"handler still running after {ctx.timeout_s:g}s")


class Dispatcher:
    """Picks the executor for a target type."""

    def __init__(self, handlers: dict[str, Handler], http: httpx.Client | None = None) -> None:
        self._by_type: dict[TargetType, Executor] = {
            TargetType.COMMAND: CommandExecutor(),
            TargetType.HTTP: HttpExecutor(http),
            TargetType.HANDLER: HandlerExecutor(handlers),
        }

    def execute(self, target: Target, ctx: AttemptContext) -> AttemptResult:
        return self._by_type[target.type].execute(target, ctx)
