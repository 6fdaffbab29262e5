"""One sandbox per attempt, with Debian's bubblewrap (docs/adr/0007-sandboxing.md).

A command attempt runs as::

    sh (joins the attempt's cgroups, as root)  -> prlimit (rlimits)
      -> setpriv (drops to the sandbox uid)   -> bwrap (namespaces)  -> argv

* **User.** The sandbox process is never root: the worker (when it is root) drops to
  ``uid`` (65534, nobody) before bwrap builds an unprivileged user namespace, so host
  files owned by root are out of reach even through a bind, and ``RLIMIT_NPROC`` binds.
  A non-root worker with subordinate ids runs each attempt as a host uid of its own
  (``host_ids``); without them, as its own uid (it says so at start).
* **Namespaces.** ``--unshare-all``: its own pid, ipc, uts, cgroup, user and network
  namespaces. No network unless the policy grants it (then the host's network).
* **Filesystem.** Only ``/usr`` (read-only, with the merged-usr links), a few files of
  ``/etc``, a fresh ``/proc`` and ``/dev``, and a private, size-capped ``/tmp`` and
  ``/dev/shm``: the only writable places, with or without cgroups (the root, ``/etc`` and
  ``/dev`` are remounted read-only once built). The worker's working directory,
  ``.gnomon/``, ``/root`` and ``/home`` are not there.
* **Environment.** Cleared; the run's own variables plus the job's secrets are set.
* **Limits.** rlimits always (processes, CPU seconds, file size, open files, address
  space when there are no cgroups); when the worker is root, cgroup v1 ``pids``,
  ``memory`` and ``cpu`` groups per attempt (pids is the fork-bomb defence).
* **Kill.** bwrap is the pid namespace's parent: SIGKILL to it tears the namespace down,
  so a child that called ``setsid`` dies too. The cgroups are swept as well.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from gnomon.core.errors import InfraError
from gnomon.worker import host_ids
from gnomon.worker.host_ids import AttemptIds

log = logging.getLogger("gnomon.worker")

MIB = 1024 * 1024
SANDBOX_UID = 65534
CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_PARENT = "gnomon"
REMOVE_ATTEMPTS_MAX = 20  # rmdir of an attempt cgroup still EBUSY just after its last task exited
REMOVE_PAUSE_S = 0.01
PATH_IN_SANDBOX = "/usr/local/bin:/usr/bin:/bin"
# host files a program expects to find; none of them holds a secret
_ETC_FILES = ("passwd", "group", "nsswitch.conf", "ld.so.cache", "localtime", "alternatives", "mime.types")
_ETC_NET_FILES = ("hosts", "resolv.conf", "ssl", "ca-certificates", "gai.conf", "services", "protocols")
_JOIN_CGROUPS = 'for f in $GNOMON_CGROUP_PROCS; do echo $$ > "$f" || exit 125; done; exec "$@"'


class SandboxError(InfraError):
    """The sandbox cannot be built on this host (bwrap missing, cgroups unusable)."""


@dataclass(frozen=True)
class SandboxLimits:
    memory_max_bytes: int = 512 * MIB
    pids_max: int = 64  # per attempt: the cgroup pids.max (root workers)
    # RLIMIT_NPROC: counted per uid over every sandbox of the host (and kernel-side it
    # lags the processes' exit), so it is the coarse second bound, not the per-attempt one
    uid_processes_max: int = 1024
    cpu_time_max_s: int = 3600
    cpu_cores_max: float = 1.0
    output_max_bytes: int = 8 * MIB  # stdout + stderr together; past it the attempt is killed
    file_size_max_bytes: int = 256 * MIB
    tmp_max_bytes: int = 64 * MIB
    open_files_max: int = 256

    def __post_init__(self) -> None:
        assert self.memory_max_bytes >= 8 * MIB, "memory_max_bytes below 8 MiB cannot start a shell"
        assert 4 <= self.pids_max <= 65536 and self.uid_processes_max >= self.pids_max
        assert self.cpu_time_max_s >= 1 and self.cpu_cores_max > 0
        assert self.output_max_bytes >= 1024 and self.tmp_max_bytes >= MIB
        assert self.open_files_max >= 16 and self.file_size_max_bytes >= MIB


@dataclass(frozen=True)
class SandboxRequest:
    """One attempt's sandbox: what runs, with which variables, and what it may use."""

    name: str  # unique per attempt on this host: names its cgroups
    argv: Sequence[str]
    env: Mapping[str, str]
    limits: SandboxLimits
    network: bool = False


