"""Command targets: an argv run in a fresh bubblewrap sandbox per attempt.

``worker/sandbox.py`` builds the sandbox; this module runs it: it reads stdout and
stderr in bounded chunks (lines cut at ``LINE_MAX_CHARS``, all output capped at the
policy's ``output_max_bytes``), and kills the whole sandbox on timeout, cancel, drain
or too much output.
"""

from __future__ import annotations

import itertools
import os
import secrets
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import IO

from gnomon.core.messages import LogStream
from gnomon.core.model import Target
from gnomon.core.runs import Outcome
from gnomon.outbound.secrets import SecretError, redactor
from gnomon.worker import seccomp
from gnomon.worker.attempt import (
    LINE_MAX_CHARS,
    TAIL_LINES_MAX,
    AttemptContext,
    AttemptResult,
    tail_output,
)
from gnomon.worker.sandbox import (
    BwrapSandbox,
    Cgroups,
    SandboxError,
    SandboxLimits,
    SandboxRequest,
    kill_tree,
)

READ_CHUNK_BYTES = 64 * 1024
POLL_S = 0.02
KILL_WAIT_S = 30.0
_attempt_seq = itertools.count(1)
_RUN_TAG = secrets.token_hex(3)  # with the pid: unique across pid reuse


class OutputMeter:
    """Counts the bytes both streams produced; past the cap, ``exceeded`` is set."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.total_bytes = 0
        self.exceeded = threading.Event()
        self._lock = threading.Lock()

    def take(self, n: int) -> bool:
        """Account n bytes; False once the cap is passed (stop logging, kill)."""
        with self._lock:
            self.total_bytes += n
            if self.total_bytes > self.max_bytes:
                self.exceeded.set()
                return False
            return True


def pump_lines(stream: IO[bytes], emit: Callable[[str], None], meter: OutputMeter) -> None:
    """Read a pipe in chunks and emit its lines, each cut at LINE_MAX_CHARS; never holds
    more than one chunk plus one capped line, whatever the child writes. The pump closes
    the pipe itself when it is done: closed under a reader that is still at it, its fd
    number could be reused by another attempt's pipe (the variables' pipe holds secrets)."""
    fd = stream.fileno()
    partial = bytearray()
    try:
        while True:
            chunk = os.read(fd, READ_CHUNK_BYTES)
            if not chunk:
                break
            if not meter.take(len(chunk)):
                _drain(fd)  # the attempt is being killed; the rest is read and dropped
                return
            partial += chunk
            *lines, rest = bytes(partial).split(b"\n")
            for line in lines:
                emit(line[:LINE_MAX_CHARS].decode("utf-8", "replace"))
            partial = bytearray(rest[: LINE_MAX_CHARS + 1])  # a newline-less flood stays bounded
        if partial:
            emit(bytes(partial[:LINE_MAX_CHARS]).decode("utf-8", "replace"))
    finally:
        stream.close()


def _drain(fd: int) -> None:
    """Read and drop a pipe to its end. A writer blocked on a full pipe never exits: `podman
    run` (a container target) copies the container's output to it and waited there, past the
    container's removal, until the kill timeout (30 s) had its client killed."""
    try:
        while os.read(fd, READ_CHUNK_BYTES):
            pass
    except OSError:
        pass  # closed under us once the child is reaped


