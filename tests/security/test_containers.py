"""Container targets on real podman (with Debian's runc), from an image built here.

The image is a busybox rootfs imported with ``podman import``: nothing is pulled from a
registry. CI installs podman, runc and busybox-static (Makefile `sysdeps`).
"""

from __future__ import annotations

import shutil
import subprocess
import tarfile
import threading
from pathlib import Path

import pytest

from gnomon.core.model import Target, TargetType
from gnomon.core.runs import Outcome
from gnomon.worker.attempt import AttemptContext, AttemptResult
from gnomon.worker.container import ContainerExecutor, PodmanRunner
from gnomon.worker.sandbox import MIB, SandboxLimits

IMAGE = "localhost/gnomon-busybox:test"
APPLETS = ("sh", "echo", "cat", "env", "id", "ls", "sleep", "head", "wc", "nc", "wget", "tr", "true", "date")
LIMITS = SandboxLimits(memory_max_bytes=64 * MIB, pids_max=32, output_max_bytes=1 * MIB, tmp_max_bytes=8 * MIB)


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> str:
    busybox = shutil.which("busybox")
    assert busybox, "busybox-static is not installed (make sysdeps)"
    root = tmp_path_factory.mktemp("rootfs")
    (root / "bin").mkdir()
    (root / "tmp").mkdir()
    shutil.copy(busybox, root / "bin" / "busybox")
    for applet in APPLETS:
        (root / "bin" / applet).symlink_to("busybox")
    tar = root.parent / "rootfs.tar"
    with tarfile.open(tar, "w") as tf:
        for item in root.iterdir():
            tf.add(item, arcname=item.name)
    runner = PodmanRunner()
    subprocess.run([*runner.base(), "import", "--change", "ENV PATH=/bin", str(tar), IMAGE],
                   check=True, capture_output=True, timeout=120)
    return IMAGE


class Run:
    def __init__(self, argv: tuple[str, ...], timeout_s: float = 30, image: str = IMAGE) -> None:
        self.lines: list[tuple[str, str]] = []
        self.ctx = AttemptContext("job_c@1", "job_c", "acme", 1, {"k": 1}, timeout_s,
                                  lambda kind, line: self.lines.append((str(kind), line)))
        self.target = Target(TargetType.CONTAINER, image=image, argv=argv)
        self.executor = ContainerExecutor(LIMITS, extra_env=lambda _c: {"GNOMON_SECRET_TOKEN": "granted"})

    def __call__(self) -> AttemptResult:
        return self.executor.execute(self.target, self.ctx)

    def out(self, kind: str = "stdout") -> str:
        return "\n".join(line for k, line in self.lines if k == kind)


def leftovers() -> list[str]:
    out = subprocess.run([*PodmanRunner().base(), "ps", "-a", "--format", "{{.Names}}"],
                         capture_output=True, text=True, check=True)
    return [n for n in out.stdout.split() if n.startswith("gnomon-")]


