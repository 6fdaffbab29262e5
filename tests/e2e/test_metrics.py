"""The metrics on a live stack: after a few runs (some succeed, one fails its retry and
becomes a dead letter), each process's /metrics has what the dashboards and alerts read
(deploy/), with bounded labels only; ``gnomon status`` shows the same essentials."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time

import httpx
import pytest
from harness import API_PORT, METRICS_PORTS, Stack, wait_for

from gnomon.client import ApiError
from gnomon.core.clock import ms_to_iso
from gnomon.metrics.status import Sample, parse
from gnomon.topology import load_topology

pytestmark = pytest.mark.integration

ID_LABELS = {"job_id", "run_id", "tenant", "job", "run"}


def scrape(url: str) -> tuple[Sample, ...]:
    r = httpx.get(url, timeout=5)
    assert r.status_code == 200, (url, r.status_code)
    assert r.headers["content-type"].startswith("text/plain"), r.headers
    return parse(r.text)


def value(samples: tuple[Sample, ...], name: str, **labels: str) -> float:
    return sum(s.value for s in samples if s.name == name and labels.items() <= s.labels.items())


def urls() -> dict[str, str]:
    out = {kind: f"http://127.0.0.1:{port}/metrics" for kind, port in METRICS_PORTS.items()}
    out["api"] = f"http://127.0.0.1:{API_PORT}/metrics"
    return out


def test_every_process_exposes_its_metrics_after_a_few_runs(stack: Stack) -> None:
    c = stack.client
    tag = secrets.token_hex(3)
    every_s = c.create_job({"name": f"e2e-metrics-{tag}", "schedule": "* * * * * *", "priority": "high",
                            "target": {"type": "command", "argv": ["true"]}, "timeoutS": 10})["id"]
    failing = c.create_job({"name": f"e2e-metrics-fail-{tag}", "runAt": ms_to_iso(int(time.time() * 1000) + 3000),
                            "target": {"type": "command", "argv": ["sh", "-c", "exit 3"]}, "timeoutS": 10,
                            "retry": {"max": 2, "backoffS": 1}})["id"]
    with pytest.raises(ApiError):
        c.get_job("job_does_not_exist")  # a 404 on a templated route

    def succeeded() -> int:
        try:
            return sum(r["status"] == "succeeded" for r in c.list_runs(every_s, limit=50)["items"])
        except ApiError:
            return 0

    def dead() -> bool:
        try:
            return any(r["status"] == "failed" for r in c.list_runs(failing, limit=5)["items"])
        except ApiError:
            return False

    wait_for(lambda: succeeded() >= 4, 60, "4 succeeded runs of the per-second job")
    wait_for(dead, 60, "the failing job's run to exhaust its 2 attempts")
    c.pause(every_s)  # its runs staged ahead are withdrawn: skipped, reason paused
    time.sleep(6)  # the processor samples its gauges every 5 s; the projector its lag too

    m = {kind: scrape(url) for kind, url in urls().items()}
    proc, worker, proj, api = m["processor"], m["worker"], m["projector"], m["api"]

    # start lag, measured by the worker when the handler started: by pool and priority
    assert value(worker, "gnomon_start_lag_seconds_count", pool="default", priority="high") >= 4
    assert value(worker, "gnomon_start_lag_seconds_bucket", pool="default", priority="high", le="+Inf") >= 4
    assert value(worker, "gnomon_start_lag_window_seconds_bucket", pool="default", priority="high", le="+Inf") >= 1
    assert value(worker, "gnomon_worker_attempts_finished_total", outcome="succeeded") >= 4
    assert value(worker, "gnomon_worker_attempts_finished_total", outcome="failed") >= 2
    assert value(worker, "gnomon_consumer_lag_records", group="gnomon-worker-inbox") >= 0
    assert any(s.name == "gnomon_consumer_lag_records" for s in worker)

    # runs by outcome, retries and dead letters, counted by the processor from its commits
    assert value(proc, "gnomon_runs_finished_total", outcome="succeeded", pool="default", priority="high") >= 4
    assert value(proc, "gnomon_runs_finished_total", outcome="failed", pool="default") >= 1
    assert value(proc, "gnomon_retries_total", pool="default") >= 1
    assert value(proc, "gnomon_dead_letters_total", pool="default") >= 1
    topo = load_topology()
    assert value(proc, "gnomon_topology_partitions") == topo.partitions
    owned = [s for s in proc if s.name == "gnomon_processor_partition_owned" and s.value == 1]
    assert owned, "the session processor owns partitions"
    for t in (topo.job_commands, topo.run_events):
        assert any(s.name == "gnomon_consumer_lag_records" and s.labels == {"group": "gnomon-processor", "topic": t}
                   for s in proc), t
    assert any(s.name == "gnomon_consumer_committed_lag_records"
               and s.labels == {"group": "gnomon-history", "topic": topo.runs} for s in proc)
    for pool in topo.pools:
        for prio in topo.priorities:
            assert any(s.name == "gnomon_queue_depth" and s.labels == {"pool": pool, "priority": prio} for s in proc)
    assert value(proc, "gnomon_workers_live", pool="default") >= 1
    assert any(s.name == "gnomon_attempts_staged" for s in proc) and any(s.name == "gnomon_attempts_running"
                                                                         for s in proc)
    assert value(proc, "gnomon_partition_restore_seconds_count") >= len(owned)
    assert any(s.name == "gnomon_lease_expiries_total" for s in proc)
    assert value(proc, "gnomon_slots_skipped_total", reason="paused", pool="default") >= 1

    # the projector's group lag, and what it wrote
    assert any(s.name == "gnomon_consumer_lag_records" and s.labels.get("group") == "gnomon-history" for s in proj)
    assert value(proj, "gnomon_projector_batches_total") >= 1

    # API: requests by route template and status code, and their latency
    assert value(api, "gnomon_api_requests_total", method="POST", route="/v1/jobs", status="201") >= 2
    assert value(api, "gnomon_api_requests_total", method="GET", route="/v1/jobs/{job_id}", status="404") >= 1
    assert value(api, "gnomon_api_requests_total", route="/v1/jobs/{job_id}/runs", status="200") >= 1
    assert value(api, "gnomon_api_request_duration_seconds_count", method="POST", route="/v1/jobs") >= 2

    # bounded labels: no id label, and no job id in any label value
    for kind, samples in m.items():
        for s in samples:
            assert not ID_LABELS & s.labels.keys(), (kind, s)
            assert not any(every_s in v or failing in v for v in s.labels.values()), (kind, s)

    # gnomon status: the same essentials, from the same endpoints
    env = {**os.environ, "GNOMON_STATUS_TARGETS": ",".join(urls().values())}
    out = subprocess.run([sys.executable, "-m", "gnomon.cli.main", "status"], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    print(text)
    assert "e2e-0" in text and "e2e-w1" in text, text
    assert "default/high" in text and "p99" in text, text
    assert "gnomon-processor" in text and "gnomon-history" in text, text
    c.delete(every_s)
    c.delete(failing)
