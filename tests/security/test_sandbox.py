"""Sandbox escapes, tried for real: every command runs in bubblewrap on this host.

Each test runs the worker's command executor (the code a worker runs per attempt) with a
hostile argv and checks, from outside, what the command could reach and what is left
afterwards. CI installs bubblewrap (Makefile `sysdeps`); without it these tests fail.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from gnomon.config import REPO_ROOT
from gnomon.core.model import Target, TargetType
from gnomon.core.runs import Outcome
from gnomon.testing import renewing
from gnomon.worker.attempt import AttemptContext, AttemptResult
from gnomon.worker.command import SandboxedCommandExecutor
from gnomon.worker.sandbox import CGROUP_PARENT, CGROUP_ROOT, MIB, Cgroups, SandboxLimits

LIMITS = SandboxLimits(memory_max_bytes=64 * MIB, pids_max=32, output_max_bytes=1 * MIB, tmp_max_bytes=8 * MIB)


class Run:
    def __init__(self, argv: list[str], timeout_s: float = 10, limits: SandboxLimits = LIMITS,
                 network: bool = False, env: dict[str, str] | None = None) -> None:
        self.lines: list[tuple[str, str]] = []
        self.ctx = AttemptContext("job_x@2026-12-01T00:00:00Z", "job_x", "acme", 1, {"k": "v"}, timeout_s,
                                  lambda kind, line: self.lines.append((str(kind), line)))
        self.executor = SandboxedCommandExecutor(limits, network, extra_env=(lambda _ctx: env or {}))
        self.argv = argv

    def __call__(self) -> AttemptResult:
        return self.executor.execute(Target(TargetType.COMMAND, argv=tuple(self.argv)), self.ctx)

    def out(self, kind: str = "stdout") -> str:
        return "\n".join(line for k, line in self.lines if k == kind)


def procs_with(marker: str) -> list[int]:
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                if marker.encode() in (d / "cmdline").read_bytes():
                    found.append(int(d.name))
            except OSError:
                pass
    return found


def wait_until(pred: Any, timeout_s: float = 10) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


def test_the_command_runs_as_nobody_not_root() -> None:
    run = Run(["sh", "-c", "id -u; id -g"])
    assert run().outcome is Outcome.SUCCEEDED
    assert run.out().split() == ["65534", "65534"]


def test_a_setsid_child_dies_with_the_sandbox_at_timeout() -> None:
    marker = f"gnomon-escape-{os.getpid()}-setsid"
    run = Run(["sh", "-c", f"setsid sh -c 'while :; do sleep 1; done; : {marker}' & sleep 600"], timeout_s=1)
    result = run()
    assert result.outcome is Outcome.TIMED_OUT
    assert wait_until(lambda: not procs_with(marker), 5), f"a setsid child survived: {procs_with(marker)}"


def test_a_setsid_child_dies_when_the_command_exits() -> None:
    marker = f"gnomon-escape-{os.getpid()}-daemon"
    run = Run(["sh", "-c", f"setsid sh -c 'while :; do sleep 1; done; : {marker}' & sleep 0.5; echo bye"])
    assert run().outcome is Outcome.SUCCEEDED
    assert wait_until(lambda: not procs_with(marker), 5), f"a daemonised child survived: {procs_with(marker)}"


def test_cancel_kills_the_whole_sandbox() -> None:
    marker = f"gnomon-escape-{os.getpid()}-cancel"
    run = Run(["sh", "-c", f"sh -c 'sleep 600; : {marker}' & sh -c 'sleep 600; : {marker}'"], timeout_s=60)
    threading.Timer(0.5, run.ctx.request_stop, args=("cancelled: by the test",)).start()
    result = run()
    assert result.outcome is Outcome.FAILED and "cancelled" in (result.error or "")
    assert wait_until(lambda: not procs_with(marker), 5)


def test_a_cancelled_shell_never_runs_its_next_command() -> None:
    """Killed one by one, the sandbox's processes could let ``sleep`` die before its shell,
    which then ran ``echo after`` before its own turn (seen in the e2e cancel test): every
    process is stopped before any is killed."""
    leaked = []
    for i in range(12):
        run = Run(["sh", "-c", f"echo started; sleep 60; echo after-{i}"], timeout_s=60)
        timer = threading.Timer(0.3, run.ctx.request_stop, args=("cancelled: by the test",))
        timer.start()
        result = run()
        timer.join()
        assert result.outcome is Outcome.FAILED and "cancelled" in (result.error or ""), result
        assert "started" in run.out(), run.lines
        if "after-" in run.out():
            leaked.append(i)
    assert leaked == [], f"the shell ran past its killed child in rounds {leaked}"


def test_the_worker_environment_does_not_leak(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GNOMON_API_TOKENS", "canary-token-123:acme")
    monkeypatch.setenv("GNOMON_KAFKA_PASSWORD", "canary-kafka-456")
    run = Run(["sh", "-c", "env"], env={"GNOMON_SECRET_DB_PASSWORD": "granted"})
    assert run().outcome is Outcome.SUCCEEDED
    env = dict(line.split("=", 1) for line in run.out().splitlines() if "=" in line)
    assert "canary" not in run.out()
    assert env["GNOMON_RUN_ID"] == "job_x@2026-12-01T00:00:00Z" and env["GNOMON_TENANT"] == "acme"
    assert env["GNOMON_SECRET_DB_PASSWORD"] == "***"  # what the job declared (its value redacted in the log)
    assert set(env) <= {"PATH", "HOME", "TMPDIR", "LANG", "PWD", "SHLVL", "_", "OLDPWD", "GNOMON_RUN_ID",
                        "GNOMON_JOB_ID", "GNOMON_TENANT", "GNOMON_ATTEMPT", "GNOMON_PAYLOAD",
                        "GNOMON_SECRET_DB_PASSWORD"}


def test_the_state_dir_the_repo_and_homes_are_not_there(tmp_path: Path) -> None:
    state = REPO_ROOT / ".gnomon"
    state.mkdir(exist_ok=True)
    canary = state / f"security-canary-{os.getpid()}"
    canary.write_text("canary-secret-789\n")
    canary.chmod(0o600)
    try:
        run = Run(["sh", "-c", f"cat {canary}; cat {REPO_ROOT}/.gnomon/dev-token; ls /root /home /work; "
                               f"cat /proc/1/environ; cat /etc/shadow; echo ---; ls /"])
        run()
    finally:
        canary.unlink()
    assert "canary-secret-789" not in run.out() + run.out("stderr")
    assert "No such file" in run.out("stderr")
    assert set(run.out().split("---")[-1].split()) == {"bin", "dev", "etc", "lib", "lib64", "proc", "sbin", "tmp", "usr"}


def test_no_network_egress() -> None:
    seen: list[object] = []
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(5)
    server.settimeout(0.2)
    port = server.getsockname()[1]

    def accept() -> None:
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            try:
                seen.append(server.accept())
            except TimeoutError:
                continue

    t = threading.Thread(target=accept)
    t.start()
    run = Run(["bash", "-c", f"echo hi > /dev/tcp/127.0.0.1/{port} && echo connected-local; "
                             "echo hi > /dev/tcp/1.1.1.1/53 && echo connected-out; cat /proc/net/dev"])
    run()
    t.join()
    server.close()
    assert seen == [], "the sandbox reached a host port"
    assert "connected" not in run.out()
    interfaces = [line.split(":")[0].strip() for line in run.out().splitlines() if ":" in line]
    assert interfaces == ["lo"], interfaces


def test_a_fork_bomb_hits_the_process_limit_and_leaves_nothing() -> None:
    marker = f"gnomon-escape-{os.getpid()}-bomb"
    run = Run(["sh", "-c", f"f(){{ f|f& }}; f; sleep 1; echo survived; : {marker}"], timeout_s=5)
    run()
    assert "Cannot fork" in run.out("stderr") or "Resource temporarily unavailable" in run.out("stderr")
    if Cgroups.usable():
        peak = next(line for k, line in run.lines if line.startswith("peak processes"))
        assert 0 < int(peak.split()[2]) <= LIMITS.pids_max, peak
    assert wait_until(lambda: not procs_with(marker), 5)
    # and the host can still start processes
    assert subprocess.run(["true"], check=False).returncode == 0


def test_a_gigabyte_of_output_is_cut_at_the_limit() -> None:
    run = Run(["sh", "-c", "head -c 1073741824 /dev/zero; echo not-reached"], timeout_s=120)
    result = run()
    assert result.outcome is Outcome.FAILED and "output limit exceeded" in (result.error or "")
    logged = sum(len(line) for k, line in run.lines if k != "system")
    assert logged <= LIMITS.output_max_bytes
    assert "not-reached" not in run.out()


def test_memory_is_capped() -> None:
    # 200 MB in a shell variable, against a 64 MiB limit
    run = Run(["sh", "-c", "x=$(head -c 200000000 /dev/zero | tr '\\0' a); echo ${#x}"], timeout_s=60)
    result = run()
    assert result.outcome is Outcome.FAILED
    assert "200000000" not in run.out()


def test_tmp_is_private_and_capped(tmp_path: Path) -> None:
    (Path("/tmp") / f"gnomon-host-file-{os.getpid()}").write_text("host")
    try:
        run = Run(["sh", "-c", "ls /tmp; head -c 20000000 /dev/zero > /tmp/big; echo rc=$?"])
        run()
    finally:
        (Path("/tmp") / f"gnomon-host-file-{os.getpid()}").unlink()
    assert "gnomon-host-file" not in run.out()
    assert "rc=0" not in run.out(), "wrote 20 MB into an 8 MiB /tmp"


def test_killing_the_worker_kills_its_sandboxes(tmp_path: Path) -> None:
    """kill -9 of the worker process: bwrap dies with its parent, and its namespace with it."""
    marker = f"gnomon-escape-{os.getpid()}-orphan"
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent(f"""
        from gnomon.core.model import Target, TargetType
        from gnomon.worker.attempt import AttemptContext
        from gnomon.worker.command import SandboxedCommandExecutor
        ctx = AttemptContext("r", "j", "acme", 1, None, 600, lambda k, line: print(line, flush=True))
        SandboxedCommandExecutor().execute(Target(TargetType.COMMAND, argv=(
            "sh", "-c", "setsid sh -c 'while :; do sleep 1; done; : {marker}' & echo started; sleep 600")), ctx)
    """))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "started"
    assert wait_until(lambda: bool(procs_with(marker)), 5)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert wait_until(lambda: not procs_with(marker), 10), f"sandbox outlived its worker: {procs_with(marker)}"
    if Cgroups.usable():  # its cgroups stayed behind (nobody ran the cleanup); the next worker sweeps them
        left = [d for c in Cgroups.CONTROLLERS for d in (CGROUP_ROOT / c / CGROUP_PARENT).glob(f"{proc.pid}-*")]
        assert left, "the killed worker's attempt cgroups"
        Cgroups.sweep_stale()
        assert not [d for d in left if d.exists()]


# Issue 50: a worker alive but cut off from Kafka (its heartbeats never acknowledged) kept
# its sandboxed command running past the lease, while the processor granted the run again:
# two copies at once. Now the attempt is killed once no renewal came for one lease.
# Checked against the code before: the unrenewed 60 s command ran to its 20 s timeout.


def test_a_command_whose_lease_is_not_renewed_is_killed_at_the_lease() -> None:
    marker = f"gnomon-lease-{os.getpid()}"
    run = Run(["sh", "-c", f"echo started; sleep 60; : {marker}"], timeout_s=20)
    run.ctx.lease_s = 2.0
    started = time.monotonic()
    result = run()
    took_s = time.monotonic() - started
    assert result.outcome is Outcome.FAILED and "lease lapsed" in (result.error or ""), result
    assert took_s < 10, f"ran {took_s:.1f} s past a 2 s lease"
    assert "started" in run.out() and any("lease lapsed" in line for k, line in run.lines if k == "system")
    assert not procs_with(marker)


def test_a_command_whose_lease_is_renewed_runs_to_its_end() -> None:
    run = Run(["sh", "-c", "sleep 4; echo finished"], timeout_s=20)
    run.ctx.lease_s = 2.0
    with renewing(run.ctx.renewed, every_s=0.3):
        result = run()
    assert result.outcome is Outcome.SUCCEEDED and run.out() == "finished", (result, run.lines)
    assert run.ctx.renewals == []  # the attempt's listener is gone with it


def test_secrets_and_payload_are_not_on_any_command_line() -> None:
    """Any local user can read /proc/<pid>/cmdline: the sandbox's variables go through a pipe."""
    value = f"cmdline-canary-{os.getpid()}"
    run = Run(["sh", "-c", "sleep 2"], env={"GNOMON_SECRET_X": value})
    run.ctx.payload = {"secret-payload": value}
    seen: list[int] = []
    t = threading.Thread(target=run)
    t.start()
    assert wait_until(lambda: bool(procs_with("sleep 2")), 5)
    seen = procs_with(value)
    t.join()
    assert seen == [], "a secret value is visible in a process's command line"


