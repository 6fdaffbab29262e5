"""The status-page read under load: ``GET /v1/jobs/{id}/runs?limit=20`` on the real stack.

    .venv/bin/python bench/reads.py [--jobs 20] [--clients 32] [--duration-s 30] [--api-workers 1,2]
                                    [--baseline-src DIR] [--port 18890]
    .venv/bin/python bench/reads.py --url http://127.0.0.1:8787 --token TOKEN [--job-ids a,b,...]

Without ``--url``: on the running broker and Cassandra (``gnomon infra up`` first) it
starts its own processor, worker and history projector, registers ``--jobs`` jobs firing
every second (the ``noop`` handler) for its own tenant through its own API, and waits
until history shows at least ``--limit`` runs of each. Then, for each API configuration
in turn, it starts the API (``gnomon api --workers N`` on ``--port``), and ``--clients``
concurrent keep-alive connections each send ``GET /v1/jobs/{random job}/runs?limit=L``
back to back for ``--duration-s`` (after ``--warmup-s`` not counted). Printed per
configuration: requests/s, latency p50/p90/p99/max, errors, and the CPU seconds per
request and the cores busy of the API processes, the load generator (this process),
Cassandra, the broker, the bench's processor (p1), worker (w1) and projector, and the
whole machine ("machine", from /proc/stat), so that a bottleneck shows as a number.

``--api-workers 1+log+nocache,1+nocache,2`` (N processes, ``+log``: with the access
log, ``gnomon api``'s default; ``+nocache``: ``GNOMON_API_RUNS_CACHE_MS=0``, every
request reads Cassandra). ``--baseline-src DIR`` measures first an API
started from another checkout (its ``src`` first on PYTHONPATH, plain ``gnomon api``:
one process, access log on),
e.g. the commit before the read path changed (``git worktree add /tmp/before HEAD``):
before and after in one run, on the same stack and jobs.

With ``--url``/``--token`` it only measures that API (jobs from ``--job-ids``, else it
registers ``--jobs`` jobs through it and waits for their runs; they are deleted at the end).

The load generator is a minimal HTTP/1.1 client on asyncio streams (one process): httpx
costs about 1 ms of CPU per request, which on a 2-core machine would measure the client.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import secrets
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # topic_reading
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "chaos"))  # chaoslib

CLK_TCK = os.sysconf("SC_CLK_TCK")


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] if xs else float("nan")


# ---- CPU accounting from /proc (read only) ---------------------------------------------


def _cpu_s(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            parts = f.read().rsplit(")", 1)[1].split()
        return (int(parts[11]) + int(parts[12])) / CLK_TCK  # utime + stime
    except (OSError, IndexError, ValueError):
        return 0.0


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(c) for c in f.read().split()]
    except OSError:
        pass
    return out


def tree(pid: int) -> list[int]:
    """``pid`` and its descendants (uvicorn's worker processes)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += _children(p)
    return out


def find_java(marker: str) -> list[int]:
    """Pids of JVMs whose command line contains ``marker`` (to read their CPU time)."""
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    if marker.encode() in f.read():
                        pids.append(int(name))
            except OSError:
                pass
    return pids


def cpu_of(pids: list[int]) -> float:
    return sum(_cpu_s(p) for p in pids)


def machine_busy_s() -> float:
    """CPU seconds spent on anything but idle and iowait, all CPUs (/proc/stat)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v[:8]) - v[3] - v[4]) / CLK_TCK


# ---- the load generator ------------------------------------------------------------------


@dataclass
class Result:
    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    statuses: dict[int, int] = field(default_factory=dict)
    checked: int = 0
    bad_body: int = 0
    first_error: str = ""


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    if "content-length" in headers:
        return status, await reader.readexactly(int(headers["content-length"]))
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = b""
        while True:
            size = int((await reader.readuntil(b"\r\n")).strip(), 16)
            body += await reader.readexactly(size + 2)
            if size == 0:
                return status, body
    raise ValueError("response without a length")


async def _client(host: str, port: int, token: str, paths: list[str], limit: int, t_start: float, t_end: float,
                  res: Result, check_every: int) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    n = 0
    try:
        while True:
            path = random.choice(paths)
            req = (f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {token}\r\n"
                   f"Accept: application/json\r\n\r\n").encode()
            t0 = time.perf_counter()
            if t0 >= t_end:
                return
            try:
                writer.write(req)
                status, body = await _read_response(reader)
            except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
                if t0 >= t_start:
                    res.errors += 1
                    res.first_error = res.first_error or repr(exc)
                writer.close()
                reader, writer = await asyncio.open_connection(host, port)
                continue
            t1 = time.perf_counter()
            if t0 < t_start:
                continue
            res.statuses[status] = res.statuses.get(status, 0) + 1
            if status != 200:
                res.errors += 1
                res.first_error = res.first_error or f"{status} {body[:200]!r}"
                continue
            res.latencies.append(t1 - t0)
            n += 1
            if n % check_every == 1:  # a sample of the answers is checked to be a full page
                res.checked += 1
                page = json.loads(body)
                if len(page["items"]) != limit or not all(r["jobId"] in path for r in page["items"]):
                    res.bad_body += 1
    finally:
        writer.close()


async def _load(url: str, token: str, job_ids: list[str], limit: int, clients: int, duration_s: float,
                warmup_s: float) -> Result:
    u = urlsplit(url)
    paths = [f"{u.path.rstrip('/')}/v1/jobs/{j}/runs?limit={limit}" for j in job_ids]
    res = Result()
    now = time.perf_counter()
    t_start, t_end = now + warmup_s, now + warmup_s + duration_s
    await asyncio.gather(*(_client(u.hostname or "127.0.0.1", u.port or 80, token, paths, limit, t_start, t_end,
                                   res, 50) for _ in range(clients)))
    return res


def measure(label: str, url: str, token: str, job_ids: list[str], args: argparse.Namespace,
            api_pids: list[int], java: dict[str, list[int]]) -> dict[str, float]:
    """``java``: other processes to account for, by name (the JVMs, the stack's services)."""
    cpu0 = {"api": cpu_of(api_pids), "bench": time.process_time(), **{k: cpu_of(v) for k, v in java.items()},
            "machine": machine_busy_s()}
    t0 = time.perf_counter()
    res = asyncio.run(_load(url, token, job_ids, args.limit, args.clients, args.duration_s, args.warmup_s))
    wall = time.perf_counter() - t0
    cpu1 = {"api": cpu_of(api_pids), "bench": time.process_time(), **{k: cpu_of(v) for k, v in java.items()},
            "machine": machine_busy_s()}
    # the warm-up is in the CPU figures too: per request = CPU over the whole load / all requests
    measured = len(res.latencies) + res.errors
    total_est = measured * (wall / args.duration_s) if args.duration_s else measured
    lat = [x * 1000 for x in res.latencies]
    rps = len(res.latencies) / args.duration_s
    cpu_ms = {k: 1000 * (cpu1[k] - cpu0[k]) / max(1.0, total_est) for k in cpu0}
    cores = {k: (cpu1[k] - cpu0[k]) / wall for k in cpu0}
    print(f"{label}: {rps:,.0f} req/s  p50={pct(lat, 50):.1f} ms  p90={pct(lat, 90):.1f} ms  "
          f"p99={pct(lat, 99):.1f} ms  max={max(lat, default=float('nan')):.1f} ms  "
          f"errors={res.errors} (of {measured}; statuses {res.statuses})  "
          f"bodies checked={res.checked} bad={res.bad_body}", flush=True)
    print("    CPU ms/request: " + "  ".join(f"{k}={v:.2f}" for k, v in cpu_ms.items())
          + "   cores busy: " + "  ".join(f"{k}={v:.2f}" for k, v in cores.items()), flush=True)
    if res.first_error:
        print(f"    first error: {res.first_error}", flush=True)
    return {"rps": rps, "p50": pct(lat, 50), "p99": pct(lat, 99), "errors": res.errors}


# ---- jobs ----------------------------------------------------------------------------------


def register_jobs(url: str, token: str, n: int, tag: str) -> list[str]:
    ids = []
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30) as c:
        for i in range(n):
            body = {"name": f"{tag}-{i}", "schedule": "* * * * * *", "target": {"type": "handler", "name": "noop"},
                    "timeoutS": 30}
            r = c.post("/v1/jobs", json=body, headers={"Idempotency-Key": f"{tag}-{i}"})
            r.raise_for_status()
            ids.append(r.json()["id"])
    return ids


def wait_for_runs(url: str, token: str, job_ids: list[str], limit: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30) as c:
        while True:
            short = []
            for j in job_ids:
                r = c.get(f"/v1/jobs/{j}/runs", params={"limit": limit})
                if r.status_code != 200 or len(r.json()["items"]) < limit:
                    short.append(j)
            if not short:
                return
            if time.monotonic() > deadline:
                raise SystemExit(f"history has fewer than {limit} runs of {len(short)} jobs after {timeout_s:.0f} s")
            time.sleep(2)


def delete_jobs(url: str, token: str, job_ids: list[str]) -> None:
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30) as c:
        for j in job_ids:
            with contextlib.suppress(httpx.HTTPError):
                c.delete(f"/v1/jobs/{j}")


