"""``gnomon status`` without I/O: parse scraped /metrics texts, sum them up, render one
screen, and name the targets (``$GNOMON_STATUS_TARGETS``). The CLI (``gnomon.cli.status``)
and the API's overload probe (``gnomon.ui.overload``) do the scraping."""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from gnomon.metrics.window import quantile


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


@dataclass(frozen=True)
class Scrape:
    """One target's /metrics: its samples, or why there are none."""

    url: str
    samples: tuple[Sample, ...] = ()
    error: str | None = None


def parse(text: str) -> tuple[Sample, ...]:
    """Samples of a Prometheus text exposition (ValueError if it is not one)."""
    out = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.append(Sample(s.name, dict(s.labels), float(s.value)))
    return tuple(out)


@dataclass
class ProcessorView:
    url: str
    instance_id: str
    partitions: list[int]
    standbys: int
    overload_window: float = 0.0  # normal/low runs allowed in flight
    overload_in_flight: int = 0
    overload_deferred: int = 0  # >0: overloaded (due jobs deferred in the last 2 s)
    overload_lag_s: float = 0.0


@dataclass
class WorkerView:
    url: str
    worker_id: str
    pool: str
    slots: int
    running: int
    staged: int


@dataclass
class Status:
    processors: list[ProcessorView] = field(default_factory=list)
    partitions_total: int | None = None
    unowned: list[int] = field(default_factory=list)
    workers: list[WorkerView] = field(default_factory=list)
    pools: dict[str, dict[str, float]] = field(default_factory=dict)  # pool -> live, free, staged, running, queued
    lag: dict[str, dict[str, float]] = field(default_factory=dict)  # group -> topic -> records
    start_lag: dict[str, dict[str, float | None]] = field(default_factory=dict)  # "pool/priority" | "all" -> p50..
    outcomes: dict[str, float] = field(default_factory=dict)
    dead_letters: float = 0.0
    projector: list[str] = field(default_factory=list)
    api: list[str] = field(default_factory=list)
    unreachable: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


TARGETS_ENV = "GNOMON_STATUS_TARGETS"  # comma-separated /metrics endpoints (host:port or URL)


def metrics_url(target: str) -> str:
    """``host:port`` or a URL, as the /metrics URL to scrape."""
    t = target.strip()
    if "://" not in t:
        t = "http://" + t
    return t if t.rstrip("/").endswith("/metrics") else t.rstrip("/") + "/metrics"


def env_targets() -> list[str]:
    """The targets named in ``$GNOMON_STATUS_TARGETS`` (none: [])."""
    return [t for t in os.environ.get(TARGETS_ENV, "").split(",") if t.strip()]


def _named(samples: Iterable[Sample], name: str) -> list[Sample]:
    return [s for s in samples if s.name == name]


