"""Container targets: ``{"type": "container", "image", "argv"}`` run by podman.

Podman runs with Debian's runc (its default crun cannot drive the hybrid cgroups of
these hosts; ../shared/infra-facts.md). Images come from the host's local store only
(``--pull never``): the pool's policy names the images a tenant may run, and an
operator loads them (``podman load``/``podman import``); nothing is pulled at run time.

Each attempt gets its own container: user nobody, no capabilities, no new privileges,
read-only root, a private size-capped ``/tmp``, no network unless the policy grants it,
the policy's memory, CPU and pid limits, and only the run's variables and its secrets.
On timeout, cancel, drain or too much output the container is removed by name
(``podman rm -f``), which kills everything in it.

A container must not outlive its worker: a killed worker's attempt is granted again once
its lease lapses, and two copies would run at once. So each container gets a hard
deadline enforced by the runtime (``podman run --timeout``: the attempt's timeout plus
``RUNTIME_GRACE_S``), and carries its worker's identity in a label (``gnomon.worker``:
the host's boot id, the worker's pid and that process's start time, so a reused pid is
not mistaken for it); a worker starting on the host removes every labelled container
whose worker is gone (``PodmanRunner.sweep_orphans``) before it takes work.

Neither bounds the overlap by the lease: the runtime's deadline is the attempt's timeout
(often far longer than the 30 s lease) and the sweep waits for a worker to start. So each
container also has a guard (``gnomon.worker.container_guard``), a small process started
before it in a session of its own and fed the worker's lease renewals through a pipe: when
the worker dies (the pipe closes) or stops renewing for one lease, the guard removes the
container. A re-granted run, granted once the lease lapsed, never runs beside it.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from gnomon.core.messages import LogStream
from gnomon.core.model import Target
from gnomon.core.runs import Outcome
from gnomon.outbound.secrets import SecretError, redactor
from gnomon.worker.attempt import AttemptContext, AttemptResult
from gnomon.worker.command import outcome_of, supervise
from gnomon.worker.sandbox import SANDBOX_UID, SandboxError, SandboxLimits

log = logging.getLogger("gnomon.worker")

RUNTIME = "/usr/sbin/runc"
REMOVE_TIMEOUT_S = 30.0
RUNTIME_GRACE_S = 10  # past the attempt's timeout, the runtime kills the container itself
NAME_PREFIX = "gnomon-"
_seq = itertools.count(1)


GUARD_SCRIPT = Path(__file__).with_name("container_guard.py")
GUARD_QUIT_TIMEOUT_S = 5.0


class Guard:
    """The worker's end of a container's guard (``container_guard``): ``renew()`` on each
    lease renewal, ``close()`` once the container is removed. Thread-safe: renewals come
    from the worker's loop, the close from the attempt's thread. Never raises."""

    def __init__(self, proc: subprocess.Popen[bytes] | None) -> None:
        self._proc = proc
        self._lock = threading.Lock()

    def renew(self) -> None:
        self._write(b"h")

    def close(self) -> None:
        """The attempt is over and its container removed: the guard leaves without acting."""
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            assert proc.stdin is not None
            proc.stdin.write(b"q")
            proc.stdin.close()
        except OSError:
            pass
        try:
            proc.wait(GUARD_QUIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def _write(self, data: bytes) -> None:
        with self._lock:
            proc = self._proc
            if proc is None or proc.stdin is None:
                return
            try:
                proc.stdin.write(data)
                proc.stdin.flush()
            except OSError as exc:  # the guard is gone: nothing ends the container if we die now
                log.warning("container guard of pid %d is gone: %s", proc.pid, exc)
                self._proc = None


class PodmanRunner:
    """Builds ``podman run`` argv and removes containers; one place knows podman's flags."""

    def __init__(self, podman: str | None = None, runtime: str = RUNTIME, grace_s: int = RUNTIME_GRACE_S,
                 guarded: bool = True) -> None:
        """``guarded``: start a guard per container (False only in tests of the other
        backstops: the runtime's deadline, the sweep)."""
        self.podman = podman or shutil.which("podman") or ""
        self.runtime = runtime
        self.grace_s = grace_s
        self.guarded = guarded

    def check(self) -> None:
        if not self.podman:
            raise SandboxError("podman is not installed; container targets need it: apt-get install podman runc")
        if not os.path.exists(self.runtime):
            raise SandboxError(f"the OCI runtime {self.runtime} is missing: apt-get install runc")

    def base(self) -> list[str]:
        return [self.podman, "--runtime", self.runtime]

    def run_argv(self, name: str, image: str, argv: tuple[str, ...], env: dict[str, str],
                 limits: SandboxLimits, network: bool, timeout_s: float) -> list[str]:
        deadline_s = max(1, math.ceil(timeout_s)) + self.grace_s  # the runtime's, if the worker is gone
        args = [*self.base(), "run", "--rm", "--name", name, "--pull", "never", "--init",
                "--timeout", str(deadline_s), "--label", f"{WORKER_LABEL}={process_identity(os.getpid())}",
                "--user", f"{SANDBOX_UID}:{SANDBOX_UID}", "--cap-drop", "all",
                "--security-opt", "no-new-privileges", "--read-only",
                "--tmpfs", f"/tmp:rw,size={limits.tmp_max_bytes},U",  # U: owned by the user (mode= is lost here)
                "--network", "slirp4netns" if network else "none",
                "--memory", str(limits.memory_max_bytes), "--memory-swap", str(limits.memory_max_bytes),
                "--pids-limit", str(limits.pids_max), "--cpus", f"{limits.cpu_cores_max:g}",
                # runc needs explicit rlimits here (infra-facts); nproc is per uid, pids-limit binds
                "--ulimit", f"nofile={limits.open_files_max}:{limits.open_files_max}",
                "--ulimit", "nproc=1024:1024",
                "--ulimit", f"cpu={limits.cpu_time_max_s}:{limits.cpu_time_max_s}",
                "--env-host=false", "--workdir", "/tmp", "--log-driver", "none"]
        for key in env:  # names only: podman takes the values from its own environment (not argv)
            args += ["--env", key]
        return [*args, image, *argv]

    def guard(self, name: str, silence_s: float) -> Guard:
        """Start the guard of container ``name`` (before the container): it removes the
        container if this process dies or the returned ``Guard`` is not renewed for
        ``silence_s``. A guard that cannot start is logged, and the attempt runs unguarded
        (the runtime's deadline and the next worker's sweep still end the container)."""
        if not self.guarded:
            return Guard(None)
        argv = [sys.executable, "-I", str(GUARD_SCRIPT), self.podman, self.runtime, name, f"{silence_s:g}"]
        try:
            # the worker's own environment, as ``remove`` has: a rootless podman finds its
            # storage through HOME and XDG_RUNTIME_DIR (the guard is the worker's, not sandboxed)
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                    start_new_session=True, close_fds=True, bufsize=0)
        except OSError as exc:
            log.warning("cannot start the guard of container %s: %s", name, exc)
            return Guard(None)
        return Guard(proc)

    def remove(self, name: str) -> None:
        """Kill and remove the container; never raises (it runs on the kill path)."""
        try:
            subprocess.run([*self.base(), "rm", "-f", "-t", "0", name], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=REMOVE_TIMEOUT_S, check=False)
        except (subprocess.TimeoutExpired, OSError) as exc:
            log.warning("cannot remove container %s: %s", name, exc)

    def sweep_orphans(self, alive: Callable[[str], bool] | None = None) -> list[str]:
        """Remove the containers of workers that are gone: labelled ``gnomon.worker`` with
        the identity of a process that no longer runs (``process_identity``). Returns their
        names. Never raises."""
        is_alive = alive or identity_alive
        try:
            out = subprocess.run([*self.base(), "ps", "-a", "--filter", f"label={WORKER_LABEL}",
                                  "--format", f'{{{{.Names}}}} {{{{index .Labels "{WORKER_LABEL}"}}}}'],
                                 capture_output=True, text=True, timeout=REMOVE_TIMEOUT_S, check=False)
        except (subprocess.TimeoutExpired, OSError) as exc:
            log.warning("cannot list containers to sweep: %s", exc)
            return []
        gone: list[str] = []
        for line in out.stdout.splitlines():
            name, _, identity = line.partition(" ")
            if name and identity and not is_alive(identity):
                self.remove(name)
                gone.append(name)
        return gone

    def exists(self, name: str) -> bool:
        out = subprocess.run([*self.base(), "ps", "-a", "--filter", f"name=^{name}$", "--format", "{{.Names}}"],
                             capture_output=True, text=True, timeout=REMOVE_TIMEOUT_S, check=False)
        return name in out.stdout.split()


