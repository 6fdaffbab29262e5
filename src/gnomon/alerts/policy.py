"""Where alert webhooks may connect: the alerter's ``HttpPolicy`` and the API's early check
of a tenant's webhook URL, from the same environment so the two agree.

* ``GNOMON_ALERT_ALLOWED_CIDRS``: comma-separated networks (e.g. ``127.0.0.1/32`` for a
  test receiver) opened although not public; everything non-public stays refused
  otherwise, as for HTTP targets.
* ``GNOMON_ALERT_ALLOW_PLAIN_HTTP``: ``1`` lets webhooks use ``http://``; https only by
  default (an alert names runs and jobs, and carries the signature's timestamp).
* ``GNOMON_ALERT_ALLOWED_PORTS``: comma-separated ports or ranges (``443,8000-8999``);
  default https's ports, and 80 and 8080 too with plain http.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from gnomon.outbound.http import HttpPolicy
from gnomon.outbound.netguard import IPNetwork, parse_networks

ALLOWED_CIDRS_ENV = "GNOMON_ALERT_ALLOWED_CIDRS"
ALLOW_PLAIN_HTTP_ENV = "GNOMON_ALERT_ALLOW_PLAIN_HTTP"
ALLOWED_PORTS_ENV = "GNOMON_ALERT_ALLOWED_PORTS"


def _items(raw: str) -> tuple[str, ...]:
    return tuple(c.strip() for c in raw.split(",") if c.strip())


def allowed_cidrs(raw: str | None = None) -> tuple[str, ...]:
    return _items(os.environ.get(ALLOWED_CIDRS_ENV, "") if raw is None else raw)


def allowed_networks(raw: str | None = None) -> tuple[IPNetwork, ...]:
    """The networks of ``raw`` (default: the environment); ValueError on a bad entry."""
    return parse_networks(allowed_cidrs(raw))


def http_policy(cidrs: Sequence[str] | None = None, plain_http: bool | None = None,
                ports: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> HttpPolicy:
    """The webhooks' policy: each argument given wins over its variable (``env``, default
    the process's environment). ValueError on a bad network, flag or port."""
    env = os.environ if env is None else env
    flag = env.get(ALLOW_PLAIN_HTTP_ENV, "").strip().lower()
    if flag not in ("", "0", "1", "true", "false"):
        raise ValueError(f"{ALLOW_PLAIN_HTTP_ENV}: {flag!r} is not 1 or 0")
    return HttpPolicy(
        allowed_cidrs=tuple(cidrs) if cidrs else allowed_cidrs(env.get(ALLOWED_CIDRS_ENV, "")),
        allow_plain_http=plain_http if plain_http is not None else flag in ("1", "true"),
        allowed_ports=tuple(ports) if ports else _items(env.get(ALLOWED_PORTS_ENV, "")),
    )
