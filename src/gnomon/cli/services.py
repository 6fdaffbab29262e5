"""Long-running services: processor, worker, projector, alerter, api, and ``dev`` (all of them)."""

from __future__ import annotations

import importlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gnomon import stacks
from gnomon.cli.common import command, console, fail, require_server_extra
from gnomon.config import REPO_ROOT, load
from gnomon.core.errors import ValidationError
from gnomon.worker.log_budget import LOG_LINES_MAX

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from gnomon.metrics.liveness import Watchdog
    from gnomon.metrics.serve import Health


def _logging(verbose: bool) -> None:
    from gnomon.logs import configure

    configure(logging.DEBUG if verbose else logging.INFO)


MetricsPort = Annotated[int | None, typer.Option(
    "--metrics-port", min=0, max=65535,
    help="serve /metrics on this port (0: off; default: $GNOMON_<KIND>_METRICS_PORT, else the first free one "
         "from 9470 processor, 9480 projector, 9490 worker)")]


StallLimit = Annotated[float, typer.Option(
    "--stall-limit-s", min=0, max=86_400, envvar="GNOMON_STALL_LIMIT_S",
    help="exit (code 75) after this long without progress while the broker answers, so that a supervisor "
         "restarts it; /healthz says 503 and gnomon_stalled 1 (0: never)")]


def _serve_metrics(registry: CollectorRegistry, kind: str, port: int | None, health: Health | None = None) -> None:
    from gnomon.metrics.serve import serve

    s = load()
    configured = {"processor": s.processor_metrics_port, "worker": s.worker_metrics_port,
                  "projector": s.projector_metrics_port}[kind]
    serve(registry, kind, port=port if port is not None else configured, host=s.metrics_host, health=health)


EXIT_GRACE_S = 15.0  # a stuck process asked to stop is killed from within after this
WORKER_FLUSH_S = 10.0  # a stopping worker's last flush (Worker.shutdown)


def _watchdog(kind: str, registry: CollectorRegistry, progress_at: Callable[[], float], stop: Callable[[], None],
              limit_s: float, role: str, grace_s: float = EXIT_GRACE_S) -> Watchdog | None:
    """Liveness for a long-running process (``gnomon.metrics.liveness``): stuck with the
    broker answering for ``limit_s``, it is asked to stop and, if its loop does not come
    back (stuck inside a client library), ended with ``EXIT_STALLED`` after ``grace_s``
    (a worker's covers its drain: killed mid-drain, its attempts' processes would outlive it)."""
    if limit_s <= 0:
        return None
    from gnomon.eventlog.kafka import KafkaProbe
    from gnomon.metrics.liveness import (
        EXIT_STALLED,
        LivenessGauges,
        ProgressWatch,
        Verdict,
        Watchdog,
    )

    probe = KafkaProbe(load().kafka_bootstrap, role=role)

    def on_stuck(_v: Verdict) -> None:
        stop()
        timer = threading.Timer(grace_s, lambda: os._exit(EXIT_STALLED))
        timer.daemon = True
        timer.start()

    watch = ProgressWatch(limit_s, progress_at, time.monotonic)
    return Watchdog(watch, lambda: probe.reachable(3.0), on_stuck, gauges=LivenessGauges(registry, kind),
                    on_stop=probe.close).start()


def _exit_if_stalled(dog: Watchdog | None) -> None:
    """After the loop: the watchdog stopped (its probe's client closed), and exit code
    ``EXIT_STALLED`` if it had tripped."""
    from gnomon.metrics.liveness import EXIT_STALLED

    if dog is not None:
        dog.stop()
        if dog.tripped:
            raise typer.Exit(EXIT_STALLED)


