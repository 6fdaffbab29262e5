"""What every executor shares: the attempt's context and its result.

Each executor gets an ``AttemptContext`` (exported as ``gnomon.worker.Context`` for
handler signatures): the run id (the idempotency key), the job, the tenant the run
belongs to, the attempt number, the slot, the payload, the deadline, a ``log`` function
that streams lines to the run's log, and ``stop`` (set when the attempt must end:
timeout, cancel, stale token, drain). Executors return an ``AttemptResult``; they never
raise for the job's own failures. A result may carry ``output``: JSON text of at most
``OUTPUT_MAX_BYTES`` (a handler's return value, a command's last lines), recorded on
the run.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from gnomon.core.messages import LogStream
from gnomon.core.model import Target
from gnomon.core.runs import OUTPUT_MAX_BYTES, Outcome

LINE_MAX_CHARS = 8192
ERROR_MAX_CHARS = 2048  # an attempt's error text, as reported to the processor
KILL_GRACE_S = 5.0


@dataclass
class AttemptContext:
    """One attempt of a run, as a handler sees it.

    ``run_id`` is the idempotency key (the same across retries of the run); ``attempt``
    counts from 1; ``slot_ms`` is the scheduled instant (``slot``: as a UTC datetime);
    ``deadline_ms`` is when the attempt is stopped (``deadline``; set when it starts);
    ``log(stream, line)`` appends a line ("stdout", "stderr") to the run's log; ``stop``
    is set when the attempt must end (``stop_reason`` says why): a long handler checks
    ``ctx.stop.is_set()`` (an ``async def`` handler is cancelled instead).
    """

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
    slot_ms: int = 0  # the run's scheduled instant (epoch ms)
    deadline_ms: int | None = None  # when this attempt is stopped (epoch ms, worker clock); set at its start
    # set by an executor that runs the handler on the attempt's own thread and leaves its
    # deadline to the worker's loop (stop at the deadline, give up ``KILL_GRACE_S`` later)
    watched: bool = False
    # the attempt's lease (the grant's): a guard that outlives the worker ends a container
    # this long after the last renewal (gnomon.worker.container_guard)
    lease_s: float = 30.0
    # called on each lease renewal (the worker's heartbeat of this attempt), from the
    # worker's loop thread; executors add to it (a container's guard is fed from here)
    renewals: list[Callable[[], None]] = field(default_factory=list)

    @property
    def slot(self) -> datetime:
        return datetime.fromtimestamp(self.slot_ms / 1000, UTC)

    @property
    def deadline(self) -> datetime | None:
        return None if self.deadline_ms is None else datetime.fromtimestamp(self.deadline_ms / 1000, UTC)

    def sandbox_env(self) -> dict[str, str]:
        """The variables a sandboxed attempt starts with: the run's own, none of the worker's."""
        from gnomon.worker.sandbox import base_env

        return base_env(self.run_id, self.job_id, self.tenant, self.attempt, json.dumps(self.payload))

    def renewed(self) -> None:
        """The worker renewed this attempt's lease: tell whoever listens (never raises)."""
        for call in list(self.renewals):
            try:
                call()
            except Exception:  # a listener's failure must not stop the worker's loop
                logging.getLogger("gnomon.worker").exception("lease renewal listener failed")

    def request_stop(self, reason: str) -> None:
        if not self.stop.is_set():
            self.stop_reason = reason
            self.stop.set()


@dataclass(frozen=True)
class AttemptResult:
    outcome: Outcome
    exit_code: int | None = None
    error: str | None = None
    output: str | None = None  # JSON text of at most OUTPUT_MAX_BYTES (see encode_output)

    def capped(self) -> AttemptResult:
        """The same result with its error text cut to ``ERROR_MAX_CHARS`` and an output
        over ``OUTPUT_MAX_BYTES`` dropped (encode_output never makes one)."""
        error, output = self.error, self.output
        if error is not None and len(error) > ERROR_MAX_CHARS:
            error = error[: ERROR_MAX_CHARS - 14] + " …(truncated)"
        if output is not None and len(output.encode()) > OUTPUT_MAX_BYTES:
            output = None
        if error is self.error and output is self.output:
            return self
        return AttemptResult(self.outcome, self.exit_code, error, output)


def encode_output(value: Any) -> tuple[str | None, str | None]:
    """A handler's return value as recorded output: ``(json_text, None)``, or
    ``(None, why)`` when it cannot be recorded (not JSON-serialisable, or over
    ``OUTPUT_MAX_BYTES`` once encoded). ``None`` records nothing."""
    if value is None:
        return None, None
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        return None, f"output not recorded: the return value is not JSON ({exc})"
    size = len(text.encode())
    if size > OUTPUT_MAX_BYTES:
        return None, f"output not recorded: {size} bytes of JSON, over the {OUTPUT_MAX_BYTES}-byte cap"
    return text, None


TAIL_LINES_MAX = 20


def tail_output(lines: list[str]) -> str | None:
    """A command's result summary: its last lines of standard output (at most
    ``TAIL_LINES_MAX``, trimmed from the front to fit ``OUTPUT_MAX_BYTES``), as JSON text
    of one string; None when it printed nothing."""
    kept = [line.rstrip("\n") for line in lines[-TAIL_LINES_MAX:]]
    while kept:
        text = json.dumps("\n".join(kept), ensure_ascii=False)
        if len(text.encode()) <= OUTPUT_MAX_BYTES:
            return text
        if len(kept) == 1:  # one line over the cap: keep its end
            kept = [kept[0][-(OUTPUT_MAX_BYTES // 8):]]
            continue
        kept = kept[1:]
    return None


class Executor(Protocol):
    def execute(self, target: Target, ctx: AttemptContext) -> AttemptResult: ...
