"""How an attempt is executed: a registered handler, a command, a container or an HTTP callback.

The shared types live in ``gnomon.worker.attempt``; each target type has its module
(``command``, ``container``, ``http_target``); ``Dispatcher`` picks one per target.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from gnomon.core.messages import LogStream
from gnomon.core.model import Target, TargetType
from gnomon.core.runs import Outcome
from gnomon.outbound.secrets import SecretStore
from gnomon.worker.attempt import (
    KILL_GRACE_S,
    AttemptContext,
    AttemptResult,
    Executor,
    encode_output,
)
from gnomon.worker.command import CommandExecutor, SandboxedCommandExecutor
from gnomon.worker.container import ContainerExecutor
from gnomon.worker.http_target import HttpExecutor
from gnomon.worker.policy import PoolPolicy

__all__ = ["AttemptContext", "AttemptResult", "CommandExecutor", "Dispatcher", "Executor", "Handler",
           "HandlerExecutor", "HttpExecutor"]


Handler = Callable[[AttemptContext], Any]  # a plain function or an ``async def``


class HandlerExecutor:
    """Calls a Python function registered with ``@worker.handler(name)``.

    The function gets the context (``ctx.run_id`` is the idempotency key). A plain
    function runs on the attempt's thread; ``ctx.stop`` is set on timeout or cancel, so
    a long one should check it. An ``async def`` handler runs on the worker's event loop
    (one loop thread shared by all async handlers) and is cancelled on timeout or
    cancel. What it returns is recorded as the run's output (JSON, at most
    ``OUTPUT_MAX_BYTES``; anything else is logged and not recorded). Raising = failed
    attempt.

    ``inline`` (the worker's choice): a plain function runs on the calling thread (the
    attempt's pooled thread) and the caller enforces the deadline (``ctx.watched``: the
    worker's loop sets ``ctx.stop`` at the deadline and gives the attempt up
    ``KILL_GRACE_S`` later). Otherwise it runs on a thread of its own, joined with a
    timeout: a thread start per attempt (~100 µs) on the path of every start, when
    thousands share one slot."""

    def __init__(self, handlers: dict[str, Handler], *, inline: bool = False) -> None:
        self.handlers = handlers
        self.inline = inline
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_lock = threading.Lock()

    def execute(self, target: Target, ctx: AttemptContext) -> AttemptResult:
        fn = self.handlers.get(target.handler or "")
        if fn is None:
            msg = f"no handler named {target.handler!r} in this worker (known: {', '.join(sorted(self.handlers)) or 'none'})"
            ctx.log(LogStream.SYSTEM, msg)
            return AttemptResult(Outcome.FAILED, None, msg)
        if inspect.iscoroutinefunction(fn):
            return self._execute_async(fn, ctx)
        if self.inline:
            return self._execute_inline(fn, ctx)
        result: list[AttemptResult] = []

        def call() -> None:
            try:
                value = fn(ctx)
                if inspect.isawaitable(value):  # e.g. a partial of an async def
                    value = asyncio.run_coroutine_threadsafe(_awaited(value, threading.Event()), self.loop()).result()
                result.append(_succeeded(value, ctx))
            except Exception as exc:
                result.append(_failed(exc, ctx))

        t = threading.Thread(target=call, daemon=True, name=f"handler-{ctx.run_id}")
        t.start()
        t.join(ctx.timeout_s)
        if result:
            return result[0]
        ctx.request_stop("timeout")
        t.join(KILL_GRACE_S)
        return AttemptResult(Outcome.TIMED_OUT, None, f"handler still running after {ctx.timeout_s:g}s")

    def _execute_inline(self, fn: Handler, ctx: AttemptContext) -> AttemptResult:
        ctx.watched = True
        try:
            value = fn(ctx)
            if inspect.isawaitable(value):
                value = asyncio.run_coroutine_threadsafe(_awaited(value, threading.Event()), self.loop()).result()
            result = _succeeded(value, ctx)
        except Exception as exc:
            result = _failed(exc, ctx)
        if ctx.stop_reason == "timeout":  # it outlived its deadline: the loop asked it to stop
            return AttemptResult(Outcome.TIMED_OUT, None, f"handler still running after {ctx.timeout_s:g}s")
        return result

    def _execute_async(self, fn: Handler, ctx: AttemptContext) -> AttemptResult:
        ended = threading.Event()
        future = asyncio.run_coroutine_threadsafe(_awaited(fn(ctx), ended), self.loop())
        deadline = time.monotonic() + ctx.timeout_s
        # wait() rather than result(timeout): a handler that itself raises TimeoutError
        # (asyncio.wait_for, an HTTP client) must fail the attempt, not look like our poll
        while not concurrent.futures.wait([future], timeout=min(ASYNC_POLL_S,
                                                                 max(0.0, deadline - time.monotonic()))).done:
            if ctx.stop.is_set() or time.monotonic() >= deadline:
                timed_out = not ctx.stop.is_set()
                if timed_out:
                    ctx.request_stop("timeout")
                future.cancel()  # CancelledError inside the handler, at its next await
                ended.wait(KILL_GRACE_S)  # let it unwind (its finally blocks) before the attempt ends
                if timed_out:
                    return AttemptResult(Outcome.TIMED_OUT, None, f"handler still running after {ctx.timeout_s:g}s")
                return AttemptResult(Outcome.FAILED, None, f"stopped: {ctx.stop_reason}")
        try:
            value = future.result()
        except concurrent.futures.CancelledError:
            return AttemptResult(Outcome.FAILED, None, f"stopped: {ctx.stop_reason or 'cancelled'}")
        except Exception as exc:
            return _failed(exc, ctx)
        return _succeeded(value, ctx)

    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop async handlers run on, started on first use (a daemon thread)."""
        with self._loop_lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, daemon=True, name="gnomon-handlers-loop").start()
                self._loop = loop
            return self._loop

    def close(self) -> None:
        with self._loop_lock:
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._loop = None