def _interrupt_on_signals() -> None:
    """SIGTERM and SIGHUP (a closed terminal) stop like Ctrl-C: a supervisor killed without
    stopping its children would leave them running, holding their ports. SIGINT is set
    too: a non-interactive shell starts its background jobs with SIGINT ignored, and
    Python then installs no KeyboardInterrupt for it."""
    def handler(_sig: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGHUP, handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _stop_on_signals(stop: threading.Event | object) -> None:
    """SIGTERM and SIGINT stop the loop cleanly; SIGUSR1 writes every thread's stack to
    stderr (the process's log) and goes on: where a process that went silent waits."""
    def handler(_sig: int, _frame: object) -> None:
        stop.stop() if hasattr(stop, "stop") else stop.set()  # type: ignore[attr-defined]

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    stacks.dump_on_sigusr1()


@command
def processor(
    instance_id: Annotated[str | None, typer.Option(help="stable id of this instance (transactional id)")] = None,
    lookahead_s: Annotated[int, typer.Option(min=0, max=3600, help="trigger jobs due within this many seconds")] = 30,
    misfire_grace_s: Annotated[int, typer.Option(
        min=1, max=86_400, help="a slot later than this when its partition is next ticked (after an outage) "
                                "follows its job's catch-up policy; also the default lateMaxS")] = 60,
    stage_ahead_s: Annotated[int | None, typer.Option(
        min=0, max=3600, help="grant runs to workers this long before their slot (default: the lookahead)")] = None,
    lease_s: Annotated[int, typer.Option(min=2, max=3600, help="a grant's lease; workers heartbeat every lease/3")] = 30,
    session_timeout_ms: Annotated[int, typer.Option(
        min=1000, max=300_000,
        help="a dead processor's partitions move after this; the broker's group.min.session.timeout.ms "
             "must allow it (gnomon infra sets 1000; Kafka's default minimum is 6000)")] = 3000,
    retention_s: Annotated[int, typer.Option(
        min=1, max=30 * 86400,
        help="a finished run leaves processor state and the ledger this long after it ended, "
             "once history has it (history keeps it)")] = 3600,
    standbys: Annotated[bool, typer.Option(
        help="keep warm copies of the partitions other processors own, so a takeover reads only "
             "the changelog tail (costs a second apply of every changelog record)")] = True,
    priority_weights: Annotated[str, typer.Option(
        help="high,normal,low: under contention, runs take free worker slots in these proportions")] = "70,20,10",
    batch_max: Annotated[int, typer.Option(
        min=1, max=20_000,
        help="input records applied per transaction at most (larger: more throughput when behind, "
             "and each record waits for a longer batch's commit)")] = 500,
    accept_unsigned_commands: Annotated[bool, typer.Option(
        help="apply job commands without a valid signature of their tenant's command key (ADR 0006): "
             "any holder of the api Kafka credential can then act for every tenant; for a migration only")] = False,
    takeover_s: Annotated[float, typer.Option(
        min=0, max=3600, help="with $GNOMON_REGION: a standby in another region ($GNOMON_RUNS_IN) takes the "
                              "namespace over after its owner's processors were silent this long; 0: only "
                              "`gnomon regions takeover` does (docs/adr/0013-regions.md)")] = 20.0,
    metrics_port: MetricsPort = None,
    stall_limit_s: StallLimit = 60.0,
    verbose: bool = False,
) -> None:
    """Run the scheduler + run processor (consumes job commands and run events)."""
    import socket

    require_server_extra("processor", "rocksdict")

    from gnomon.codec.remote import install_registry_source
    from gnomon.command_keys import DirKeyring, keys_dir
    from gnomon.core.jobs import SchedulerConfig
    from gnomon.core.priorities import parse_weights
    from gnomon.core.runs import RunConfig
    from gnomon.processor.runtime import Processor, ProcessorConfig

    try:
        weights = parse_weights(priority_weights)
    except ValueError as exc:
        fail(f"--priority-weights: {exc}", 2)
    _logging(verbose)
    s = load()
    install_registry_source(s)  # a newer release's schema ids: asked of the schema registry (schemas/README.md)
    cfg = ProcessorConfig(bootstrap=s.kafka_bootstrap, state_dir=s.state_dir,
                          instance_id=instance_id or socket.gethostname(), session_timeout_ms=session_timeout_ms,
                          standbys=standbys, batch_max=batch_max,
                          sched=SchedulerConfig(lookahead_ms=lookahead_s * 1000,
                                                misfire_grace_ms=misfire_grace_s * 1000),
                          runs=RunConfig(lease_ms=lease_s * 1000, retention_ms=retention_s * 1000,
                                         priority_weights=weights,
                                         stage_ahead_ms=(lookahead_s if stage_ahead_s is None else stage_ahead_s) * 1000))
    if accept_unsigned_commands:
        logging.getLogger("gnomon.processor").warning(
            "--accept-unsigned-commands: job commands are applied without proof of their tenant; any holder of "
            "the api Kafka credential may act for every tenant")
    from gnomon.gate import STALE_S

    if 0 < takeover_s <= STALE_S:
        fail(f"--takeover-s must be above {STALE_S:g} s, the time an active processor that lost the cluster "
             "waits before it stops (or 0: takeovers by `gnomon regions takeover` only)", 2)
    proc = Processor(cfg, keyring=None if accept_unsigned_commands else DirKeyring(keys_dir(s)))
    proc.gate = _gate(lambda: proc.log, proc.topo.regions, proc.clock, cfg.instance_id, takeover_s=takeover_s or None)
    dog = _watchdog("processor", proc.metrics.registry, lambda: proc.progress_at_s, proc.stop, stall_limit_s,
                    role="processor")
    _serve_metrics(proc.metrics.registry, "processor", metrics_port, health=dog.health if dog else None)
    _stop_on_signals(proc)
    proc.run()
    _exit_if_stalled(dog)
    if proc.fenced:  # another region runs the namespace now: the supervisor starts it again, as a standby
        fail(f"stopped: {proc.gate.stop_reason if proc.gate else 'another region runs this namespace'}", 3)


@command
def worker(
    pool: Annotated[str, typer.Option(help="worker pool to serve")] = "default",
    concurrency: Annotated[int, typer.Option(
        min=1, max=20_000, help="attempts at once: the processor stages at most this many runs due in any "
                                "one second on it")] = 8,
    stage_max: Annotated[int | None, typer.Option(
        min=1, max=1_000_000, help="attempts it holds staged ahead of their slots, in all "
                                   "[default: 10,000 or twice --concurrency, whichever is more]")] = None,
    app: Annotated[str | None, typer.Option(help="module:attribute of a Worker with your handlers")] = None,
    worker_id: Annotated[str | None, typer.Option(help="default: host-pid-random")] = None,
    tenant: Annotated[list[str] | None, typer.Option(
        help="a tenant this pool serves (repeat for a shared pool; default: $GNOMON_WORKER_TENANTS)")] = None,
    policy: Annotated[Path | None, typer.Option(
        help="the pool's policy file (TOML): commands, containers, sandbox limits, HTTP rules")] = None,
    secrets_dir: Annotated[Path | None, typer.Option(
        help="per-tenant secrets on this host: DIR/<tenant>/<name> (default: <state dir>/secrets)")] = None,
    log_lines_max: Annotated[int, typer.Option(
        min=1, max=10_000_000, help="an attempt's output lines logged; the rest are counted, cut and said so in "
                                    "one line")] = LOG_LINES_MAX,
    metrics_port: MetricsPort = None,
    stall_limit_s: StallLimit = 60.0,
    verbose: bool = False,
) -> None:
    """Run a worker of POOL: holds runs staged on it and starts each at its slot.

    Runs only the jobs of the tenants it serves; commands and containers run sandboxed,
    and only when the policy enables them (docs/security.md)."""
    from gnomon.codec.remote import install_registry_source
    from gnomon.outbound.secrets import SecretStore
    from gnomon.worker import Worker
    from gnomon.worker.policy import PolicyError, PoolPolicy
    from gnomon.worker.worker import default_stage_max

    _logging(verbose)
    if app:
        mod_name, _, attr = app.partition(":")
        if "" not in sys.path and os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())  # like uvicorn: `--app mymod:worker` from the module's directory
        try:
            w = getattr(importlib.import_module(mod_name), attr or "worker")
        except (ImportError, AttributeError) as exc:
            fail(f"--app {app!r}: {exc}", 2)
        if not isinstance(w, Worker):
            fail(f"--app {app!r} is not a gnomon.worker.Worker", 2)
        if w.stage_max == default_stage_max(w.concurrency_max):  # (the app's own stage_max stays)
            w.stage_max = default_stage_max(concurrency)
        w.pool, w.concurrency_max = pool, concurrency
    else:
        from gnomon.demo import handlers as demo

        w = Worker(pool, concurrency_max=concurrency, worker_id=worker_id)
        demo.register(w)
    if stage_max is not None:
        w.stage_max = stage_max
    w.log_lines_max = log_lines_max
    if worker_id:
        w.worker_id = worker_id
    tenants = [t for t in (tenant or os.environ.get("GNOMON_WORKER_TENANTS", "").split(",")) if t.strip()]
    w.tenants = w.tenants | {t.strip() for t in tenants}
    try:
        if policy is not None:
            w._policy = PoolPolicy.load(policy, w.tenants)
        w.policy  # noqa: B018  (resolves and checks it now, before joining)
    except PolicyError as exc:
        fail(str(exc), 2)
    w.secrets = SecretStore(secrets_dir or load().state_dir / "secrets")
    s = load()
    install_registry_source(s)  # a newer release's schema ids: asked of the schema registry (schemas/README.md)
    dog = _watchdog("worker", w.ensure_metrics().registry, lambda: w.progress_at_s, w.stop, stall_limit_s, role="worker",
                    grace_s=w.drain_timeout_s + WORKER_FLUSH_S + EXIT_GRACE_S)
    w.serve_metrics(metrics_port if metrics_port is not None else s.worker_metrics_port, s.metrics_host,
                    health=dog.health if dog else None)
    _stop_on_signals(w)
    w.gate = _gate(lambda: _worker_log(w.bootstrap), w.topo.regions, w.clock, w.worker_id, beats=False)
    w.run()
    _exit_if_stalled(dog)
    if w.fenced:
        fail(f"stopped: {w.gate.stop_reason if w.gate else 'another region runs this namespace'}", 3)


