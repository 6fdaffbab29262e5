"""Which host a process belongs to, when several hosts share one machine (issue 26).

Host *i* of ``gnomon infra up --hosts 3`` is the loopback address 127.0.0.*i*; its servers
listen there only. That says where a process *listens*, not where it *connects from*: on
loopback every outgoing connection leaves with source 127.0.0.1 (librdkafka has no option to
bind its source address), so a firewall rule keyed on addresses alone cannot cut one host
off from the others both ways. A host's processes are therefore also placed in a cgroup of
their own (cgroup v2, ``<mount>/gnomon/<cluster>/host-<i>``), which nftables can match on
the sending socket (``socket cgroupv2``) and on the receiving one: the cut-off chaos test
(``tests/chaos/netcut.py``) drops exactly the packets that cross that boundary.

Placement is asked for (``GNOMON_HOST_CGROUPS=1``, :func:`enabled`: the host-fault chaos
tests set it), since it moves the servers out of the caller's own cgroup (a systemd unit's,
a CI job's) and its limits. It is best effort and changes nothing else: with no writable
cgroup v2 hierarchy (:func:`cgroup2_root` is ``None``) processes start where they would
have, and a test that needs placement says so. ``<cluster>`` is a digest of the state
directory, so two clusters on one machine (CI's and a bench's) never share a group.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

MOUNTS = Path("/proc/self/mounts")
BASE = "gnomon"
MAX_HOSTS = 254  # 127.0.0.1 .. 127.0.0.254


ENV = "GNOMON_HOST_CGROUPS"


def enabled() -> bool:
    """Should ``gnomon infra up --hosts N`` place each host's servers in its cgroup?"""
    return os.environ.get(ENV) == "1"


def cgroup2_root(mounts: Path = MOUNTS) -> Path | None:
    """Where the cgroup v2 hierarchy is mounted (``/sys/fs/cgroup`` on a pure v2 system,
    ``/sys/fs/cgroup/unified`` on a hybrid one), if it is and this process may write it."""
    try:
        lines = mounts.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) >= 3 and fields[2] == "cgroup2":
            root = Path(fields[1])
            return root if os.access(root, os.W_OK) else None
    return None


def cluster_dir(state_dir: Path, root: Path) -> Path:
    digest = hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:12]
    return root / BASE / digest


def host_group(state_dir: Path, host: int, *, root: Path | None = None) -> Path | None:
    """Host ``host``'s cgroup (created if missing), or ``None`` where there is none to use."""
    assert 1 <= host <= MAX_HOSTS, host
    root = root if root is not None else cgroup2_root()
    if root is None:
        return None
    group = cluster_dir(state_dir, root) / f"host-{host}"
    try:
        group.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return group


def host_of(address: str) -> int:
    """The host number of a loopback host address: 127.0.0.3 -> 3."""
    head, _, last = address.rpartition(".")
    if head != "127.0.0" or not last.isdigit() or not 1 <= int(last) <= MAX_HOSTS:
        raise ValueError(f"not a host address of one machine (127.0.0.1-254): {address!r}")
    return int(last)


def wrap(argv: Sequence[str], group: Path | None) -> list[str]:
    """``argv`` started inside ``group``: a shell moves itself into the group, then execs
    ``argv`` (same pid, so pid files and signals are unchanged). Unchanged without a group."""
    if group is None:
        return list(argv)
    procs_file = str(group / "cgroup.procs")
    return ["/bin/sh", "-c", 'echo $$ 2>/dev/null > "$0"; exec "$@"', procs_file, *argv]


def group_of(pid: int, root: Path | None = None) -> Path | None:
    """The cgroup v2 group process ``pid`` is in (``None`` if it is gone or unplaced)."""
    root = root if root is not None else cgroup2_root()
    if root is None:
        return None
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("0::"):
            return root / line[3:].lstrip("/")
    return None


def remove(state_dir: Path, *, root: Path | None = None) -> None:
    """Remove the cluster's empty host groups (a group with a process left stays)."""
    root = root if root is not None else cgroup2_root()
    if root is None:
        return
    top = cluster_dir(state_dir, root)
    if not top.is_dir():
        return
    for group in top.glob("host-*"):
        with contextlib.suppress(OSError):
            group.rmdir()
    with contextlib.suppress(OSError):
        top.rmdir()
