"""deploy/ against the code (promtool is not available here): every alerting rule has
a runbook section in docs/runbooks.md, and every series and label that the rules and
the Grafana dashboard read is one that a gnomon process exposes."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from gnomon.metrics.api import ApiMetrics
from gnomon.metrics.liveness import LivenessGauges
from gnomon.metrics.processor import ProcessorMetrics
from gnomon.metrics.projector import ProjectorMetrics
from gnomon.metrics.serve import DEFAULT_PORTS
from gnomon.metrics.worker import WorkerMetrics
from gnomon.topology import load_topology

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
SERIES = re.compile(r"\bgnomon_[a-z0-9_]+\b")
# a selector's label matchers: name{a="x", b=~"y"}
SELECTOR = re.compile(r"\b(gnomon_[a-z0-9_]+)\{([^}]*)\}")
MATCHER_LABEL = re.compile(r"([a-z_]+)\s*(?:=~|!~|!=|=)")
BY_CLAUSE = re.compile(r"\b(?:by|without|on|group_left|group_right)\s*\(([^)]*)\)")
TARGET_LABELS = {"job", "instance"}  # added by Prometheus to every scraped series
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"),
            "gaugehistogram": ("_bucket", "_gcount", "_gsum"), "info": ("_info",)}


def _labels_by_series(registry: CollectorRegistry) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for collector in list(registry._collector_to_names):  # (prometheus_client keeps this map)
        declared = set(getattr(collector, "_labelnames", ()))
        for fam in collector.collect():
            seen = {k for sample in fam.samples for k in sample.labels}
            if fam.type == "gaugehistogram":
                seen |= {"pool", "priority"}  # (its label set has no children before an observation)
            for suffix in SUFFIXES.get(fam.type, ("",)):
                out[fam.name + suffix] = declared | seen | TARGET_LABELS | ({"le"} if suffix == "_bucket" else set())
    return out


def _liveness() -> CollectorRegistry:
    """The processor's and the worker's liveness gauges (served beside their metrics)."""
    registry = CollectorRegistry()
    LivenessGauges(registry, "processor")
    return registry


@pytest.fixture(scope="module")
def exposed() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for registry in (ProcessorMetrics(load_topology(), "check").registry,
                     WorkerMetrics("default", "check", now_s=lambda: 0).registry,
                     ProjectorMetrics("gnomon-history").registry, ApiMetrics().registry, _liveness()):
        for name, labels in _labels_by_series(registry).items():
            out.setdefault(name, set()).update(labels)
    return out


def _check_expr(expr: str, exposed: dict[str, set[str]]) -> None:
    names = set(SERIES.findall(expr))
    assert names, f"no gnomon series in {expr!r}"
    unknown = names - exposed.keys()
    assert not unknown, f"{sorted(unknown)} are not exposed by any gnomon process: {expr!r}"
    for name, matchers in SELECTOR.findall(expr):
        for label in MATCHER_LABEL.findall(matchers):
            assert label in exposed[name], f"{name} has no label {label!r}: {expr!r}"
    known = set().union(*(exposed[n] for n in names))
    for clause in BY_CLAUSE.findall(expr):
        for label in (x.strip() for x in clause.split(",") if x.strip()):
            assert label in known, f"no series of {sorted(names)} has label {label!r}: {expr!r}"


def _rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load((DEPLOY / "alerts.yml").read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    out = set()
    for line in markdown.splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", title)))
    return out


def test_every_alert_has_a_runbook_section() -> None:
    rules = _rules()
    assert len(rules) >= 6
    names = [r["alert"] for r in rules]
    assert len(names) == len(set(names))
    for rule in rules:
        url = rule["annotations"]["runbook_url"]
        path, _, anchor = url.partition("#")
        doc = ROOT / path
        assert doc.is_file() and doc.parent == ROOT / "docs" and doc.name.startswith("runbook"), url
        assert anchor == rule["alert"].lower() and anchor in _anchors(doc.read_text()), url
        assert rule["labels"]["severity"] in ("page", "ticket") and rule["annotations"]["summary"]


def test_alert_expressions_read_series_the_code_exposes(exposed: dict[str, set[str]]) -> None:
    for rule in _rules():
        expr = rule["expr"]
        if expr.strip().startswith("up{"):
            assert re.search(r'job=~"gnomon-\(api\|processor\|projector\)"', expr), expr
            continue
        _check_expr(expr, exposed)


def test_the_objectives_each_have_an_alert() -> None:
    exprs = {r["alert"]: r["expr"] for r in _rules()}
    wanted = {"gnomon_start_lag_seconds_bucket", "gnomon_slots_skipped_total", "gnomon_dead_letters_total",
              "gnomon_consumer_lag_records", "gnomon_processor_partition_owned", "gnomon_lease_expiries_total"}
    assert wanted <= set().union(*(SERIES.findall(e) for e in exprs.values()))


def test_dashboard_panels_read_series_the_code_exposes(exposed: dict[str, set[str]]) -> None:
    dash = json.loads((DEPLOY / "grafana" / "gnomon-dashboard.json").read_text())
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    targets = [t for p in dash["panels"] for t in p.get("targets", [])]
    assert len(targets) >= 20
    for t in targets:
        _check_expr(t["expr"].replace("$__rate_interval", "5m"), exposed)
    for var in dash["templating"]["list"]:
        _check_expr(var["definition"], exposed)


def test_scrape_config_names_the_default_ports_and_the_rules() -> None:
    doc = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    assert doc["rule_files"] == ["alerts.yml"]
    targets = {job["job_name"]: [t for c in job["static_configs"] for t in c["targets"]]
               for job in doc["scrape_configs"]}
    assert targets["gnomon-api"] == ["127.0.0.1:8787"]
    for kind, port in DEFAULT_PORTS.items():
        assert targets[f"gnomon-{kind}"] == [f"127.0.0.1:{port}"]
