"""Command targets: an argv run as a subprocess in its own process group."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from typing import Any

from gnomon.core.messages import LogStream
from gnomon.core.model import Target
from gnomon.core.runs import Outcome
from gnomon.worker.attempt import KILL_GRACE_S, LINE_MAX_CHARS, AttemptContext, AttemptResult


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


