"""Regions as namespaces (gnomon.region, issue 27): a region's topics and group ids, the
topology of a region's namespace, the ACLs of several namespaces, the topics infra
creates, and the group ids the processes join with ``GNOMON_REGION`` set. No Kafka."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from gnomon import codec, region
from gnomon.config import load
from gnomon.core.clock import FakeClock
from gnomon.eventlog.memory import MemoryEventLog
from gnomon.infra import acls
from gnomon.infra import grow as grow_mod
from gnomon.infra import topics as infra_topics
from gnomon.metrics.processor import ProcessorMetrics
from gnomon.processor.history_mark import HistoryWatermark
from gnomon.sim import SimCluster
from gnomon.topology import (
    ROLES,
    SHARED_ROLES,
    Topology,
    load_topology,
    namespaces,
    read_topology,
    regional,
)

BASES = ("gnomon-processor", "gnomon-history", "gnomon-worker-inbox", "gnomon-alerter")


@pytest.fixture
def no_region(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in (region.ENV, region.RUNS_IN_ENV, region.REGIONS_ENV):
        monkeypatch.delenv(var, raising=False)


def _all_names(topo: Topology) -> set[str]:
    """Every topic name ``topo`` holds: roles, specs, processors' reads and writes."""
    names = set(topo.roles().values()) | {s.name for s in topo.topics}
    for p in topo.processors:
        names |= {*p.reads(), *p.writes()}
    return names


# ---- gnomon.region ---------------------------------------------------------------------


@pytest.mark.parametrize("name", ["a", "eu1", "b2c", "x" * 16])
def test_region_names_that_are_valid(name: str) -> None:
    assert region.validate(name) == name


@pytest.mark.parametrize("name", ["", "A", "1a", "a-b", "a.b", "a b", "é", "x" * 17])
def test_region_names_that_are_not(name: str) -> None:
    with pytest.raises(ValueError, match=region.ENV):
        region.validate(name)
    with pytest.raises(ValueError, match=region.REGIONS_ENV):
        region.validate(name, region.REGIONS_ENV)


def test_the_environment(monkeypatch: pytest.MonkeyPatch, no_region: None) -> None:
    assert region.current() is None and region.runs_in() is None and region.configured() == ()
    monkeypatch.setenv(region.ENV, "a")
    assert region.current() == "a" and region.runs_in() == "a"  # runs where it belongs by default
    monkeypatch.setenv(region.RUNS_IN_ENV, "b")
    assert region.current() == "a" and region.runs_in() == "b"
    monkeypatch.setenv(region.REGIONS_ENV, " a, b ,,c")
    assert region.configured() == ("a", "b", "c")
    monkeypatch.setenv(region.REGIONS_ENV, "a,b,a")
    with pytest.raises(ValueError, match="GNOMON_REGIONS: a given more than once"):
        region.configured()
    monkeypatch.setenv(region.REGIONS_ENV, "a,B")
    with pytest.raises(ValueError, match="GNOMON_REGIONS"):
        region.configured()
    monkeypatch.setenv(region.RUNS_IN_ENV, "Eu")
    with pytest.raises(ValueError, match="GNOMON_RUNS_IN"):
        region.runs_in()
    monkeypatch.setenv(region.ENV, "")
    assert region.current() is None  # empty: unset


def test_topic_and_group_names() -> None:
    assert region.topic_name("gnomon.job-commands", "a") == "gnomon.a.job-commands"
    assert region.topic_name("gnomon.job-commands", None) == "gnomon.job-commands"
    assert region.topic_name("other.topic", "eu1") == "eu1.other.topic"
    assert region.group_id("gnomon-processor", "a") == "gnomon-processor.a"
    assert region.group_id("gnomon-processor", None) == "gnomon-processor"
    with pytest.raises(ValueError):
        region.topic_name("gnomon.runs", "A")
    with pytest.raises(ValueError):
        region.group_id("gnomon-processor", "a.b")


# ---- the topology of a namespace ------------------------------------------------------------


