"""Issue 50, finding 5, on the real stack: a worker running a container target is killed
-9; its container is gone within the lease, and the run's next attempt, which the real
processor grants once the lease lapsed, starts after it ended, by the containers' own
output (their ``date`` lines, read back through the REST API's run logs).

Before (540a8ec): the container ran on for the attempt's timeout plus 10 s after the
kill, so the re-granted attempt ran beside it (test_containers.py shows the same with a
stand-in worker, in seconds and without Kafka).

Real podman, Kafka and Cassandra; the processor, projector, API and both workers are
processes of this test's own (a pool of its own, so no other worker takes the run).
"""

from __future__ import annotations

import os
import secrets
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "e2e"))
from harness import Stack, own_services, wait_for
from test_containers import IMAGE, image, leftovers  # noqa: F401  (image: a fixture)

from gnomon.client import ApiError
from gnomon.core.clock import ms_to_iso
from gnomon.worker.container import NAME_PREFIX, PodmanRunner

pytestmark = pytest.mark.integration

LEASE_S = 30  # the processor's lease (its default), said explicitly: the bar is one lease
TOKEN = "test-token-lease-" + secrets.token_hex(4)
POOL = "batch"  # a pool of the topology no other worker serves while this runs
# attempt 1 prints the time each half second until it is removed; attempt 2 starts, says
# when, and ends. Their lines reach the run's log through their worker (busybox date: s).
SCRIPT = ('echo "start $GNOMON_ATTEMPT $(date +%s)"; '
          'if [ "$GNOMON_ATTEMPT" = 1 ]; then while :; do echo "tick $(date +%s)"; sleep 0.5; done; fi; '
          'echo "end $GNOMON_ATTEMPT $(date +%s)"')


@pytest.fixture
def lease_stack(tmp_path: Path, image: str) -> Iterator[Stack]:  # noqa: F811
    from gnomon.config import load
    from gnomon.infra import manager

    manager.up(load())
    (tmp_path / "policy.toml").write_text(f'tenants = ["acme"]\n[containers]\nenabled = true\nimages = ["{image}"]\n')
    with own_services(tmp_path, TOKEN, "acme", "--lease-s", str(LEASE_S)) as st:
        yield st


def _worker(st: Stack, name: str) -> Any:
    return st.start(name, "worker", "--worker-id", f"{name}-{secrets.token_hex(3)}", "--pool", POOL,
                    "--tenant", "acme", "--concurrency", "2", "--policy", str(st.logs / "policy.toml"))


def _containers_of(pid: int) -> list[str]:
    return [n for n in leftovers() if n.startswith(f"{NAME_PREFIX}{pid}-")]


def _times(lines: list[dict[str, Any]], attempt: int, word: str) -> list[int]:
    return [int(x["line"].split()[-1]) for x in lines
            if x["attempt"] == attempt and x["stream"] == "stdout" and x["line"].startswith(word + " ")]


def test_a_killed_workers_container_is_gone_within_the_lease_and_the_regrant_starts_after_it(
        lease_stack: Stack) -> None:
    st, c = lease_stack, lease_stack.client
    first = _worker(st, "worker1")
    at_ms = (int(time.time()) + 8) * 1000
    body = {"name": "lease-guard-" + secrets.token_hex(3), "runAt": ms_to_iso(at_ms), "pool": POOL,
            "target": {"type": "container", "image": IMAGE, "argv": ["sh", "-c", SCRIPT]},
            "timeoutS": 300, "retry": {"max": 3, "backoffS": 0}}
    job_id = c.create_job(body)["id"]
    run_id = f"{job_id}@{ms_to_iso(at_ms)}"
    try:
        name = wait_for(lambda: _containers_of(first.pid), 60, "worker1's container")[0]
        wait_for(lambda: len(_times(c.get_logs(run_id)["items"], 1, "tick")) >= 2, 30,
                 "attempt 1's output in the run's log")
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(10)
        st.procs.pop("worker1")
        killed_wall = time.time()
        while PodmanRunner().exists(name):
            assert time.time() - killed_wall < LEASE_S, f"the container outlived its worker's lease ({LEASE_S} s)"
            time.sleep(0.2)
        gone_wall = time.time()  # at most this late: it was listed at the poll before

        _worker(st, "worker2")

        def done() -> dict[str, Any] | None:
            try:
                run = c.get_run(run_id)
            except ApiError:
                return None
            return run if run["status"] == "succeeded" else None

        run = wait_for(done, LEASE_S + 60, "the run granted again to succeed")
        lines = wait_for(lambda: (ls := c.get_logs(run_id)["items"]) and _times(ls, 2, "end") and ls, 20,
                         "attempt 2's output")
    finally:
        c.delete(job_id)
    started_1, ticks_1 = _times(lines, 1, "start"), _times(lines, 1, "tick")
    started_2, ended_2 = _times(lines, 2, "start"), _times(lines, 2, "end")
    assert run["attempt"] == 2, run
    assert started_1 and ticks_1 and started_2 and ended_2, lines
    # attempt 1, by its own output, ran until at least its last tick logged; it was gone
    # (no longer listed by podman) at gone_wall; attempt 2 says it started later than that
    assert started_1[0] <= ticks_1[-1] <= gone_wall
    assert started_2[0] >= gone_wall, (started_2, gone_wall)
    print(f"container gone {gone_wall - killed_wall:.1f} s after its worker's kill -9 (lease {LEASE_S} s); "
          f"attempt 2 started {started_2[0] - gone_wall:+.1f} s after that")
    assert _containers_of(first.pid) == []