class SandboxedCommandExecutor:
    """Runs ``target.argv`` in bubblewrap with the pool's limits (see worker/sandbox.py)."""

    def __init__(self, limits: SandboxLimits | None = None, network: bool = False,
                 sandbox: BwrapSandbox | None = None,
                 extra_env: Callable[[AttemptContext], dict[str, str]] | None = None) -> None:
        self.limits = limits or SandboxLimits()
        self.network = network
        self.sandbox = sandbox or BwrapSandbox()
        self.extra_env = extra_env  # the job's secrets, resolved by the worker

    def execute(self, target: Target, ctx: AttemptContext) -> AttemptResult:
        try:
            extra = self.extra_env(ctx) if self.extra_env is not None else {}
        except SecretError as exc:
            ctx.log(LogStream.SYSTEM, f"secret unavailable: {exc}")
            return AttemptResult(Outcome.FAILED, None, f"secret unavailable: {exc}")
        try:
            self.sandbox.check()
            name = f"{os.getpid()}-{_RUN_TAG}-{next(_attempt_seq)}"
            cgroups = Cgroups.create(name, self.limits)
        except SandboxError as exc:
            ctx.log(LogStream.SYSTEM, f"sandbox unavailable: {exc}")
            return AttemptResult(Outcome.FAILED, None, f"sandbox unavailable: {exc}")
        env = {**ctx.sandbox_env(), **extra}
        ids = self.sandbox.ids
        attempt_id = ids.acquire() if ids is not None else None
        try:
            if ids is not None and attempt_id is None:
                ctx.log(LogStream.SYSTEM, f"sandbox unavailable: all {ids.count} per-attempt host ids are in use")
                return AttemptResult(Outcome.FAILED, None, "sandbox unavailable: no free per-attempt host id")
            return self._run(SandboxRequest(name, target.argv, env, self.limits, self.network), cgroups, ctx,
                             redactor(extra.values()), attempt_id)
        finally:
            if cgroups is not None:
                cgroups.kill_all()
                cgroups.remove()
            if ids is not None and attempt_id is not None:
                ids.release(attempt_id)

    def _run(self, req: SandboxRequest, cgroups: Cgroups | None, ctx: AttemptContext,
             redact: Callable[[str], str], attempt_id: int | None = None) -> AttemptResult:
        env_r, env_w = os.pipe()
        filter_r: int | None = None
        try:
            filter_r = _seccomp_pipe()
            argv, launcher_env = self.sandbox.argv(req, cgroups, env_r, filter_r, attempt_id)
            env_bytes = self.sandbox.env_args(req)
            fds = (env_r,) if filter_r is None else (env_r, filter_r)
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    env=launcher_env, start_new_session=True, close_fds=True, pass_fds=fds)
        except (OSError, SandboxError) as exc:
            os.close(env_w)
            ctx.log(LogStream.SYSTEM, f"cannot start the sandbox: {exc}")
            return AttemptResult(Outcome.FAILED, 127, f"cannot start the sandbox: {exc}")
        finally:
            os.close(env_r)
            if filter_r is not None:
                os.close(filter_r)
        # the variables go through a pipe, not the argv (see BwrapSandbox.argv); a thread,
        # since they may be larger than the pipe's buffer
        threading.Thread(target=_write_and_close, args=(env_w, env_bytes), daemon=True).start()
        # kill_tree after a normal exit too: it reaps what a setsid child left in the cgroups
        ended = supervise(proc, ctx, req.limits.output_max_bytes, kill=lambda: kill_tree(proc.pid, cgroups),
                          kill_after_exit=cgroups is not None, redact=redact)
        code, why = ended.code, ended.why
        if cgroups is not None:
            ctx.log(LogStream.SYSTEM, f"peak processes {cgroups.peak_pids()} of {req.limits.pids_max} allowed")
        if code == 125 and not why:
            ctx.log(LogStream.SYSTEM, "the sandbox could not join its cgroups")
            return AttemptResult(Outcome.FAILED, code, "sandbox setup failed (cgroups)")
        return outcome_of(ended, ctx, req.limits.output_max_bytes, "sandbox killed")


SECCOMP_PROGRAM = seccomp.program()  # None where no syscall table exists (the worker says so at start)


def _seccomp_pipe() -> int | None:
    """The read end of a pipe holding the sandbox's seccomp filter (a few hundred bytes: it
    fits in the pipe's buffer, so it is written whole before bwrap starts)."""
    if SECCOMP_PROGRAM is None:
        return None
    r, w = os.pipe()
    try:
        os.write(w, SECCOMP_PROGRAM)
    finally:
        os.close(w)
    return r


def _write_and_close(fd: int, data: bytes) -> None:
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except OSError:
        pass  # the sandbox died before reading its variables; its exit code says so
    finally:
        os.close(fd)


@dataclass
class Supervised:
    """How a supervised child ended: its exit code, why it was killed ("" if it was not)
    and its last lines of standard output (redacted), for the result summary."""

    code: int
    why: str
    tail: list[str]


