"""What an idle partition costs (issue 26, "room to grow"): one processor owning N
partitions with no job, its CPU and the broker's, for each N.

    .venv/bin/python bench/idle_partitions.py --partitions 8 32 128 --idle-s 40

For each N: a Kafka of its own (a state directory under /tmp, ports 49092/49093, the
local stack's jars and credentials), the topology with every co-partitioned topic at N
partitions (`[defaults] partitions`), one `gnomon processor`; once it has restored every
partition, its CPU (utime + stime from /proc) and the broker's are sampled over the idle
window. Prints CPU-ms per second per process, the processor's per partition, and how long
the processor took from its start to every partition restored.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gnomon.config import Settings, load
from gnomon.infra import fetch, kafka, manager, procs

PORT, CONTROLLER_PORT = 49092, 49093


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def topology_with(partitions: int, out: Path) -> Path:
    text = load().topology_path.read_text()
    text, n = re.subn(r"(?m)^(\[defaults\]\npartitions = )\d+", rf"\g<1>{partitions}", text)
    assert n == 1, "no [defaults] partitions in the topology"
    out.mkdir(parents=True, exist_ok=True)
    path = out / "topology.toml"
    path.write_text(text)
    return path


def measure(partitions: int, idle_s: float, base: Path) -> tuple[float, float, float]:
    """(processor CPU-ms/s, broker CPU-ms/s, seconds to restore every partition)."""
    main = load()
    state = base / f"p{partitions}"
    (state / "lib").mkdir(parents=True)
    (state / "lib" / "kafka").symlink_to(fetch.lib_dir(main.state_dir, "kafka"))
    topo = topology_with(partitions, base / f"t{partitions}")
    env = {**os.environ, "GNOMON_STATE_DIR": str(state), "GNOMON_TOPOLOGY": str(topo),
           "GNOMON_KAFKA_PORT": str(PORT), "GNOMON_KAFKA_CONTROLLER_PORT": str(CONTROLLER_PORT),
           "GNOMON_KAFKA_BOOTSTRAP": f"127.0.0.1:{PORT}", "GNOMON_CREDENTIALS_DIR": str(main.credentials_dir),
           "GNOMON_PROCESSOR_METRICS_PORT": "0"}
    settings = Settings(state_dir=state, kafka_port=PORT, kafka_controller_port=CONTROLLER_PORT,
                        credentials_path=main.credentials_dir, topology_path=topo)
    manager.up(settings, kafka_nodes=1, components=("kafka",))
    log = state / "processor.log"
    proc = None
    try:
        started = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "gnomon.cli.main", "processor", "--instance-id", "idle-0"],
                                env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
        deadline = started + 180
        while True:
            text = log.read_text(errors="replace") if log.exists() else ""
            restored = len(set(re.findall(r"partition (\d+) restored:", text)))
            if restored >= partitions:
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the processor did not restore {partitions} partitions:\n{text[-2000:]}")
            time.sleep(0.2)
        ready_s = time.monotonic() - started
        time.sleep(5)  # settle after the restore
        broker = procs.running_pid(state, kafka.nodes(settings, 1)[0].name)
        assert broker is not None
        p0, b0, t0 = cpu_s(proc.pid), cpu_s(broker), time.monotonic()
        time.sleep(idle_s)
        p1, b1, t1 = cpu_s(proc.pid), cpu_s(broker), time.monotonic()
        return (p1 - p0) * 1000 / (t1 - t0), (b1 - b0) * 1000 / (t1 - t0), ready_s
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            proc.wait(30)
        manager.down(settings)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--partitions", type=int, nargs="+", default=[8, 32, 128])
    ap.add_argument("--idle-s", type=float, default=40)
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="gnomon-idle-partitions-"))
    rows = []
    try:
        for n in args.partitions:
            print(f"{n} partitions…", file=sys.stderr, flush=True)
            rows.append((n, *measure(n, args.idle_s, base)))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(f"\none idle processor owning N partitions, {args.idle_s:.0f} s idle, machine of {os.cpu_count()} CPUs")
    print("partitions  processor CPU-ms/s  per partition  broker CPU-ms/s  start to all restored")
    for n, proc_ms, broker_ms, ready_s in rows:
        print(f"{n:10d}  {proc_ms:18.1f}  {proc_ms / n:13.2f}  {broker_ms:15.1f}  {ready_s:19.1f} s")


if __name__ == "__main__":
    main()
