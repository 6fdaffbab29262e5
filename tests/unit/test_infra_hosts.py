"""Operating one host of `gnomon infra up --hosts 3` (gnomon.infra.manager.stop_host,
`gnomon infra host`, `infra status` per node), over stand-in server processes: real
processes tagged as the nodes, no JVM."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gnomon.cli.main import app
from gnomon.config import Settings
from gnomon.infra import cassandra, kafka, manager, procs
from gnomon.infra.errors import InfraError

NAMES = [*(f"kafka-{i}" for i in (1, 2, 3)), *(f"cassandra-{i}" for i in (1, 2, 3))]


@pytest.fixture
def three_hosts(tmp_path: Path) -> Iterator[Settings]:
    # ports nothing listens on: every node is "starting" (its process runs, its port is closed)
    settings = Settings(state_dir=tmp_path, kafka_port=1, kafka_controller_port=2, cassandra_port=3)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "kafka.nodes").write_text("3\n")
    (tmp_path / "run" / "cassandra-layout").write_text("3\n")
    for name in NAMES:
        procs.start(tmp_path, name, [sys.executable, "-c", "import time; time.sleep(120)", procs.marker(name)])
    yield settings
    for name in NAMES:
        procs.stop(tmp_path, name, timeout_s=5)


def test_stopping_one_host_stops_its_two_servers_only(three_hosts: Settings) -> None:
    assert manager.stop_host(three_hosts, 2) == ["kafka-2", "cassandra-2"]
    running = {n for n in NAMES if procs.is_running(three_hosts.state_dir, n)}
    assert running == set(NAMES) - {"kafka-2", "cassandra-2"}
    assert manager.stop_host(three_hosts, 2) == []  # nothing left there: fine
    st = manager.status(three_hosts)
    for component in ("kafka", "cassandra"):
        members = {m["name"]: m["state"] for m in st[component]["members"]}
        assert members == {f"{component}-1": "starting", f"{component}-2": "down", f"{component}-3": "starting"}
        assert [m["host"] for m in st[component]["members"]] == ["127.0.0.1", "127.0.0.2", "127.0.0.3"]


def test_status_prints_every_node_of_three(three_hosts: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    manager.stop_host(three_hosts, 3)
    monkeypatch.setattr("gnomon.cli.infra.load", lambda: three_hosts)
    out = CliRunner().invoke(app, ["infra", "status"])
    assert out.exit_code == 0, out.output
    assert "  kafka-3 on 127.0.0.3: down\n" in out.output and "  cassandra-3 on 127.0.0.3: down\n" in out.output
    assert "  kafka-1 on 127.0.0.1: starting (pid " in out.output


def test_one_host_is_refused_outside_the_three_host_layout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings(state_dir=tmp_path)
    with pytest.raises(InfraError, match="not the three-host layout"):
        manager.stop_host(settings, 1)  # (the last layout was one node)
    (tmp_path / "run").mkdir(exist_ok=True)
    (tmp_path / "run" / "cassandra-layout").write_text("3\n")
    with pytest.raises(InfraError, match="must be 1, 2 or 3"):
        manager.stop_host(settings, 4)
    monkeypatch.setattr("gnomon.cli.infra.load", lambda: settings)
    out = CliRunner().invoke(app, ["infra", "host", "stop", "0"])
    assert out.exit_code == 2 and out.output.strip().splitlines() == ["gnomon: host: must be 1, 2 or 3"]
    assert kafka.running_layout(settings) is None and cassandra.layout(settings) == 3