def supervise(proc: subprocess.Popen[bytes], ctx: AttemptContext, output_max_bytes: int,
              kill: Callable[[], None], kill_after_exit: bool = False,
              redact: Callable[[str], str] = lambda line: line) -> Supervised:
    """Pump the child's output into the run's log (secret values redacted) until it
    exits, or kill it at the timeout, on ``ctx.stop``, past the output cap, or once its
    lease lapsed: no renewal (``ctx.renewed``) for ``ctx.lease_s`` (a worker cut off from
    Kafka: the processor grants the run again then, so the child must not run on)."""
    meter = OutputMeter(output_max_bytes)
    lease = _LeaseWatch(ctx.lease_s)
    assert proc.stdout is not None and proc.stderr is not None
    tail: deque[str] = deque(maxlen=TAIL_LINES_MAX)

    def out(line: str) -> None:
        line = redact(line)
        tail.append(line)
        ctx.log(LogStream.STDOUT, line)

    def err(line: str) -> None:
        ctx.log(LogStream.STDERR, redact(line))

    pumps = [threading.Thread(target=pump_lines, args=(s, sink, meter), daemon=True)
             for s, sink in ((proc.stdout, out), (proc.stderr, err))]
    for t in pumps:
        t.start()
    deadline = time.monotonic() + ctx.timeout_s
    why = ""
    ctx.renewals.append(lease.renew)
    try:
        while proc.poll() is None and not why:
            if time.monotonic() >= deadline:
                why = "timeout"
            elif meter.exceeded.is_set():
                why = "output"
            elif lease.lapsed():
                why = "lease"
            elif ctx.stop.wait(POLL_S):
                why = "stop"
    finally:
        ctx.renewals.remove(lease.renew)
    if why or kill_after_exit:
        kill()
    try:
        code = proc.wait(timeout=KILL_WAIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = proc.wait()
    for t in pumps:
        t.join(timeout=2)  # each pump closes its own pipe (pump_lines)
    return Supervised(code, why or ("output" if meter.exceeded.is_set() else ""), list(tail))


class _LeaseWatch:
    """When an attempt's lease was last renewed (monotonic), and whether it has lapsed."""

    def __init__(self, lease_s: float) -> None:
        assert lease_s > 0
        self.lease_s = lease_s
        self.renewed_at_s = time.monotonic()  # the attempt starts on a fresh grant

    def renew(self) -> None:
        self.renewed_at_s = time.monotonic()  # one float store: safe from the worker's loop thread

    def lapsed(self) -> bool:
        return time.monotonic() - self.renewed_at_s >= self.lease_s


def outcome_of(ended: Supervised, ctx: AttemptContext, output_max_bytes: int, killed: str) -> AttemptResult:
    """The attempt's result, with one SYSTEM line in its log saying how it ended; its
    output is the last lines the child printed (``tail_output``)."""
    result = _outcome(ended.code, ended.why, ctx, output_max_bytes, killed)
    return replace(result, output=tail_output(ended.tail))


def _outcome(code: int, why: str, ctx: AttemptContext, output_max_bytes: int, killed: str) -> AttemptResult:
    if why == "timeout":
        ctx.log(LogStream.SYSTEM, f"timed out after {ctx.timeout_s:g}s; {killed}")
        return AttemptResult(Outcome.TIMED_OUT, code, f"timed out after {ctx.timeout_s:g}s")
    if why == "output":
        ctx.log(LogStream.SYSTEM, f"output passed the limit of {output_max_bytes} bytes; {killed}")
        return AttemptResult(Outcome.FAILED, code, f"output limit exceeded ({output_max_bytes} bytes)")
    if why == "lease":
        ctx.log(LogStream.SYSTEM, f"lease lapsed: no renewal for {ctx.lease_s:g}s (is Kafka reachable?); {killed}")
        return AttemptResult(Outcome.FAILED, code, f"lease lapsed: no renewal for {ctx.lease_s:g}s")
    if why == "stop":
        ctx.log(LogStream.SYSTEM, f"stopped: {ctx.stop_reason}; {killed}")
        return AttemptResult(Outcome.FAILED, code, f"stopped: {ctx.stop_reason}")
    ctx.log(LogStream.SYSTEM, f"exit code {code}")
    if code == 0:
        return AttemptResult(Outcome.SUCCEEDED, 0)
    return AttemptResult(Outcome.FAILED, code, f"exit code {code}")


CommandExecutor = SandboxedCommandExecutor