def test_regional_renames_every_topic_consistently(no_region: None) -> None:
    base = load_topology()
    a = regional(base, "a")
    assert a.region == "a" and base.region is None
    shared = {getattr(base, role) for role in SHARED_ROLES}
    assert shared == {"gnomon.regions"}

    def renamed(n: str) -> str:
        return n if n in shared else region.topic_name(n, "a")

    for role in ROLES:
        assert getattr(a, role) == renamed(getattr(base, role)), role
    assert [s.name for s in a.topics] == [renamed(s.name) for s in base.topics]
    assert [replace(s, name="") for s in a.topics] == [replace(s, name="") for s in base.topics]  # only names
    assert len(a.processors) == len(base.processors) > 0
    for pa, pb in zip(a.processors, base.processors, strict=True):
        assert pa.name == pb.name
        assert pa.reads() == tuple(renamed(t) for t in pb.reads())
        assert pa.writes() == tuple(renamed(t) for t in pb.writes())
    # every name a region's topology holds is one of its topics, none the default namespace's but the shared
    assert _all_names(a) == {s.name for s in a.topics}
    assert _all_names(a) & _all_names(base) == shared
    assert a.co_partitioned() == [region.topic_name(n, "a") for n in base.co_partitioned()]
    assert (a.partitions, a.pools, a.replication_factor, a.min_insync_replicas) == (
        base.partitions, base.pools, base.replication_factor, base.min_insync_replicas)


def test_regional_none_and_twice() -> None:
    base = load_topology(region=None)
    assert regional(base, None) is base
    a = regional(base, "a")
    assert regional(a, "a") is a  # already that region's
    with pytest.raises(ValueError, match="region a"):
        regional(a, "b")
    with pytest.raises(ValueError, match=region.ENV):
        regional(base, "Not-a-region")


def test_load_topology_by_region(monkeypatch: pytest.MonkeyPatch, no_region: None) -> None:
    default = load_topology()
    a = load_topology(region="a")
    assert default.region is None and default == read_topology(load().topology_path)
    assert a == regional(default, "a") and a is load_topology(region="a")  # cached per region
    assert load_topology(region="b").runs == region.topic_name(default.runs, "b")
    monkeypatch.setenv(region.ENV, "a")
    assert load_topology() is a  # the default is $GNOMON_REGION's namespace
    assert load_topology(region=None) is default
    # a Topology built by hand takes the default namespace's names (its region is None)
    hand = Topology(partitions=2, pools=("default",))
    assert hand.region is None and hand.runs == default.runs
    monkeypatch.setenv(region.ENV, "Bad")
    with pytest.raises(ValueError, match=region.ENV):
        load_topology()


def test_namespaces_are_the_default_then_each_configured_region(monkeypatch: pytest.MonkeyPatch,
                                                                 no_region: None) -> None:
    assert [t.region for t in namespaces()] == [None]
    monkeypatch.setenv(region.REGIONS_ENV, "a,b")
    monkeypatch.setenv(region.ENV, "b")  # (which namespace this process serves does not matter)
    assert [t.region for t in namespaces()] == [None, "a", "b"]
    specs = infra_topics.namespace_specs(load().topology_path)
    assert [r for r, _ in specs] == [None, "a", "b"]
    assert specs[0][1] == infra_topics.topic_specs(load().topology_path)
    # a region's topics, but a shared one only once (with the default namespace's)
    assert [s.name for s in specs[1][1]] == [s.name for s in load_topology(region="a").topics
                                               if s.name != "gnomon.regions"]
    names = [s.name for _, ss in specs for s in ss]
    assert len(names) == len(set(names)) == 3 * len(specs[0][1]) - 2
    assert infra_topics.namespace_label(None) == "" and infra_topics.namespace_label("a") == "region a: "
    monkeypatch.setenv(region.REGIONS_ENV, "a,a")
    with pytest.raises(ValueError, match="GNOMON_REGIONS"):
        infra_topics.namespace_specs(load().topology_path)


# ---- the codec: one subject per role, for every region --------------------------------------


def test_a_regions_topics_share_the_default_ones_schemas() -> None:
    base, a = load_topology(region=None), load_topology(region="a")
    for role in ROLES:
        b_topic, a_topic = getattr(base, role), getattr(a, role)
        try:
            want = codec.subject_for_topic(b_topic)
        except KeyError:
            with pytest.raises(KeyError):
                codec.subject_for_topic(a_topic)
            continue
        assert codec.subject_for_topic(a_topic) == want, role
        assert codec.topic_types(a_topic) == codec.topic_types(b_topic)
    with pytest.raises(KeyError):
        codec.subject_for_topic(region.topic_name(base.runs, "a") + "x")
    with pytest.raises(KeyError):
        codec.subject_for_topic(base.runs.replace("gnomon.", "gnomon.A."))  # not a region's name
    # the retired family still resolves
    assert codec.subject_for_topic("gnomon.dispatch.default.high") == "gnomon.dispatch-value"


