"""Publish each owned partition's per-tenant counts on ``gnomon.tenant-usage``.

The API reads them (``core.usage.UsageBook``) to answer admission with an HTTP status
before the processor decides, and to show a tenant its usage. Records are keyed
``<tenant>/<partition>``, written in the processor's transaction when a count changes
(at most once per ``interval_ms``), and all of a partition's records again every
``refresh_ms``, so that a reader can drop records older than a few refreshes: those of
a partition whose new owner has not written yet, or of a count that went away while
nobody owned it.
"""

from __future__ import annotations

from collections.abc import Iterable

from gnomon.core.quota import QuotaBook
from gnomon.core.usage import TenantUsage
from gnomon.processor.output import Output
from gnomon.topology import Topology

UsageRow = dict[str, int]


class UsagePublisher:
    def __init__(self, topology: Topology, quota: QuotaBook, interval_ms: int = 1_000,
                 refresh_ms: int = 60_000) -> None:
        self.topo = topology
        self.quota = quota
        self.interval_ms = interval_ms
        self.refresh_ms = refresh_ms
        self._last: dict[int, dict[str, UsageRow]] = {}  # partition -> tenant -> what was published
        self._refreshed_at: dict[int, int] = {}
        self._at_ms = -(10**15)

    def forget(self, partition: int) -> None:
        """``partition`` changed hands (or was restored): publish all of it again."""
        self._last.pop(partition, None)
        self._refreshed_at.pop(partition, None)

    def changes(self, partitions: Iterable[int], now_ms: int) -> list[Output]:
        if now_ms - self._at_ms < self.interval_ms:
            return []
        self._at_ms = now_ms
        out: list[Output] = []
        for p in partitions:
            current = self.quota.partition_counts(p, now_ms)
            last = self._last.get(p, {})
            refresh = now_ms - self._refreshed_at.get(p, -(10**15)) >= self.refresh_ms
            if refresh:
                self._refreshed_at[p] = now_ms
            for tenant, row in current.items():
                if refresh or last.get(tenant) != row:
                    usage = TenantUsage(tenant, p, row["jobs"], row["backlog"], row["running"],
                                        row["triggers_last_min"], now_ms)
                    out.append(Output(self.topo.tenant_usage, f"{tenant}/{p}", usage))
            for tenant in last.keys() - current.keys():
                out.append(Output(self.topo.tenant_usage, f"{tenant}/{p}", None))  # nothing left: tombstone
            self._last[p] = current
        return out
