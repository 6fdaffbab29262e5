"""What a stretched cluster costs a write: latency with the sites 30 ms apart, and with no delay.

Needs the regions layout running (ADR 0013)::

    GNOMON_STATE_DIR=/tmp/g/reg GNOMON_HOST_CGROUPS=1 gnomon infra up --hosts 3 --regions a,b
    GNOMON_STATE_DIR=/tmp/g/reg .venv/bin/python bench/regions_write.py

From region a's listener (its clients' path: the leader on its own site, the followers on
b and the witness), it measures, one at a time so that nothing queues:

* ``produce``: one record, acks=all, min.insync.replicas 2, to a topic led on a's site;
* ``txn``: a processor's unit of work: begin, 10 records to two such topics, commit,
  once per transactional id of ``--txn-ids`` (their coordinators land on different sites,
  by the hash of the id);

first with the inter-site delay, then with the latency proxy told to add none (SIGUSR1),
then with the delay again (SIGUSR2), so the three rounds run on the same cluster in one
run. Prints p50/p90/p99/max in ms per round and the ratios.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import time
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

from gnomon.adapters.kafka import security_config
from gnomon.config import load
from gnomon.infra import procs, sites
from gnomon.infra.kafka import admin

TOPICS = ("bench.regions.one", "bench.regions.two")


def _pct(xs: list[float], q: float) -> float:
    ys = sorted(xs)
    return ys[min(len(ys) - 1, int(q * len(ys)))]


def _line(name: str, xs: list[float]) -> str:
    return (f"{name:<22} n={len(xs):>4}  p50 {_pct(xs, .5):7.1f}  p90 {_pct(xs, .9):7.1f}  "
            f"p99 {_pct(xs, .99):7.1f}  max {max(xs):7.1f} ms")


def _topics(bootstrap: str, leader: int) -> None:
    client = admin(bootstrap)
    have = client.list_topics(timeout=10).topics
    new = [NewTopic(t, num_partitions=1, replica_assignment=[[leader, *[b for b in (1, 2, 3) if b != leader]]],
                    config={"min.insync.replicas": "2"}) for t in TOPICS if t not in have]
    for f in (client.create_topics(new).values() if new else []):
        f.result()


def _producer(bootstrap: str, **extra: Any) -> Producer:
    return Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0, **security_config("admin"),
                     **extra})


def _produce_round(bootstrap: str, n: int) -> list[float]:
    p = _producer(bootstrap)
    out: list[float] = []
    p.produce(TOPICS[0], b"warm", b"x")
    p.flush(10)
    for i in range(n):
        done: list[float] = []
        t0 = time.perf_counter()
        p.produce(TOPICS[0], str(i).encode(), b"x" * 200, on_delivery=lambda e, _m, d=done: d.append(time.perf_counter()))
        p.flush(10)
        if done:
            out.append((done[0] - t0) * 1000)
    return out


def _txn_round(bootstrap: str, n: int, tid: str) -> list[float]:
    p = _producer(bootstrap, **{"transactional.id": tid, "transaction.timeout.ms": 10_000})
    p.init_transactions(30)
    out: list[float] = []
    for i in range(n + 2):
        t0 = time.perf_counter()
        p.begin_transaction()
        for k in range(10):
            p.produce(TOPICS[k % 2], f"{i}-{k}".encode(), b"x" * 200)
        p.commit_transaction(30)
        if i >= 2:  # (the first ones find the coordinator and the partitions)
            out.append((time.perf_counter() - t0) * 1000)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200, help="writes per round")
    ap.add_argument("--txn-ids", type=int, default=3, help="transactional ids per round")
    args = ap.parse_args()
    settings = load()
    layout = sites.load(settings.state_dir)
    if layout is None:
        raise SystemExit("no regions layout here: gnomon infra up --hosts 3 --regions a,b (GNOMON_STATE_DIR)")
    pid = procs.running_pid(settings.state_dir, sites.LATENCY_PROCESS)
    if pid is None:
        raise SystemExit("the latency proxy does not run: gnomon infra up")
    region = layout.names[0]
    bootstrap = sites.bootstrap(layout, region, settings.kafka_port)
    _topics(bootstrap, layout.host(region))
    print(f"region {region}'s client path ({bootstrap}), leader on its site, followers on "
          f"{layout.names[1]} and the witness; {layout.latency_ms:g} ms each way between sites; "
          f"{os.cpu_count()} CPUs")
    rounds: dict[str, dict[str, list[float]]] = {}
    for name, sig in (("delayed", None), ("no delay", signal.SIGUSR1), ("delayed again", signal.SIGUSR2)):
        if sig is not None:
            os.kill(pid, sig)
            time.sleep(1.0)
        r: dict[str, list[float]] = {"produce": _produce_round(bootstrap, args.n)}
        for k in range(args.txn_ids):
            r[f"txn id {k}"] = _txn_round(bootstrap, max(20, args.n // 4), f"bench-regions-{k}")
        rounds[name] = r
        print(f"-- {name}")
        for what, xs in r.items():
            print("  " + _line(what, xs))
    os.kill(pid, signal.SIGUSR2)
    print("-- added by the delay (p50 delayed / p50 no delay)")
    for what in rounds["no delay"]:
        base = statistics.median(rounds["no delay"][what])
        for name in ("delayed", "delayed again"):
            print(f"  {what:<12} {name:<14} +{statistics.median(rounds[name][what]) - base:6.1f} ms "
                  f"(x{statistics.median(rounds[name][what]) / base:.1f})")


if __name__ == "__main__":
    main()
