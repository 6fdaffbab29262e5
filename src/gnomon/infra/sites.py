"""Two regions and a witness on one machine: the stretched layout (issue 27, ADR 0013).

``gnomon infra up --hosts 3 --regions a,b`` keeps the three hosts of issue 26 and names
them: host 1 (127.0.0.1) is region ``a``, host 2 is region ``b``, host 3 is the
*witness*, a third site that holds a Kafka replica and the controller vote that breaks a
tie between the regions (and a Cassandra node of its own datacenter). One Kafka cluster
spans the three sites (``broker.rack`` = the site: one replica of every partition on
each, min.insync.replicas 2), and Cassandra has one datacenter per site.

Inter-site latency. The kernel here has no netem, so a TCP proxy
(:mod:`gnomon.infra.latency`, one process named ``latency``) delays every byte that
crosses sites by ``latency_ms`` each way. A Kafka broker advertises one address per
listener, so each path gets listeners of its own:

* replication (``REPL``, the inter-broker listener): every broker advertises its proxy
  (port + :data:`PROXY_OFFSET`). With one broker per site every replication link crosses
  sites, so every follower fetch pays the round trip;
* the controller quorum: the voters' addresses are the proxies (every vote crosses
  sites; a node's own broker also reaches its own controller through its proxy, which
  adds the delay on a link that is local in a real deployment);
* clients: one listener per region (``REGION_A``, ...). A client of region ``r``
  bootstraps on ``r``'s listener (:func:`bootstrap`), and each broker advertises that
  listener directly if it is in ``r`` and through its proxy if not. So a processor of
  region a reaches a leader in b or on the witness with the delay, and its own site's
  broker without it;
* the ``CLIENT`` listener of issue 26 stays undelayed: infra, admin tools and tests.

Cassandra's own links (gossip, replication between datacenters) are not delayed: a
region's processes read and write their local datacenter (LOCAL_QUORUM of one node),
and the cross-datacenter copy is asynchronous, so the delay would not be on any write
path the tests measure. Said again in ADR 0013.

The layout is remembered in ``<state_dir>/run/regions.json`` until ``--no-regions``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gnomon import region

WITNESS = "witness"  # host 3's site: a replica and a controller vote, no region's jobs
WITNESS_HOST = 3  # (and the leader of the topics the regions share: gnomon.regions)
PROXY_OFFSET = 10000  # a proxy listens on its target's port + this, on the target's address
LATENCY_PROCESS = "latency"  # the proxy's pid-file name


@dataclass(frozen=True)
class Regions:
    """Host 1 is ``names[0]``, host 2 ``names[1]``, host 3 the witness."""

    names: tuple[str, str]
    latency_ms: float = 30.0

    def __post_init__(self) -> None:
        if len(self.names) != 2 or self.names[0] == self.names[1]:
            raise ValueError(f"--regions takes two different names, e.g. a,b; got {','.join(self.names)}")
        for n in self.names:
            region.validate(n, "--regions")  # (the rule of GNOMON_REGION, so every region here is a namespace)
            if n == WITNESS:
                raise ValueError(f"--regions: {n!r} is the third site's name, not a region's")
        if not 0 <= self.latency_ms <= 1000:
            raise ValueError(f"--region-latency-ms must be 0-1000, not {self.latency_ms}")

    @classmethod
    def parse(cls, text: str, latency_ms: float = 30.0) -> Regions:
        parts = tuple(p.strip() for p in text.split(",") if p.strip())
        if len(parts) != 2:
            raise ValueError(f"--regions takes two names separated by a comma, e.g. a,b; got {text!r}")
        return cls((parts[0], parts[1]), latency_ms)

    def site(self, host: int) -> str:
        """The site of host ``host`` (1-3)."""
        assert 1 <= host <= 3, host
        return self.names[host - 1] if host <= 2 else WITNESS

    def host(self, region: str) -> int:
        if region not in self.names:
            raise ValueError(f"unknown region {region!r}: this layout has {', '.join(self.names)}")
        return self.names.index(region) + 1

    def sites(self) -> tuple[str, str, str]:
        return (self.names[0], self.names[1], WITNESS)


def _file(state_dir: Path) -> Path:
    return state_dir / "run" / "regions.json"


def load(state_dir: Path) -> Regions | None:
    """The regions layout last started in ``state_dir`` (None: no regions)."""
    try:
        data = json.loads(_file(state_dir).read_text())
        return Regions((str(data["names"][0]), str(data["names"][1])), float(data["latency_ms"]))
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return None


def names(state_dir: Path) -> tuple[str, ...]:
    """The region names of the layout last started in ``state_dir`` (none: no regions)."""
    layout = load(state_dir)
    return layout.names if layout is not None else ()


def save(state_dir: Path, regions: Regions | None) -> None:
    path = _file(state_dir)
    if regions is None:
        path.unlink(missing_ok=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"names": list(regions.names), "latency_ms": regions.latency_ms}) + "\n")


# --- Kafka listeners ------------------------------------------------------------------


def repl_port(kafka_port: int) -> int:
    return kafka_port + 2


def region_port(kafka_port: int, regions: Regions, region: str) -> int:
    return kafka_port + 3 + regions.names.index(region)


def listener_name(region: str) -> str:
    return f"REGION_{region.upper()}"


@dataclass(frozen=True)
class Listeners:
    """The listener lines of one broker's ``server.properties``."""

    listeners: str
    advertised: str
    inter_broker: str
    protocol_map: str
    extra: str  # rack and the SASL settings of the added listeners


