"""Tenants as data: each team's limits, with defaults for a team nobody configured.

Limits live on the compacted topic ``gnomon.tenants`` (key: the tenant; ``*`` holds the
defaults for tenants without a record of their own; a tombstone returns a tenant to the
defaults). Every processor and API instance reads the whole topic into a
``TenantBook``, so a change takes effect within a poll, without a restart. Only the
admin role may write it (``gnomon tenants set``, ``PUT /v1/tenants/{tenant}``).

What each limit bounds (enforced by the processor, ``core.admission`` and
``core.quota``; the API checks the same rules first to answer with an HTTP status):

* ``concurrency_max``: runs of the tenant granted to workers (staged or running) at
  once, per pool. Runs over it wait, READY, with the reason "waiting for quota".
* ``jobs_max``: registered jobs.
* ``interval_min_s``: the shortest gap between two fire times of a cron schedule.
* ``backlog_max``: one-off runs (manual triggers, backfilled runs, one-time jobs) queued
  and not started.
* ``triggers_per_min_max``: manual triggers accepted per minute, a backfill's runs included.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields

from gnomon.core.errors import ValidationError

DEFAULTS_KEY = "*"  # the record whose limits apply to every tenant without its own

# field -> (lowest, highest) accepted value
LIMIT_BOUNDS: dict[str, tuple[int, int]] = {
    "concurrency_max": (1, 1_000_000),
    "jobs_max": (1, 100_000_000),
    "interval_min_s": (1, 31 * 86_400),
    "backlog_max": (1, 10_000_000),
    "triggers_per_min_max": (1, 1_000_000),
}
TENANT_NAME_MAX = 128
_TENANT_RE = re.compile(r"\A[A-Za-z0-9._-]+\Z")


@dataclass(frozen=True)
class TenantLimits:
    tenant: str  # DEFAULTS_KEY: the defaults
    concurrency_max: int = 100_000  # generous: an admin tightens it per tenant
    jobs_max: int = 1_000_000
    interval_min_s: int = 1
    backlog_max: int = 10_000
    triggers_per_min_max: int = 6_000
    updated_at_ms: int = 0

    def __post_init__(self) -> None:
        check_tenant_name(self.tenant)
        for name, (low, high) in LIMIT_BOUNDS.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ValidationError(name, f"must be a whole number from {low} to {high}, got {value!r}")

    def limits(self) -> dict[str, int]:
        """The limit fields alone (no tenant, no time)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name in LIMIT_BOUNDS}


def check_tenant_name(tenant: str) -> None:
    if not isinstance(tenant, str) or not tenant or len(tenant) > TENANT_NAME_MAX:
        raise ValidationError("tenant", f"a tenant is a non-empty name of at most {TENANT_NAME_MAX} characters")
    if tenant != DEFAULTS_KEY and not _TENANT_RE.match(tenant):
        raise ValidationError("tenant", "a tenant name uses ASCII letters, digits, '-', '_' and '.' only")


BUILT_IN_DEFAULTS = TenantLimits(DEFAULTS_KEY)


class TenantBook:
    """Every tenant's limits, as last read from ``gnomon.tenants``."""

    def __init__(self, tenants_max: int = 1_000_000) -> None:
        self.tenants_max = tenants_max
        self._by_tenant: dict[str, TenantLimits] = {}
        # the defaults as each tenant without a record sees them (built on first use; every
        # apply clears it): a processor asks for a tenant's limits on every command
        self._derived: dict[str, TenantLimits] = {}

    DERIVED_MAX = 10_000

    def apply(self, tenant: str, limits: TenantLimits | None) -> None:
        """A record read from the topic: ``limits`` None is a tombstone (back to defaults)."""
        self._derived.clear()
        if limits is None:
            self._by_tenant.pop(tenant, None)
            return
        if limits.tenant != tenant:
            raise ValidationError("tenant", f"record key {tenant!r} names another tenant than its value "
                                            f"({limits.tenant!r})")
        if tenant not in self._by_tenant and len(self._by_tenant) >= self.tenants_max:
            raise ValidationError("tenant", f"more than {self.tenants_max} tenants configured")
        self._by_tenant[tenant] = limits

    def defaults(self) -> TenantLimits:
        return self._by_tenant.get(DEFAULTS_KEY, BUILT_IN_DEFAULTS)

    def limits(self, tenant: str) -> TenantLimits:
        """The tenant's own record, else the defaults record (with its name), else the
        built-in defaults."""
        own = self._by_tenant.get(tenant)
        if own is not None:
            return own
        if tenant == DEFAULTS_KEY:
            return self.defaults()
        derived = self._derived.get(tenant)
        if derived is None:
            d = self.defaults()
            derived = TenantLimits(tenant, **d.limits(), updated_at_ms=d.updated_at_ms)
            if len(self._derived) >= self.DERIVED_MAX:
                self._derived.clear()
            self._derived[tenant] = derived
        return derived

    def configured(self, tenant: str) -> bool:
        return tenant in self._by_tenant

    def all(self) -> list[TenantLimits]:
        """Every record, defaults first, then by tenant."""
        return sorted(self._by_tenant.values(), key=lambda t: (t.tenant != DEFAULTS_KEY, t.tenant))
