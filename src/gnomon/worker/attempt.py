"""What every executor shares: the attempt's context and its result.

Each executor gets an ``AttemptContext``: the run id (the idempotency key), the tenant
the run belongs to, the payload, a ``log`` function that streams lines to
gnomon.run-logs, and ``stop`` (set when the attempt must end: timeout, cancel, stale
token, drain). Executors return an ``AttemptResult``; they never raise for the job's
own failures.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from gnomon.core.messages import LogStream
from gnomon.core.model import Target
from gnomon.core.runs import Outcome

LINE_MAX_CHARS = 8192
ERROR_MAX_CHARS = 2048  # an attempt's error text, as reported to the processor
KILL_GRACE_S = 5.0


@dataclass
class AttemptContext:
    run_id: str
    job_id: str
    tenant: str
    attempt: int
    payload: Any
    timeout_s: float
    log: Callable[[LogStream, str], None]
    stop: threading.Event = field(default_factory=threading.Event)
    stop_reason: str = ""
    secrets: tuple[str, ...] = ()  # names of the tenant's secrets the job declared

    def sandbox_env(self) -> dict[str, str]:
        """The variables a sandboxed attempt starts with: the run's own, none of the worker's."""
        from gnomon.worker.sandbox import base_env

        return base_env(self.run_id, self.job_id, self.tenant, self.attempt, json.dumps(self.payload))

    def request_stop(self, reason: str) -> None:
        if not self.stop.is_set():
            self.stop_reason = reason
            self.stop.set()


@dataclass(frozen=True)
class AttemptResult:
    outcome: Outcome
    exit_code: int | None = None
    error: str | None = None

    def capped(self) -> AttemptResult:
        """The same result with its error text cut to ``ERROR_MAX_CHARS``."""
        if self.error is None or len(self.error) <= ERROR_MAX_CHARS:
            return self
        return AttemptResult(self.outcome, self.exit_code, self.error[: ERROR_MAX_CHARS - 14] + " …(truncated)")


class Executor(Protocol):
    def execute(self, target: Target, ctx: AttemptContext) -> AttemptResult: ...