def test_a_container_runs_as_nobody_with_only_the_runs_variables(image: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GNOMON_API_TOKENS", "canary-token:acme")
    run = Run(("sh", "-c", "id -u; env"))
    assert run().outcome is Outcome.SUCCEEDED, run.lines
    assert run.out().splitlines()[0] == "65534"
    assert "GNOMON_RUN_ID=job_c@1" in run.out() and "GNOMON_SECRET_TOKEN=***" in run.out()  # value redacted in logs
    assert "canary" not in run.out()


def test_no_network_in_a_container(image: str) -> None:
    run = Run(("sh", "-c", "cat /proc/net/dev; wget -q -T 2 -O - http://1.1.1.1/ && echo reached"))
    run()
    interfaces = [line.split(":")[0].strip() for line in run.out().splitlines() if ":" in line]
    assert interfaces == ["lo"]
    assert "reached" not in run.out()


def test_timeout_removes_the_container(image: str) -> None:
    run = Run(("sh", "-c", "sleep 600 & sleep 600"), timeout_s=2)
    result = run()
    assert result.outcome is Outcome.TIMED_OUT
    assert leftovers() == []


def test_cancel_removes_the_container(image: str) -> None:
    run = Run(("sleep", "600"))
    threading.Timer(1.5, run.ctx.request_stop, args=("cancelled: by the test",)).start()
    result = run()
    assert result.outcome is Outcome.FAILED and "cancelled" in (result.error or "")
    assert leftovers() == []


def test_a_fork_bomb_stays_inside_the_pid_limit(image: str) -> None:
    run = Run(("sh", "-c", "f(){ f|f& }; f; sleep 1; echo survived"), timeout_s=10)
    run()
    assert "can't fork" in run.out("stderr").lower() or "resource temporarily unavailable" in run.out("stderr").lower()
    assert leftovers() == []


def test_output_is_capped(image: str) -> None:
    run = Run(("sh", "-c", "head -c 1073741824 /dev/zero"), timeout_s=120)
    result = run()
    assert result.outcome is Outcome.FAILED and "output limit exceeded" in (result.error or "")
    # `podman run` ended by itself once its container was removed (137: the container's
    # SIGKILL), not killed at the kill timeout (-9) while blocked on a pipe nobody read
    assert result.exit_code == 137, result
    assert leftovers() == []


def test_the_root_filesystem_is_read_only(image: str) -> None:
    run = Run(("sh", "-c", "echo x > /bin/evil && echo wrote-root; echo y > /tmp/ok && echo wrote-tmp"))
    run()
    assert "wrote-root" not in run.out() and "wrote-tmp" in run.out()


def test_an_image_that_is_not_loaded_is_a_clear_failure(image: str) -> None:
    run = Run(("true",), image="localhost/not-loaded:1")
    result = run()
    assert result.outcome is Outcome.FAILED
    assert "image missing" in (result.error or "")


def test_secret_values_are_not_on_podmans_command_line(image: str) -> None:
    import os
    from pathlib import Path

    run = Run(("sh", "-c", "sleep 3"))
    found: list[str] = []

    def scan() -> None:
        for _ in range(40):
            for d in Path("/proc").iterdir():
                if d.name.isdigit() and int(d.name) != os.getpid():
                    try:
                        cmd = (d / "cmdline").read_bytes()
                    except OSError:
                        continue
                    if b"granted" in cmd:
                        found.append(cmd.decode(errors="replace"))
            threading.Event().wait(0.05)

    t = threading.Thread(target=scan)
    t.start()
    assert run().outcome is Outcome.SUCCEEDED, run.lines
    t.join()
    assert found == [], found


# ---- a container does not outlive its worker (issue 24, finding 6) ---------------------------
#
# Before: no deadline of the runtime's and nothing tied to the worker's life. After kill -9
# of the worker the container ran on; once the lease lapsed the run was granted again and
# ran twice at once (``overlap: forbid`` did not hold).

_WORKER = """
import sys
sys.path.insert(0, {tests!r})
from gnomon.worker.container import ContainerExecutor, PodmanRunner
from test_containers import LIMITS, Run
run = Run(("sh", "-c", "sleep 120"), timeout_s={timeout_s})
run.executor = ContainerExecutor(LIMITS, runner=PodmanRunner(grace_s={grace_s}, guarded={guarded}))
run()
"""


def _worker_killed_mid_attempt(tmp_path: Path, timeout_s: float, grace_s: int, *, sweep_first: bool = True,
                               guarded: bool = False) -> str:
    """A stand-in worker that starts a container attempt and is killed -9 while the
    container runs (``sweep_first``: after checking that a sweep leaves a live worker's
    container alone; ``guarded``: with the container's guard, else without it, to show
    the other backstops); the container's name."""
    import os
    import signal
    import sys
    import time

    script = tmp_path / "stand_in_worker.py"
    script.write_text(_WORKER.format(tests=str(Path(__file__).parent), timeout_s=timeout_s, grace_s=grace_s,
                                     guarded=guarded))
    proc = subprocess.Popen([sys.executable, str(script)], start_new_session=True)
    name = f"gnomon-{proc.pid}-1"
    deadline = time.monotonic() + 60
    while not PodmanRunner().exists(name):
        assert proc.poll() is None and time.monotonic() < deadline, "the container did not start"
        time.sleep(0.2)
    if sweep_first:
        assert name not in PodmanRunner().sweep_orphans(), "a live worker's container is left alone"
        assert PodmanRunner().exists(name)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)
    return name


def test_a_restarted_worker_removes_its_predecessors_containers(image: str, tmp_path: Path) -> None:
    name = _worker_killed_mid_attempt(tmp_path, timeout_s=60, grace_s=60)
    assert PodmanRunner().exists(name), "killed -9, the worker left its container running"
    assert name in PodmanRunner().sweep_orphans()  # what a worker does at start, before taking work
    assert not PodmanRunner().exists(name)
    assert leftovers() == []


