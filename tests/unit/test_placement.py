"""A host's processes placed in its own cgroup (gnomon.infra.placement), and the nftables
rules of the cut-off chaos test (tests/chaos/netcut.py) read back."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gnomon.infra import placement

sys.path.insert(0, str(Path(__file__).parents[1] / "chaos"))
import netcut


def test_the_cgroup2_mount_is_found_in_a_hybrid_and_a_pure_hierarchy(tmp_path: Path) -> None:
    unified = tmp_path / "unified"
    unified.mkdir()
    mounts = tmp_path / "mounts"
    mounts.write_text("tmpfs /sys/fs/cgroup tmpfs rw 0 0\n"
                      "cgroup /sys/fs/cgroup/cpu cgroup rw,cpu 0 0\n"
                      f"cgroup2 {unified} cgroup2 rw 0 0\n")
    assert placement.cgroup2_root(mounts) == unified
    mounts.write_text("cgroup /sys/fs/cgroup/cpu cgroup rw,cpu 0 0\n")
    assert placement.cgroup2_root(mounts) is None
    assert placement.cgroup2_root(tmp_path / "absent") is None


def test_each_host_of_a_cluster_has_its_own_group_and_clusters_do_not_share(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    root.mkdir()
    a2 = placement.host_group(tmp_path / "a", 2, root=root)
    a3 = placement.host_group(tmp_path / "a", 3, root=root)
    b2 = placement.host_group(tmp_path / "b", 2, root=root)
    assert a2 is not None and a3 is not None and b2 is not None
    assert a2.is_dir() and a2.name == "host-2" and a3.parent == a2.parent and b2.parent != a2.parent
    assert a2.relative_to(root).parts[0] == placement.BASE
    placement.remove(tmp_path / "a", root=root)
    assert not a2.parent.exists() and b2.exists()


def test_host_numbers_come_from_loopback_host_addresses_only() -> None:
    assert placement.host_of("127.0.0.3") == 3
    for bad in ("10.0.0.3", "127.0.0.0", "127.0.0.255", "127.0.0.x", "localhost"):
        with pytest.raises(ValueError, match=r"127\.0\.0\.1-254"):
            placement.host_of(bad)


def test_a_wrapped_command_writes_its_own_pid_to_the_group_then_becomes_the_command(tmp_path: Path) -> None:
    group = tmp_path / "host-2"
    group.mkdir()
    (group / "cgroup.procs").write_text("")
    argv = placement.wrap([sys.executable, "-c", "import os; print(os.getpid())", "--marker"], group)
    proc = subprocess.run(argv, capture_output=True, text=True, check=True)
    assert (group / "cgroup.procs").read_text().strip() == proc.stdout.strip()  # the same pid: exec
    assert "--marker" in argv  # the marker a pid file is checked by stays in the command line
    assert placement.wrap(["true"], None) == ["true"]


def test_a_group_that_cannot_be_joined_still_starts_the_command(tmp_path: Path) -> None:
    argv = placement.wrap([sys.executable, "-c", "print('ran')"], tmp_path / "no-such-group")
    proc = subprocess.run(argv, capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "ran" and proc.stderr == ""


def test_the_cut_marks_both_ends_of_a_connection_and_drops_only_what_crosses(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    group = root / "gnomon" / "abc" / "host-2"
    text = netcut.rules("gnomon_cut_t1", group, root)
    match = 'socket cgroupv2 level 3 "gnomon/abc/host-2"'
    assert text.startswith("table inet gnomon_cut_t1 {")
    out, inp = text.split("chain in")
    assert "hook output" in out and "hook input" in inp
    assert f"ct direction original {match} ct mark set ct mark or 0x1" in out  # opener is host 2
    assert f"ct direction reply {match} ct mark set ct mark or 0x2" in out  # acceptor is host 2
    assert f"ct direction original {match} ct mark set ct mark or 0x2" in inp
    assert f"ct direction reply {match} ct mark set ct mark or 0x1" in inp
    drops = [line.strip() for line in inp.splitlines() if line.strip().endswith("drop")]
    assert drops == ["ct mark and 0x3 == 0x1 drop", "ct mark and 0x3 == 0x2 drop"]  # one end inside: cut


def test_placement_is_asked_for_not_assumed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Moving servers out of the caller's cgroup (a unit's, a CI job's) is opt-in."""
    monkeypatch.delenv(placement.ENV, raising=False)
    assert not placement.enabled()
    monkeypatch.setenv(placement.ENV, "1")
    assert placement.enabled()
