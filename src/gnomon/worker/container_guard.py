"""A container's guard: removes it when its worker stops renewing the attempt's lease.

A container outlives its worker unless something outside the worker ends it: ``podman
run`` and the container's monitor (conmon) are other processes, and a killed worker's
run is granted again once its lease lapses, so two copies would run at once. The worker
starts one guard per container attempt, before ``podman run``, in a session of its own
(a kill of the worker's process group misses it) with a pipe from the worker on its
standard input:

* each lease renewal of the attempt (the worker's heartbeat) writes ``h``;
* the end of the attempt, once the worker removed the container itself, writes ``q``:
  the guard leaves;
* end of file without ``q`` (the worker died: the kernel closes its end of the pipe) or
  ``silence_s`` without a byte (the worker hung, or stopped renewing): the guard removes
  the container (``podman rm -f -t 0``, which kills everything in it) and leaves.

So a container is gone within one lease of its worker's last renewal, and a long run
whose worker keeps renewing is never cut short. The worker's side is
``gnomon.worker.container.Guard``.

Standard library only, and run as a script (``python -I <this file> ...``): it must start
fast and import nothing of the worker's.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable

RENEW, QUIT = b"h", b"q"
REMOVE_TIMEOUT_S = 60.0
USAGE = "usage: container_guard.py PODMAN RUNTIME NAME SILENCE_S"


def watch(fd: int, silence_s: float, clock: Callable[[], float] = time.monotonic) -> str:
    """Read ``fd`` until the worker says ``q`` ("quit"), closes it ("eof") or says nothing
    for ``silence_s`` ("silent")."""
    deadline = clock() + silence_s
    while True:
        left = deadline - clock()
        if left <= 0:
            return "silent"
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        data = os.read(fd, 4096)
        if not data:
            return "eof"
        if QUIT in data:
            return "quit"
        deadline = clock() + silence_s


def main(argv: list[str]) -> int:
    if len(argv) != 5:
        print(USAGE, file=sys.stderr)
        return 2
    podman, runtime, name, silence_text = argv[1:]
    try:
        silence_s = float(silence_text)
    except ValueError:
        print(USAGE, file=sys.stderr)
        return 2
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):  # only the worker's pipe ends it
        signal.signal(sig, signal.SIG_IGN)
    why = watch(sys.stdin.fileno(), silence_s)
    if why == "quit":
        return 0
    try:
        subprocess.run([podman, "--runtime", runtime, "rm", "-f", "-t", "0", name], stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=REMOVE_TIMEOUT_S, check=False)
    except (subprocess.TimeoutExpired, OSError) as exc:
        _say(f"container guard: cannot remove {name} ({why}): {exc}")
        return 1
    _say(f"container guard: removed {name}: its worker {'ended' if why == 'eof' else 'stopped renewing'}")
    return 0


def _say(line: str) -> None:
    """One line on the worker's log (stderr, inherited); the worker may be gone with it."""
    with contextlib.suppress(OSError):
        print(line, file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
