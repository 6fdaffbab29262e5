"""Topic names and sizes, read from ``streams/topology.toml`` (the topology as data)."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from gnomon.config import load


@dataclass(frozen=True)
class Topology:
    partitions: int
    pools: tuple[str, ...]
    priorities: tuple[str, ...]
    dispatch_format: str
    job_commands: str = "gnomon.job-commands"
    run_events: str = "gnomon.run-events"
    jobs: str = "gnomon.jobs"
    runs: str = "gnomon.runs"
    run_history: str = "gnomon.run-history"
    worker_inbox: str = "gnomon.worker-inbox"
    run_logs: str = "gnomon.run-logs"
    dead_letters: str = "gnomon.dead-letters"
    poison: str = "gnomon.poison"
    workers: str = "gnomon.workers"
    tenants: str = "gnomon.tenants"  # tenant limits (core.tenants), compacted, key tenant
    tenant_usage: str = "gnomon.tenant-usage"  # per-partition usage (core.usage), key "<tenant>/<partition>"

    def dispatch_topic(self, pool: str, priority: str) -> str:
        return self.dispatch_format.format(pool=pool, priority=priority)

    def dispatch_topics(self, pool: str) -> list[str]:
        return [self.dispatch_topic(pool, p) for p in self.priorities]


@lru_cache(maxsize=4)
def load_topology(path: Path | None = None) -> Topology:
    path = path or load().topology_path
    data = tomllib.loads(path.read_text())
    parts = int(data["defaults"]["partitions"])
    for name in ("gnomon.job-commands", "gnomon.run-events", "gnomon.jobs", "gnomon.runs"):
        spec = data["topics"][name]
        if int(spec.get("partitions", parts)) != parts:
            raise ValueError(f"{path}: {name} must have {parts} partitions (co-partitioned by job_id)")
    d = data["dispatch"]
    return Topology(
        partitions=parts,
        pools=tuple(d["pools"]),
        priorities=tuple(d["priorities"]),
        dispatch_format=d["name_format"],
    )
