"""``python -m gnomon.registry [--port N] [--host H]``: serve the schema registry.

At start it reads its store topic (``Topology.schemas``) to the end, then imports the
checked-in registry (``schemas/avro/registry.json``, ids unchanged) and writes the
versions the store lacks; a contradiction between the two is fatal (exit 1, one line).
Then it serves on ``--host`` (127.0.0.1) port ``--port`` (``Settings.registry_port``,
``$GNOMON_REGISTRY_PORT``, 8081), to requests whose ``Host`` names loopback, ``--host`` or an
``--allow-host`` (DNS rebinding: a page whose name resolves to 127.0.0.1 is refused). Kafka: ``Settings.kafka_bootstrap`` as the role
``registry``. ``gnomon infra up`` runs this (gnomon.infra.registry).

``--memory``: no Kafka at all, the checked-in registry (``$GNOMON_AVRO_DIR`` or the
packaged one) in memory, lost at exit: a private registry for a test or for a branch
whose new ids must not reach a shared store.

Exit codes: 0 stopped, 1 cannot start (Kafka, the store, the port), 2 bad usage.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import NoReturn

from gnomon.core.errors import GnomonError
from gnomon.logs import configure

MARKER_PREFIX = "-Dgnomon.component="  # gnomon.infra.procs tags its processes so; ignored here

log = logging.getLogger("gnomon.registry")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        print(f"gnomon registry: {message} (usage: python -m gnomon.registry [--port N] [--host H])",
              file=sys.stderr)
        raise SystemExit(2)


def main(argv: list[str] | None = None) -> int:
    args_in = [a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith(MARKER_PREFIX)]
    p = _Parser(prog="python -m gnomon.registry", description="gnomon's schema registry (Confluent REST subset)")
    p.add_argument("--port", type=int, default=None, help="default: $GNOMON_REGISTRY_PORT or 8081")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--memory", action="store_true", help="no Kafka store: the checked-in schemas in memory")
    p.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                   help="a further name a request's Host header may carry (loopback names and --host always may)")
    p.add_argument("--no-auth", action="store_true",
                   help="serve without credentials (anyone who can connect may register schemas)")
    args = p.parse_args(args_in)
    configure(logging.INFO)

    import uvicorn

    from gnomon.config import load
    from gnomon.registry.app import LOOPBACK_HOSTS, create_app
    from gnomon.registry.auth import RegistryUsers
    from gnomon.registry.kafka_store import KafkaStore, read_all
    from gnomon.registry.service import MemoryStore, Registry, Store
    from gnomon.registry.state import checked_in_versions, fold, import_checked_in, own_subjects
    from gnomon.topology import load_topology

    settings = load()
    port = settings.registry_port if args.port is None else args.port
    topic = "memory" if args.memory else load_topology(settings.topology_path).schemas
    kafka_store: KafkaStore | None = None
    try:
        stored = [] if args.memory else read_all(settings.kafka_bootstrap, topic)
        state = fold(stored)
        checked = checked_in_versions()
        missing = import_checked_in(state, checked)
        store: Store = MemoryStore()
        if not args.memory:
            store = kafka_store = KafkaStore(settings.kafka_bootstrap, topic)
        store.append(missing)
        state = fold(missing, state)
    except GnomonError as exc:
        print(f"gnomon registry: cannot start: {exc}", file=sys.stderr)
        return 1
    log.info("store %s: %d record(s) read, %d checked-in version(s) imported; %d schema id(s), %d subject(s); "
             "serving on http://%s:%d", topic, len(stored), len(missing), len(state.by_id), len(state.subjects),
             args.host, port)
    wildcard = args.host in ("0.0.0.0", "::")  # not a name a client puts in Host
    hosts = (*LOOPBACK_HOSTS, *(() if wildcard else (args.host,)), *args.allow_host)
    users = None
    if args.no_auth:
        log.warning("--no-auth: anyone who can connect may read and register schemas")
    else:
        try:
            users = RegistryUsers.ensure(settings.credentials_dir)
        except GnomonError as exc:
            print(f"gnomon registry: cannot start: {exc}", file=sys.stderr)
            return 1
    app = create_app(Registry(state, store, own_subjects(state.by_id.values())), hosts, users)
    try:
        uvicorn.run(app, host=args.host, port=port, log_level="warning", access_log=False)
    finally:
        if kafka_store is not None:
            kafka_store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