def _worker_log(bootstrap: str) -> Any:
    from gnomon.eventlog.kafka import KafkaEventLog

    return KafkaEventLog(bootstrap, role="worker")


def _gate(log_: Callable[[], Any], topic: str, clock: Any, instance: str, *, takeover_s: float | None = None,
          beats: bool = True) -> Any:
    """The region gate of a process of ``$GNOMON_REGION``'s namespace (None without one)."""
    from gnomon import region
    from gnomon.gate import RegionGate

    try:
        home = region.current()
        runs_in = region.runs_in()
    except ValueError as exc:
        fail(str(exc), 2)
    if home is None or runs_in is None:
        return None
    return RegionGate(log_(), topic, home, runs_in, clock, instance=instance, takeover_s=takeover_s, beats=beats)


@command
def projector(metrics_port: MetricsPort = None, verbose: bool = False) -> None:
    """Project run events, jobs and logs into Cassandra history."""
    require_server_extra("projector", "cassandra")
    from gnomon.codec.remote import install_registry_source
    from gnomon.history.projector import HistoryProjector

    _logging(verbose)
    s = load()
    install_registry_source(s)  # a newer release's schema ids: asked of the schema registry (schemas/README.md)
    stop = threading.Event()
    _stop_on_signals(stop)
    proj = HistoryProjector.from_settings(s)
    _serve_metrics(proj.metrics.registry, "projector", metrics_port)
    proj.run(stop)