ASYNC_POLL_S = 0.1  # how often a waiting async attempt checks ctx.stop


async def _awaited(value: Awaitable[Any], ended: threading.Event) -> Any:
    try:
        return await value
    finally:
        ended.set()


def _succeeded(value: Any, ctx: AttemptContext) -> AttemptResult:
    output, problem = encode_output(value)
    if problem is not None:
        ctx.log(LogStream.SYSTEM, problem)
    return AttemptResult(Outcome.SUCCEEDED, output=output)


def _failed(exc: Exception, ctx: AttemptContext) -> AttemptResult:
    ctx.log(LogStream.STDERR, f"{type(exc).__name__}: {exc}")
    return AttemptResult(Outcome.FAILED, None, f"{type(exc).__name__}: {exc}")


class Dispatcher:
    """Picks the executor for a target type, configured by the pool's policy: sandbox
    limits and network for commands and containers, address rules for HTTP, and the
    tenant's secrets (the job's ``secrets``) injected into sandboxes."""

    def __init__(self, handlers: dict[str, Handler], policy: PoolPolicy | None = None,
                 secrets: SecretStore | None = None, *, inline_handlers: bool = False) -> None:
        policy = policy or PoolPolicy(frozenset({"-"}))
        store = secrets or SecretStore(None)
        self._by_type: dict[TargetType, Executor] = {
            TargetType.COMMAND: SandboxedCommandExecutor(policy.limits, policy.commands.network,
                                                         extra_env=store.env_for),
            TargetType.CONTAINER: ContainerExecutor(policy.limits, policy.containers.network, extra_env=store.env_for),
            TargetType.HTTP: HttpExecutor(policy.http, store),
            TargetType.HANDLER: HandlerExecutor(handlers, inline=inline_handlers),
        }

    def execute(self, target: Target, ctx: AttemptContext) -> AttemptResult:
        return self._by_type[target.type].execute(target, ctx)
