"""Runtime settings, read from the environment once, with sane defaults.

Every setting has a unit in its name where it has one. Nothing here does I/O beyond
reading ``os.environ``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from gnomon._data import TOPOLOGY, data_path


def _repo_root() -> Path:
    """The checkout gnomon runs from (its ``.gnomon/`` is the default state dir), or the
    current directory for an installed gnomon (set ``GNOMON_STATE_DIR`` there)."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "streams" / "topology.toml").exists():
            return parent
    return Path.cwd()


REPO_ROOT = _repo_root()


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError as exc:
        raise SystemExit(f"gnomon: environment variable {name}={raw!r} is not an integer") from exc


def _env_port(name: str) -> int | None:
    """A port from the environment; None when unset (the process kind's default)."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return None
    port = _env_int(name, 0)
    if not 0 <= port <= 65535:
        raise SystemExit(f"gnomon: environment variable {name}={raw!r} is not a port (0 turns it off)")
    return port


@dataclass(frozen=True)
class Settings:
    state_dir: Path = field(
        default_factory=lambda: Path(os.environ.get("GNOMON_STATE_DIR", str(REPO_ROOT / ".gnomon")))
    )
    kafka_port: int = field(default_factory=lambda: _env_int("GNOMON_KAFKA_PORT", 9092))
    kafka_controller_port: int = field(
        default_factory=lambda: _env_int("GNOMON_KAFKA_CONTROLLER_PORT", 9093)
    )
    cassandra_port: int = field(default_factory=lambda: _env_int("GNOMON_CASSANDRA_PORT", 9042))
    cassandra_storage_port: int = field(
        default_factory=lambda: _env_int("GNOMON_CASSANDRA_STORAGE_PORT", 7000)
    )
    api_port: int = field(default_factory=lambda: _env_int("GNOMON_API_PORT", 8787))
    # the private PostgreSQL that Kafka Connect's JDBC sink exports runs into (gnomon.infra.postgres)
    postgres_port: int = field(default_factory=lambda: _env_int("GNOMON_POSTGRES_PORT", 15432))
    # The schema registry `gnomon infra up` starts (gnomon.registry, docs/adr/0009), on 127.0.0.1.
    registry_port: int = field(default_factory=lambda: _env_int("GNOMON_REGISTRY_PORT", 8081))
    # Where `gnomon infra up` writes the generated credentials (one 0600 JSON file per
    # role; see infra/README.md) and where clients look for theirs; default
    # <state_dir>/credentials. Production: $GNOMON_KAFKA_USERNAME/$GNOMON_KAFKA_PASSWORD,
    # $GNOMON_CASSANDRA_USERNAME/$GNOMON_CASSANDRA_PASSWORD instead.
    credentials_path: Path | None = field(
        default_factory=lambda: Path(p) if (p := os.environ.get("GNOMON_CREDENTIALS_DIR")) else None
    )
    # The topology packaged with gnomon (gnomon/_data/topology.toml: in a checkout a
    # symlink to streams/topology.toml), or $GNOMON_TOPOLOGY.
    topology_path: Path = field(
        default_factory=lambda: Path(p) if (p := os.environ.get("GNOMON_TOPOLOGY")) else data_path(TOPOLOGY)
    )
    # /metrics of the processor, the worker and the projector, each on a port of its own
    # (the API serves it on api_port). None: the kind's default, or the first free port
    # after it (gnomon.metrics.serve: 9470, 9480, 9490); 0: off.
    processor_metrics_port: int | None = field(default_factory=lambda: _env_port("GNOMON_PROCESSOR_METRICS_PORT"))
    worker_metrics_port: int | None = field(default_factory=lambda: _env_port("GNOMON_WORKER_METRICS_PORT"))
    projector_metrics_port: int | None = field(default_factory=lambda: _env_port("GNOMON_PROJECTOR_METRICS_PORT"))
    metrics_host: str = field(default_factory=lambda: os.environ.get("GNOMON_METRICS_HOST", "127.0.0.1"))

    @property
    def credentials_dir(self) -> Path:
        return self.credentials_path or self.state_dir / "credentials"

    @property
    def kafka_bootstrap(self) -> str:
        return os.environ.get("GNOMON_KAFKA_BOOTSTRAP", f"127.0.0.1:{self.kafka_port}")

    @property
    def cassandra_hosts(self) -> list[str]:
        return os.environ.get("GNOMON_CASSANDRA_HOSTS", "127.0.0.1").split(",")

    @property
    def registry_url(self) -> str:
        """Where producers outside gnomon find the schema registry (``$GNOMON_REGISTRY_URL``)."""
        return os.environ.get("GNOMON_REGISTRY_URL", f"http://127.0.0.1:{self.registry_port}")

    @property
    def api_url(self) -> str:
        return os.environ.get("GNOMON_API_URL", f"http://127.0.0.1:{self.api_port}")


def load() -> Settings:
    return Settings()
