"""Time a restore read of one changelog partition whose restore starts at its end (a warm
standby at the changelog's stable end): what ``read_partition_to_end`` costs when there
is nothing to read. Usage: ``python bench/restore_read.py [N]`` on a running stack
(``make infra-up``); prints the median and max of N reads."""

from __future__ import annotations

import statistics
import sys
import time

from gnomon.config import load
from gnomon.eventlog import kafka
from gnomon.topology import load_topology


def main(reads: int) -> None:
    settings, topo = load(), load_topology()
    took_s = []
    for _ in range(reads):
        end = kafka.wait_stable(settings.kafka_bootstrap, topo.runs, 0, 10, role="processor")
        began = time.monotonic()
        for _rec in kafka.read_partition_to_end(settings.kafka_bootstrap, topo.runs, 0, 10, start=end,
                                                role="processor"):
            pass
        took_s.append(time.monotonic() - began)
    print(f"read_partition_to_end(start=end) x{reads}: median {statistics.median(took_s) * 1000:.0f} ms, "
          f"max {max(took_s) * 1000:.0f} ms")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 10)
