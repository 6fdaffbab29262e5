"""Dependencies on the real stack (docs/schedules.md "Dependencies"; issue 25): API ->
Kafka -> processor (each job's partition, told over gnomon.dependencies) -> worker ->
Cassandra -> API.

* A chain extract -> transform -> load (load with no schedule of its own: it runs after
  each run of transform), on more than one partition, runs in order for several slots,
  and a kill -9 of the processor in the middle of it (down for two slots)
  loses and doubles nothing (every slot once, in order).
* An upstream whose run fails leaves its downstream's run skipped with the reason; the
  replay of the failed run (which then succeeds) releases the downstream, which runs."""

from __future__ import annotations

import secrets
import signal
import time
from typing import Any

import pytest
from harness import Stack, job_runs, wait_for

from gnomon.adapters.kafka import partition_for
from gnomon.core.clock import iso_to_ms, ms_to_iso
from gnomon.core.model import idempotent_job_id
from gnomon.topology import load_topology

pytestmark = pytest.mark.integration

SLOTS = 6
EVERY_S = 3


def _keys_on_two_partitions(tag: str) -> list[str]:
    """Idempotency keys of three jobs of tenant acme, not all on one partition."""
    parts = load_topology().partitions
    for n in range(100):
        keys = [f"{tag}-{name}-{n}" for name in ("extract", "transform", "load")]
        if len({partition_for(idempotent_job_id("acme", k), parts) for k in keys}) > 1:
            return keys
    raise AssertionError("no keys on two partitions")


def test_a_chain_runs_in_order_across_partitions_through_a_kill_of_the_processor(stack: Stack) -> None:
    tag = f"e2e-chain-{secrets.token_hex(3)}"
    anchor = (int(time.time()) + 6) * 1000
    # catchUp all: a slot that came while the processor was down runs late, not skipped
    common = {"every": f"{EVERY_S}s", "from": ms_to_iso(anchor), "maxRuns": SLOTS, "timeoutS": 30, "catchUp": "all",
              "retry": {"max": 2, "backoffS": 0.5}, "target": {"type": "command", "argv": ["sleep", "0.3"]}}
    # load: no schedule of its own, its slots are transform's
    follows = {k: v for k, v in common.items() if k in ("timeoutS", "retry", "target")}
    ids: list[str] = []
    for key, name in zip(_keys_on_two_partitions(tag), ("extract", "transform", "load"), strict=True):
        body = {**(follows if name == "load" else common), "name": f"{tag}-{name}",
                **({"after": [{"job": ids[-1]}]} if ids else {})}
        ids.append(str(stack.client.create_job(body, idempotency_key=key)["id"]))
    extract, transform, load = ids
    got = stack.client.get_job(load)
    assert got["after"] == [{"job": transform, "on": "succeeded"}] and "every" not in got, got
    wait_for(lambda: any(r["status"] == "succeeded" for r in job_runs(stack, load)), 60, "the first load")
    stack.stop("processor", signal.SIGKILL)  # mid-chain: its open transaction is lost
    time.sleep(2 * EVERY_S)  # slots come while it is down: caught up (all), after their upstreams
    stack.start("processor", "processor", "--instance-id", "e2e-0")

    def all_done() -> bool:
        return all(len([r for r in job_runs(stack, j) if r["status"] == "succeeded"]) == SLOTS for j in ids)

    try:
        wait_for(all_done, 150, f"{SLOTS} slots of each job succeeded")
    except AssertionError as exc:
        seen = {name: [(r["slot"][11:19], r["status"], r.get("reason")) for r in job_runs(stack, j)]
                for name, j in zip(("extract", "transform", "load"), ids, strict=True)}
        raise AssertionError(f"{exc}: {seen}") from None
    runs = {j: {iso_to_ms(r["slot"]): r for r in job_runs(stack, j)} for j in ids}
    for j in ids:
        assert sorted(runs[j]) == [anchor + i * EVERY_S * 1000 for i in range(SLOTS)], (j, sorted(runs[j]))
    for slot in runs[extract]:
        for up, down in ((extract, transform), (transform, load)):
            ended, started = runs[up][slot]["finishedAt"], runs[down][slot]["startedAt"]
            assert iso_to_ms(ended) <= iso_to_ms(started), (slot, up, ended, down, started)
    assert stack.client.get_job(extract).get("downstreams") == [transform]
    for j in ids:
        stack.client.delete(j)


def test_a_failed_upstream_skips_its_downstream_and_its_replay_releases_it(stack: Stack,
                                                                           callback_server: str) -> None:
    tag = f"e2e-dep-{secrets.token_hex(3)}"
    at = ms_to_iso((int(time.time()) + 4) * 1000)
    up = stack.client.create_job({"name": f"{tag}-up", "runAt": at, "retry": {"max": 1},
                                  "target": {"type": "http", "url": f"{callback_server}/flaky-{tag}"}})
    down = stack.client.create_job({"name": f"{tag}-down", "runAt": at, "after": [{"job": up["id"]}],
                                    "target": {"type": "command", "argv": ["true"]}})

    def only_run(job_id: str, status: str) -> dict[str, Any] | None:
        items = job_runs(stack, job_id)
        return items[0] if len(items) == 1 and items[0]["status"] == status else None

    failed = wait_for(lambda: only_run(up["id"], "failed"), 60, "the upstream's run dead-lettered")
    skipped = wait_for(lambda: only_run(down["id"], "skipped"), 30, "the downstream's run skipped")
    assert skipped["reason"].startswith(f"upstream {failed['id']} failed"), skipped
    assert skipped["startedAt"] is None
    stack.client.replay(failed["id"])  # the callback answers 200 the second time
    ran = wait_for(lambda: only_run(down["id"], "succeeded"), 60, "the downstream released by the replay")
    assert "reopened: upstream" in (ran["note"] or ""), ran
    assert iso_to_ms(stack.client.get_run(failed["id"])["finishedAt"]) <= iso_to_ms(ran["startedAt"])