def wait_healthy(url: str, proc_alive: Callable[[], bool], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not proc_alive():
            raise SystemExit("the API exited; see its log")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        time.sleep(0.5)
    raise SystemExit(f"the API at {url} did not answer within {timeout_s:.0f} s")


# ---- main ----------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=20)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--duration-s", type=float, default=30)
    ap.add_argument("--warmup-s", type=float, default=3)
    ap.add_argument("--limit", type=int, default=20)
    ap.add_argument("--url", help="measure this API instead of starting the stack")
    ap.add_argument("--token", help="with --url: a token of the tenant whose jobs are read")
    ap.add_argument("--job-ids", help="with --url: comma-separated job ids to read (default: register --jobs)")
    ap.add_argument("--api-workers", default="1+nocache,2+nocache,1,2",
                    help="API configurations to measure in turn: N worker processes, '+log' to keep the access "
                         "log, '+nocache' for GNOMON_API_RUNS_CACHE_MS=0 (e.g. 1+log+nocache,1,2)")
    ap.add_argument("--baseline-src", help="also measure (first) an API started from this checkout")
    ap.add_argument("--port", type=int, default=18890, help="port of the APIs this bench starts")
    ap.add_argument("--wait-runs-s", type=float, default=180)
    args = ap.parse_args()
    tag = "reads" + secrets.token_hex(3)
    java = {"cassandra": find_java("CassandraDaemon"), "kafka": find_java("kafka.Kafka")}
    print(f"machine: {os.cpu_count()} CPUs, {_cpu_model()}; clients={args.clients} duration={args.duration_s:g}s "
          f"limit={args.limit}", flush=True)

    if args.url:
        if not args.token:
            raise SystemExit("--url needs --token")
        url = args.url.rstrip("/")
        ids = args.job_ids.split(",") if args.job_ids else register_jobs(url, args.token, args.jobs, tag)
        try:
            if not args.job_ids:
                wait_for_runs(url, args.token, ids, args.limit, args.wait_runs_s)
            measure(f"{url} jobs={len(ids)}", url, args.token, ids, args, [], java)
        finally:
            if not args.job_ids:
                delete_jobs(url, args.token, ids)
        return

    from chaoslib import Scenario

    from gnomon.config import load

    s = load()
    from gnomon.infra import manager

    manager.up(s)
    logs = Path(s.state_dir) / "bench-logs" / tag
    logs.mkdir(parents=True, exist_ok=True)
    tenant, token = f"{tag}-t", "tok-" + secrets.token_urlsafe(18)
    sc = Scenario(tag, logs, lease_s=30, lookahead_s=30, worker_tenants=(tenant,))
    sc.env["GNOMON_API_TOKENS"] = f"{token}:{tenant}"
    url = f"http://127.0.0.1:{args.port}"
    configs: list[tuple[str, list[str], dict[str, str]]] = []
    if args.baseline_src:
        src = str(Path(args.baseline_src).resolve() / "src")
        # its config would default the state dir (and so the credentials) to that checkout's
        configs.append((f"baseline ({args.baseline_src})", [],
                        {"PYTHONPATH": src, "GNOMON_STATE_DIR": str(s.state_dir)}))
    for conf in args.api_workers.split(","):
        w, *flags = conf.split("+")
        unknown = set(flags) - {"log", "nocache"}
        if unknown:
            raise SystemExit(f"--api-workers {conf!r}: unknown {sorted(unknown)}; use N[+log][+nocache]")
        configs.append((f"workers={w}" + "".join(f" {f}" for f in flags),
                        ["--workers", w] + ([] if "log" in flags else ["--no-access-log"]),
                        {"GNOMON_API_RUNS_CACHE_MS": "0"} if "nocache" in flags else {}))
    ids: list[str] = []
    try:
        sc.processor("p1")
        sc.worker("w1", 64)
        sc.start("projector", "projector")
        results = []
        for i, (label, extra, env) in enumerate(configs):
            name = f"api{i}"
            saved = sc.env
            sc.env = {**saved, **env}
            try:
                sc.start(name, "api", "--port", str(args.port), *extra)
            finally:
                sc.env = saved
            proc = sc.procs[name]
            wait_healthy(url, lambda p=proc: p.poll() is None)
            if not ids:
                ids = register_jobs(url, token, args.jobs, tag)
                print(f"registered {len(ids)} jobs (every second) for tenant {tenant}; waiting for "
                      f"{args.limit} runs of each in history", flush=True)
                wait_for_runs(url, token, ids, args.limit, args.wait_runs_s)
            time.sleep(2)  # the API's worker processes are all up
            stack = {n: [p.pid] for n, p in sc.procs.items() if not n.startswith("api")}
            results.append((label, measure(label, url, token, ids, args, tree(proc.pid), {**java, **stack})))
            os.killpg(proc.pid, 15)
            proc.wait(30)
            del sc.procs[name]
            time.sleep(1)
        base = results[0][1]
        for label, r in results[1:]:
            print(f"{label} vs {results[0][0]}: {r['rps'] / base['rps']:.2f}x req/s, "
                  f"p99 {r['p99']:.1f} ms vs {base['p99']:.1f} ms")
    finally:
        if ids:
            with contextlib.suppress(Exception):
                sc.start("api-cleanup", "api", "--port", str(args.port), "--no-access-log")
                wait_healthy(url, lambda: sc.procs["api-cleanup"].poll() is None)
                delete_jobs(url, token, ids)
        sc.stop_all()
        print(f"logs: {logs}")


def _cpu_model() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "?"


if __name__ == "__main__":
    main()
