"""Start rate of sandboxed attempts against in-process handlers, on this host.

Runs the worker's own executors (no Kafka: this measures the sandbox, not the
pipeline) with a trivial target, N attempts at a given concurrency, and prints per
kind: attempts/s, and the start latency (execute() called -> the target's first
output line) p50/p99. Kinds: an in-process handler, a bwrap command (`true`-like
`echo`), and a podman container (busybox image imported locally; skipped with a note
if podman is missing).

    .venv/bin/python bench/sandbox_starts.py --attempts 200 --concurrency 4

As a non-root worker with subordinate ids (per-attempt host uids, gnomon.worker.host_ids),
from root: ``tests/nonroot.sh bench/sandbox_starts.py --attempts 200 --container-attempts 0``
(then "bwrap command" runs with them and "bwrap, worker's uid" without, in the same run).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from gnomon.core.messages import LogStream
from gnomon.core.model import Target, TargetType
from gnomon.worker.attempt import AttemptContext, AttemptResult
from gnomon.worker.command import SandboxedCommandExecutor
from gnomon.worker.container import ContainerExecutor, PodmanRunner
from gnomon.worker.executors import HandlerExecutor
from gnomon.worker.sandbox import BwrapSandbox

IMAGE = "localhost/gnomon-bench-busybox:1"


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] if xs else float("nan")


def one(execute: Callable[[AttemptContext], AttemptResult], i: int) -> float:
    started = threading.Event()
    t0 = time.perf_counter()
    seen: list[float] = []

    def log(kind: LogStream | str, _line: str) -> None:
        if str(kind) == "stdout" and not started.is_set():
            seen.append(time.perf_counter())
            started.set()

    ctx = AttemptContext(f"b@{i}", "b", "bench", 1, None, 60, log)
    result = execute(ctx)
    assert str(result.outcome) == "succeeded", result
    return (seen[0] if seen else time.perf_counter()) - t0


def measure(name: str, execute: Callable[[AttemptContext], AttemptResult], attempts: int, concurrency: int) -> None:
    one(execute, -1)  # warm up
    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        lat = list(pool.map(lambda i: one(execute, i), range(attempts)))
    wall = time.perf_counter() - t0
    print(f"{name:<22} {attempts / wall:8.1f} attempts/s   start p50 {pct(lat, 50) * 1000:7.1f} ms   "
          f"p99 {pct(lat, 99) * 1000:7.1f} ms", flush=True)


def image() -> str | None:
    busybox = shutil.which("busybox")
    runner = PodmanRunner()
    try:
        runner.check()
    except Exception as exc:
        print(f"container: skipped ({exc})")
        return None
    if not busybox:
        print("container: skipped (busybox-static missing)")
        return None
    with tempfile.TemporaryDirectory() as d:
        root = Path(d) / "root"
        (root / "bin").mkdir(parents=True)
        shutil.copy(busybox, root / "bin" / "busybox")
        for applet in ("sh", "echo"):
            (root / "bin" / applet).symlink_to("busybox")
        tar = Path(d) / "img.tar"
        with tarfile.open(tar, "w") as tf:
            tf.add(root / "bin", arcname="bin")
        subprocess.run([*runner.base(), "import", "--change", "ENV PATH=/bin", str(tar), IMAGE], check=True,
                       capture_output=True)
    return IMAGE


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--attempts", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--container-attempts", type=int, default=40)
    args = ap.parse_args()
    print(f"{args.attempts} attempts per kind, concurrency {args.concurrency}; python {sys.version.split()[0]}")

    handlers = HandlerExecutor({"hi": lambda ctx: ctx.log(LogStream.STDOUT, "hi")})
    measure("in-process handler", lambda ctx: handlers.execute(Target(TargetType.HANDLER, handler="hi"), ctx),
            args.attempts, args.concurrency)
    command = SandboxedCommandExecutor()
    measure("bwrap command", lambda ctx: command.execute(Target(TargetType.COMMAND, argv=("echo", "hi")), ctx),
            args.attempts, args.concurrency)
    if command.sandbox.ids is not None:  # a non-root worker with subordinate ids: their cost, in the same run
        own = SandboxedCommandExecutor(sandbox=BwrapSandbox(ids=None))
        measure("bwrap, worker's uid", lambda ctx: own.execute(Target(TargetType.COMMAND, argv=("echo", "hi")), ctx),
                args.attempts, args.concurrency)
    img = image() if args.container_attempts > 0 else None
    if img:
        container = ContainerExecutor()
        measure("podman container", lambda ctx: container.execute(
            Target(TargetType.CONTAINER, image=img, argv=("echo", "hi")), ctx), args.container_attempts,
            args.concurrency)


if __name__ == "__main__":
    main()