def summarize(scrapes: Sequence[Scrape]) -> Status:
    st = Status()
    owned: set[int] = set()
    windows: dict[str, dict[float, float]] = defaultdict(lambda: defaultdict(float))  # key -> le -> count
    pools: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    live_seen: dict[str, float] = {}
    for sc in scrapes:
        if sc.error is not None:
            st.unreachable.append(f"{sc.url} ({sc.error})")
            continue
        s = sc.samples
        info = _named(s, "gnomon_processor_info")
        if info:
            parts = sorted(int(x.labels["partition"]) for x in _named(s, "gnomon_processor_partition_owned")
                           if x.value > 0)
            owned.update(parts)
            standbys = sum(x.value for x in _named(s, "gnomon_processor_standby_partitions"))
            view = ProcessorView(sc.url, info[0].labels.get("instance_id", "?"), parts, int(standbys))
            view.overload_window = sum(x.value for x in _named(s, "gnomon_overload_window_runs"))
            view.overload_in_flight = int(sum(x.value for x in _named(s, "gnomon_overload_in_flight_runs")))
            view.overload_deferred = int(sum(x.value for x in _named(s, "gnomon_overload_deferred_jobs")))
            view.overload_lag_s = sum(x.value for x in _named(s, "gnomon_overload_signal_lag_seconds"))
            st.processors.append(view)
            for x in _named(s, "gnomon_topology_partitions"):  # (after a grow, the largest count any knows)
                st.partitions_total = max(st.partitions_total or 0, int(x.value))
            for x in _named(s, "gnomon_workers_live"):  # every processor sees every worker: the most any saw
                live_seen[x.labels["pool"]] = max(live_seen.get(x.labels["pool"], 0), x.value)
            for metric, key in (("gnomon_worker_slots_free", "free"), ("gnomon_attempts_staged", "staged"),
                                ("gnomon_attempts_running", "running")):
                for x in _named(s, metric):
                    if key == "free":
                        pools[x.labels["pool"]][key] = max(pools[x.labels["pool"]][key], x.value)
                    else:
                        pools[x.labels["pool"]][key] += x.value
            for x in _named(s, "gnomon_queue_depth"):
                pools[x.labels["pool"]]["queued"] += x.value
            for x in _named(s, "gnomon_runs_finished_total"):
                st.outcomes[x.labels["outcome"]] = st.outcomes.get(x.labels["outcome"], 0.0) + x.value
            st.dead_letters += sum(x.value for x in _named(s, "gnomon_dead_letters_total"))
        winfo = _named(s, "gnomon_worker_info")
        if winfo:
            held = {x.labels["state"]: x.value for x in _named(s, "gnomon_worker_attempts")}
            slots = sum(x.value for x in _named(s, "gnomon_worker_slots"))
            st.workers.append(WorkerView(sc.url, winfo[0].labels.get("worker_id", "?"), winfo[0].labels.get("pool", "?"),
                                         int(slots), int(held.get("running", 0)), int(held.get("staged", 0))))
            for x in _named(s, "gnomon_start_lag_window_seconds_bucket"):
                le = float(x.labels["le"])
                for key in (f"{x.labels['pool']}/{x.labels['priority']}", "all"):
                    windows[key][le] += x.value
        if _named(s, "gnomon_projector_batches_total"):
            st.projector.append(sc.url)
        if _named(s, "gnomon_api_requests_in_flight"):
            st.api.append(sc.url)
        for metric, suffix in (("gnomon_consumer_lag_records", ""), ("gnomon_consumer_committed_lag_records",
                                                                     " (committed)")):
            for x in _named(s, metric):
                group = x.labels["group"] + suffix
                st.lag.setdefault(group, {}).setdefault(x.labels["topic"], 0.0)
                st.lag[group][x.labels["topic"]] += x.value
    for pool, live in live_seen.items():
        pools[pool]["live"] = live
    st.pools = {p: dict(v) for p, v in sorted(pools.items())}
    if st.partitions_total is not None:
        st.unowned = sorted(set(range(st.partitions_total)) - owned)
    for key, by_le in sorted(windows.items()):
        buckets = sorted(by_le.items())
        count = buckets[-1][1] if buckets else 0
        st.start_lag[key] = {"count": count, "p50": quantile(0.5, buckets), "p99": quantile(0.99, buckets)}
    return st


def _s(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v * 1000:.0f} ms" if v < 1 else f"{v:.2f} s"


def render(st: Status) -> list[str]:
    """The screen, as lines of text."""
    out: list[str] = []
    total = "?" if st.partitions_total is None else str(st.partitions_total)
    out.append(f"processors ({len(st.processors)}; partitions {total}, unowned: "
               f"{','.join(map(str, st.unowned)) if st.unowned else 'none'})")
    for p in sorted(st.processors, key=lambda p: p.instance_id):
        parts = ",".join(map(str, p.partitions)) or "none"
        out.append(f"  {p.instance_id:<20} partitions {parts:<24} standbys {p.standbys:<4} {p.url}")
        if p.overload_deferred:
            out.append(f"    OVERLOADED: {p.overload_deferred} due normal/low jobs deferred in the last 2 s; "
                       f"{p.overload_in_flight} normal/low runs in flight, room {p.overload_window:.0f}; urgent "
                       f"start lag p90 {p.overload_lag_s:.2f} s (high runs first; slots later than their "
                       "lateMaxS are recorded skipped, reason overload)")
    if not st.processors:
        out.append("  none answered")
    out.append(f"workers ({len(st.workers)} answered)")
    for w in sorted(st.workers, key=lambda w: w.worker_id):
        out.append(f"  {w.worker_id:<20} pool {w.pool:<10} running {w.running}/{w.slots}  staged {w.staged}  {w.url}")
    for pool, v in st.pools.items():
        out.append(f"  pool {pool:<10} live {int(v.get('live', 0))}  free slots {int(v.get('free', 0))}  "
                   f"staged {int(v.get('staged', 0))}  running {int(v.get('running', 0))}  "
                   f"waiting {int(v.get('queued', 0))}")
    out.append("start lag, last minute")
    if not st.start_lag:
        out.append("  no attempts started")
    for key, q in st.start_lag.items():
        out.append(f"  {key:<20} p50 {_s(q['p50']):>9}  p99 {_s(q['p99']):>9}  ({int(q['count'] or 0)} starts)")
    out.append("consumer lag (records)")
    if not st.lag:
        out.append("  none reported")
    for group, topics in sorted(st.lag.items()):
        out.append(f"  {group:<20} " + "  ".join(f"{t} {int(n)}" for t, n in sorted(topics.items())))
    outcomes = "  ".join(f"{k} {int(v)}" for k, v in sorted(st.outcomes.items()))
    out.append(f"runs since the processors started: {outcomes or '-'}; dead letters {int(st.dead_letters)}")
    out.append(f"projector: {', '.join(st.projector) or 'none answered'}; api: {', '.join(st.api) or 'none answered'}")
    for u in st.unreachable:
        out.append(f"unreachable: {u}")
    return out