def test_dev_shm_is_capped_like_tmp() -> None:
    run = Run(["sh", "-c", "head -c 20000000 /dev/zero > /dev/shm/big; echo rc=$?; touch /dev/evil; echo dev=$?"])
    run()
    assert "rc=0" not in run.out(), "wrote 20 MB into /dev/shm past the 8 MiB cap"


@pytest.mark.parametrize("cgroups", [True, False], ids=["with-cgroups", "without-cgroups"])
def test_only_the_capped_tmp_and_dev_shm_are_writable(cgroups: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 24, finding 3: the sandbox's ``/``, ``/etc`` and ``/dev`` were writable tmpfs
    without a size cap. Without cgroups (a non-root worker, a cgroup-v2-only host) a command
    with a 64 MiB memory limit and an 8 MiB ``/tmp`` wrote two 256 MiB files there and
    succeeded; with cgroups 40 MB went past the ``/tmp`` cap first."""
    if not cgroups:
        monkeypatch.setattr(Cgroups, "usable", classmethod(lambda cls: False))
    script = ("for f in /evil /etc/evil /dev/evil /usr/evil /proc/evil; do echo x > $f 2>/dev/null; "
              "echo \"$f rc=$?\"; done; "
              "head -c 20000000 /dev/zero > /tmp/big 2>/dev/null; echo \"tmp-big rc=$?\"; rm -f /tmp/big; "
              "head -c 20000000 /dev/zero > /dev/shm/big 2>/dev/null; echo \"shm-big rc=$?\"; rm -f /dev/shm/big; "
              "echo ok > /tmp/small && echo tmp-small=ok; echo ok > /dev/shm/small && echo shm-small=ok")
    run = Run(["sh", "-c", script], timeout_s=30)
    result = run()
    out = run.out()
    assert result.outcome is Outcome.SUCCEEDED, (result, run.lines)
    for path in ("/evil", "/etc/evil", "/dev/evil", "/usr/evil", "/proc/evil"):
        assert f"{path} rc=" in out and f"{path} rc=0" not in out, f"{path} is writable:\n{out}"
    assert "tmp-big rc=0" not in out and "shm-big rc=0" not in out, out  # past the 8 MiB caps
    assert "tmp-small=ok" in out and "shm-small=ok" in out, out


_SYSCALLS = r"""
import ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
for name, nr, args in [("io_uring_setup", 425, (1, 0)), ("keyctl", 250, (0, -3, 0)), ("add_key", 248, (0, 0, 0, 0, 0)),
                       ("bpf", 321, (0, 0, 0)), ("perf_event_open", 298, (0, 0, -1, -1, 0)), ("userfaultfd", 323, (0,)),
                       ("mount", 165, (0, 0, 0, 0, 0)), ("ptrace", 101, (0, 0, 0, 0)), ("unshare", 272, (0,)),
                       ("getpid", 39, ()), ("uname", 63, (ctypes.create_string_buffer(512),))]:
    ctypes.set_errno(0)
    rc = libc.syscall(nr, *args)
    print(name, rc, errno.errorcode.get(ctypes.get_errno(), "-"))
"""


def test_the_seccomp_filter_refuses_the_kernels_riskiest_calls() -> None:
    """Issue 24, finding 9: no seccomp filter in the sandbox (``Seccomp: 0``;
    ``io_uring_setup`` and ``keyctl`` reachable)."""
    import re

    from gnomon.worker import seccomp

    run = Run(["/usr/bin/python3", "-c", _SYSCALLS], timeout_s=30)
    run2 = Run(["sh", "-c", "grep -E '^Seccomp:' /proc/self/status"])
    assert run().outcome is Outcome.SUCCEEDED, run.lines
    run2()
    assert re.search(r"Seccomp:\s+2", run2.out()), run2.out()  # filter mode
    seen = dict((line.split()[0], line.split()[1:]) for line in run.out().splitlines())
    for name in ("io_uring_setup", "keyctl", "add_key", "bpf", "perf_event_open", "userfaultfd", "mount", "ptrace",
                 "unshare"):
        assert seen[name] == ["-1", "EPERM"], (name, seen[name])
    assert int(seen["getpid"][0]) > 0 and seen["uname"][0] == "0", seen  # the rest is allowed
    # the filter's numbers are the kernel's (where this host has the headers)
    header = Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h")
    if header.exists():
        nrs = {m.group(1): int(m.group(2)) for m in re.finditer(r"#define __NR_(\w+) (\d+)", header.read_text())}
        assert {k: nrs.get(k) for k in seccomp.DENIED["x86_64"]} == seccomp.DENIED["x86_64"]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""  # gone meanwhile


def _host_uid(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])  # the real uid, as the host sees it
    raise AssertionError(f"no Uid line for {pid}")


def test_each_attempt_runs_as_a_host_uid_that_is_not_the_workers() -> None:
    """Finding 8: on a non-root worker the sandbox was the worker's own uid on the host,
    with the worker's Kafka credential and every tenant's secret files. Two attempts at
    once, seen from the host: a root worker runs both as nobody; a non-root worker with
    subordinate ids runs each as an id of its own from its range, never its own uid.
    (CI runs this suite again as a non-root user with a range: GNOMON_EXPECT_SUBUIDS=1.)"""
    from gnomon.worker import host_ids

    tag = f"uidprobe{os.getpid()}x{time.monotonic_ns()}"
    runs = [Run(["sh", "-c", "sleep 4; true", f"{tag}-{i}"]) for i in range(2)]
    threads = [threading.Thread(target=run) for run in runs]
    for t in threads:
        t.start()
    try:
        # the command itself: its shell (the launcher's stages before bwrap carry the tag too)
        shells = [lambda i=i: [p for p in procs_with(f"{tag}-{i}") if _cmdline(p).startswith(b"sh\0-c\0sleep 4")]
                  for i in range(2)]
        assert wait_until(lambda: all(s() for s in shells), 10), "the attempts did not start"
        uids = [_host_uid(s()[0]) for s in shells]
    finally:
        for t in threads:
            t.join(15)
    if os.geteuid() == 0:
        assert uids == [65534, 65534]
        return
    ids, why_not = host_ids.shared()
    if ids is None:
        assert not os.environ.get("GNOMON_EXPECT_SUBUIDS"), f"this user was given subordinate ids: {why_not}"
        assert uids == [os.geteuid()] * 2  # the documented gap: the worker warns at start
        return
    assert uids[0] != uids[1], uids
    assert os.geteuid() not in uids
    assert all(ids.uids.start <= u < ids.uids.start + ids.count for u in uids), (uids, ids)
