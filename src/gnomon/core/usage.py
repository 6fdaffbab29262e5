"""Tenant usage: what each tenant uses now, as the processors count it.

Each processor partition writes, for every tenant it holds, one ``TenantUsage`` to the
compacted topic ``gnomon.tenant-usage`` under the key ``"<tenant>/<partition>"`` (a
tombstone when the tenant has nothing left there). A tenant's usage is the sum over
partitions: ``UsageBook`` keeps the latest record per key and sums them. The API reads
it to check ``core.admission`` before sending a command, and to show usage to admins.
"""

from __future__ import annotations

from dataclasses import dataclass

from gnomon.core.errors import ValidationError

COUNTS = ("jobs", "backlog", "running", "triggers_last_min")


@dataclass(frozen=True)
class TenantUsage:
    tenant: str
    partition: int
    jobs: int  # registered jobs
    backlog: int  # one-off runs queued and not started
    running: int  # runs granted to workers (staged or running)
    triggers_last_min: int  # manual triggers accepted in the last minute
    at_ms: int  # when the partition counted

    @property
    def key(self) -> str:
        return usage_key(self.tenant, self.partition)


def usage_key(tenant: str, partition: int) -> str:
    """The record key of a tenant's usage on a partition."""
    return f"{tenant}/{partition}"


def parse_usage_key(key: str) -> tuple[str, int]:
    """``"<tenant>/<partition>"`` -> (tenant, partition). Tenant names have no ``/``."""
    tenant, sep, part = key.rpartition("/")
    if not sep or not tenant or not part.isdigit():
        raise ValidationError("key", f"a usage key is '<tenant>/<partition>', got {key!r}")
    return tenant, int(part)


class UsageBook:
    """Every (tenant, partition)'s latest usage, summed per tenant on demand."""

    def __init__(self, stale_after_ms: int = 180_000) -> None:
        self.stale_after_ms = stale_after_ms  # three of the processors' one-minute refreshes
        self._by_tenant: dict[str, dict[int, TenantUsage]] = {}

    def apply(self, key: str, usage: TenantUsage | None) -> None:
        """A record read from ``gnomon.tenant-usage``: ``usage`` None is a tombstone
        (the partition has nothing of the tenant any more)."""
        tenant, partition = parse_usage_key(key)
        if usage is None:
            parts = self._by_tenant.get(tenant)
            if parts is not None:
                parts.pop(partition, None)
                if not parts:
                    del self._by_tenant[tenant]
            return
        if (usage.tenant, usage.partition) != (tenant, partition):
            raise ValidationError("key", f"record key {key!r} names another tenant or partition than "
                                         f"its value ({usage.key!r})")
        self._by_tenant.setdefault(tenant, {})[partition] = usage

    def totals(self, tenant: str, now_ms: int | None = None) -> dict[str, int]:
        """The tenant's counts summed over partitions (zeros for an unknown tenant), and
        ``at_ms``: the oldest partition count they include (0 if none). With ``now_ms``,
        records older than ``stale_after_ms`` are left out: processors write every
        partition's counts again each minute, so an older one is of a partition nobody has
        counted since (its new owner has not written yet, or it has nothing left there)."""
        parts = [u for u in self._by_tenant.get(tenant, {}).values()
                 if now_ms is None or now_ms - u.at_ms <= self.stale_after_ms]
        out = {name: sum(getattr(u, name) for u in parts) for name in COUNTS}
        out["at_ms"] = min((u.at_ms for u in parts), default=0)
        return out

    def tenants(self) -> list[str]:
        """The tenants with usage on some partition, sorted."""
        return sorted(self._by_tenant)
