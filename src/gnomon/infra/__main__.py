"""``python -m gnomon.infra up|down|status|topics [--kafka-nodes N] [--only COMPONENT]``.

``up`` starts Kafka, Cassandra and the schema registry (port ``$GNOMON_REGISTRY_PORT``,
default 8081); Kafka Connect only with ``--only connect`` (port ``$GNOMON_CONNECT_PORT``,
default 8083), which also starts PostgreSQL (``--only postgres`` alone: port
``$GNOMON_POSTGRES_PORT``, default 15432). ``down`` without ``--only`` stops them all.

``topics`` only creates the topics of ``streams/topology.toml`` (and each ``$GNOMON_REGIONS``
region's: gnomon.region) on an already running Kafka (``--bootstrap``,
``--replication-factor``) and applies changed configs to existing ones, as ``up`` does;
docker-compose.yml uses it.

Exit codes: 0 ok, 1 a component failed (one line, then a log excerpt), 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import NoReturn

from gnomon.infra.errors import InfraError

USAGE = (
    "python -m gnomon.infra up|down|status|topics [--kafka-nodes 1|3] "
    "[--only kafka|cassandra|registry|connect|postgres] "
    "[--tls|--no-tls] [--json] [--bootstrap HOST:PORT] [--replication-factor N]"
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        print(f"gnomon: {message} (usage: {USAGE})", file=sys.stderr)
        raise SystemExit(2)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="python -m gnomon.infra",
        usage=USAGE,
        description="Fetch, start and stop Kafka (KRaft) and Cassandra; no Docker needed.",
    )
    p.add_argument("action", choices=("up", "down", "status", "topics"))
    p.add_argument(
        "--kafka-nodes",
        type=int,
        choices=(1, 3),
        default=1,
        help="KRaft nodes on this host (up only; default 1)",
    )
    p.add_argument(
        "--only",
        choices=("kafka", "cassandra", "registry", "connect", "postgres"),
        help="act on one component (registry: the schema registry; connect: Kafka Connect, "
        "never started by default, and with it postgres, the database its JDBC sink writes to)",
    )
    p.add_argument("--tls", action=argparse.BooleanOptionalAction, default=None,
                   help="up only: Kafka's listeners speak TLS (SASL_SSL) with a private CA under <state dir>/tls; "
                        "remembered until --no-tls")
    p.add_argument("--json", action="store_true", help="status as JSON")
    p.add_argument("--bootstrap", help="topics only: Kafka to use (default: settings)")
    p.add_argument("--replication-factor", type=int, default=1, help="topics only (default 1)")
    return p


def _print_status(st: dict[str, dict[str, object]], as_json: bool) -> None:
    if as_json:
        print(json.dumps(st, indent=2, sort_keys=True))
        return
    for component, info in st.items():
        details = ", ".join(f"{k}={v}" for k, v in info.items() if k != "state")
        print(f"{component}: {info['state']}" + (f" ({details})" if details else ""))


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from gnomon.config import load
    from gnomon.infra import manager
    from gnomon.infra.perms import PRIVATE_UMASK

    os.umask(PRIVATE_UMASK)  # configs, pid files and logs it writes are private (perms.py)

    settings = load()
    components = (args.only,) if args.only else manager.COMPONENTS
    if args.action == "down" and not args.only:
        components = manager.ALL_COMPONENTS
    try:
        if args.action == "up":
            _print_status(
                manager.up(settings, kafka_nodes=args.kafka_nodes, components=components, tls=args.tls), args.json
            )
        elif args.action == "down":
            manager.down(settings, components=components)
        elif args.action == "topics":
            from gnomon.infra.topics import namespace_label, namespace_specs, sync_topics

            bootstrap = args.bootstrap or settings.kafka_bootstrap
            try:
                namespaces = namespace_specs(settings.topology_path)  # the default one, then each region's
            except ValueError as exc:  # a bad $GNOMON_REGIONS
                raise InfraError(str(exc)) from None
            for namespace, specs in namespaces:
                changes = sync_topics(bootstrap, specs, args.replication_factor)
                print(
                    f"{namespace_label(namespace)}{len(specs)} topics declared, {len(changes.created)} created, "
                    f"{len(changes.reconfigured)} reconfigured on {bootstrap}"
                )
        else:
            _print_status(manager.status(settings), args.json)
    except InfraError as exc:
        print(f"gnomon: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(
            "gnomon: interrupted (started processes keep running; `down` stops them)",
            file=sys.stderr,
        )
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
