"""``gnomon infra poison``: the records the processors could not decode or apply.

Read with the ``admin`` Kafka principal (the operators' credential: no service role may
read the poison topic). Each record names where it came from (topic, partition, offset),
why it was refused, and keeps the original key and value, so that once the cause is
fixed it can be produced again (docs/runbooks.md, GnomonPoisonRecords).
"""

from __future__ import annotations

import base64
from typing import Annotated, Any

import typer
from rich.table import Table

from gnomon.cli.common import command, console, print_json, safe

READ_TIMEOUT_S = 30.0


@command
def poison(
    limit: Annotated[int, typer.Option(min=1, max=10_000, help="newest records shown, across partitions")] = 20,
    json_: Annotated[bool, typer.Option("--json", help="every field, the key and value in base64")] = False,
) -> None:
    """List the newest poison records: source, reason and when."""
    from gnomon import codec
    from gnomon.config import load
    from gnomon.core.clock import ms_to_iso
    from gnomon.eventlog.kafka import KafkaEventLog
    from gnomon.topology import load_topology

    topo = load_topology()
    log = KafkaEventLog(load().kafka_bootstrap, role="admin")
    found: list[Any] = []
    spec = next((t for t in topo.topics if t.name == topo.poison), None)
    for p in range(spec.partitions if spec is not None else topo.partitions):
        for rec in log.read_to_end(topo.poison, p, READ_TIMEOUT_S):
            if rec.value is not None:
                found.append(codec.decode(rec.value, topic=topo.poison))
    found.sort(key=lambda r: r.at_ms)
    shown = found[-limit:]
    if json_:
        print_json([{"sourceTopic": r.source_topic, "partition": r.partition, "offset": r.offset,
                     "reason": r.reason, "at": ms_to_iso(r.at_ms),
                     "key": None if r.key is None else base64.b64encode(r.key).decode(),
                     "value": None if r.value is None else base64.b64encode(r.value).decode()} for r in shown])
        return
    if not shown:
        console.print(f"no records on {topo.poison}")
        return
    table = Table("at", "source", "reason", title=f"{len(shown)} of {len(found)} records on {topo.poison}")
    for r in shown:
        table.add_row(safe(ms_to_iso(r.at_ms)), safe(f"{r.source_topic}[{r.partition}]@{r.offset}"),
                      safe(r.reason[:300]))
    console.print(table)
