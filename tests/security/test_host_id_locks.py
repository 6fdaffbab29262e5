"""Issue 50, finding 6: a non-root worker with subordinate ids locks the per-attempt host
uids it hands out in a directory named after its uid in the shared temp directory. Any
local user could create that directory first; the worker then found it "belongs to another
user" and fell back to running every command as its own uid, with a warning only. The
lock directory now lives where only the worker's user can create it (its private runtime
directory, else gnomon's private state directory), and is trusted only as a real
directory of that user's with no access for anyone else."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from gnomon.worker import host_ids

WORKER_UID = 4242


def _as_worker(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *, made: bool = True) -> Path:
    """This process looks like a non-root worker (uid 4242) with a subordinate range, on a
    host whose tools work; its state directory is ``tmp_path/state`` (the worker's own),
    with the lock directory the worker makes there when ``made`` (this process is root:
    what it makes is root's, so the test makes it the worker's)."""
    ranges = tmp_path / "subids"
    ranges.write_text(f"{WORKER_UID}:400000:65536\n")
    monkeypatch.setattr(host_ids, "SUBUID_FILE", ranges)
    monkeypatch.setattr(host_ids, "SUBGID_FILE", ranges)
    monkeypatch.setattr(host_ids.shutil, "which", lambda tool: f"/usr/bin/{tool}")
    monkeypatch.setattr(host_ids.subprocess, "run",
                        lambda argv, **_: subprocess.CompletedProcess(argv, 0, b"", b""))
    monkeypatch.setattr(os, "geteuid", lambda: WORKER_UID)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    if os.getuid() == 0:
        os.chown(state, WORKER_UID, WORKER_UID)
    monkeypatch.setenv("GNOMON_STATE_DIR", str(state))
    if made and os.getuid() == 0:
        (state / "host-ids").mkdir(mode=0o700)
        os.chown(state / "host-ids", WORKER_UID, WORKER_UID)
    return state


def test_the_lock_directory_is_not_in_the_shared_temp_directory(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:
    state = _as_worker(monkeypatch, tmp_path)
    locks = host_ids.lock_dir()
    assert locks.parent != Path(tempfile.gettempdir()), locks
    assert state in locks.parents, locks


@pytest.mark.skipif(os.getuid() != 0, reason="makes a directory owned by another uid (CI runs as root)")
def test_a_directory_another_user_made_first_does_not_switch_off_attempt_uids(monkeypatch: pytest.MonkeyPatch,
                                                                               tmp_path: Path) -> None:
    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    monkeypatch.setattr(tempfile, "tempdir", str(shared))
    (shared / f"gnomon-host-ids-{WORKER_UID}").mkdir()  # the squatter's, made first (owned by root here)
    _as_worker(monkeypatch, tmp_path)
    ids, why_not = host_ids.AttemptIds.detect()
    assert ids is not None, why_not  # before: None, ".../gnomon-host-ids-4242 belongs to another user"
    assert ids.locks is not None and shared not in ids.locks.parents


@pytest.mark.skipif(os.getuid() != 0, reason="makes a directory owned by another uid (CI runs as root)")
def test_a_lock_directory_that_is_a_link_or_open_to_others_is_not_trusted(monkeypatch: pytest.MonkeyPatch,
                                                                          tmp_path: Path) -> None:
    state = _as_worker(monkeypatch, tmp_path, made=False)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    os.chown(elsewhere, WORKER_UID, WORKER_UID)
    link = host_ids.lock_dir()
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(elsewhere)
    ids, why_not = host_ids.AttemptIds.detect()
    assert ids is None and "not a directory" in why_not, why_not
    link.unlink()
    link.mkdir(mode=0o777)
    link.chmod(0o777)
    os.chown(link, WORKER_UID, WORKER_UID)
    ids, why_not = host_ids.AttemptIds.detect()
    assert ids is None and "others" in why_not, why_not
    assert state in link.parents
