"""The regions layout on one machine (gnomon.infra.sites): listeners, proxies, datacenters."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from gnomon import credentials
from gnomon.cli.main import app
from gnomon.config import Settings
from gnomon.infra import cassandra as infra_cassandra
from gnomon.infra import kafka as infra_kafka
from gnomon.infra import sites


def _props(text: str) -> dict[str, str]:
    return dict(ln.split("=", 1) for ln in text.splitlines() if ln and not ln.startswith("#"))


def test_regions_parse_and_refuse_bad_names() -> None:
    r = sites.Regions.parse("east, west", 30)
    assert r.sites() == ("east", "west", sites.WITNESS)
    assert (r.site(1), r.site(2), r.site(3)) == ("east", "west", "witness")
    assert r.host("west") == 2
    for bad in ("a", "a,a", "a,b,c", "A,b", "a,witness", "a,1b"):
        with pytest.raises(ValueError, match="--regions"):
            sites.Regions.parse(bad)
    with pytest.raises(ValueError, match="--region-latency-ms"):
        sites.Regions(("a", "b"), -1)
    with pytest.raises(ValueError, match="unknown region"):
        r.host("north")


def test_the_layout_is_remembered_and_forgotten(tmp_path: Path) -> None:
    assert sites.load(tmp_path) is None
    sites.save(tmp_path, sites.Regions(("a", "b"), 12.5))
    assert sites.load(tmp_path) == sites.Regions(("a", "b"), 12.5)
    sites.save(tmp_path, None)
    assert sites.load(tmp_path) is None


def test_each_broker_advertises_its_own_region_directly_and_the_others_through_a_proxy(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path)
    credentials.ensure_all(settings.credentials_dir)
    sites.save(tmp_path, sites.Regions(("a", "b")))
    ns = infra_kafka.nodes(settings, 3)
    p1, p3 = (_props(infra_kafka.render_config(settings, 3, ns[i])) for i in (0, 2))
    assert p1["broker.rack"] == "a" and p3["broker.rack"] == "witness"
    assert p1["inter.broker.listener.name"] == "REPL"
    # region a's clients reach host 1 directly, host 3 (the witness) through the proxy
    assert "REGION_A://127.0.0.1:9095" in p1["advertised.listeners"].split(",")
    assert "REGION_B://127.0.0.1:19096" in p1["advertised.listeners"].split(",")
    assert "REGION_A://127.0.0.3:19095" in p3["advertised.listeners"].split(",")
    assert "REPL://127.0.0.3:19094" in p3["advertised.listeners"].split(",")
    assert "REPL://127.0.0.3:9094" in p3["listeners"].split(",")
    assert p1["controller.quorum.voters"] == "1@127.0.0.1:19093,2@127.0.0.2:19093,3@127.0.0.3:19093"
    assert set(p1["listener.security.protocol.map"].split(",")) == {
        "CLIENT:SASL_PLAINTEXT", "CONTROLLER:SASL_PLAINTEXT", "REPL:SASL_PLAINTEXT",
        "REGION_A:SASL_PLAINTEXT", "REGION_B:SASL_PLAINTEXT"}
    assert "username=" in p1["listener.name.repl.scram-sha-512.sasl.jaas.config"]
    routes = sites.proxy_routes(sites.Regions(("a", "b")), [n.host for n in ns], 9092, 9093)
    # every advertised proxy has a route to the listener behind it, and nothing else does
    advertised = {a.split("//")[1] for p in (p1, p3) for a in p["advertised.listeners"].split(",")
                  if int(a.rsplit(":", 1)[1]) > sites.PROXY_OFFSET}
    assert advertised <= {r.split("=")[0] for r in routes}
    assert len(routes) == 10 and all(r.split("=")[0].rsplit(":", 1)[0] == r.split("=")[1].rsplit(":", 1)[0]
                                     for r in routes)
    assert sites.bootstrap(sites.Regions(("a", "b")), "b", 9092) == "127.0.0.2:9096"


def test_without_regions_the_listeners_are_unchanged(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path)
    credentials.ensure_all(settings.credentials_dir)
    p = _props(infra_kafka.render_config(settings, 3, infra_kafka.nodes(settings, 3)[1]))
    assert p["listeners"] == "CLIENT://127.0.0.2:9092,CONTROLLER://127.0.0.2:9093"
    assert p["inter.broker.listener.name"] == "CLIENT" and "broker.rack" not in p
    assert p["controller.quorum.voters"] == "1@127.0.0.1:9093,2@127.0.0.2:9093,3@127.0.0.3:9093"


def test_cassandra_has_a_datacenter_per_site(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path)
    plain = infra_cassandra.nodes(settings, 3)
    assert "endpoint_snitch: SimpleSnitch" in infra_cassandra.render_config(settings, plain[0], 3)
    sites.save(tmp_path, sites.Regions(("a", "b")))
    ns = infra_cassandra.nodes(settings, 3)
    assert ns[0].home != plain[0].home  # a datacenter may never change under a node's data
    assert "endpoint_snitch: GossipingPropertyFileSnitch" in infra_cassandra.render_config(settings, ns[1], 3)
    assert not (ns[1].home / "cassandra-rackdc.properties").exists()  # (the command writes it, once)
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "jamm-0.4.0.jar").touch()  # (what the JVM options name)
    argv = infra_cassandra.command(settings, "java", lib, ns[1])
    rackdc = ns[1].home / "cassandra-rackdc.properties"
    assert f"-Dcassandra-rackdc.properties=file://{rackdc}" in argv
    assert rackdc.read_text().startswith("dc=b\n")
    assert infra_cassandra.replication(settings) == (
        "{'class': 'NetworkTopologyStrategy', 'a': 1, 'b': 1, 'witness': 1}")


def test_the_cli_refuses_regions_without_three_hosts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GNOMON_STATE_DIR", str(tmp_path))
    out = CliRunner().invoke(app, ["infra", "up", "--regions", "a,b"])
    assert out.exit_code == 2, out.output
    assert "--regions" in out.output and "--hosts 3" in out.output
    out = CliRunner().invoke(app, ["infra", "up", "--hosts", "3", "--regions", "a"])
    assert out.exit_code == 2 and "two names" in out.output
    assert sites.load(tmp_path) is None


def test_a_regions_topics_are_led_from_its_site_and_the_shared_one_from_the_witness() -> None:
    from gnomon.config import load
    from gnomon.infra import manager
    from gnomon.infra.topics import namespace_specs
    from gnomon.topology import load_topology

    layout = sites.Regions(("a", "b"))
    specs = dict(namespace_specs(load().topology_path, layout.names))
    regions_topic = load_topology().regions
    default = manager.leaders(None, specs[None], layout)
    assert [(sorted(s.name for s in g), leader) for g, leader in default if leader is not None] == [
        ([regions_topic], sites.WITNESS_HOST)]
    assert all(s.name != regions_topic for g, leader in default if leader is None for s in g)
    assert manager.leaders("b", specs["b"], layout) == [(specs["b"], 2)]
    assert manager.leaders(None, specs[None], None) == [(specs[None], None)]
