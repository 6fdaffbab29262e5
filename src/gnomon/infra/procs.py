"""Detached JVM processes with pid files: start, is_running, stop (all idempotent).

Layout under the state dir: ``run/<name>.pid`` and ``logs/<name>.out`` (stdout+stderr).
Every process is started in its own session (``start_new_session=True``) so it outlives
the Python process that started it and can be signalled as a group. The command line
carries ``-Dgnomon.component=<name>``, so a pid that the OS recycled for an unrelated
process is never mistaken for ours.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from gnomon.infra.errors import InfraError
from gnomon.infra.perms import PRIVATE_UMASK


def marker(name: str) -> str:
    """The JVM system property that tags a process as gnomon's ``name``."""
    return f"-Dgnomon.component={name}"


def pid_file(state_dir: Path, name: str) -> Path:
    return state_dir / "run" / f"{name}.pid"


def out_file(state_dir: Path, name: str) -> Path:
    return state_dir / "logs" / f"{name}.out"


def read_pid(state_dir: Path, name: str) -> int | None:
    try:
        return int(pid_file(state_dir, name).read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def _alive(pid: int, name: str) -> bool:
    """True if ``pid`` is a live (not zombie) process whose command line is ``name``'s."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (FileNotFoundError, ProcessLookupError, IndexError, PermissionError):
        return False
    if state in (b"Z", b"X"):
        _reap(pid)
        return False
    return marker(name).encode() in cmdline


def _reap(pid: int) -> None:
    """Collect a zombie child of this very process (no-op for anyone else's)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def running_pid(state_dir: Path, name: str) -> int | None:
    """Pid of ``name`` if it is running; removes a stale pid file."""
    pid = read_pid(state_dir, name)
    if pid is None:
        return None
    if _alive(pid, name):
        return pid
    pid_file(state_dir, name).unlink(missing_ok=True)
    return None


def is_running(state_dir: Path, name: str) -> bool:
    return running_pid(state_dir, name) is not None


def start(
    state_dir: Path,
    name: str,
    argv: Sequence[str],
    *,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> int:
    """Start ``argv`` detached unless ``name`` already runs; return its pid.

    ``argv`` must contain :func:`marker` (``name``) so the process can be recognised.
    """
    if marker(name) not in argv:
        raise ValueError(f"argv for {name} must contain {marker(name)!r}")
    pid = running_pid(state_dir, name)
    if pid is not None:
        return pid
    out = out_file(state_dir, name)
    out.parent.mkdir(parents=True, exist_ok=True)
    pid_file(state_dir, name).parent.mkdir(parents=True, exist_ok=True)
    with open(os.open(out, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab") as log:
        log.write(f"\n==== {time.strftime('%Y-%m-%dT%H:%M:%S%z')} starting {name}\n".encode())
        log.flush()
        try:
            proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                env=env,
                start_new_session=True,
                close_fds=True,
                umask=PRIVATE_UMASK,  # its data and logs are the tenants': 0600/0700 (perms.py)
            )
        except OSError as exc:
            raise InfraError(f"cannot start {name} ({argv[0]}): {exc}") from exc
    pid_file(state_dir, name).write_text(f"{proc.pid}\n")
    return proc.pid


def member_state(name: str, host: str, pid: int | None, serving: bool) -> dict[str, object]:
    """One node's line of ``infra status``: up (serving its port), starting (its process
    runs, its port is not open yet) or down (no process)."""
    return {"name": name, "host": host, "pid": pid,
            "state": "up" if serving else ("starting" if pid is not None else "down")}


def signal_term(state_dir: Path, name: str) -> None:
    """Send SIGTERM to ``name``'s group without waiting (see :func:`stop`)."""
    pid = running_pid(state_dir, name)
    if pid is not None:
        _signal_group(pid, signal.SIGTERM)


def stop(state_dir: Path, name: str, timeout_s: float = 30.0) -> bool:
    """SIGTERM ``name``'s process group, wait up to ``timeout_s``, then SIGKILL.

    Returns True if something was running. Safe to call when nothing runs.
    """
    pid = running_pid(state_dir, name)
    if pid is None:
        return False
    _signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _alive(pid, name):
            break
        time.sleep(0.2)
    else:
        _signal_group(pid, signal.SIGKILL)
        for _ in range(50):
            if not _alive(pid, name):
                break
            time.sleep(0.1)
    pid_file(state_dir, name).unlink(missing_ok=True)
    return True


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)  # the process leads its own session, so pgid == pid
    except ProcessLookupError:
        pass
    except PermissionError as exc:
        raise InfraError(f"cannot signal process {pid}: {exc}") from exc


def exited(pid: int) -> bool:
    """True once ``pid`` is gone or a zombie (it died)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return True
    if state in (b"Z", b"X"):
        _reap(pid)
        return True
    return False


def tail(path: Path, lines: int = 20) -> str:
    """The last ``lines`` lines of ``path`` ('' if it does not exist)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


def log_excerpt(out: Path, full_log: Path | None = None, lines: int = 20) -> str:
    """Last ``lines`` of the latest run's captured stdout, or of ``full_log`` if that says
    too little (components log WARN+ and JVM crashes to stdout, everything to their log)."""
    text = tail(out, 200)
    latest = (
        text.rsplit("\n==== ", 1)[-1].splitlines()[1:] if "==== " in text else text.splitlines()
    )
    useful = [ln for ln in latest if ln.strip()]
    if len(useful) < 3 and full_log is not None and full_log.exists():
        return f"(from {full_log})\n{tail(full_log, lines)}"
    return f"(from {out})\n" + "\n".join(useful[-lines:])
