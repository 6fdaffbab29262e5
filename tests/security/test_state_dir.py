"""Issue 24, finding 2: tenants' data was world-readable on disk. Kafka log segments,
Cassandra SSTables, the processor's RocksDB files and the logs under the state directory
were 0644 in 0755 directories (only ``credentials/`` was 0700): as an unprivileged local
user, ``strings`` on a ``gnomon.job-commands`` segment printed job specs.

Without services: the tightening of an existing tree and the umask of every process the
project starts. On the real stack (``integration``): no other user can read a Kafka
segment, and nothing under the services' directories has group or other bits."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from gnomon.infra import perms, procs

NOBODY = 65534


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_tighten_makes_an_existing_tree_private(tmp_path: Path) -> None:
    state = tmp_path / "state"
    (state / "kafka" / "data").mkdir(parents=True)
    segment = state / "kafka" / "data" / "00000000000000000000.log"
    segment.write_text("a job spec")
    for path, mode in ((state, 0o755), (state / "kafka", 0o755), (state / "kafka" / "data", 0o775),
                       (segment, 0o644)):
        path.chmod(mode)
    (state / "lib").symlink_to(tmp_path)  # a symbolic link is not followed (nor its target changed)
    (tmp_path / "outside.txt").write_text("x")
    (tmp_path / "outside.txt").chmod(0o644)
    assert perms.private_state_dir(state) == 4
    assert _mode(state) == 0o711  # traversable, not listable
    assert _mode(state / "kafka") == 0o700 and _mode(state / "kafka" / "data") == 0o700
    assert _mode(segment) == 0o600
    assert _mode(tmp_path / "outside.txt") == 0o644
    assert perms.private_state_dir(state) == 0  # nothing left to do


def test_a_process_the_project_starts_writes_private_files(tmp_path: Path) -> None:
    script = "echo data > f.log; mkdir d; touch d/x; sleep 0"
    pid = procs.start(tmp_path, "umask-probe", ["sh", "-c", script, procs.marker("umask-probe")], cwd=tmp_path)
    os.waitpid(pid, 0)
    assert _mode(tmp_path / "f.log") == 0o600
    assert _mode(tmp_path / "d") == 0o700 and _mode(tmp_path / "d" / "x") == 0o600
    assert _mode(procs.out_file(tmp_path, "umask-probe")) == 0o600  # its log, written by the parent


def test_gnomons_own_services_run_with_a_private_umask(tmp_path: Path) -> None:
    code = ("import os, sys\nsys.argv = ['gnomon', '--help']\nfrom gnomon.cli import main as m\n"
            "try:\n    m.main()\nexcept SystemExit:\n    pass\nprint(oct(os.umask(0)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "0o77"


@pytest.mark.integration
def test_another_local_user_cannot_read_the_stacks_data() -> None:
    from gnomon.config import load
    from gnomon.infra import manager

    settings = load()
    manager.up(settings)
    setpriv = shutil.which("setpriv")
    assert setpriv, "setpriv (util-linux) is needed"
    segments = sorted((settings.state_dir / "kafka").glob("*/node-*/data/gnomon.job-commands-*/*.log"))
    assert segments, "no gnomon.job-commands segment found"
    as_nobody = subprocess.run([setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                                "cat", str(segments[0])], capture_output=True, text=True, check=False)
    assert as_nobody.returncode != 0 and "Permission denied" in as_nobody.stderr, as_nobody
    me = os.geteuid()
    loose = []
    for sub in ("kafka", "cassandra", "logs", "run", "credentials", "processor"):
        for root, dirs, files in os.walk(settings.state_dir / sub):
            for name in (*dirs, *files):
                path = Path(root) / name
                st = os.lstat(path)
                if st.st_uid == me and not stat.S_ISLNK(st.st_mode) and st.st_mode & 0o077:
                    loose.append(f"{path} {oct(stat.S_IMODE(st.st_mode))}")
    assert not loose, f"{len(loose)} readable by others, e.g. {loose[:5]}"
    assert _mode(settings.state_dir) == perms.STATE_DIR_MODE
