"""Cut one loopback host off from the others, both ways, with nftables (issue 26).

Host *i*'s processes run in cgroup ``host-<i>`` (``gnomon.infra.placement``); a packet
crosses the cut when exactly one of its two ends is in host 2's group. Both ends are known
on loopback: the sending socket in the output hook, the receiving one in the input hook
(``socket cgroupv2`` looks it up), each recorded in the connection's conntrack mark:

* bit 0x1 set: the side that opened the connection is in the group,
* bit 0x2 set: the side that accepted it is in the group,

and the input hook drops a packet of a connection with exactly one bit set. Connections
open before the cut are cut too (their first packet after it marks them), and a
connection attempt times out as in a real partition (nothing answers, nothing refuses).

Everything lives in one nftables table of the test's own (``gnomon_cut_<tag>``); healing
deletes that table and nothing else. Limits: the marks stay on the conntrack entries after
healing, so a second cut of another host within their lifetime would read them wrong
(clear them first, ``conntrack -U --mark 0/0x3``; one cut per cluster today); and the
cgroup level in the rule counts from the kernel's root, so inside a cgroup namespace (a
container's) the rule matches nothing and the probes say the cut is not real. nft resolves a cgroup path under ``/sys/fs/cgroup``;
on a hybrid hierarchy (v2 at ``/sys/fs/cgroup/unified``) the rules are loaded in a private
mount namespace where the v2 mount is bound there, and the kernel keeps the group's id.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from gnomon.infra import placement

CUT_MARK = 0x3  # the two bits of the conntrack mark this table owns (docstring)


def available() -> str | None:
    """Why a cut cannot be made here, or ``None`` when it can."""
    if shutil.which("nft") is None:
        return "nft is not installed (apt-get install nftables; `make testdeps` does)"
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    if placement.cgroup2_root() is None:
        return "no writable cgroup v2 hierarchy to place a host's processes in"
    return None


def rules(table: str, group: Path, root: Path) -> str:
    rel = group.relative_to(root)
    path = f'"{rel.as_posix()}"'
    level = len(rel.parts)
    match = f"socket cgroupv2 level {level} {path}"
    return f"""table inet {table} {{
  chain out {{
    type filter hook output priority 0; policy accept;
    ct direction original {match} ct mark set ct mark or 0x1
    ct direction reply {match} ct mark set ct mark or 0x2
  }}
  chain in {{
    type filter hook input priority 0; policy accept;
    ct direction original {match} ct mark set ct mark or 0x2
    ct direction reply {match} ct mark set ct mark or 0x1
    ct mark and {CUT_MARK:#x} == 0x1 drop
    ct mark and {CUT_MARK:#x} == 0x2 drop
  }}
}}
"""


def _nft_load(text: str, root: Path) -> None:
    # nft finds a cgroup path under /sys/fs/cgroup: bind the v2 mount there, privately
    script = 'mount --bind "$0" /sys/fs/cgroup && exec nft -f -'
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, str(root)],
                          input=text, text=True, capture_output=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"nft refused the cut: {done.stderr.strip()}\n{text}")


@contextlib.contextmanager
def cut_off(group: Path, tag: str) -> Iterator[str]:
    """Every connection between ``group``'s processes and any other process dropped, both
    ways, until the block ends; yields the table's name."""
    root = placement.cgroup2_root()
    assert root is not None, available()
    table = f"gnomon_cut_{tag}"
    _nft_load(rules(table, group, root), root)
    try:
        yield table
    finally:
        subprocess.run(["nft", "delete", "table", "inet", table], check=True, capture_output=True, timeout=30)


def table_exists(table: str) -> bool:
    return subprocess.run(["nft", "list", "table", "inet", table], capture_output=True, timeout=30).returncode == 0


PROBE = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])).close()
    print("connected")
except TimeoutError:
    print("timeout")
except OSError as exc:
    print(type(exc).__name__)
"""


def probe(group: Path | None, host: str, port: int, timeout_s: float = 3.0) -> str:
    """What a TCP connection from a process in ``group`` (``None``: this test's own) to
    ``host:port`` does: "connected", "timeout" (dropped, as by a cut) or the error (e.g.
    ConnectionRefusedError: nothing listens, which says nothing of a cut)."""
    argv = placement.wrap([sys.executable, "-c", PROBE, host, str(port), str(timeout_s)], group)
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s + 10).stdout.strip()


def reaches(group: Path | None, host: str, port: int, timeout_s: float = 3.0) -> bool:
    return probe(group, host, port, timeout_s) == "connected"


def dropped(group: Path | None, host: str, port: int, timeout_s: float = 3.0) -> bool:
    """The connection attempt times out (a refused one is not a cut)."""
    return probe(group, host, port, timeout_s) == "timeout"
