"""``gnomon regions status|takeover|failback``: which region runs each region's jobs.

Read and written with the ``admin`` Kafka principal (an operator's command) on the regions
topic (:mod:`gnomon.core.regions`, docs/adr/0013-regions.md). A takeover or a failback
is one ownership record; it is written only where the cluster's majority is reachable,
so running it in a region that is cut off fails with exit 1 and changes nothing.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from gnomon.cli.common import command, console, fail, print_json, safe

app = typer.Typer(help="Which region runs each region's jobs: status, takeover, failback.", no_args_is_help=True)


def _known(region_name: str) -> str:
    from gnomon import region

    try:
        return region.validate(region_name, "REGION")
    except ValueError as exc:
        fail(str(exc), 2)


def _gate(ns: str, runs_in: str) -> object:
    from gnomon.config import load
    from gnomon.core.clock import SystemClock
    from gnomon.eventlog.kafka import KafkaEventLog
    from gnomon.gate import RegionGate
    from gnomon.topology import load_topology

    log = KafkaEventLog(load().kafka_bootstrap, role="admin")
    return RegionGate(log, load_topology(region=None).regions, ns, runs_in, SystemClock(), instance="operator")


def _move(ns: str, to: str, reason: str) -> None:
    from gnomon.core.errors import EventLogError
    from gnomon.gate import RegionGate

    gate = _gate(ns, to)
    assert isinstance(gate, RegionGate)
    try:
        done = gate.move(to, reason)
    except EventLogError as exc:
        fail(f"not changed: {exc}", 1)
    finally:
        gate.close()
    if done is None:
        console.print(f"region {to} runs {ns} already (epoch {gate.view.owner(ns).epoch})")
    else:
        console.print(f"region {to} runs {ns} now (epoch {done.epoch}); the processes of the region that ran it "
                      f"stop at their next check, and region {to}'s standbys start")


@app.command()
@command
def status(
    regions: Annotated[list[str] | None, typer.Argument(help="regions to show (default: $GNOMON_REGIONS)")] = None,
    json_: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Who runs each region's namespace, since when, and why."""
    from gnomon import region
    from gnomon.core.clock import ms_to_iso
    from gnomon.gate import RegionGate

    names = [_known(r) for r in regions] if regions else list(region.configured())
    if not names:
        fail("name the regions (gnomon regions status a b) or set GNOMON_REGIONS", 2)
    gate = _gate(names[0], names[0])
    assert isinstance(gate, RegionGate)
    try:
        gate.refresh()
    finally:
        gate.close()
    if not gate.readable:
        fail("cannot read the regions topic (is Kafka up, and this host on the majority's side?)", 1)
    rows = [gate.view.owner(n) for n in names]
    if json_:
        print_json([{"region": o.region, "owner": o.owner, "epoch": o.epoch,
                     "at": ms_to_iso(o.at_ms) if o.at_ms else None, "reason": o.reason,
                     "heartbeats": gate.view.beats.get(o.region, 0)} for o in rows])
        return
    table = Table("region", "run by", "epoch", "since", "why", "heartbeats read")
    for o in rows:
        table.add_row(safe(o.region), safe(o.owner), str(o.epoch), safe(ms_to_iso(o.at_ms) if o.at_ms else "-"),
                      safe(o.reason), str(gate.view.beats.get(o.region, 0)))
    console.print(table)


@app.command()
@command
def takeover(
    region_name: Annotated[str, typer.Argument(metavar="REGION", help="the region whose jobs move")],
    by: Annotated[str, typer.Option("--by", help="the region that runs them from now")],
) -> None:
    """Let region --by run REGION's jobs now (its standby processes start within seconds)."""
    ns, to = _known(region_name), _known(by)
    if ns == to:
        fail("--by: a region takes over another region's jobs; to bring them home use `gnomon regions failback`", 2)
    _move(ns, to, f"operator takeover by {to}")


@app.command()
@command
def failback(region_name: Annotated[str, typer.Argument(metavar="REGION", help="the region whose jobs go home")]) -> None:
    """Bring REGION's jobs home: its own processes run them again."""
    ns = _known(region_name)
    _move(ns, ns, "operator failback")
