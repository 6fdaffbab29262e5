"""One wait loop for every JVM component: until it serves, dies, or times out."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

from gnomon.infra import procs
from gnomon.infra.errors import InfraError
from gnomon.infra.net import port_open
from gnomon.infra.progress import Ticker

HOST = "127.0.0.1"


def wait_until_serving(
    *,
    state_dir: Path,
    processes: Sequence[tuple[str, str]],
    ports: Sequence[int | tuple[str, int]],
    probe: Callable[[], str | None],
    waiting_for: str,
    not_ready: str,
    excerpt: Callable[[str], str],
    timeout_s: float,
    interval_s: float = 0.5,
    last: str = "port closed",
) -> float:
    """Poll ``probe`` once every port is open; it returns None when ready, else why not
    (raising ``InfraError`` fails at once; any other exception means "not yet").

    ``ports``: a port on 127.0.0.1, or (address, port). ``processes`` are (pid-file name, label) pairs: if one exits, fail with its log.
    Returns the seconds waited; on timeout raises ``InfraError`` quoting the first
    process's log. ``not_ready`` starts the timeout message, e.g. "Kafka did not serve on X".
    """
    ticker = Ticker(f"waiting for {waiting_for}")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for name, label in processes:
            pid = procs.read_pid(state_dir, name)
            if pid is None or procs.exited(pid):
                raise InfraError(f"{label} exited during startup; last lines of its log:\n{excerpt(name)}")
        if all(port_open(*(p if isinstance(p, tuple) else (HOST, p))) for p in ports):
            try:
                reason = probe()
            except InfraError:
                raise
            except Exception as exc:  # client errors while the component starts: keep waiting
                reason = str(exc) or type(exc).__name__
            if reason is None:
                return ticker.elapsed_s
            last = reason
        ticker.tick()
        time.sleep(interval_s)
    raise InfraError(
        f"{not_ready} within {timeout_s:.0f}s ({last}); last lines of its log:\n{excerpt(processes[0][0])}"
    )