@command
def alerter(
    secrets_dir: Annotated[Path | None, typer.Option(
        help="the tenants' http-signing-key secrets: DIR/<tenant>/http-signing-key "
             "(default: <state dir>/secrets); a tenant without one gets unsigned alerts")] = None,
    allowed_cidr: Annotated[list[str] | None, typer.Option(
        help="a network webhooks may reach although not public (repeat; default: $GNOMON_ALERT_ALLOWED_CIDRS)")] = None,
    allow_plain_http: Annotated[bool | None, typer.Option(
        "--allow-plain-http/--https-only",
        help="let webhooks use http:// (default: $GNOMON_ALERT_ALLOW_PLAIN_HTTP, else https only)")] = None,
    allowed_port: Annotated[list[str] | None, typer.Option(
        help="a port or range webhooks may use (repeat; default: $GNOMON_ALERT_ALLOWED_PORTS, else 443 and 8443, "
             "and 80 and 8080 with plain http)")] = None,
    attempts_max: Annotated[int, typer.Option(min=1, max=100, help="calls per alert, the first included")] = 5,
    backoff_s: Annotated[float, typer.Option(min=0, max=3600, help="wait after the first failed call, doubling")] = 1.0,
    backoff_cap_s: Annotated[float, typer.Option(min=0, max=3600, help="longest wait between calls")] = 30.0,
    timeout_s: Annotated[float, typer.Option(min=0.1, max=300, help="one call's timeout")] = 5.0,
    in_flight_max: Annotated[int, typer.Option(min=1, max=1024, help="alerts being delivered at once")] = 32,
    tenant_in_flight_max: Annotated[int, typer.Option(
        min=1, max=1024, help="of those, at most this many for one tenant (a hanging webhook delays only its "
                              "own tenant)")] = 8,
    tenant_backlog_max: Annotated[int, typer.Option(
        min=0, max=1_000_000, help="a tenant's alerts waiting for a place; more are given up and counted")] = 1000,
    group_id: Annotated[str, typer.Option(
        help="the ledger consumer group (gnomon-alerter or gnomon-alerter-<name>; with $GNOMON_REGION, joined "
             "as <group>.<region>); a new group starts at the ledger's end")] = "gnomon-alerter",
    verbose: bool = False,
) -> None:
    """Call the tenants' alert webhooks: dead letters, skipped slots, late starts (docs/operations.md, "Alerts")."""
    from gnomon.alerts.feed import AlertFeed
    from gnomon.alerts.policy import http_policy
    from gnomon.alerts.sender import AlertSender
    from gnomon.alerts.service import ROLE, Alerter
    from gnomon.codec.remote import install_registry_source
    from gnomon.core.alerts import AlertBook, DeliveryPolicy
    from gnomon.outbound.secrets import SecretStore
    from gnomon.topology import load_topology

    if not (group_id == "gnomon-alerter" or group_id.startswith("gnomon-alerter-")):
        fail("--group-id: must be gnomon-alerter or start with gnomon-alerter- (the alerter's Kafka ACL)", 2)
    try:
        http = http_policy(allowed_cidr, allow_plain_http, allowed_port)
        policy = DeliveryPolicy(attempts_max, backoff_s, max(backoff_s, backoff_cap_s), timeout_s, in_flight_max,
                                tenant_in_flight_max, tenant_backlog_max)
    except ValueError as exc:
        fail(f"alerter: {exc}", 2)
    _logging(verbose)
    if not verbose:
        logging.getLogger("httpx").setLevel(logging.WARNING)  # the alerter logs each call itself
    s = load()
    install_registry_source(s)  # a newer release's schema ids: asked of the schema registry (schemas/README.md)
    feed = AlertFeed(s.kafka_bootstrap, load_topology(), AlertBook(), role=ROLE)
    feed.load()
    sender = AlertSender(http, SecretStore(secrets_dir or s.state_dir / "secrets"))
    logging.getLogger("gnomon.alerts").info("webhooks: %s (the API's PUT /v1/alerts check reads the same "
                                            "GNOMON_ALERT_* variables, not these flags)", http.describe())
    stop = threading.Event()
    _stop_on_signals(stop)
    Alerter(feed.book, sender, policy, bootstrap=s.kafka_bootstrap, feed=feed, group_id=group_id).run(stop)