def test_encoding_on_a_regions_topic(no_region: None) -> None:
    from gnomon.core.tenants import TenantLimits

    base, a = load_topology(region=None), load_topology(region="a")
    limits = TenantLimits("t", concurrency_max=10, jobs_max=10)
    data = codec.encode(limits, a.tenants)
    assert data == codec.encode(limits, base.tenants)
    assert codec.decode(data, topic=a.tenants) == limits
    assert codec.schema_id_for_topic(a.tenants) == codec.schema_id_for_topic(base.tenants)


# ---- ACLs ---------------------------------------------------------------------------------


def test_grants_of_a_region_name_its_topics_and_groups(no_region: None) -> None:
    base, a = load_topology(region=None), load_topology(region="a")
    table_a = acls.grants(a)
    topics = {g.name for g in table_a if g.resource == acls.TOPIC}
    assert topics <= {s.name for s in a.topics} and topics & _all_names(base) == {a.regions}  # the shared one
    # a region's processors write a moved job's adoption to its new region's commands
    assert acls.roles_with(table_a, a.job_commands, "WRITE") == {"api", "producer", "processor"}
    assert acls.roles_with(acls.grants(base), base.job_commands, "WRITE") == {"api", "producer"}  # no moves there
    assert acls.roles_with(table_a, a.worker_inbox, "READ") == {"worker"}
    groups = {(g.role, g.name, g.pattern, g.operation) for g in table_a if g.resource == acls.GROUP}
    assert ("processor", "gnomon-processor.a", acls.LITERAL, "READ") in groups
    assert ("processor", "gnomon-history.a", acls.LITERAL, "DESCRIBE") in groups
    assert ("projector", "gnomon-history.a", acls.LITERAL, "READ") in groups
    assert ("worker", "gnomon-worker-inbox.a", acls.LITERAL, "READ") in groups
    # the alerter's grant is a prefix: it admits gnomon-alerter.a and gnomon-alerter-<name>.a
    assert ("alerter", "gnomon-alerter", acls.PREFIXED, "READ") in groups
    assert not {name for _, name, _, _ in groups} & {"gnomon-processor", "gnomon-history", "gnomon-worker-inbox"}
    # groups only assigned, never committed, keep their ids
    assert ("processor", "gnomon-tenants", acls.LITERAL, "READ") in groups
    assert ("api", "gnomon-api-answers", acls.LITERAL, "READ") in groups
    # the default namespace's table: the same with the default names
    unnamed = {(g.role, g.resource, g.pattern, g.operation) for g in acls.grants(base)}
    assert unnamed == {(g.role, g.resource, g.pattern, g.operation) for g in table_a}
    assert len(acls.grants(base)) + 1 == len(table_a)  # (+ the processors' WRITE on a's job-commands)


def test_grants_for_is_the_union_of_the_namespaces() -> None:
    base, a, b = (load_topology(region=r) for r in (None, "a", "b"))
    union = acls.grants_for([base, a, b])
    assert union == sorted(set(acls.grants(base)) | set(acls.grants(a)) | set(acls.grants(b)))
    assert len(set(union)) == len(union)
    names = {g.name for g in union}
    assert {base.runs, a.runs, b.runs, "gnomon-processor", "gnomon-processor.a", "gnomon-processor.b"} <= names
    assert acls.grants_for([base]) == acls.grants(base)


class _Future:
    def __init__(self, value: Any = None) -> None:
        self.value = value

    def result(self) -> Any:
        return self.value


class _FakeAdmin:
    """An AdminClient's ACL calls over a list of bindings."""

    def __init__(self, bindings: list[Any]) -> None:
        self.bindings = list(bindings)
        self.created: list[Any] = []
        self.deleted: list[Any] = []

    def describe_acls(self, _filter: Any, request_timeout: float) -> _Future:
        return _Future(list(self.bindings))

    def create_acls(self, bindings: list[Any], request_timeout: float) -> dict[Any, _Future]:
        self.created += bindings
        self.bindings += bindings
        return {b: _Future() for b in bindings}

    def delete_acls(self, filters: list[Any], request_timeout: float) -> dict[Any, _Future]:
        gone = {acls._grant_of(f) for f in filters}
        self.deleted += filters
        self.bindings = [b for b in self.bindings if acls._grant_of(b) not in gone]
        return {f: _Future() for f in filters}


