"""``gnomon infra up|down|status``: Kafka (KRaft) and Cassandra from Maven Central, and
gnomon's schema registry (gnomon.registry)."""

from __future__ import annotations

from typing import Annotated

import typer

from gnomon.cli import poison as poison_cmd
from gnomon.cli.common import command, print_json, require_server_extra
from gnomon.config import load

app = typer.Typer(help="Fetch, start and stop Kafka and Cassandra (no Docker needed).", no_args_is_help=True)


@app.command()
@command
def up(kafka_nodes: Annotated[int, typer.Option(min=1, max=3, help="1 or 3 KRaft nodes")] = 1) -> None:
    """Fetch (first time), start and wait until Kafka, Cassandra and the schema registry
    serve; create topics."""
    from gnomon.core.errors import ValidationError
    from gnomon.infra import manager

    require_server_extra("infra up", "cassandra")
    if kafka_nodes not in (1, 3):
        raise ValidationError("--kafka-nodes", "must be 1 (development) or 3 (fault tests)")
    manager.up(load(), kafka_nodes=kafka_nodes)


@app.command()
@command
def down() -> None:
    """Stop everything `infra up` started."""
    from gnomon.infra import manager

    manager.down(load())


@app.command()
@command
def status(json_: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Show what is running."""
    from gnomon.infra import manager

    st = manager.status(load())
    if json_:
        print_json(st)
    else:
        for k, v in st.items():
            typer.echo(f"{k}: {v}")


app.command(name="poison")(poison_cmd.poison)
