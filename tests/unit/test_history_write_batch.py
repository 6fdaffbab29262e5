"""How the Cassandra store writes a batch, without Cassandra: which bytes become a
state's blob, and how statements are grouped into requests."""

from __future__ import annotations

from dataclasses import dataclass
from io import BytesIO
from typing import Any

from fastavro import schemaless_writer

from gnomon.codec import decode, default_codec, encode, subject_for_topic
from gnomon.core.jobs import JobState
from gnomon.core.runs import RunState, RunStatus
from gnomon.history import cassandra as C
from gnomon.topology import load_topology
from history_contract import T0, job, run


def test_the_codec_header_is_what_encode_starts_with() -> None:
    r, j = run("job_a", T0), job("job_a", "t1")
    assert default_codec.header(RunState) == encode(r)[:5]
    assert default_codec.header(JobState) == encode(j)[:5]
    assert default_codec.header(int) is None


def test_record_bytes_of_the_latest_schema_are_the_blob_as_they_are() -> None:
    r = run("job_a", T0, RunStatus.RUNNING, attempt=1, token=1, worker_id="w")
    raw = encode(r)
    assert C._blob(r, raw) is raw
    j = job("job_a", "t1")
    assert C._blob(j, encode(j)) == encode(j)
    assert C._blob(r, None) == raw


def _older_runs_version() -> Any:
    subject = subject_for_topic(load_topology().runs)
    versions = [v for v in default_codec.registry if v.subject == subject]
    return versions[-2]  # the one before the latest


def test_record_bytes_of_an_older_schema_are_encoded_again() -> None:
    old = _older_runs_version()
    r = run("job_a", T0)
    buf = BytesIO()
    buf.write(bytes([0]) + old.id.to_bytes(4, "big"))
    schemaless_writer(buf, old.schema, default_codec._to_avro[old.subject][RunState](r))
    raw = buf.getvalue()
    state = decode(raw)  # what the projector would have decoded from that record
    blob = C._blob(state, raw)
    assert blob != raw and blob == encode(state) and decode(blob) == state


def test_bytes_that_are_not_of_the_type_are_encoded_again() -> None:
    r, j = run("job_a", T0), job("job_a", "t1")
    assert C._blob(r, encode(j)) == encode(r)  # a JobState's bytes for a run: never stored as the run's blob
    assert C._blob(r, b"") == encode(r)


def test_param_bytes_counts_utf8_and_per_cell_overhead() -> None:
    assert C._param_bytes(["ab", b"xyz", 7, None]) == 2 + 3 + 8 + 8 + 4 * C._CELL_OVERHEAD_BYTES
    assert C._param_bytes(["\u2603"]) == 3 + C._CELL_OVERHEAD_BYTES


def test_a_write_group_stays_below_the_partition_byte_and_statement_limits() -> None:
    g = C._WriteGroup()
    for i in range(C.WRITE_BATCH_PARTITIONS_MAX):
        assert g.fits(b"p%d" % i, 10)
        g.add(object(), b"p%d" % i, 10)
    assert not g.fits(b"another", 10)  # one partition too many
    assert g.fits(b"p0", 10)  # a partition already in: free
    big = C._WriteGroup()
    big.add(object(), b"p", C.WRITE_BATCH_BYTES_MAX)
    assert not big.fits(b"p", 1)
    one = C._WriteGroup()
    assert one.fits(b"p", 10 * C.WRITE_BATCH_BYTES_MAX)  # a lone statement goes whatever its size
    same = C._WriteGroup()
    for _ in range(C.WRITE_BATCH_STATEMENTS_MAX):
        same.add(object(), b"p", 1)
    assert not same.fits(b"p", 1)


@dataclass
class _Bound:
    routing_key: bytes
    values: tuple[Any, ...]


@dataclass
class _Prepared:
    def bind(self, params: tuple[Any, ...]) -> _Bound:
        return _Bound(str(params[0]).encode(), params)


class _Metadata:
    def __init__(self, owners: dict[bytes, str]) -> None:
        self.owners = owners

    def get_replicas(self, keyspace: str, key: bytes) -> list[str]:
        return [self.owners.get(key, "node-a")]


@dataclass
class _Cluster:
    metadata: _Metadata


@dataclass
class _Session:
    cluster: _Cluster


def test_statements_are_grouped_by_replicas_and_partition() -> None:
    store = C.CassandraHistoryStore(["127.0.0.1"])
    owners = {f"k{i}".encode(): ("node-a" if i % 2 else "node-b") for i in range(40)}
    session = _Session(_Cluster(_Metadata(owners)))
    stmt = _Prepared()
    # 40 partitions, two rows each, in an order that splits each partition's rows
    writes = [(stmt, (f"k{i}", n)) for n in range(2) for i in range(40)]
    groups = store._write_groups(session, writes)
    assert len(groups) == 4  # 20 partitions per node, 10 per request
    sent = [b for g in groups for b in g.statements]
    assert sorted(b.values for b in sent) == sorted(p for _, p in writes)  # every write, once
    for g in groups:
        keys = {b.routing_key for b in g.statements}
        assert len(keys) == C.WRITE_BATCH_PARTITIONS_MAX and len(g.statements) == 2 * len(keys)
        assert len({owners[k] for k in keys}) == 1  # one replica set per request