def test_applying_a_region_keeps_the_others_grants() -> None:
    base, a, b = (load_topology(region=r) for r in (None, "a", "b"))
    roles = tuple({g.role for g in acls.grants(base)})
    client = _FakeAdmin([acls._binding(g) for g in acls.grants_for([base, a])])
    created, deleted = acls.apply(client, [base, a, b], roles)
    assert deleted == 0 and created == len(set(acls.grants(b)) - set(acls.grants_for([base, a])))
    assert {acls._grant_of(x) for x in client.bindings} == set(acls.grants_for([base, a, b]))
    assert acls.apply(client, [base, a, b], roles) == (0, 0)  # idempotent
    # one topology alone (the old call) would delete the other namespaces' grants
    created, deleted = acls.apply(client, base, roles)
    assert created == 0 and deleted == len(set(acls.grants_for([a, b])) - set(acls.grants(base)))


# ---- the groups the processes use -------------------------------------------------------------


def test_grow_waits_for_its_namespaces_processors(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}
    monkeypatch.setattr("gnomon.infra.kafka.admin", lambda *a, **k: object())
    monkeypatch.setattr(grow_mod, "counts", lambda client, topics, t: dict.fromkeys(topics, 4))
    monkeypatch.setattr(grow_mod, "_write_markers", lambda bootstrap, topic, to, creds, t: {0: 1})

    def wait_read(bootstrap: str, topic: str, markers: dict[int, int], timeout_s: float, progress: Any,
                  **kw: Any) -> float:
        seen.update(kw, topic=topic)
        return 0.0

    monkeypatch.setattr(grow_mod, "wait_read", wait_read)
    said: list[str] = []
    a = replace(load_topology(region="a"), partitions=4)
    grow_mod.grow("unused:1", a, 4, say=said.append)
    assert seen["group"] == "gnomon-processor.a" and seen["topic"] == a.job_commands
    assert seen["jobs_topic"] == a.jobs and said[0] == "growing region a's namespace"
    seen.clear()
    grow_mod.grow("unused:1", replace(load_topology(region=None), partitions=4), 4, say=said.append)
    assert seen["group"] == "gnomon-processor"


def test_metrics_and_history_mark_take_the_namespaces_ids() -> None:
    m = ProcessorMetrics(load_topology(region="a"), "x")
    assert (m.group_id, m.history_group) == ("gnomon-processor.a", "gnomon-history.a")
    m = ProcessorMetrics(load_topology(region=None), "x")
    assert (m.group_id, m.history_group) == ("gnomon-processor", "gnomon-history")
    clock = FakeClock()
    assert HistoryWatermark(MemoryEventLog(clock), "t", clock, region="a").group_id == "gnomon-history.a"
    assert HistoryWatermark(MemoryEventLog(clock), "t", clock).group_id == "gnomon-history"


def _groups_of(c: SimCluster) -> dict[str, str]:
    proc = c.procs[0].proc
    worker = c.workers[0].worker
    assert proc is not None and proc.history is not None and worker is not None
    assert c.projector is not None and c.alerter is not None
    inbox: Any = worker._inbox
    return {
        "processor": proc.consumer.group_id,  # type: ignore[attr-defined]
        "processor metrics": proc.metrics.group_id,
        "history mark": proc.history.group_id,
        "projector": c.projector.group_id,
        "alerter": c.alerter.group_id,
        "worker inbox": inbox.group_id,
    }


@pytest.mark.usefixtures("quiet_logs")
def test_with_gnomon_region_set_the_processes_join_the_regions_groups(monkeypatch: pytest.MonkeyPatch,
                                                                      no_region: None) -> None:
    monkeypatch.setenv(region.ENV, "a")
    c = SimCluster(5, history=True, alerts=True)
    assert c.topo.region == "a"
    c.register("j", "* * * * * *")
    c.run_for(6_000, faults=False)
    assert _groups_of(c) == {
        "processor": "gnomon-processor.a", "processor metrics": "gnomon-processor.a",
        "history mark": "gnomon-history.a", "projector": "gnomon-history.a", "alerter": "gnomon-alerter.a",
        "worker inbox": "gnomon-worker-inbox.a",
    }
    assert set(c.log.groups) == {"gnomon-processor.a", "gnomon-history.a", "gnomon-alerter.a"}
    # everything it wrote is on region a's topics, and the whole system ran on them
    a = load_topology(region="a")
    assert {tp[0] for tp in c.log._parts} <= {s.name for s in a.topics}
    assert c.history is not None and c.history.get_job("j") is not None and c.history_gaps() == []
    rep = c.history_report()
    assert rep.ok and rep.slots > 0 and rep.missed == 0, rep.summary()


@pytest.mark.usefixtures("quiet_logs")
def test_without_gnomon_region_the_groups_are_as_before(no_region: None) -> None:
    c = SimCluster(5, history=True, alerts=True)
    c.run_for(1_000, faults=False)
    assert c.topo.region is None
    assert set(_groups_of(c).values()) == set(BASES)

