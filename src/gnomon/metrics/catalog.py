"""Every series name gnomon's processes expose (for the checks of deploy/'s alerting
rules and dashboard against the code): built from the registries themselves."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

_SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_count", "_sum"),
    "gaugehistogram": ("_bucket", "_gcount", "_gsum"),
    "info": ("_info",),
    "summary": ("_count", "_sum"),
}


def series_names(registry: CollectorRegistry) -> set[str]:
    out: set[str] = set()
    for family in registry.collect():
        for suffix in _SUFFIXES.get(family.type, ("",)):
            out.add(family.name + suffix)
    return out


def all_series_names() -> dict[str, set[str]]:
    """Process kind -> the series names its registry exposes."""
    from gnomon.metrics.api import ApiMetrics
    from gnomon.metrics.liveness import LivenessGauges
    from gnomon.metrics.processor import ProcessorMetrics
    from gnomon.metrics.projector import ProjectorMetrics
    from gnomon.metrics.worker import WorkerMetrics
    from gnomon.topology import load_topology

    processor = ProcessorMetrics(load_topology(), "catalog").registry
    worker = WorkerMetrics("default", "catalog", now_s=lambda: 0).registry
    LivenessGauges(processor, "processor")  # registered by the CLI's watchdog (gnomon.metrics.liveness)
    LivenessGauges(worker, "worker")
    return {
        "processor": series_names(processor),
        "worker": series_names(worker),
        "projector": series_names(ProjectorMetrics("gnomon-history").registry),
        "api": series_names(ApiMetrics().registry),
    }