def kafka_listeners(regions: Regions, host_no: int, host: str, kafka_port: int, controller_port: int,
                    protocol: str, broker_jaas: str) -> Listeners:
    """Broker ``host_no``'s listeners in the regions layout (module docstring)."""
    repl = repl_port(kafka_port)
    site = regions.site(host_no)
    own = [f"CLIENT://{host}:{kafka_port}", f"CONTROLLER://{host}:{controller_port}", f"REPL://{host}:{repl}"]
    adv = [f"CLIENT://{host}:{kafka_port}", f"REPL://{host}:{repl + PROXY_OFFSET}"]
    names = ["CLIENT", "CONTROLLER", "REPL"]
    extra = [f"broker.rack={site}",
             # a site cut off is fenced (its leaderships moved) after 4 s, not 9, and a follower
             # that stopped fetching leaves the ISR after 4 s, not 30: the other sites' writes
             # (acks=all) wait that long for it at most
             "broker.session.timeout.ms=4000", "broker.heartbeat.interval.ms=1000",
             "replica.lag.time.max.ms=4000",
             # after a heal, each region's partitions go back to their own site's leader within 30 s
             "leader.imbalance.check.interval.seconds=30",
             "listener.name.repl.sasl.enabled.mechanisms=SCRAM-SHA-512",
             f"listener.name.repl.scram-sha-512.sasl.jaas.config={broker_jaas}"]
    for r in regions.names:
        name, port = listener_name(r), region_port(kafka_port, regions, r)
        own.append(f"{name}://{host}:{port}")
        adv.append(f"{name}://{host}:{port if r == site else port + PROXY_OFFSET}")
        names.append(name)
        extra += [f"listener.name.{name.lower()}.sasl.enabled.mechanisms=SCRAM-SHA-512",
                  f"listener.name.{name.lower()}.scram-sha-512.sasl.jaas.config="
                  "org.apache.kafka.common.security.scram.ScramLoginModule required;"]
    return Listeners(
        listeners=",".join(own),
        advertised=",".join(adv),
        inter_broker="REPL",
        protocol_map=",".join(f"{n}:{protocol}" for n in names),
        extra="\n".join(["# regions layout (gnomon.infra.sites)", *extra]),
    )


def voters(hosts: Sequence[str], controller_port: int) -> str:
    """``controller.quorum.voters`` through the proxies (every vote crosses sites)."""
    return ",".join(f"{i}@{h}:{controller_port + PROXY_OFFSET}" for i, h in enumerate(hosts, start=1))


def proxy_routes(regions: Regions, hosts: Sequence[str], kafka_port: int, controller_port: int) -> list[str]:
    """The latency proxy's routes (``listen=target``): each broker's replication and
    controller listeners, and its region listeners of the regions it is not in."""
    routes: list[str] = []
    for i, h in enumerate(hosts, start=1):
        ports = [repl_port(kafka_port), controller_port]
        ports += [region_port(kafka_port, regions, r) for r in regions.names if r != regions.site(i)]
        routes += [f"{h}:{p + PROXY_OFFSET}={h}:{p}" for p in ports]
    return routes


def bootstrap(regions: Regions, region: str, kafka_port: int) -> str:
    """Where a client of ``region`` bootstraps: its own site's broker, on its listener."""
    host = regions.host(region)
    return f"127.0.0.{host}:{region_port(kafka_port, regions, region)}"


# --- Cassandra ------------------------------------------------------------------------


def cassandra_replication(regions: Regions) -> str:
    """One replica of every row in each site's datacenter."""
    inner = ", ".join(f"'{s}': 1" for s in regions.sites())
    return "{'class': 'NetworkTopologyStrategy', " + inner + "}"


def rackdc(regions: Regions, host_no: int) -> str:
    """``cassandra-rackdc.properties`` of host ``host_no`` (GossipingPropertyFileSnitch)."""
    return f"dc={regions.site(host_no)}\nrack=rack1\n"
