"""One call of a tenant's alert webhook, guarded and signed like an HTTP target.

The URL is the tenant's: it goes through the SSRF guard the workers use too
(``gnomon.outbound.http.pin``, under the alerter's ``HttpPolicy``) and the
connection is pinned to the address the guard checked. No redirects are followed (a 3xx
is a failed call). The body is the alert as JSON; the request carries
``Idempotency-Key: <alert key>`` and, with the tenant's ``http-signing-key`` secret on
the alerter's host, ``X-Gnomon-Timestamp`` and ``X-Gnomon-Signature`` computed by
``gnomon.outbound.http.sign`` (a receiver verifies them with ``verify_signature``, as for HTTP
targets). 2xx is delivered; anything else raises ``AlertDeliveryError``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

import httpx

from gnomon.core.alerts import Alert
from gnomon.core.clock import ms_to_iso
from gnomon.core.errors import InfraError
from gnomon.outbound.http import (
    CallAborted,
    HttpPolicy,
    pin,
    redact_text,
    redact_url,
    sign,
    url_secrets,
    within_deadline,
)
from gnomon.outbound.netguard import Resolver, TargetRefused, system_resolver
from gnomon.outbound.secrets import SecretStore

log = logging.getLogger("gnomon.alerts")

RESPONSE_MAX_BYTES = 1024


class AlertDeliveryError(InfraError):
    """A webhook call that did not deliver the alert (refused, transport error, not 2xx)."""


def alert_json(alert: Alert) -> dict[str, Any]:
    """The body of the webhook call (camelCase, times as ISO-8601 UTC)."""

    def iso(ms: int | None) -> str | None:
        return None if ms is None else ms_to_iso(ms)

    doc: dict[str, Any] = {
        "kind": alert.kind.value, "idempotencyKey": alert.key, "tenant": alert.tenant, "runId": alert.run_id,
        "jobId": alert.job_id, "jobName": alert.job_name, "status": alert.status, "slot": iso(alert.slot_ms),
        "startAt": iso(alert.start_at_ms), "startedAt": iso(alert.started_at_ms), "attempts": alert.attempts,
        "reason": alert.reason, "error": alert.error, "at": iso(alert.at_ms),
    }
    if alert.lag_ms is not None:
        doc["startLagS"] = round(alert.lag_ms / 1000, 3)
        doc["lateThresholdS"] = alert.threshold_s
    if alert.skipped_from_ms is not None or alert.kind.value == "skipped":
        doc["skippedFrom"] = iso(alert.skipped_from_ms)
        doc["skippedCount"] = alert.skipped_count
    return doc


class AlertSender:
    def __init__(self, policy: HttpPolicy | None = None, secrets: SecretStore | None = None,
                 resolver: Resolver = system_resolver, clock_s: Callable[[], float] = time.time) -> None:
        self.policy = policy or HttpPolicy()
        self.secrets = secrets
        self.resolver = resolver
        self.clock_s = clock_s
        self._tls = httpx.create_ssl_context()
        self._unsigned_warned: set[str] = set()

    def body(self, alert: Alert) -> bytes:
        return json.dumps(alert_json(alert), ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()

    def headers(self, alert: Alert, body: bytes) -> dict[str, str]:
        headers = {
            "Content-Type": "application/json",
            "Accept-Encoding": "identity",
            "Idempotency-Key": alert.key,
            "X-Gnomon-Alert": alert.kind.value,
            "X-Gnomon-Run-Id": alert.run_id,
            "X-Gnomon-Job-Id": alert.job_id,
            "X-Gnomon-Tenant": alert.tenant,
        }
        key = self.secrets.signing_key(alert.tenant) if self.secrets is not None else None
        if key is None:
            if alert.tenant not in self._unsigned_warned:
                self._unsigned_warned.add(alert.tenant)
                log.warning("alerts of tenant %s are unsigned: no http-signing-key secret on this host",
                            alert.tenant)
            return headers
        timestamp = str(int(self.clock_s()))
        return {**headers, "X-Gnomon-Timestamp": timestamp, "X-Gnomon-Signature": sign(key, timestamp, body)}

    def send(self, alert: Alert, url: str, timeout_s: float) -> int:
        """POST ``alert`` to ``url``; the HTTP status on 2xx, else ``AlertDeliveryError``.
        ``timeout_s`` bounds the whole call (``within_deadline``), not each read: a server
        trickling its answer cannot hold a delivery place."""
        secrets = url_secrets(url)
        body = self.body(alert)
        headers = self.headers(alert, body)
        deadline = time.monotonic() + timeout_s

        def call(on_client: Callable[[httpx.Client], None]) -> int:
            pinned = pin(httpx.URL(url), self.policy, self.resolver)
            with httpx.Client(verify=self._tls, trust_env=False, follow_redirects=False, timeout=timeout_s) as client:
                on_client(client)
                with client.stream("POST", pinned.url, content=body, headers={**headers, **pinned.headers},
                                   extensions=pinned.extensions) as resp:
                    seen = 0
                    for chunk in resp.iter_raw():  # read a little of the answer, never all of it
                        seen += len(chunk)
                        if seen >= RESPONSE_MAX_BYTES or time.monotonic() > deadline:
                            break
                    return resp.status_code

        try:
            status = within_deadline(call, timeout_s, name=f"alert-{alert.key}")
        except CallAborted:
            raise AlertDeliveryError(f"no complete answer from {redact_url(url)} within {timeout_s:g}s") from None
        except TargetRefused as exc:
            raise AlertDeliveryError(redact_text(f"webhook refused: {exc}", secrets)) from None
        except (httpx.HTTPError, httpx.InvalidURL, ValueError) as exc:
            raise AlertDeliveryError(redact_text(f"{type(exc).__name__}: {exc}", secrets)) from None
        if not 200 <= status < 300:
            raise AlertDeliveryError(f"HTTP {status} from {redact_url(url)}")
        return status