@command
def api(
    port: Annotated[int | None, typer.Option(help="default 8787 (GNOMON_API_PORT)")] = None,
    host: str = "127.0.0.1",
    dev: Annotated[bool, typer.Option("--dev", help="allow the dev token when GNOMON_API_TOKENS is unset")] = False,
    workers: Annotated[int | None, typer.Option(
        min=1, max=64, help="API processes sharing the port, each with its own Kafka producer and Cassandra "
                            "session (default $GNOMON_API_WORKERS or 1)")] = None,
    access_log: Annotated[bool, typer.Option(help="log every request (one line each)")] = True,
    tls_cert: Annotated[Path | None, typer.Option(
        "--tls-cert", help="serve HTTPS with this certificate chain (PEM; default $GNOMON_API_TLS_CERT); "
                           "plain HTTP is then refused")] = None,
    tls_key: Annotated[Path | None, typer.Option(
        "--tls-key", help="its private key (PEM; default $GNOMON_API_TLS_KEY)")] = None,
) -> None:
    """Serve the REST API (OpenAPI at /openapi.json)."""
    require_server_extra("api", "fastapi", "uvicorn")
    from gnomon.api.wiring import api_workers, serve
    from gnomon.web.auth import load_principals

    s = load()
    if dev:  # the worker processes build their own app: they read dev mode from the environment
        os.environ["GNOMON_DEV"] = "1"
    load_principals(s)  # no tokens: refuse here, once, before any worker starts
    cert = tls_cert or (Path(v) if (v := os.environ.get("GNOMON_API_TLS_CERT")) else None)
    key = tls_key or (Path(v) if (v := os.environ.get("GNOMON_API_TLS_KEY")) else None)
    if (cert is None) != (key is None):
        raise ValidationError("--tls-cert/--tls-key", "give both the certificate and its key, or neither")
    for flag, path in (("--tls-cert", cert), ("--tls-key", key)):
        if path is not None and not path.is_file():
            raise ValidationError(flag, f"{path} is not a readable file")
    serve(host=host, port=port or s.api_port, workers=api_workers() if workers is None else workers,
          access_log=access_log, tls=(cert, key) if cert is not None and key is not None else None)


