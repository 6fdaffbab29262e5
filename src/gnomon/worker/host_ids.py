"""A host uid and gid of its own for each attempt of a non-root worker (issue 24, finding 8).

A root worker drops every sandbox to ``nobody`` (``sandbox.SANDBOX_UID``). A worker that
is not root cannot change its uid, so bubblewrap's namespaces used to map ``nobody`` onto
the worker's own uid: an escaped command held the worker's Kafka credential and every
tenant's secret files. Where the host gives the worker's user a subordinate id range
(``/etc/subuid`` and ``/etc/subgid``, the ranges rootless podman uses) and has
``newuidmap``/``newgidmap`` (Debian's ``uidmap``), each attempt runs instead as::

    unshare --map-root-user --map-users=<sub start>,1,<n> --map-groups=<sub start>,1,<n>
      -> setpriv --reuid=<k> --regid=<k> (drops every capability)  -> bwrap ...

a user namespace whose root is the worker and whose ids 1..n are the range; the
attempt's ``k`` is distinct among the attempts in flight, so on the host the command runs
as ``<sub start> + k - 1``: not the worker's uid (its files, 0600, are out of reach), not
another attempt's (no signals, no ``/proc`` between attempts), and ``RLIMIT_NPROC``
counts per attempt. The worker owns the namespace, so it can still kill the sandbox.

``AttemptIds.detect()`` says at start whether the host allows it, and why not.
"""

from __future__ import annotations

import logging
import os
import pwd
import shutil
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("gnomon.worker")

SUBUID_FILE = Path("/etc/subuid")
SUBGID_FILE = Path("/etc/subgid")
IDS_MIN = 2  # a range of one id leaves no attempt id besides the namespace's root
IDS_MAX = 65_536  # ids beyond this are not used (a user namespace needs no more)
PROBE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class SubIdRange:
    start: int
    count: int


def read_range(path: Path, user: str, uid: int) -> SubIdRange | None:
    """The first range of ``user`` (by name or by uid) in a subuid/subgid file, or None."""
    try:
        text = path.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        parts = line.strip().split(":")
        if len(parts) != 3 or parts[0] not in (user, str(uid)):
            continue
        try:
            start, count = int(parts[1]), int(parts[2])
        except ValueError:
            continue
        if start > 0 and count >= IDS_MIN:
            return SubIdRange(start, count)
    return None


@dataclass
class AttemptIds:
    """Hands out the in-namespace ids 1..``count``, one per attempt in flight."""

    uids: SubIdRange
    gids: SubIdRange
    _in_use: set[int] = field(default_factory=set)
    _next: int = 1
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def count(self) -> int:
        return min(self.uids.count, self.gids.count, IDS_MAX)

    def acquire(self) -> int | None:
        """A free id (round robin, so a just-freed id waits its turn), or None when every
        id is in flight."""
        with self._lock:
            for _ in range(self.count):
                k = self._next
                self._next = k % self.count + 1
                if k not in self._in_use:
                    self._in_use.add(k)
                    return k
        return None

    def release(self, k: int) -> None:
        with self._lock:
            self._in_use.discard(k)

    def host_uid(self, k: int) -> int:
        return self.uids.start + k - 1

    def prefix(self, k: int) -> list[str]:
        """The argv that enters the namespace and drops to id ``k``, before bwrap."""
        assert 1 <= k <= self.count, k
        n = self.count
        return ["unshare", "--map-root-user", f"--map-users={self.uids.start},1,{n}",
                f"--map-groups={self.gids.start},1,{n}", "--",
                "setpriv", f"--reuid={k}", f"--regid={k}", "--clear-groups", "--inh-caps=-all",
                "--bounding-set=-all", "--"]

    @classmethod
    def detect(cls) -> tuple[AttemptIds | None, str]:
        """(the ids, "") where this host allows them to this non-root process, else (None,
        why not): root, no range for the user, no newuidmap, or a probe that fails."""
        uid = os.geteuid()
        if uid == 0:
            return None, "the worker is root (sandboxes drop to nobody)"
        try:
            user = pwd.getpwuid(uid).pw_name
        except KeyError:
            user = str(uid)
        uids, gids = read_range(SUBUID_FILE, user, uid), read_range(SUBGID_FILE, user, uid)
        if uids is None or gids is None:
            return None, (f"no subordinate id range for user {user!r} in {SUBUID_FILE} and {SUBGID_FILE} "
                          f"(e.g. usermod --add-subuids 200000-265535 --add-subgids 200000-265535 {user})")
        for tool, package in (("newuidmap", "uidmap"), ("newgidmap", "uidmap"), ("unshare", "util-linux"),
                              ("setpriv", "util-linux")):
            if shutil.which(tool) is None:
                return None, f"{tool} is not installed (apt-get install {package})"
        ids = cls(uids, gids)
        probe = [*ids.prefix(1), "true"]
        try:
            done = subprocess.run(probe, capture_output=True, timeout=PROBE_TIMEOUT_S, stdin=subprocess.DEVNULL,
                                  env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
        except (OSError, subprocess.TimeoutExpired) as exc:
            return None, f"entering a user namespace with the subordinate ids failed: {exc}"
        if done.returncode != 0:
            err = done.stderr.decode(errors="replace").strip()[-300:]
            return None, f"entering a user namespace with the subordinate ids failed (exit {done.returncode}): {err}"
        return ids, ""


_detected: tuple[AttemptIds | None, str] | None = None
_detect_lock = threading.Lock()


def shared() -> tuple[AttemptIds | None, str]:
    """This process's ``AttemptIds.detect()``, probed once."""
    global _detected
    with _detect_lock:
        if _detected is None:
            _detected = AttemptIds.detect()
        return _detected
