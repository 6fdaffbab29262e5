"""`make run`: start everything and register a small demo, then show runs live.

    .venv/bin/python -m gnomon.demo.run [--duration-s N]

Starts Kafka and Cassandra (fetched from Maven Central on first use), then `gnomon dev`
(processor, worker, projector, API), registers four jobs and refreshes a table of their
latest runs every 2 s. Ctrl-C deletes the demo's jobs and stops everything it started.

`gnomon dev` runs in a process group of its own, so a terminal's Ctrl-C reaches the demo
alone: the demo deletes its jobs while the API and the processor still answer, then stops
`gnomon dev` (which stops its children). Were they in the terminal's process group, the
interrupt would stop the API before the deletes. (A demo killed with SIGKILL leaves
`gnomon dev` running: stop it with Ctrl-C in its terminal or `kill -INT -<its pid>`.)
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
from rich.console import Console
from rich.live import Live
from rich.table import Table

from gnomon.client import ApiError, Client
from gnomon.config import load
from gnomon.core.clock import ms_to_iso

console = Console()


class _Callback(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.send_response(200)
        self.end_headers()
        self.wfile.write(f"demo endpoint got run {self.headers.get('Idempotency-Key')}".encode())

    def log_message(self, *args: Any) -> None:
        pass


def _wait_api(url: str, dev: subprocess.Popen[bytes], timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if dev.poll() is not None:
            raise SystemExit("gnomon: `gnomon dev` exited; see the lines above")
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"gnomon: the API did not answer at {url} within {timeout_s:.0f}s")


def register_demo(client: Client, callback_url: str) -> dict[str, str]:
    tag = secrets.token_hex(2)
    in_a_minute = ms_to_iso((int(time.time()) + 60) * 1000)
    jobs: dict[str, dict[str, Any]] = {
        "every 10 s (command)": {"schedule": "*/10 * * * * *",
                                 "target": {"type": "command", "argv": ["sh", "-c", "echo tick $GNOMON_RUN_ID; date -u"]}},
        "one-time, in a minute": {"runAt": in_a_minute, "target": {"type": "handler", "name": "echo"},
                                  "payload": {"hello": "world"}},
        "HTTP callback every 15 s": {"schedule": "*/15 * * * * *", "target": {"type": "http", "url": callback_url}},
        "fails (retries, then dead letter)": {"schedule": "*/30 * * * * *", "retry": {"max": 2, "backoffS": 2},
                                              "target": {"type": "command", "argv": ["sh", "-c", "echo oops >&2; exit 3"]}},
        # an interval with bounds: every 20 s from a minute from now, six runs, then done
        "every 20 s, 6 runs (interval)": {"every": "20s", "from": in_a_minute, "maxRuns": 6,
                                          "target": {"type": "handler", "name": "echo"}},
    }
    ids = {}
    for name, body in jobs.items():
        ids[name] = client.create_job({"name": f"demo {tag}: {name}", "timeoutS": 30, **body})["id"]
    # a dependency with no schedule of its own: a run after each run of the command job,
    # once that run succeeded (docs/schedules.md, "Dependencies"); its upstream must be in
    # history first (the API checks it there)
    _wait_visible(client, ids["every 10 s (command)"])
    name = "after the command (dependency)"
    ids[name] = client.create_job({"name": f"demo {tag}: {name}", "timeoutS": 30,
                                   "after": [{"job": ids["every 10 s (command)"]}], "waitMaxS": 60,
                                   "target": {"type": "handler", "name": "echo"}})["id"]
    return ids


UPSTREAM_WAIT_S = 180.0  # a processor restoring a big state, a projector catching up: say so, then give up


def _wait_visible(client: Client, job_id: str, timeout_s: float = UPSTREAM_WAIT_S) -> None:
    """Until history shows ``job_id`` (accepted by the scheduler, then written by the
    projector: after a long restore or a backlog this takes a while), with a line every
    10 s saying what it waits for."""
    began = time.monotonic()
    said = 0.0
    while True:
        try:
            client.get_job(job_id)
            return
        except ApiError as exc:
            if exc.status != 404:
                raise
        waited = time.monotonic() - began
        if waited >= timeout_s:
            raise SystemExit(f"gnomon: job {job_id} was not in history after {timeout_s:.0f} s (is the projector "
                             "running? .gnomon/logs/dev-projector.log)")
        if waited - said >= 10:
            said = waited
            console.print(f"waiting for job {job_id} to reach history ({waited:.0f} s; the processor may be "
                          "restoring its state, the projector catching up)…")
        time.sleep(0.5)


def _delete_demo(client: Client | None, ids: dict[str, str]) -> None:
    """The demo's jobs go when it stops (the next `make run` registers its own): best effort,
    the API may already be gone."""
    if client is None or not ids:
        return
    left = []
    for job_id in ids.values():
        try:
            client.delete(job_id)
        except ApiError as exc:
            if exc.status != 404:  # 404: deleted already (`gnomon jobs delete`, the UI)
                left.append(job_id)
        except Exception:  # the API or Kafka is away: say so, keep stopping
            left.append(job_id)
    if left:
        console.print(f"could not delete the demo jobs {', '.join(left)} (`gnomon jobs delete ID` later)")
    else:
        console.print(f"deleted the {len(ids)} demo jobs")


def table(client: Client, ids: dict[str, str]) -> Table:
    t = Table(title=f"gnomon demo — latest runs (UTC {time.strftime('%H:%M:%S', time.gmtime())}); Ctrl-C to stop")
    for col in ("job", "slot (UTC)", "status", "attempt", "lag s", "exit"):
        t.add_column(col)
    for name, job_id in ids.items():
        try:
            now_iso = ms_to_iso(int(time.time()) * 1000)
            # newest slots that have arrived (the lookahead also holds future, scheduled ones)
            items = [r for r in client.list_runs(job_id, limit=20)["items"] if r["slot"] <= now_iso][:3]
        except Exception as exc:  # the projection may lag at start
            t.add_row(name, "", f"({type(exc).__name__})", "", "", "")
            continue
        if not items:
            t.add_row(name, "", "waiting for first slot", "", "", "")
        for r in items:
            lag = ""
            if r["startedAt"]:
                from gnomon.core.clock import iso_to_ms

                lag = f"{(iso_to_ms(r['startedAt']) - iso_to_ms(r['slot'])) / 1000:.2f}"
            status = "staged" if r.get("staged") else r["status"]  # granted ahead, not started yet
            colour = {"succeeded": "green", "failed": "red", "running": "yellow"}.get(status, "white")
            t.add_row(name, r["slot"][11:19], f"[{colour}]{status}[/]", str(r["attempt"]), lag,
                      "" if r["exitCode"] is None else str(r["exitCode"]))
            name = ""
    return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration-s", type=float, default=0, help="stop after this long (0 = until Ctrl-C)")
    args = ap.parse_args()
    s = load()
    from gnomon.infra import manager

    manager.up(s)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Callback)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    def interrupt(_sig: int, _frame: object) -> None:  # SIGTERM, SIGHUP: stop as Ctrl-C does
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGHUP, interrupt)
    # Ctrl-C too, even when SIGINT came in ignored: a non-interactive shell starts its
    # background jobs (`make run &`, a CI script's) with SIGINT ignored, and Python then
    # installs no KeyboardInterrupt for it
    signal.signal(signal.SIGINT, signal.default_int_handler)
    dev = subprocess.Popen([sys.executable, "-m", "gnomon.cli.main", "dev", "--no-infra"], process_group=0)
    ids: dict[str, str] = {}
    client: Client | None = None
    try:
        _wait_api(s.api_url, dev)
        client = Client()
        ids = register_demo(client, f"http://127.0.0.1:{server.server_address[1]}/hook")
        console.print(f"registered {len(ids)} demo jobs: " + ", ".join(ids.values()))
        console.print("CLI: .venv/bin/gnomon jobs list · .venv/bin/gnomon runs list JOB_ID · "
                      ".venv/bin/gnomon runs logs RUN_ID")
        from gnomon.tokens import dev_token

        console.print(f"Web UI: {s.api_url}/ui (sign in with the dev token {dev_token(s)}, also in "
                      f"{s.state_dir}/dev-token)", highlight=False)
        end = time.monotonic() + args.duration_s if args.duration_s else float("inf")
        with Live(table(client, ids), console=console, refresh_per_second=1) as live:
            while time.monotonic() < end and dev.poll() is None:
                time.sleep(2)
                live.update(table(client, ids))
    except KeyboardInterrupt:
        pass
    finally:
        _delete_demo(client, ids)
        if dev.poll() is None:
            dev.send_signal(2)
            try:
                dev.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(dev.pid, signal.SIGKILL)  # its group: `gnomon dev` and its children
        server.shutdown()
        console.print("stopped gnomon (Kafka and Cassandra keep running: `make infra-down` stops them)")


if __name__ == "__main__":
    main()