@command
def dev(
    no_infra: Annotated[bool, typer.Option("--no-infra", help="assume Kafka and Cassandra are up")] = False,
) -> None:
    """Start infra, a processor, a worker, the projector, the alerter and the API; a child that
    exits is started again (backoff 1 s doubling to 60 s, as a supervisor would); Ctrl-C
    stops them all."""
    require_server_extra("dev", "rocksdict", "cassandra", "fastapi", "uvicorn")
    from gnomon.tokens import dev_admin_token, dev_token

    s = load()
    if not no_infra:
        from gnomon.infra import manager

        manager.up(s)
    exe = [sys.executable, "-m", "gnomon.cli.main"]
    logs = s.state_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    from gnomon.cli.supervisor import Supervisor

    def spawn(name: str, args: Sequence[str]) -> subprocess.Popen[bytes]:
        with open(logs / f"dev-{name}.log", "ab") as out:  # the child keeps its own descriptor
            return subprocess.Popen([*exe, *args], stdout=out, stderr=subprocess.STDOUT)

    sup = Supervisor(spawn, time.monotonic, say=lambda msg: console.print(f"[yellow]gnomon dev[/] {msg}",
                                                                         highlight=False))
    _interrupt_on_signals()
    for name, args in (("processor", ["processor", "--instance-id", "dev"]), ("worker", ["worker", "--tenant", "dev", "--policy", str(REPO_ROOT / "infra/policies/dev.toml")]),
                       ("projector", ["projector"]), ("alerter", ["alerter"]), ("api", ["api", "--dev"])):
        sup.start(name, args)
    console.print(f"[bold green]gnomon dev[/] API {s.api_url}  token: {dev_token(s)}  admin token: {dev_admin_token(s)}",
                  highlight=False)
    console.print(f"logs: {logs}/dev-{{processor,worker,projector,alerter,api}}.log", highlight=False)
    console.print("Ctrl-C stops everything this command started; a child that exits is restarted (with backoff).")
    try:
        while True:
            sup.tick()
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        sup.stop_all(15)
