"""The region gate and `gnomon regions` on real Kafka (ADR 0013): ownership records written
acks=all and read back, the operator's takeover and failback, a standby's takeover by
silence, and an active process stopping on the first check after it.

Region names are drawn per run (the regions topic is compacted and shared)."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import threading
import time

import pytest

from gnomon.config import Settings
from gnomon.core.clock import SystemClock
from gnomon.eventlog.kafka import KafkaEventLog
from gnomon.gate import RegionGate
from gnomon.topology import load_topology

pytestmark = pytest.mark.integration


def _gnomon(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "GNOMON_REGION"}
    return subprocess.run([sys.executable, "-m", "gnomon.cli.main", *args], capture_output=True, text=True,
                          timeout=120, env=env)


def _status(name: str) -> dict[str, object]:
    done = _gnomon("regions", "status", name, "--json")
    assert done.returncode == 0, done.stderr
    (row,) = json.loads(done.stdout)
    assert isinstance(row, dict)
    return row


def test_operator_takeover_and_failback(infra: Settings) -> None:
    a, b = "r" + secrets.token_hex(4), "r" + secrets.token_hex(4)
    assert _status(a) == {"region": a, "owner": a, "epoch": 0, "at": None, "reason": "home", "heartbeats": 0}
    done = _gnomon("regions", "takeover", a, "--by", b)
    assert done.returncode == 0, done.stderr
    row = _status(a)
    assert (row["owner"], row["epoch"], row["reason"]) == (b, 1, f"operator takeover by {b}")
    again = _gnomon("regions", "takeover", a, "--by", b)
    assert again.returncode == 0 and "already" in again.stdout
    back = _gnomon("regions", "failback", a)
    assert back.returncode == 0, back.stderr
    assert (_status(a)["owner"], _status(a)["epoch"]) == (a, 2)
    refused = _gnomon("regions", "takeover", a, "--by", a)
    assert refused.returncode == 2 and "failback" in refused.stderr
    bad = _gnomon("regions", "takeover", "A!", "--by", b)
    assert bad.returncode == 2 and "not a region name" in bad.stderr


class Mono:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_a_silent_owner_is_taken_over_and_stops(infra: Settings) -> None:
    ns = "r" + secrets.token_hex(4)
    topic = load_topology(region=None).regions
    log = KafkaEventLog(infra.kafka_bootstrap, role="processor")
    mono = Mono()
    active = RegionGate(log, topic, ns, ns, SystemClock(), instance="t-active", monotonic=mono, check_s=0)
    standby = RegionGate(log, topic, ns, "elsewhere", SystemClock(), instance="t-standby", takeover_s=20.0,
                         monotonic=mono, check_s=0)
    try:
        assert active.wait_until_mine(threading.Event())
        assert active.still_mine()  # a heartbeat, acks=all
        active.close()  # (flushed)
        assert standby.refresh().owner == ns and not standby.mine()
        assert standby.view.beats.get(ns) == 1
        # silent by the standby's clock, which counts only while its own probes (acks=all)
        # are taken: step it, a second at a time, until it takes over (20 s, and the first ack)
        steps = 0
        while not standby.standby_step():
            mono.t += 1
            steps += 1
            assert steps < 40, "no takeover after 40 s of silence"
            time.sleep(0.05)  # (the probes' acknowledgements come back meanwhile)
        assert steps >= 20
        owner = standby.view.owner(ns)
        assert (owner.owner, owner.epoch) == ("elsewhere", 1) and "no heartbeat" in owner.reason
        assert not active.still_mine() and "runs" in active.stop_reason
    finally:
        active.close()
        standby.close()
