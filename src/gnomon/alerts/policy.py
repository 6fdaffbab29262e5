"""Where alert webhooks may connect: the SSRF guard's exceptions for the alerter and the
API's early check. ``GNOMON_ALERT_ALLOWED_CIDRS`` (comma-separated networks, e.g.
``127.0.0.1/32`` for a test receiver) opens exactly those; everything non-public stays
refused otherwise, as for HTTP targets."""

from __future__ import annotations

import os

from gnomon.outbound.netguard import IPNetwork, parse_networks

ALLOWED_CIDRS_ENV = "GNOMON_ALERT_ALLOWED_CIDRS"


def allowed_cidrs(raw: str | None = None) -> tuple[str, ...]:
    raw = os.environ.get(ALLOWED_CIDRS_ENV, "") if raw is None else raw
    return tuple(c.strip() for c in raw.split(",") if c.strip())


def allowed_networks(raw: str | None = None) -> tuple[IPNetwork, ...]:
    """The networks of ``raw`` (default: the environment); ValueError on a bad entry."""
    return parse_networks(allowed_cidrs(raw))
