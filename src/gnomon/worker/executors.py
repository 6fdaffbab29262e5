"""How an attempt is executed: a registered handler, a command, a container or an HTTP callback.

The shared types live in ``gnomon.worker.attempt``; each target type has its module
(``command``, ``container``, ``http_target``); ``Dispatcher`` picks one per target.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from gnomon.core.messages import LogStream
from gnomon.core.model import Target, TargetType
from gnomon.core.runs import Outcome
from gnomon.worker.attempt import (
    KILL_GRACE_S,
    LINE_MAX_CHARS,
    AttemptContext,
    AttemptResult,
    Executor,
)
from gnomon.worker.command import CommandExecutor, SandboxedCommandExecutor
from gnomon.worker.container import ContainerExecutor
from gnomon.worker.http_target import HttpExecutor
from gnomon.worker.policy import PoolPolicy
from gnomon.worker.secrets import SecretStore

__all__ = ["AttemptContext", "AttemptResult", "CommandExecutor", "Dispatcher", "Executor", "Handler",
           "HandlerExecutor", "HttpExecutor"]


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
    """Picks the executor for a target type, configured by the pool's policy: sandbox
    limits and network for commands and containers, address rules for HTTP, and the
    tenant's secrets (the job's ``secrets``) injected into sandboxes."""

    def __init__(self, handlers: dict[str, Handler], policy: PoolPolicy | None = None,
                 secrets: SecretStore | None = None) -> None:
        policy = policy or PoolPolicy(frozenset({"-"}))
        store = secrets or SecretStore(None)
        self._by_type: dict[TargetType, Executor] = {
            TargetType.COMMAND: SandboxedCommandExecutor(policy.limits, policy.commands.network,
                                                         extra_env=store.env_for),
            TargetType.CONTAINER: ContainerExecutor(policy.limits, policy.containers.network, extra_env=store.env_for),
            TargetType.HTTP: HttpExecutor(policy.http, store),
            TargetType.HANDLER: HandlerExecutor(handlers),
        }

    def execute(self, target: Target, ctx: AttemptContext) -> AttemptResult:
        return self._by_type[target.type].execute(target, ctx)