def test_the_runtime_ends_a_container_at_its_deadline_without_the_worker(image: str, tmp_path: Path) -> None:
    import time

    # `podman run --timeout 10`: long enough that the worker is killed before it (each podman
    # call of the test takes 0.5-2 s on a loaded box; with 2 s, CI of 19bbcbe found the
    # container already ended, and removed by the live worker, before the kill)
    name = _worker_killed_mid_attempt(tmp_path, timeout_s=1, grace_s=9, sweep_first=False)
    assert PodmanRunner().exists(name), "the container ended before its worker was killed: nothing shown"
    deadline = time.monotonic() + 40
    while PodmanRunner().exists(name):
        assert time.monotonic() < deadline, "the container outlived its deadline"
        time.sleep(0.5)
    assert leftovers() == []


def test_a_worker_identity_outlives_nothing_but_its_process() -> None:
    """The label a container carries names its worker by boot, pid and start time: a pid
    reused by a later process is not the worker."""
    import os

    from gnomon.worker.container import identity_alive, process_identity

    me = process_identity(os.getpid())
    assert identity_alive(me)
    boot, pid, ticks = me.split(":")
    assert not identity_alive(f"{boot}:{pid}:{int(ticks) + 1}")  # the same pid, a later process
    assert not identity_alive(f"another-boot:{pid}:{ticks}")
    assert not identity_alive(f"{boot}:999999999:1") and not identity_alive("garbage")


# Issue 50, finding 5: killed -9, a worker's container ran on for its whole runtime
# deadline (the attempt's timeout + 10 s: 70 s in the audit, 32 s after the kill when it
# was looked at) while the lease is 30 s, so the run granted again ran beside it. Now a
# guard outside the worker (gnomon.worker.container_guard) removes it as soon as the
# worker's pipe closes, or after one lease without a renewal. Checked against the code
# before: the first test's container was still listed 30 s after the kill (its deadline
# was 130 s away).

LEASE_S = 30.0  # the attempt's lease (AttemptContext.lease_s, the grant's: 30 s by default)


def test_a_killed_workers_container_is_gone_within_the_lease_and_its_next_attempt_starts_after(
        image: str, tmp_path: Path) -> None:
    import time

    name = _worker_killed_mid_attempt(tmp_path, timeout_s=120, grace_s=10, sweep_first=False, guarded=True)
    killed = time.monotonic()
    while PodmanRunner().exists(name):
        assert time.monotonic() - killed < LEASE_S, f"the container outlived its worker's lease ({LEASE_S:g} s)"
        time.sleep(0.2)
    gone_wall_s = time.time()  # at most this late: it was listed until the poll before
    gone_after_s = time.monotonic() - killed
    # the processor grants the run again once its lease lapsed, at the earliest: the next
    # attempt (a worker of its own) starts then, and says when in its own output
    time.sleep(max(0.0, LEASE_S - (time.monotonic() - killed)))
    run = Run(("sh", "-c", "echo started $(date +%s)"), timeout_s=30)
    assert run().outcome.value == "succeeded", run.lines
    started_s = int(run.out().split()[-1])
    assert started_s >= int(gone_wall_s), (started_s, gone_wall_s)
    print(f"container gone {gone_after_s:.1f} s after its worker was killed; next attempt started "
          f"{started_s - gone_wall_s:+.1f} s after that")
    assert leftovers() == []


def test_a_long_attempt_whose_lease_is_renewed_runs_to_its_end(image: str) -> None:
    """The guard cuts nothing short while the worker renews: a 2 s lease renewed every
    0.3 s, a container that runs 4 s."""
    from gnomon.testing import renewing

    run = Run(("sh", "-c", "sleep 4; echo finished"), timeout_s=30)
    run.ctx.lease_s = 2.0
    with renewing(run.ctx.renewed, every_s=0.3):
        result = run()
    assert result.outcome.value == "succeeded" and run.out() == "finished", (result, run.lines)
    assert leftovers() == []


def test_an_attempt_whose_lease_is_not_renewed_is_removed_by_its_guard(image: str) -> None:
    """A worker alive but silent (its loop stuck: no renewal for one lease) loses the
    container too: a 2 s lease never renewed ends a 60 s container within seconds."""
    import time

    run = Run(("sh", "-c", "sleep 60"), timeout_s=60)
    run.ctx.lease_s = 2.0
    started = time.monotonic()
    result = run()
    took_s = time.monotonic() - started
    assert result.outcome.value == "failed", result
    assert took_s < 30, f"ran {took_s:.1f} s: the guard did not act"
    assert leftovers() == []
