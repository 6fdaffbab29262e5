"""gnomon.metrics: the pure parts (windowed histogram, quantiles from buckets, bounded
reason labels, the status screen from parsed samples), the API middleware on a real
app, and the processor's and worker's counts checked against what the real loops
committed on the in-memory log (gnomon.sim), aborted transactions included."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client import generate_latest

from gnomon.api.app import CommandSink, create_app
from gnomon.core import runs as R
from gnomon.core.clock import FakeClock
from gnomon.history.memory import InMemoryHistoryStore
from gnomon.metrics import START_LAG_BUCKETS_S
from gnomon.metrics.processor import ProcessorMetrics
from gnomon.metrics.reasons import SKIP_REASONS, expiry_kind, skip_reason
from gnomon.metrics.serve import DEFAULT_PORTS, PORT_SPAN, candidate_ports
from gnomon.metrics.status import Sample, Scrape, parse, render, summarize
from gnomon.metrics.window import WindowedHistogram, quantile
from gnomon.metrics.worker import WorkerMetrics
from gnomon.sim import SimCluster, SimFaults
from gnomon.testing import DecidingProducer, ListProducer
from gnomon.topology import load_topology
from gnomon.web.auth import Authenticator

INF = float("inf")


def value(samples: tuple[Sample, ...], name: str, **labels: str) -> float:
    return sum(s.value for s in samples if s.name == name and labels.items() <= s.labels.items())


# ---- pure ------------------------------------------------------------------------------------


def test_quantile_interpolates_within_a_bucket_like_histogram_quantile() -> None:
    buckets = [(0.1, 50.0), (1.0, 90.0), (10.0, 100.0), (INF, 100.0)]
    assert quantile(0.5, buckets) == pytest.approx(0.1)  # rank 50 at the first bucket's top
    assert quantile(0.25, buckets) == pytest.approx(0.05)
    assert quantile(0.7, buckets) == pytest.approx(0.1 + 0.9 * 20 / 40)
    assert quantile(0.99, buckets) == pytest.approx(1.0 + 9.0 * 9 / 10)
    assert quantile(0.99, [(1.0, 0.0), (INF, 0.0)]) is None
    assert quantile(0.99, [(1.0, 1.0), (INF, 10.0)]) == 1.0  # in +Inf: the last finite bound
    assert quantile(1.5, buckets) is None


def test_windowed_histogram_forgets_what_left_the_window() -> None:
    h = WindowedHistogram((0.1, 1.0), window_s=60)
    h.observe(0.05, 1_000)
    h.observe(0.5, 1_030)
    h.observe(5.0, 1_059)
    buckets, count, total = h.buckets(1_059)
    assert buckets == [(0.1, 1), (1.0, 2), (INF, 3)] and count == 3 and total == pytest.approx(5.55)
    buckets, count, _ = h.buckets(1_060)  # the first observation is 60 s old: gone
    assert buckets == [(0.1, 0), (1.0, 1), (INF, 2)] and count == 2
    h.observe(0.01, 1_120)  # the same ring slot as second 1_060 (and 1_000): reused, not added to
    assert h.buckets(1_120)[0] == [(0.1, 1), (1.0, 1), (INF, 1)]
    assert h.buckets(2_000)[1] == 0


def test_skip_reasons_from_the_cores_texts_are_bounded() -> None:
    assert skip_reason("paused") == "paused"
    assert skip_reason("job deleted before the slot") == "deleted"
    assert skip_reason("schedule changed before the slot") == "schedule_changed"
    assert skip_reason("overlap: job_1@2026-01-01T00:00:00Z is still running") == "overlap"
    assert skip_reason("catch-up policy skip") == "catch_up"
    assert skip_reason("something new") == "other" and skip_reason(None) == "other"
    assert {skip_reason(x) for x in ("paused", "x", "overlap: a")} <= set(SKIP_REASONS)
    assert expiry_kind("lease lost (no heartbeat)") == "lease"
    assert expiry_kind("deadline passed (timeout + grace)") == "deadline"
    assert expiry_kind("failed") is None


def test_metrics_ports_default_to_a_range_per_kind_that_do_not_overlap() -> None:
    assert candidate_ports("worker", 0) == [] and candidate_ports("worker", 9999) == [9999]
    ranges = [set(candidate_ports(kind, None)) for kind in DEFAULT_PORTS]
    assert sum(map(len, ranges)) == len(set().union(*ranges)) == sum(PORT_SPAN.values())
    assert 8787 not in set().union(*ranges)


def test_status_screen_from_scraped_samples() -> None:
    topo = load_topology()
    procs = []
    for name, parts in (("p-a", [0, 1, 2]), ("p-b", [3, 4])):
        m = ProcessorMetrics(topo, name)
        for p in parts:
            m.partition_owned.labels(str(p)).set(1)
        m.consumer_lag.labels("gnomon-processor", topo.run_events).set(7)
        m.workers_live.labels("default").set(2)
        m.dead_letters.labels("default").inc(3)
        m.runs_finished.labels("succeeded", "default", "high").inc(10)
        procs.append(m)
    clock = FakeClock(1_000_000)
    w = WorkerMetrics("default", "w-1", now_s=lambda: clock.now_ms() // 1000)
    for lag_ms in range(0, 100):  # 0..99 ms: p50 about 50 ms, p99 about 99 ms
        w.attempt_started("high", 1, 10_000 + lag_ms, 10_000)
    w.attempt_started("high", 2, 90_000, 10_000)  # a retry: not a start lag
    w.held(running=3, staged=4, due=0, slots=8)
    texts = [generate_latest(m.registry).decode() for m in (*procs, w)]
    scrapes = [Scrape(f"http://h:{i}/metrics", parse(t)) for i, t in enumerate(texts)]
    st = summarize([*scrapes, Scrape("http://down:1/metrics", error="refused")])
    assert [(p.instance_id, p.partitions) for p in st.processors] == [("p-a", [0, 1, 2]), ("p-b", [3, 4])]
    assert st.partitions_total == topo.partitions
    assert st.unowned == list(range(5, topo.partitions))
    assert [(x.worker_id, x.running, x.staged, x.slots) for x in st.workers] == [("w-1", 3, 4, 8)]
    assert st.lag["gnomon-processor"][topo.run_events] == 14  # summed over the processors' partitions
    assert st.pools["default"]["live"] == 2  # both see the same workers: not summed
    q = st.start_lag["default/high"]
    assert q["count"] == 100
    assert q["p50"] is not None and 0.025 <= q["p50"] <= 0.05
    assert q["p99"] is not None and 0.05 <= q["p99"] <= 0.1
    assert st.dead_letters == 6 and st.outcomes["succeeded"] == 20
    screen = "\n".join(render(st))
    assert "p-a" in screen and "partitions 0,1,2" in screen and "w-1" in screen
    assert f"unowned: {','.join(map(str, range(5, topo.partitions)))}" in screen
    assert "default/high" in screen and "p99" in screen and "gnomon-processor" in screen
    assert "unreachable: http://down:1/metrics (refused)" in screen
    # after a grow, one processor places jobs by 16: the count is the largest any knows
    procs[1].partitions.set(2 * topo.partitions)
    grown = summarize([Scrape(f"http://h:{i}/metrics", parse(generate_latest(m.registry).decode()))
                       for i, m in enumerate(procs)])
    assert grown.partitions_total == 2 * topo.partitions
    assert grown.unowned == list(range(5, 2 * topo.partitions))
    clock.advance(61_000)  # a minute later nothing started: the window is empty
    st = summarize([Scrape("w", parse(generate_latest(w.registry).decode()))])
    assert st.start_lag["default/high"]["count"] == 0 and st.start_lag["default/high"]["p99"] is None


# ---- the API middleware ------------------------------------------------------------------------


def test_api_counts_requests_by_route_template_and_status() -> None:
    topo = load_topology()
    producer = DecidingProducer(clock=FakeClock(1_800_000_000_000))
    app = create_app(history=InMemoryHistoryStore(), commands=CommandSink(producer, topo.job_commands),
                     auth=Authenticator({"tok-a": "acme"}), topology=topo, clock=FakeClock(1_800_000_000_000),
                     answers=producer.answers)
    client = TestClient(app)
    auth = {"Authorization": "Bearer tok-a"}
    body = {"name": "n", "schedule": "0 * * * *", "target": {"type": "command", "argv": ["true"]}}
    job_id = client.post("/v1/jobs", json=body, headers=auth).json()["id"]
    assert client.get(f"/v1/jobs/{job_id}_nope", headers=auth).status_code == 404
    assert client.get("/v1/jobs", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.get("/no/such/route").status_code == 404
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    s = parse(r.text)
    assert value(s, "gnomon_api_requests_total", method="POST", route="/v1/jobs", status="201") == 1
    assert value(s, "gnomon_api_requests_total", method="GET", route="/v1/jobs/{job_id}", status="404") == 1
    assert value(s, "gnomon_api_requests_total", method="GET", route="/v1/jobs", status="401") == 1
    assert value(s, "gnomon_api_requests_total", route="unmatched", status="404") == 1
    assert value(s, "gnomon_api_request_duration_seconds_count", method="POST", route="/v1/jobs") == 1
    assert not any(job_id in v for x in s for v in x.labels.values())
    assert "/metrics" not in app.openapi()["paths"]


def test_the_uis_in_process_calls_are_not_counted() -> None:
    """The web UI calls /v1 in process (gnomon.ui.backend): the page request is what a
    user made, so its inner API calls would double the request rate."""
    import asyncio

    from gnomon.ui.backend import ApiBackend

    topo = load_topology()
    app = create_app(history=InMemoryHistoryStore(), commands=CommandSink(ListProducer(), topo.job_commands),
                     auth=Authenticator({"tok-a": "acme"}), topology=topo, clock=FakeClock(1_800_000_000_000))
    client = TestClient(app)
    assert asyncio.run(ApiBackend(app).get("/v1/jobs", "tok-a")).status == 200
    assert client.get("/v1/jobs", headers={"Authorization": "Bearer tok-a"}).status_code == 200
    s = parse(client.get("/metrics").text)
    assert value(s, "gnomon_api_requests_total", method="GET", route="/v1/jobs", status="200") == 1


# ---- the real loops on the in-memory log -------------------------------------------------------



def test_processor_and_worker_counts_match_what_was_committed(quiet_logs: None) -> None:
    """One processor (aborting some transactions: what they wrote is rewound and must not
    count) and one worker; every count equals what the run ledger holds."""
    c = SimCluster(7, processors=1, workers=1, faults=SimFaults(abort=0.05), standbys=False, step_ms=200,
                   duration_ms=(100, 500))
    c.register("ok", "*/2 * * * * *")
    c.register("bad", "*/3 * * * * *", fail_attempts=9, max_attempts=2)
    c.run_for(20_000)
    c.heal(10_000)
    proc = c.live_processors()[0]
    worker = c.workers[0].worker
    assert proc.aborts > 0 and worker is not None and worker.metrics is not None
    ledger = c.ledger()
    final: dict[str, R.RunState] = {}
    for state in ledger:
        final[state.run_id] = state
    p = parse(generate_latest(proc.metrics.registry).decode())
    by_outcome = {o: sum(1 for r in final.values() if r.status.value == o) for o in ("succeeded", "failed")}
    assert by_outcome["succeeded"] > 5 and by_outcome["failed"] > 2
    assert value(p, "gnomon_runs_finished_total", outcome="succeeded") == by_outcome["succeeded"]
    assert value(p, "gnomon_runs_finished_total", outcome="failed") == by_outcome["failed"]
    assert value(p, "gnomon_dead_letters_total", pool="default") == by_outcome["failed"]
    assert value(p, "gnomon_retries_total", pool="default") == sum(
        1 for r in ledger if r.status is R.RunStatus.RETRY_WAIT)
    assert value(p, "gnomon_processor_transactions_total") == proc.transactions
    assert value(p, "gnomon_partition_restore_seconds_count") >= c.topo.partitions
    owned = {int(s.labels["partition"]) for s in p if s.name == "gnomon_processor_partition_owned"}
    assert owned == set(range(c.topo.partitions))
    assert value(p, "gnomon_workers_live", pool="default") == 1
    # no projector in the simulation: the history group committed nothing, the ledger is all lag
    # (as of the last sample, taken every 5 s)
    ledger_records = sum(c.log.high((c.topo.runs, part)) for part in range(c.topo.partitions))
    history_lag = value(p, "gnomon_consumer_committed_lag_records", group="gnomon-history", topic=c.topo.runs)
    assert ledger_records * 0.5 < history_lag <= ledger_records
    assert any(s.name == "gnomon_consumer_lag_records" and s.labels["group"] == "gnomon-processor" for s in p)

    w = parse(generate_latest(worker.metrics.registry).decode())
    started = [r for r in final.values() if r.started_at_ms is not None]
    lags = [(r.started_at_ms - max(r.slot_ms, r.not_before_ms)) / 1000 for r in started if r.started_at_ms]
    assert value(w, "gnomon_start_lag_seconds_count", pool="default", priority="normal") == len(started)
    assert math.isclose(value(w, "gnomon_start_lag_seconds_sum"), sum(lags), abs_tol=1e-6)
    le = {float(s.labels["le"]): s.value for s in w if s.name == "gnomon_start_lag_seconds_bucket"}
    assert sorted(le) == [*START_LAG_BUCKETS_S, INF]
    assert value(w, "gnomon_worker_attempts_finished_total", outcome="failed") == 2 * by_outcome["failed"]


def test_two_clusters_in_one_process_keep_their_own_counts(quiet_logs: None) -> None:
    """Per-instance registries: no duplicate registration, no shared counts."""
    a, b = (SimCluster(s, processors=2, workers=1, step_ms=200) for s in (1, 2))
    a.register("j", "* * * * * *")
    a.run_for(6_000, faults=False)
    b.run_for(6_000, faults=False)
    count = [sum(value(parse(generate_latest(p.metrics.registry).decode()), "gnomon_runs_finished_total")
                 for p in c.live_processors()) for c in (a, b)]
    assert count[0] > 0 and count[1] == 0


def test_serve_takes_the_port_it_is_given_and_never_fails_the_process() -> None:
    import socket

    import httpx

    from gnomon.metrics.serve import serve

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        w = WorkerMetrics("default", "w-serve", now_s=lambda: 0)
        assert serve(w.registry, "worker", port=taken.getsockname()[1], process_metrics=False) is None
        assert serve(w.registry, "worker", port=0) is None  # off
        free = socket.socket()
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
        free.close()
        endpoint = serve(w.registry, "worker", port=port)
        assert endpoint is not None and endpoint.port == port
        s = parse(httpx.get(endpoint.url, timeout=5).text)
        assert value(s, "gnomon_worker_info", worker_id="w-serve", pool="default") == 1
        assert any(x.name == "process_cpu_seconds_total" for x in s)
    finally:
        taken.close()


def test_gnomon_status_reads_the_targets_it_is_given() -> None:
    import json
    import socket

    from typer.testing import CliRunner

    from gnomon.cli.main import app
    from gnomon.metrics.serve import serve

    topo = load_topology()
    m = ProcessorMetrics(topo, "p-cli")
    m.partition_owned.labels("0").set(1)
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()
    assert serve(m.registry, "processor", port=port, process_metrics=False) is not None
    runner = CliRunner()
    out = runner.invoke(app, ["status", "--target", f"127.0.0.1:{port}"])
    assert out.exit_code == 0, out.output
    assert "p-cli" in out.output and "partitions 0 " in out.output
    assert f"unowned: {','.join(map(str, range(1, topo.partitions)))}" in out.output
    out = runner.invoke(app, ["status", "--target", f"127.0.0.1:{port}", "--json"])
    assert json.loads(out.output)["processors"][0]["partitions"] == [0]
    out = runner.invoke(app, ["status", "--target", "127.0.0.1:9", "--timeout-s", "1"])
    assert out.exit_code == 1 and "no gnomon /metrics endpoint answered" in out.output


def test_api_processes_share_their_counts_in_multiprocess_mode(tmp_path: Path) -> None:
    """``gnomon api --workers N``: each process counts into the directory
    (``multiprocess_dir``); a scrape of any of them reports the sum."""
    import os
    import subprocess
    import sys

    count = (
        "from gnomon.metrics.api import ApiMetrics\n"
        "ApiMetrics().observe('GET', '/v1/jobs', 200, 0.01)\n"
    )
    scrape = (
        "from fastapi import FastAPI\n"
        "from fastapi.testclient import TestClient\n"
        "from gnomon.metrics import api\n"
        "app = FastAPI()\n"
        "api.install(app)\n"
        "print(TestClient(app).get('/metrics').text)\n"
    )
    from gnomon.metrics.api import MULTIPROC_ENV

    env = {**os.environ, MULTIPROC_ENV: str(tmp_path)}
    for _ in range(2):
        subprocess.run([sys.executable, "-c", count], env=env, check=True, timeout=60)
    out = subprocess.run([sys.executable, "-c", scrape], env=env, check=True, timeout=60, capture_output=True,
                         text=True).stdout
    s = parse(out)
    assert value(s, "gnomon_api_requests_total", method="GET", route="/v1/jobs", status="200") == 2
    assert value(s, "gnomon_api_request_duration_seconds_count", route="/v1/jobs") == 2
