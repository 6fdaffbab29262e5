"""The processor's CPU with and without the transaction's journal (issue 51 item 2).

    .venv/bin/python bench/txn_journal.py [--jobs 400] [--sim-s 30] [--rounds 3]

Runs the simulation (the real Processor and Worker loops on the in-memory log and
stores: no Kafka, no RocksDB) with ``--jobs`` jobs firing every second for ``--sim-s``
simulated seconds, once with each partition's transaction journaled (as shipped) and
once with ``PartitionTask.txn_begin`` turned off, alternating, ``--rounds`` times. Prints
the processors' CPU (``time.process_time`` inside ``Processor.step``) per 1,000 runs for
each, and the ratio of the medians. The in-memory store's reads are dict lookups, so this
is the journal's bookkeeping; on RocksDB a written key the transaction did not read
first costs one more read.
"""

from __future__ import annotations

import argparse
import statistics
import time

from gnomon.core import runs as R
from gnomon.processor.runtime import Processor
from gnomon.processor.task import PartitionTask
from gnomon.sim import SimCluster


def one(jobs: int, sim_s: int, journal: bool) -> tuple[float, int]:
    """CPU seconds inside Processor.step, and runs that succeeded."""
    spent = [0.0]
    real_step = Processor.step
    real_begin = PartitionTask.txn_begin

    def timed(self: Processor) -> None:
        t0 = time.process_time()
        try:
            real_step(self)
        finally:
            spent[0] += time.process_time() - t0

    def off(self: PartitionTask) -> None:
        return None

    Processor.step = timed  # type: ignore[method-assign]
    if not journal:
        PartitionTask.txn_begin = off  # type: ignore[method-assign]
    try:
        c = SimCluster(1, processors=1, workers=2, worker_slots=jobs * 2, duration_ms=(50, 100))
        for i in range(jobs):
            c.register(f"j{i:05d}", "* * * * * *")
        c.run_for(5_000, faults=False)  # warm-up: registrations applied, first runs
        spent[0] = 0.0
        before = sum(1 for s in c.ledger() if s.status is R.RunStatus.SUCCEEDED)
        c.run_for(sim_s * 1000, faults=False)
        runs = sum(1 for s in c.ledger() if s.status is R.RunStatus.SUCCEEDED) - before
    finally:
        Processor.step = real_step  # type: ignore[method-assign]
        PartitionTask.txn_begin = real_begin  # type: ignore[method-assign]
    return spent[0], runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=400)
    ap.add_argument("--sim-s", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    per: dict[bool, list[float]] = {True: [], False: []}
    for r in range(a.rounds):
        for journal in (True, False):
            cpu_s, runs = one(a.jobs, a.sim_s, journal)
            ms = cpu_s * 1000 / max(1, runs) * 1000
            per[journal].append(ms)
            print(f"round {r + 1}: journal {'on ' if journal else 'off'}: {runs} runs, processor CPU "
                  f"{cpu_s:.2f} s = {ms:.0f} ms per 1,000 runs", flush=True)
    on, off = statistics.median(per[True]), statistics.median(per[False])
    print(f"median: on {on:.0f} ms, off {off:.0f} ms per 1,000 runs; on/off = {on / off:.3f}")


if __name__ == "__main__":
    main()
