"""``gnomon infra grow --to M``: more partitions for a live system (docs/adr/0012).

1. Every co-partitioned topic (``gnomon.topology.CO_PARTITIONED``) gets M partitions
   (Kafka's CreatePartitions), unless it has them already (a run that stopped half-way
   is finished by running it again).
2. Every partition of the job-commands topic gets a grow marker (``gnomon.core.control``):
   each old partition's processor hands the jobs that now live elsewhere to their new
   partitions when it reads it (``gnomon.processor.growth``); a partition that already
   places jobs by M ignores it. So the command is idempotent.
3. It waits (progress on stderr) until the processors' group has committed past every
   marker and every partition born in a grow has its handover in its jobs changelog:
   from then on each partition's jobs are where M places them.

The topology file keeps the count the topics were created with: the partitions born in
a grow know from it that they must wait for their handover.

A grow acts on one namespace (gnomon.region): the topology's (the CLI's is that of
``$GNOMON_REGION``), its topics and its processors' group.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gnomon import region
from gnomon.core import control
from gnomon.infra.errors import InfraError
from gnomon.topology import Topology

MARKER_TIMEOUT_S = 30.0
POLL_S = 0.5
PROCESSOR_GROUP = "gnomon-processor"  # (gnomon.processor.runtime.GROUP_ID, not imported: no RocksDB here)


@dataclass(frozen=True)
class GrowReport:
    before: dict[str, int]  # topic -> partitions before
    after: int
    markers: dict[int, int]  # job-commands partition -> the marker's offset
    waited_s: float


def counts(client: Any, topics: list[str], timeout_s: float) -> dict[str, int]:
    """topic -> its partitions now (metadata). InfraError for a missing topic."""
    from confluent_kafka import KafkaException

    try:
        found = client.list_topics(timeout=timeout_s).topics
    except KafkaException as exc:
        raise InfraError(f"cannot list topics: {exc}") from exc
    missing = [t for t in topics if t not in found]
    if missing:
        raise InfraError(f"topics {', '.join(missing)} do not exist: run `gnomon infra up` (or "
                         "`python -m gnomon.infra topics`) first")
    return {t: len(found[t].partitions) for t in topics}


def plan(before: dict[str, int], to: int) -> list[str]:
    """The topics to grow to ``to`` partitions; ValueError if the counts make no sense
    (a topic with more, or one whose count does not divide ``to``)."""
    grow = []
    for topic, n in before.items():
        if n == to:
            continue
        control.check_grow(n, to)
        grow.append(topic)
    return grow


def _create_partitions(client: Any, topics: list[str], to: int, timeout_s: float) -> None:
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewPartitions  # type: ignore[attr-defined]

    futures = client.create_partitions([NewPartitions(t, to) for t in topics], operation_timeout=timeout_s,
                                       request_timeout=timeout_s)
    for topic, future in futures.items():
        try:
            future.result()
        except KafkaException as exc:
            err = exc.args[0]
            if err.code() == KafkaError.INVALID_PARTITIONS and "already has" in str(err):
                continue  # a concurrent run did it
            raise InfraError(f"cannot add partitions to {topic}: {err}") from exc


def _write_markers(bootstrap: str, topic: str, to: int, credentials_dir: Path | None,
                   timeout_s: float) -> dict[int, int]:
    """A grow marker to ``to`` on each of the ``to`` partitions of ``topic``; partition -> its offset."""
    from confluent_kafka import Producer

    from gnomon.adapters.kafka import producer_config, security_config

    producer = Producer(producer_config(bootstrap, role=None, **{
        "client.id": "gnomon-grow", "logger": _quiet, **security_config("admin", credentials_dir=credentials_dir)}))
    written: dict[int, int] = {}
    errors: list[str] = []

    def report(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(f"partition {msg.partition()}: {err}")
        else:
            written[msg.partition()] = msg.offset()

    for p in range(to):
        producer.produce(topic, key=control.GROW_KEY.encode(), value=control.encode_count(to), partition=p,
                         on_delivery=report)
    left = producer.flush(timeout_s)
    if errors or left:
        raise InfraError(f"grow markers not written to {topic}: {'; '.join(errors) or f'{left} undelivered'}")
    return written


# confluent-kafka's "logger" must be a logging.Logger (it calls .log on it): a plain
# function made the first librdkafka log line during the markers' flush (a broker
# connection closed) crash `gnomon infra grow` with "'function' object has no attribute
# 'log'" (seen in the host chaos test's idempotent second grow)
_quiet = logging.getLogger("gnomon.infra.grow.librdkafka")
_quiet.addHandler(logging.NullHandler())
_quiet.propagate = False


def wait_read(bootstrap: str, topic: str, markers: dict[int, int], timeout_s: float,
              progress: Callable[[int, int], None], *, jobs_topic: str | None = None, born: int = 0,
              group: str = PROCESSOR_GROUP) -> float:
    """Wait until the processors' group (``group``: its id in the topics' namespace) has
    committed past every marker and, with ``jobs_topic``, every partition from ``born``
    on has its handover there (a marker the processors poisoned is read past with
    nothing handed over); seconds waited."""
    from gnomon.eventlog.kafka import KafkaEventLog

    reader = KafkaEventLog(bootstrap, role="admin").reader(group, client_id="gnomon-grow")
    began = time.monotonic()
    try:
        last = -1
        while True:
            committed = reader.committed([(topic, p) for p in markers], 10.0)
            done = sorted(p for p, off in markers.items() if (committed.get((topic, p)) or 0) > off
                          and (jobs_topic is None or p < born or reader.watermarks((jobs_topic, p), 10.0)[1] > 0))
            if len(done) != last:
                progress(len(done), len(markers))
                last = len(done)
            if len(done) == len(markers):
                return time.monotonic() - began
            if time.monotonic() - began > timeout_s:
                waiting = sorted(set(markers) - set(done))
                raise InfraError(
                    f"partitions {waiting} of {topic} have not read their grow marker, or have no handover, in "
                    f"{timeout_s:.0f} s: is a processor running (`gnomon status`)? `gnomon infra poison` shows a "
                    "marker the processors refused. Nothing is lost: the grow completes when they read it; run this "
                    "command again (it writes the markers again) to wait for it")
            time.sleep(POLL_S)
    finally:
        reader.close()


def grow(bootstrap: str, topo: Topology, to: int, *, timeout_s: float = 300.0,
         credentials_dir: Path | None = None, say: Callable[[str], None] = print) -> GrowReport:
    """The whole procedure (module doc), on ``topo``'s namespace. ValueError for a count
    that cannot be grown to, InfraError when Kafka refuses or the processors do not read
    their markers in time."""
    from gnomon.infra.kafka import admin
    from gnomon.infra.topics import _wait_until_led

    if topo.region is not None:
        say(f"growing region {topo.region}'s namespace")
    topics = topo.co_partitioned()
    client = admin(bootstrap, credentials_dir=credentials_dir)
    before = counts(client, topics, 30.0)
    todo = plan(before, to)
    if todo:
        say(f"adding partitions: {', '.join(f'{t} {before[t]} -> {to}' for t in todo)}")
        _create_partitions(client, todo, to, 30.0)
        _wait_until_led(bootstrap, dict.fromkeys(todo, to), 60.0, credentials_dir)
    else:
        say(f"every co-partitioned topic has {to} partitions already; (re)writing the grow markers")
    markers = _write_markers(bootstrap, topo.job_commands, to, credentials_dir, MARKER_TIMEOUT_S)
    say(f"grow markers written to the {to} partitions of {topo.job_commands}; waiting for the processors")
    waited = wait_read(bootstrap, topo.job_commands, markers, timeout_s,
                       lambda done, total: say(f"  handed over: {done}/{total} partitions"),
                       jobs_topic=topo.jobs, born=topo.partitions,
                       group=region.group_id(PROCESSOR_GROUP, topo.region))
    say(f"grown to {to} partitions in {waited:.1f} s (the topology file keeps {topo.partitions}: the count the "
        "topics were created with)")
    return GrowReport(before, to, markers, waited)
