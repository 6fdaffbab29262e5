"""An attempt's cgroup can answer EBUSY for a moment after its last task exits: removal
retries (bounded) instead of leaving it for the next worker start."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from gnomon.worker.sandbox import Cgroups


class _BusyDir:
    """A cgroup directory whose rmdir fails with ``err`` ``busy_for`` times."""

    def __init__(self, busy_for: int, err: int = errno.EBUSY) -> None:
        self.busy_for, self.err, self.calls, self.removed = busy_for, err, 0, False

    def rmdir(self) -> None:
        self.calls += 1
        if self.calls <= self.busy_for:
            raise OSError(self.err, "Device or resource busy")
        self.removed = True


def _groups(*dirs: _BusyDir) -> Cgroups:
    return Cgroups({f"c{i}": d for i, d in enumerate(dirs)})  # type: ignore[misc]


def test_a_briefly_busy_group_is_removed_after_retries() -> None:
    d = _BusyDir(busy_for=3)
    slept: list[float] = []
    _groups(d).remove(attempts_max=5, pause_s=0.01, sleep=slept.append)
    assert d.removed and d.calls == 4 and slept == [0.01] * 3


def test_retries_are_bounded_and_other_errors_are_not_retried(caplog: pytest.LogCaptureFixture) -> None:
    busy, denied = _BusyDir(busy_for=100), _BusyDir(busy_for=100, err=errno.EACCES)
    _groups(busy, denied).remove(attempts_max=4, pause_s=0.0, sleep=lambda _: None)
    assert not busy.removed and busy.calls == 4
    assert not denied.removed and denied.calls == 1
    assert sum("cannot remove cgroup" in r.message for r in caplog.records) == 2


def test_a_group_already_gone_is_fine(tmp_path: Path) -> None:
    _groups().remove()
    Cgroups({"pids": tmp_path / "gone"}).remove(sleep=lambda _: pytest.fail("no retry for a missing group"))
