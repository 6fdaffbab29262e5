"""``gnomon infra up|down|status [--only COMPONENT]``: Kafka (KRaft) and Cassandra from
Maven Central, gnomon's schema registry (gnomon.registry), and on request Kafka Connect
with PostgreSQL. The same as ``python -m gnomon.infra`` (which also has ``topics``)."""

from __future__ import annotations

from typing import Annotated

import typer

from gnomon.cli import poison as poison_cmd
from gnomon.cli.common import command, fail, print_json, require_server_extra
from gnomon.config import load

ONLY = ("kafka", "cassandra", "registry", "connect", "postgres")
ONLY_HELP = ("act on one component: " + ", ".join(ONLY) + " (connect, never started by default, also starts "
             "postgres, the database its JDBC sink writes to)")


def _only(only: str | None) -> str | None:
    from gnomon.core.errors import ValidationError

    if only is not None and only not in ONLY:
        raise ValidationError("--only", f"must be one of {', '.join(ONLY)}")
    return only

app = typer.Typer(help="Fetch, start and stop Kafka and Cassandra (no Docker needed).", no_args_is_help=True)


@app.command()
@command
def up(kafka_nodes: Annotated[int, typer.Option(min=1, max=3, help="1 or 3 KRaft nodes")] = 1,
       only: Annotated[str | None, typer.Option("--only", help=ONLY_HELP)] = None,
       tls: Annotated[bool | None, typer.Option(
           "--tls/--no-tls", help="Kafka's listeners speak TLS (SASL_SSL), with a private CA and per-node "
                                  "certificates under <state dir>/tls; remembered until --no-tls "
                                  "(default: as last time, else off)")] = None,
       hosts: Annotated[int, typer.Option(
           "--hosts", help="3: three hosts on this machine, 127.0.0.1-3, each with a Kafka node and a Cassandra "
                           "node (one cluster, replication 3); clients then use "
                           "GNOMON_CASSANDRA_HOSTS=127.0.0.1,127.0.0.2,127.0.0.3")] = 1,
       regions: Annotated[str | None, typer.Option(
           "--regions", help="with --hosts 3: two regions, e.g. a,b: host 1 is the first, host 2 the second, "
                             "host 3 a witness site; links between sites are delayed by --region-latency-ms "
                             "(docs/adr/0013-regions.md); 'none' goes back to plain hosts; default: as last time")] = None,
       region_latency_ms: Annotated[float, typer.Option(
           "--region-latency-ms", min=0, max=1000, help="delay each way between sites, with --regions")] = 30.0) -> None:
    """Fetch (first time), start and wait until Kafka, Cassandra and the schema registry
    serve (or only the --only component); create topics."""
    from gnomon.core.errors import ValidationError
    from gnomon.infra import manager

    require_server_extra("infra up", "cassandra")
    if kafka_nodes not in (1, 3):
        raise ValidationError("--kafka-nodes", "must be 1 (development) or 3 (fault tests)")
    one = _only(only)
    if hosts not in (1, 3):
        raise ValidationError("--hosts", "must be 1 or 3")
    if hosts == 3:
        kafka_nodes = 3
    if regions is not None:
        _set_regions(regions, region_latency_ms, hosts)
    manager.up(load(), kafka_nodes=kafka_nodes, components=(one,) if one else manager.COMPONENTS, tls=tls,
               cassandra_nodes=hosts)


def _set_regions(text: str, latency_ms: float, hosts: int) -> None:
    """Remember the regions layout (gnomon.infra.sites) before anything starts."""
    from gnomon.core.errors import ValidationError
    from gnomon.infra import cassandra, kafka, sites

    settings = load()
    wanted = None
    if text != "none":
        if hosts != 3:
            raise ValidationError("--regions", "needs --hosts 3 (region a on host 1, b on host 2, a witness on 3)")
        try:
            wanted = sites.Regions.parse(text, latency_ms)
        except ValueError as exc:
            fail(str(exc), 2)  # (its message names --regions or --region-latency-ms already)
    if wanted != sites.load(settings.state_dir) and (kafka.running_names(settings) or cassandra.running_names(settings)):
        raise ValidationError("--regions", "the stack runs with another layout; run `gnomon infra down` first")
    sites.save(settings.state_dir, wanted)


@app.command()
@command
def down(only: Annotated[str | None, typer.Option("--only", help=ONLY_HELP)] = None) -> None:
    """Stop everything `infra up` started (or only the --only component)."""
    from gnomon.infra import manager

    one = _only(only)
    manager.down(load(), components=(one,) if one else manager.ALL_COMPONENTS)


