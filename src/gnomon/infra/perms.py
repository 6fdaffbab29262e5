"""The state directory is private: tenants' data lives there (Kafka segments hold job specs,
``gnomon.run-logs`` holds run output; Cassandra's SSTables, the processor's RocksDB files and
the services' logs too), so no other local user may read any of it.

* Every process the project starts gets the umask ``PRIVATE_UMASK`` (the JVMs through
  ``procs.start``, gnomon's own services through ``gnomon.cli.main``): what they create is
  0600 files in 0700 directories.
* ``gnomon infra up`` tightens an existing tree (``tighten``): group and other bits off
  everything this user owns under it. The state directory itself stays 0711, traversable
  but not listable, so PostgreSQL's own user (``gnomon.infra.postgres``, the export's
  database) reaches the 0700 directory it owns inside the tree; what it owns is left alone.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

PRIVATE_UMASK = 0o077
STATE_DIR_MODE = 0o711  # traversable (PostgreSQL's user reaches its own directory), not listable


def private_state_dir(state_dir: Path) -> int:
    """Create ``state_dir`` (0711) if missing and, the first time (the top is not 0711 yet:
    a tree made before), tighten what is under it; how many modes changed. Once private,
    the umask keeps it so: later calls (a broker restarted in a chaos test) do not walk it."""
    state_dir.mkdir(parents=True, exist_ok=True)
    st = state_dir.stat()
    if stat.S_IMODE(st.st_mode) == STATE_DIR_MODE or st.st_uid != os.geteuid():
        return 0
    changed = tighten(state_dir)
    state_dir.chmod(STATE_DIR_MODE)  # last: an interrupted walk is done again next time
    return changed + 1


def tighten(top: Path) -> int:
    """Clear the group and other bits of every file and directory under ``top`` (not ``top``
    itself) that this user owns; symbolic links are not followed. How many changed."""
    me = os.geteuid()
    changed = 0
    for root, dirs, files in os.walk(top):
        for name in (*dirs, *files):
            path = os.path.join(root, name)
            try:
                st = os.lstat(path)
            except FileNotFoundError:  # a service removed it meanwhile
                continue
            if stat.S_ISLNK(st.st_mode) or st.st_uid != me or not st.st_mode & 0o077:
                continue
            try:
                os.chmod(path, stat.S_IMODE(st.st_mode) & 0o700)
                changed += 1
            except FileNotFoundError:
                continue
        dirs[:] = [d for d in dirs if _own_dir(os.path.join(root, d), me)]  # not into PostgreSQL's
    return changed


def _own_dir(path: str, me: int) -> bool:
    try:
        st = os.lstat(path)
    except OSError:  # removed meanwhile (a service's own clean-up)
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == me