class Cgroups:
    """The attempt's cgroup v1 groups (pids, memory, cpu) under ``/sys/fs/cgroup/<ctl>/gnomon``.

    Only a root worker can make them; ``create`` returns None otherwise and the sandbox
    falls back to rlimits alone.
    """

    CONTROLLERS = ("pids", "memory", "cpu")

    def __init__(self, dirs: dict[str, Path]) -> None:
        self.dirs = dirs

    @classmethod
    def usable(cls) -> bool:
        return os.geteuid() == 0 and all(
            (CGROUP_ROOT / c / "cgroup.procs").exists() and os.access(CGROUP_ROOT / c, os.W_OK)
            for c in cls.CONTROLLERS)

    @classmethod
    def create(cls, name: str, limits: SandboxLimits) -> Cgroups | None:
        if not cls.usable():
            return None
        dirs: dict[str, Path] = {}
        try:
            for ctl in cls.CONTROLLERS:
                d = CGROUP_ROOT / ctl / CGROUP_PARENT / name
                d.parent.mkdir(parents=True, exist_ok=True)
                d.mkdir()  # never reuse one: a stale group keeps its old counters
                dirs[ctl] = d
            (dirs["pids"] / "pids.max").write_text(str(limits.pids_max))
            (dirs["memory"] / "memory.limit_in_bytes").write_text(str(limits.memory_max_bytes))
            with contextlib.suppress(OSError):  # no swap accounting on some kernels
                (dirs["memory"] / "memory.memsw.limit_in_bytes").write_text(str(limits.memory_max_bytes))
            period_us = int((dirs["cpu"] / "cpu.cfs_period_us").read_text())
            (dirs["cpu"] / "cpu.cfs_quota_us").write_text(str(int(period_us * limits.cpu_cores_max)))
        except OSError as exc:
            Cgroups(dirs).remove()
            raise SandboxError(f"cannot set up cgroups for {name}: {exc}") from exc
        return cls(dirs)

    @property
    def procs_files(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in self.dirs.values()]

    def pids(self) -> set[int]:
        found: set[int] = set()
        for d in self.dirs.values():
            with contextlib.suppress(OSError, ValueError):
                found.update(int(x) for x in (d / "cgroup.procs").read_text().split())
        return found

    def kill_all(self, wait_s: float = 5.0) -> bool:
        """SIGKILL every process left in the groups; True once they are empty. Each is
        stopped (SIGSTOP) before any is killed: killed one by one, a child could die first
        and its shell run its next command (``sleep 60; echo after``) before its own turn."""
        deadline = time.monotonic() + wait_s
        while True:
            left = sorted(self.pids())
            if not left:
                return True
            if time.monotonic() >= deadline:
                return False
            for sig in (signal.SIGSTOP, signal.SIGKILL):
                for pid in left:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, sig)
            time.sleep(0.01)

    def peak_pids(self) -> int:
        try:
            return int((self.dirs["pids"] / "pids.peak").read_text())
        except (OSError, ValueError, KeyError):
            return -1

    def remove(self, attempts_max: int = REMOVE_ATTEMPTS_MAX, pause_s: float = REMOVE_PAUSE_S,
               sleep: Callable[[float], None] = time.sleep) -> None:
        """Remove the attempt's groups. Just after its last task exits a group can still
        answer EBUSY for a moment (the kernel frees it asynchronously), so each rmdir is
        tried ``attempts_max`` times, ``pause_s`` apart; one still busy is left to the
        next worker start (``sweep_stale``)."""
        for d in self.dirs.values():
            for attempt in range(attempts_max):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY or attempt == attempts_max - 1:
                        log.warning("cannot remove cgroup %s: %s", d, exc.strerror)
                        break
                    sleep(pause_s)

    @classmethod
    def sweep_stale(cls) -> int:
        """Kill and remove the attempt groups of workers that are gone (a kill -9 leaves
        them behind). Groups are named ``<worker pid>-…``; a live pid's are left alone."""
        if not cls.usable():
            return 0
        removed = 0
        for ctl in cls.CONTROLLERS:
            parent = CGROUP_ROOT / ctl / CGROUP_PARENT
            for d in parent.iterdir() if parent.is_dir() else ():
                pid = d.name.split("-", 1)[0]
                if not d.is_dir() or not pid.isdigit() or _alive(int(pid)):
                    continue
                group = cls({ctl: d})
                group.kill_all(wait_s=1.0)
                with contextlib.suppress(OSError):
                    d.rmdir()
                    removed += 1
        return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class BwrapSandbox:
    """Builds the argv that runs one attempt in bubblewrap (see the module docstring)."""

    def __init__(self, uid: int = SANDBOX_UID, bwrap: str | None = None,
                 ids: AttemptIds | Literal["detect"] | None = "detect") -> None:
        """``ids``: the per-attempt host ids of a non-root worker (``host_ids``; by default
        detected once per process; None: the worker's own uid)."""
        self.uid = uid
        self.bwrap = bwrap or shutil.which("bwrap") or ""
        if ids == "detect":
            ids = host_ids.shared()[0] if os.geteuid() != 0 else None
        self.ids: AttemptIds | None = ids

    def check(self) -> None:
        """Raise SandboxError with the fix when this host cannot run sandboxes."""
        if not self.bwrap:
            raise SandboxError("bubblewrap (bwrap) is not installed; command targets need it: "
                               "apt-get install bubblewrap")
        for tool in ("prlimit", "setpriv"):
            if shutil.which(tool) is None:
                raise SandboxError(f"{tool} (util-linux) is not installed; the sandbox needs it")

    def argv(self, req: SandboxRequest, cgroups: Cgroups | None, env_fd: int,
             seccomp_fd: int | None = None, attempt_id: int | None = None) -> tuple[list[str], dict[str, str]]:
        """The full argv and the (tiny) environment of the launcher process.

        The sandbox's variables (payload, secrets) are not in the argv, which any local
        user can read in /proc/<pid>/cmdline: bwrap reads them from ``env_fd``
        (``--args``), where the caller writes ``env_args(req)``. ``seccomp_fd``: where
        bwrap reads the seccomp filter (``gnomon.worker.seccomp``) it loads before the
        command runs. ``attempt_id``: the attempt's id of ``self.ids`` (a non-root worker
        with subordinate ids): the sandbox runs as that id's host uid."""
        lim = req.limits
        rlimits = [f"--nproc={lim.uid_processes_max}", f"--cpu={lim.cpu_time_max_s}",
                   f"--fsize={lim.file_size_max_bytes}", f"--nofile={lim.open_files_max}", "--core=0"]
        if cgroups is None:  # no memory cgroup: bound the address space instead
            rlimits.append(f"--as={lim.memory_max_bytes}")
        drop: list[str] = []
        if os.geteuid() == 0:
            drop = ["setpriv", f"--reuid={self.uid}", f"--regid={self.uid}", "--clear-groups",
                    "--inh-caps=-all", "--bounding-set=-all", "--"]
        elif self.ids is not None:
            if attempt_id is None:
                raise SandboxError("no per-attempt host id was given for this attempt")
            drop = self.ids.prefix(attempt_id)
        launcher_env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
                        "GNOMON_CGROUP_PROCS": " ".join(cgroups.procs_files) if cgroups else ""}
        seccomp = ["--seccomp", str(seccomp_fd)] if seccomp_fd is not None else []
        full = ["/bin/sh", "-c", _JOIN_CGROUPS, "gnomon-sandbox", "prlimit", *rlimits, "--",
                *drop, *self._bwrap_args(req), *seccomp, "--args", str(env_fd), "--", *req.argv]
        return full, launcher_env

    def _bwrap_args(self, req: SandboxRequest) -> list[str]:
        args = [self.bwrap, "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session", "--disable-userns",
                "--uid", str(self.uid), "--gid", str(self.uid), "--hostname", "gnomon-sandbox",
                "--ro-bind", "/usr", "/usr",
                "--symlink", "usr/bin", "/bin", "--symlink", "usr/sbin", "/sbin",
                "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
                "--proc", "/proc", "--dev", "/dev",
                "--size", str(req.limits.tmp_max_bytes), "--tmpfs", "/dev/shm",
                "--size", str(req.limits.tmp_max_bytes), "--tmpfs", "/tmp",
                "--dir", "/etc", "--chdir", "/tmp", "--clearenv"]
        etc = _ETC_FILES + (_ETC_NET_FILES if req.network else ())
        for name in etc:
            args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
        if req.network:
            args.append("--share-net")
        # read-only once built: the root (bwrap's own tmpfs, /etc on it) and /dev's tmpfs
        # were writable and uncapped, a way past the /tmp cap and, without a memory cgroup,
        # the memory limit; only the size-capped /tmp and /dev/shm stay writable
        args += ["--remount-ro", "/dev", "--remount-ro", "/"]
        return args

    @staticmethod
    def env_args(req: SandboxRequest) -> bytes:
        """``--setenv KEY VALUE`` for each variable, NUL-separated, for bwrap's ``--args FD``."""
        parts: list[str] = []
        for key, value in req.env.items():
            if "\x00" in key or "\x00" in value:
                raise SandboxError(f"variable {key!r} contains a NUL character")
            parts += ["--setenv", key, value]
        return b"".join(p.encode() + b"\x00" for p in parts)


def kill_tree(pid: int, cgroups: Cgroups | None) -> None:
    """Kill the sandbox: bwrap first (its pid namespace dies with it), then the cgroups."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)
    if cgroups is not None:
        cgroups.kill_all()


def base_env(run_id: str, job_id: str, tenant: str, attempt: int, payload_json: str) -> dict[str, str]:
    """The variables every sandboxed attempt gets; nothing of the worker's own."""
    return {
        "PATH": PATH_IN_SANDBOX,
        "HOME": "/tmp",
        "TMPDIR": "/tmp",
        "LANG": "C.UTF-8",
        "GNOMON_RUN_ID": run_id,
        "GNOMON_JOB_ID": job_id,
        "GNOMON_TENANT": tenant,
        "GNOMON_ATTEMPT": str(attempt),
        "GNOMON_PAYLOAD": payload_json,
    }