@app.command()
@command
def status(json_: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Show what is running."""
    from gnomon.infra import manager

    st = manager.status(load())
    if json_:
        print_json(st)
        return
    for k, v in st.items():
        members = v.pop("members", None) if isinstance(v, dict) else None
        typer.echo(f"{k}: {v}")
        for m in members if members and len(members) > 1 else ():  # three hosts: every node
            typer.echo(f"  {m['name']} on {m['host']}: {m['state']}" + (f" (pid {m['pid']})" if m["pid"] else ""))


host_app = typer.Typer(help="Stop or start one host's servers (its Kafka node and its Cassandra node) of "
                            "`infra up --hosts 3`; the other hosts keep serving.", no_args_is_help=True)
app.add_typer(host_app, name="host")
Host = Annotated[int, typer.Argument(help="the host: 1, 2 or 3 (127.0.0.1-3)")]


def _host(host: int) -> int:
    from gnomon.core.errors import ValidationError

    if host not in (1, 2, 3):
        raise ValidationError("host", "must be 1, 2 or 3")
    return host


@host_app.command(name="stop")
@command
def host_stop(host: Host) -> None:
    """Stop host N's Kafka node and Cassandra node (SIGTERM, then SIGKILL after 60 s)."""
    from gnomon.infra import manager

    manager.stop_host(load(), _host(host))


@host_app.command(name="start")
@command
def host_start(host: Host) -> None:
    """Start host N's Kafka node and Cassandra node and wait until both serve again."""
    from gnomon.infra import manager

    require_server_extra("infra host start", "cassandra")
    manager.start_host(load(), _host(host))


app.command(name="poison")(poison_cmd.poison)


@app.command()
@command
def grow(to: Annotated[int, typer.Option("--to", help="the new partition count: a multiple of the current one")],
         timeout_s: Annotated[float, typer.Option(
             "--timeout-s", min=1.0, help="how long to wait for the processors to hand their jobs over")] = 300.0,
         ) -> None:
    """Give the co-partitioned topics more partitions while gnomon runs: the processors
    hand each moving job (its schedule and its runs) to its new partition themselves
    (docs/adr/0012-growing-partitions.md). Idempotent: run it again to finish or wait."""
    from gnomon.core.errors import ValidationError
    from gnomon.infra.grow import grow as grow_topics
    from gnomon.infra.progress import say
    from gnomon.topology import load_topology

    settings = load()
    try:
        grow_topics(settings.kafka_bootstrap, load_topology(), to, timeout_s=timeout_s,
                    credentials_dir=settings.credentials_dir, say=say)
    except ValueError as exc:
        raise ValidationError("--to", str(exc)) from None


@app.command()
@command
def cert(name: Annotated[str, typer.Argument(help="the certificate's name, e.g. api-1 (its files: <state dir>/tls/"
                                                   "NAME.pem and NAME.key)")],
         ip: Annotated[list[str] | None, typer.Option(
             "--ip", help="an address the server is reached at (repeat for several; default 127.0.0.1)")] = None,
         dns: Annotated[list[str] | None, typer.Option(
             "--dns", help="a DNS name the server is reached at (repeat; default localhost)")] = None,
         renew: Annotated[bool, typer.Option("--renew", help="issue it again even if it is current")] = False,
         ) -> None:
    """Issue (or show) a server certificate from this state directory's private CA, e.g.
    for the API's HTTPS: it is issued again when missing, naming other addresses, expiring
    within 30 days or signed by another CA; otherwise the current one is kept."""
    import ipaddress

    from gnomon.core.errors import ValidationError
    from gnomon.infra import tls

    if not name or not all(c.isalnum() or c in "-_." for c in name) or name.startswith("."):
        raise ValidationError("name", "letters, digits, '-', '_' and '.' only (it names files)")
    ips = ip or ["127.0.0.1"]
    for one in ips:
        try:
            ipaddress.ip_address(one)
        except ValueError:
            raise ValidationError("--ip", f"{one!r} is not an IP address") from None
    issued = tls.ensure_host(load().state_dir, name, ips, dns or None, force=renew)
    typer.echo(f"certificate: {issued.cert}\nkey:         {issued.key}\nCA:          {issued.ca}\n"
               f"serve HTTPS: gnomon api --tls-cert {issued.cert} --tls-key {issued.key}\n"
               f"clients:     GNOMON_API_CA_FILE={issued.ca}")
