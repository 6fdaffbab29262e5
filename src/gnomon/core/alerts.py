"""Alerts as data: a tenant's alert config, and which run transitions alert it.

A tenant sets where its alerts go (``PUT /v1/alerts``, ``gnomon alerts set``): an
``AlertConfig`` on the compacted topic ``gnomon.alert-configs`` (key: the tenant; a
tombstone turns its alerts off). The alerter (``gnomon alerter``, ``gnomon.alerts``)
reads the run ledger and, for each run state it reads, asks :func:`decide` what to send:

* ``dead_letter``: the run became FAILED (retries exhausted, in the dead letters); again
  after each replay that fails again (``replays`` is in the key);
* ``skipped``: the run became SKIPPED (catch-up, paused, overlap, withdrawn...; not a
  slot on a date of the job's exclusion calendars, which the user asked for), with
  the reason and the range (``skipped_from_ms``, ``skipped_count``); again after a
  backfill reopened it and it is skipped again (``reopens`` is in the key);
* ``late``: the run's first attempt started more than the threshold after the run's
  start time (``started_at_ms - not_before_ms``, as ``startLagS`` in the API). The
  threshold is the job's ``alert_late_s``, else the config's ``late_s``; neither set:
  no late alerts for that job.

Every alert carries an idempotency key, ``<run_id>:<kind>[:<n>]``: the same transition
always has the same key, so a receiver drops what at-least-once delivery repeats.
:func:`decide` is pure: the previous state the alerter saw of the run (``Seen``, or None
if it saw none) and the new one. :class:`AlertMemory` is that memory, bounded, so a
record read twice (a replay after a crash or a rebalance) does not alert twice within an
alerter's lifetime; after a restart at most the records after the last commit alert
again, with the same keys.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass
from enum import StrEnum
from urllib.parse import urlsplit

from gnomon.core.calendars import is_calendar_skip
from gnomon.core.errors import ValidationError
from gnomon.core.runs import RunState, RunStatus
from gnomon.core.tenants import check_tenant_name
from gnomon.core.validation import check_late_s

URL_MAX_CHARS = 2048
_CONTROL_RE = re.compile(r"[\x00-\x20\x7f-\x9f]")


class AlertKind(StrEnum):
    DEAD_LETTER = "dead_letter"
    LATE = "late"
    SKIPPED = "skipped"


ALL_KINDS: tuple[str, ...] = tuple(k.value for k in AlertKind)


def check_url(url: object, field: str = "url") -> str:
    """An absolute http(s) URL with a host, no fragment, no whitespace or controls;
    where it may connect is the SSRF guard's business, at every call."""
    if not isinstance(url, str) or not url or len(url) > URL_MAX_CHARS:
        raise ValidationError(field, f"must be an http(s) URL of at most {URL_MAX_CHARS} characters")
    if _CONTROL_RE.search(url):
        raise ValidationError(field, "must not contain spaces or control characters")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises ValueError on a bad port)
    except ValueError as exc:
        raise ValidationError(field, f"is not a URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValidationError(field, f"must be an http(s) URL with a host, got {url!r}")
    if parts.fragment:
        raise ValidationError(field, "must not have a #fragment")
    return url


@dataclass(frozen=True)
class AlertConfig:
    """Value of ``gnomon.alert-configs``. The signing key is not here: the alerter signs
    with the tenant's ``http-signing-key`` secret on its host, as workers sign HTTP targets."""

    tenant: str
    url: str
    kinds: tuple[str, ...] = ALL_KINDS
    late_s: int | None = None  # default late threshold for jobs without alert_late_s
    updated_at_ms: int = 0

    def __post_init__(self) -> None:
        check_tenant_name(self.tenant)
        if self.tenant == "*":
            raise ValidationError("tenant", "alerts are set per tenant, not for '*'")
        check_url(self.url)
        if not isinstance(self.kinds, tuple) or not all(k in ALL_KINDS for k in self.kinds):
            raise ValidationError("kinds", f"must be a list of {', '.join(ALL_KINDS)}")
        if len(set(self.kinds)) != len(self.kinds):
            raise ValidationError("kinds", "must not repeat a kind")
        check_late_s(self.late_s, "lateS")

    def wants(self, kind: AlertKind) -> bool:
        return kind.value in self.kinds


class AlertBook:
    """Every tenant's alert config, as last read from ``gnomon.alert-configs``."""

    def __init__(self, tenants_max: int = 1_000_000) -> None:
        self.tenants_max = tenants_max
        self._by_tenant: dict[str, AlertConfig] = {}

    def apply(self, tenant: str, config: AlertConfig | None) -> None:
        """A record read from the topic; ``config`` None is a tombstone (alerts off)."""
        if config is None:
            self._by_tenant.pop(tenant, None)
            return
        if config.tenant != tenant:
            raise ValidationError("tenant", f"record key {tenant!r} names another tenant than its value "
                                            f"({config.tenant!r})")
        if tenant not in self._by_tenant and len(self._by_tenant) >= self.tenants_max:
            raise ValidationError("tenant", f"more than {self.tenants_max} tenants with alerts")
        self._by_tenant[tenant] = config

    def get(self, tenant: str) -> AlertConfig | None:
        return self._by_tenant.get(tenant)

    def __len__(self) -> int:
        return len(self._by_tenant)


@dataclass(frozen=True)
class Alert:
    kind: AlertKind
    key: str  # idempotency key: the same transition, the same key
    tenant: str
    run_id: str
    job_id: str
    job_name: str
    status: str
    slot_ms: int
    start_at_ms: int
    at_ms: int  # when the alerter decided it
    reason: str | None = None
    error: str | None = None
    attempts: int = 0
    started_at_ms: int | None = None
    lag_ms: int | None = None  # late: started_at - start_at
    threshold_s: int | None = None  # late: the threshold it broke
    skipped_from_ms: int | None = None
    skipped_count: int = 1


@dataclass(frozen=True)
class Seen:
    """What the alerter remembers of a run: enough to tell a transition from a repeat."""

    status: RunStatus
    started: bool
    replays: int
    reopens: int

    @staticmethod
    def of(state: RunState) -> Seen:
        return Seen(state.status, state.started_at_ms is not None, state.replays, state.reopens)


def late_threshold_s(state: RunState, config: AlertConfig) -> int | None:
    return state.spec.alert_late_s if state.spec.alert_late_s is not None else config.late_s


def decide(prev: Seen | None, new: RunState, config: AlertConfig | None, now_ms: int) -> list[Alert]:
    """The alerts ``new`` raises, given what was seen of the run before (None: nothing).
    No config (the tenant has none), or one for another tenant: none."""
    if config is None or config.tenant != new.tenant:
        return []
    out: list[Alert] = []

    def alert(kind: AlertKind, key: str, **extra: object) -> Alert:
        return Alert(kind=kind, key=key, tenant=new.tenant, run_id=new.run_id, job_id=new.job_id,
                     job_name=new.spec.name, status=new.status.value, slot_ms=new.slot_ms,
                     start_at_ms=new.not_before_ms, at_ms=now_ms, attempts=new.attempt,
                     started_at_ms=new.started_at_ms, **extra)  # type: ignore[arg-type]

    started_now = new.started_at_ms is not None and (prev is None or not prev.started)
    threshold = late_threshold_s(new, config)
    if started_now and threshold is not None and config.wants(AlertKind.LATE):
        assert new.started_at_ms is not None
        lag_ms = new.started_at_ms - new.not_before_ms
        if lag_ms > threshold * 1000:
            out.append(alert(AlertKind.LATE, f"{new.run_id}:late", lag_ms=lag_ms, threshold_s=threshold))
    if (new.status is RunStatus.FAILED and config.wants(AlertKind.DEAD_LETTER)
            and (prev is None or prev.status is not RunStatus.FAILED or prev.replays != new.replays)):
        out.append(alert(AlertKind.DEAD_LETTER, f"{new.run_id}:dead_letter:{new.replays}",
                         reason=new.reason, error=new.error))
    if (new.status is RunStatus.SKIPPED and config.wants(AlertKind.SKIPPED) and not is_calendar_skip(new.reason)
            and (prev is None or prev.status is not RunStatus.SKIPPED or prev.reopens != new.reopens)):
        out.append(alert(AlertKind.SKIPPED, f"{new.run_id}:skipped:{new.reopens}", reason=new.reason,
                         skipped_from_ms=new.skipped_from_ms, skipped_count=new.skipped_count))
    return out


class AlertMemory:
    """The latest ``Seen`` of at most ``runs_max`` runs (least recently seen forgotten
    first), and the keys of the alerts already raised for them: ``observe`` returns only
    alerts not raised before, so a record read twice alerts once."""

    def __init__(self, runs_max: int = 100_000) -> None:
        if runs_max < 1:
            raise ValueError("runs_max must be >= 1")
        self.runs_max = runs_max
        self._runs: OrderedDict[str, tuple[Seen, frozenset[str]]] = OrderedDict()

    def observe(self, state: RunState, config: AlertConfig | None, now_ms: int) -> list[Alert]:
        prev, keys = self._runs.pop(state.run_id, (None, frozenset()))
        alerts = [a for a in decide(prev, state, config, now_ms) if a.key not in keys]
        self._runs[state.run_id] = (Seen.of(state), keys | {a.key for a in alerts})
        while len(self._runs) > self.runs_max:
            self._runs.popitem(last=False)
        return alerts

    def forget(self, run_id: str) -> None:
        """The run left the ledger (a tombstone)."""
        self._runs.pop(run_id, None)

    def __len__(self) -> int:
        return len(self._runs)


@dataclass(frozen=True)
class DeliveryPolicy:
    """How an alert is delivered: each call at most ``timeout_s``; after a failure (not
    2xx, a transport error, a refused destination) again after ``backoff_base_s``,
    doubling, at most ``backoff_cap_s``, ``attempts_max`` calls in all; then the alert is
    given up (logged and counted). At most ``in_flight_max`` alerts are being delivered
    at once; the ledger consumer waits for a free place, never for one webhook.

    One tenant holds at most ``tenant_in_flight_max`` of those places (all of them if that
    is more than ``in_flight_max``), so a tenant whose
    webhook hangs cannot delay the others' alerts: its further alerts wait in a backlog of
    at most ``tenant_backlog_max`` (delivered in order as its places free up), and an
    alert finding that backlog full is given up at once (logged and counted)."""

    attempts_max: int = 5
    backoff_base_s: float = 1.0
    backoff_cap_s: float = 30.0
    timeout_s: float = 5.0
    in_flight_max: int = 32
    tenant_in_flight_max: int = 8
    tenant_backlog_max: int = 1000

    def __post_init__(self) -> None:
        if self.attempts_max < 1 or self.in_flight_max < 1:
            raise ValueError("attempts_max and in_flight_max must be >= 1")
        if self.tenant_in_flight_max < 1 or self.tenant_backlog_max < 0:
            raise ValueError("need tenant_in_flight_max >= 1 and tenant_backlog_max >= 0")
        if not 0 <= self.backoff_base_s <= self.backoff_cap_s or self.timeout_s <= 0:
            raise ValueError("need 0 <= backoff_base_s <= backoff_cap_s and timeout_s > 0")

    def delay_s(self, failures: int) -> float:
        """The wait after the ``failures``-th failed call (1-based)."""
        if failures < 1:
            raise ValueError("failures must be >= 1")
        return min(self.backoff_cap_s, self.backoff_base_s * float(2 ** min(failures - 1, 60)))

    def worst_case_s(self) -> float:
        """The longest one alert can take, every call timing out."""
        return self.attempts_max * self.timeout_s + sum(self.delay_s(n) for n in range(1, self.attempts_max))
