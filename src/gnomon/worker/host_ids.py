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
another attempt's, of this worker or of another worker of the same user on the host (a
lock file per id; no signals, no ``/proc`` between attempts), and ``RLIMIT_NPROC``
counts per attempt. The worker owns the namespace, so it can still kill the sandbox.

``AttemptIds.detect()`` says at start whether the host allows it, and why not.
"""

from __future__ import annotations

import fcntl
import logging
import os
import pwd
import shutil
import stat
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


def lock_dir() -> Path:
    """Where the workers of this user on this host lock the ids they hand out: a place only
    this user can create it in. Its private runtime directory (``$XDG_RUNTIME_DIR``, when
    it is the user's own and closed to others), else gnomon's state directory (private to
    the service's user). Never the shared temp directory: anyone may make a name there
    first, and a worker that found its lock directory taken ran commands as its own uid."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        try:
            st = os.lstat(runtime)
        except OSError:
            st = None
        if st is not None and stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o077:
            return Path(runtime) / "gnomon-host-ids"
    from gnomon.config import load

    return load().state_dir / "host-ids"


def _private_dir(path: Path, uid: int) -> str | None:
    """Why ``path`` (made if missing, 0700) cannot hold the id locks: not a directory of
    its own (a link is not followed), another user's, or open to others; None when it can."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        path.mkdir(mode=0o700, exist_ok=True)
        st = os.lstat(path)
    except OSError as exc:
        return f"cannot make {path} for the id locks: {exc}"
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory (a link is not followed)"
    if st.st_uid != uid:
        return f"{path} belongs to another user"
    if st.st_mode & 0o077:
        return f"{path} is open to others (mode {stat.S_IMODE(st.st_mode):o}; it must be 0700)"
    return None


@dataclass
class AttemptIds:
    """Hands out the in-namespace ids 1..``count``, one per attempt in flight. With
    ``locks`` (a directory), an id is also held by an exclusive lock on ``<locks>/<id>``,
    so the workers of one user on one host never hand out the same id at once (a lock
    dies with its process: nothing to clean up after a kill -9)."""

    uids: SubIdRange
    gids: SubIdRange
    locks: Path | None = None
    _in_use: dict[int, int] = field(default_factory=dict)  # id -> its lock's fd (-1: no lock)
    _next: int = 1
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def count(self) -> int:
        return min(self.uids.count, self.gids.count, IDS_MAX)

    def acquire(self) -> int | None:
        """A free id (round robin, so a just-freed id waits its turn), or None when every
        id is in flight here or held by another worker."""
        with self._lock:
            for _ in range(self.count):
                k = self._next
                self._next = k % self.count + 1
                if k in self._in_use:
                    continue
                fd = self._hold(k)
                if fd is not None:
                    self._in_use[k] = fd
                    return k
        return None

    def _hold(self, k: int) -> int | None:
        """-1 without a lock directory; the locked file's fd; None if another holds it."""
        if self.locks is None:
            return -1
        fd = os.open(self.locks / str(k), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        return fd

    def release(self, k: int) -> None:
        with self._lock:
            fd = self._in_use.pop(k, None)
        if fd is not None and fd >= 0:
            os.close(fd)  # (releases the lock)

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
        locks = lock_dir()
        unusable = _private_dir(locks, uid)
        if unusable is not None:
            return None, unusable
        ids = cls(uids, gids, locks)
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