WORKER_LABEL = "gnomon.worker"


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown-boot"


def _start_ticks(pid: int) -> str | None:
    """The start time of process ``pid`` (clock ticks since boot), or None if it is gone."""
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat_line[stat_line.rfind(")") + 2:].split()  # after "pid (comm) "
    return fields[19] if len(fields) > 19 else None  # field 22 of proc(5)


def process_identity(pid: int) -> str:
    """``<boot id>:<pid>:<start ticks>``: a process of this host, told apart from a later
    one with the same pid."""
    return f"{_boot_id()}:{pid}:{_start_ticks(pid)}"


def identity_alive(identity: str) -> bool:
    """Whether the process ``identity`` names still runs on this host (an identity of
    another boot or another host's never does)."""
    boot, _, rest = identity.partition(":")
    pid_text, _, ticks = rest.partition(":")
    if boot != _boot_id() or not pid_text.isdigit():
        return False
    return _start_ticks(int(pid_text)) == ticks


class ContainerExecutor:
    def __init__(self, limits: SandboxLimits | None = None, network: bool = False,
                 runner: PodmanRunner | None = None,
                 extra_env: Callable[[AttemptContext], dict[str, str]] | None = None) -> None:
        self.limits = limits or SandboxLimits()
        self.network = network
        self.runner = runner or PodmanRunner()
        self.extra_env = extra_env

    def execute(self, target: Target, ctx: AttemptContext) -> AttemptResult:
        try:
            self.runner.check()
        except SandboxError as exc:
            ctx.log(LogStream.SYSTEM, f"container runtime unavailable: {exc}")
            return AttemptResult(Outcome.FAILED, None, f"container runtime unavailable: {exc}")
        if not target.image:
            return AttemptResult(Outcome.FAILED, None, "container target without an image")
        try:
            extra = self.extra_env(ctx) if self.extra_env is not None else {}
        except SecretError as exc:
            ctx.log(LogStream.SYSTEM, f"secret unavailable: {exc}")
            return AttemptResult(Outcome.FAILED, None, f"secret unavailable: {exc}")
        env = {k: v for k, v in ctx.sandbox_env().items() if k != "PATH"}  # the image keeps its PATH
        env.update(extra)
        name = f"{NAME_PREFIX}{os.getpid()}-{next(_seq)}"
        argv = self.runner.run_argv(name, target.image, target.argv, env, self.limits, self.network, ctx.timeout_s)
        guard = self.runner.guard(name, ctx.lease_s)  # before the container exists
        ctx.renewals.append(guard.renew)
        try:
            podman_env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", **env}
            return self._run(argv, podman_env, name, ctx, redactor(extra.values()))
        finally:
            self.runner.remove(name)
            ctx.renewals.remove(guard.renew)
            guard.close()

    def _run(self, argv: list[str], env: dict[str, str], name: str, ctx: AttemptContext,
             redact: Callable[[str], str]) -> AttemptResult:
        """``env``: podman's own environment: PATH and the container's variables, nothing
        of the worker's (its Kafka credentials, API tokens)."""
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    env=env, start_new_session=True, close_fds=True)
        except OSError as exc:
            return AttemptResult(Outcome.FAILED, 127, f"cannot start podman: {exc}")
        # removing the container kills everything in it; `podman run` then returns
        ended = supervise(proc, ctx, self.limits.output_max_bytes, kill=lambda: self.runner.remove(name),
                          redact=redact)
        code, why = ended.code, ended.why
        if code == 125 and not why:
            ctx.log(LogStream.SYSTEM, "podman could not start the container (is the image loaded on this host?)")
            return AttemptResult(Outcome.FAILED, code, "podman could not start the container (image missing?)")
        return outcome_of(ended, ctx, self.limits.output_max_bytes, "container removed")
