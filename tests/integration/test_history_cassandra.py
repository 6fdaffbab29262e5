"""The HistoryStore contract, migrations and the projector against the real Cassandra
(and Kafka) that `gnomon infra up` runs. Everything happens in a keyspace
``gnomon_test_<random>`` and topics ``gnomon_test_<random>.*``, dropped at the end."""

from __future__ import annotations

import logging
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gnomon.codec import encode
from gnomon.config import Settings
from gnomon.core.errors import HistoryStoreError
from gnomon.core.runs import RunStatus
from gnomon.eventlog.kafka import KafkaEventLog
from gnomon.history.base import HistoryBatch
from gnomon.history.cassandra import WRITE_BATCH_PARTITIONS_MAX, CassandraHistoryStore, connect
from gnomon.history.migrate import DEFAULT_CQL_DIR, applied_versions, load_migrations, migrate
from gnomon.history.projector import HistoryProjector
from history_contract import (
    MINUTE,
    T0,
    HistoryStoreContract,
    all_pages,
    failed,
    job,
    line,
    run,
    uid,
)

pytestmark = pytest.mark.integration

TABLES = {"schema_version", "jobs_by_id", "jobs_by_tenant", "runs_by_job", "runs_by_id", "logs_by_run",
          "dead_letters_by_tenant"}


@pytest.fixture(scope="module")
def session(infra: Settings) -> Iterator[Any]:
    cluster, session = connect(infra.cassandra_hosts, infra.cassandra_port)
    yield session
    cluster.shutdown()


@pytest.fixture(scope="module")
def keyspace(session: Any) -> Iterator[str]:
    ks = f"gnomon_test_{uuid.uuid4().hex[:12]}"
    try:
        assert migrate(session, ks) == [m.version for m in load_migrations()]
        yield ks
    finally:
        session.execute(f"DROP KEYSPACE IF EXISTS {ks}", timeout=60)


@pytest.fixture(scope="module")
def stores(infra: Settings, keyspace: str) -> Iterator[dict[int | None, CassandraHistoryStore]]:
    made: dict[int | None, CassandraHistoryStore] = {}
    yield made
    for s in made.values():
        s.close()


@pytest.fixture
def make_store(
    infra: Settings, keyspace: str, stores: dict[int | None, CassandraHistoryStore]
) -> Callable[..., CassandraHistoryStore]:
    def make(status_scan_max: int | None = None) -> CassandraHistoryStore:
        if status_scan_max not in stores:
            kw = {} if status_scan_max is None else {"status_scan_max": status_scan_max}
            stores[status_scan_max] = CassandraHistoryStore(
                infra.cassandra_hosts, infra.cassandra_port, keyspace, **kw
            ).connect()
        return stores[status_scan_max]

    return make


class TestCassandraContract(HistoryStoreContract):
    pass


# ---- schema and migrations ---------------------------------------------------------------


def test_migrations_are_recorded_and_idempotent(session: Any, keyspace: str) -> None:
    rows = session.execute("SELECT table_name, default_time_to_live FROM system_schema.tables "
                           "WHERE keyspace_name = %s", (keyspace,))
    ttl = {r.table_name: r.default_time_to_live for r in rows}
    assert set(ttl) == TABLES
    assert ttl["runs_by_job"] == ttl["runs_by_id"] == ttl["dead_letters_by_tenant"] == 90 * 86400
    assert ttl["logs_by_run"] == 30 * 86400 and ttl["jobs_by_id"] == ttl["jobs_by_tenant"] == 0
    assert applied_versions(session, keyspace) == {m.version: m.sha256 for m in load_migrations()}
    assert migrate(session, keyspace) == []


def test_a_changed_applied_migration_is_refused_and_a_new_one_applied(
    session: Any, keyspace: str, tmp_path: Path
) -> None:
    for f in DEFAULT_CQL_DIR.glob("V*.cql"):
        shutil.copy(f, tmp_path / f.name)
    (tmp_path / "V900__extra.cql").write_text(
        "-- a later version; comments; and 'quoted; text'\n"
        "CREATE TABLE IF NOT EXISTS extra_t (k text PRIMARY KEY, v text) WITH comment = 'a; b';\n"
        "ALTER TABLE extra_t WITH default_time_to_live = 60;\n"
    )
    assert migrate(session, keyspace, cql_dir=tmp_path) == [900]
    assert migrate(session, keyspace, cql_dir=tmp_path) == []
    v1 = next(tmp_path.glob("V001__*.cql"))
    v1.write_text(v1.read_text() + "\n-- edited\n")
    with pytest.raises(HistoryStoreError, match="changed after it was applied"):
        migrate(session, keyspace, cql_dir=tmp_path)
    session.execute(f"DROP TABLE {keyspace}.extra_t")
    session.execute(f"DELETE FROM {keyspace}.schema_version WHERE version = 900")


def test_ensure_schema_creates_a_keyspace(infra: Settings, session: Any) -> None:
    ks = f"gnomon_test_{uuid.uuid4().hex[:12]}"
    store = CassandraHistoryStore(infra.cassandra_hosts, infra.cassandra_port, ks, ensure_schema=True)
    try:
        j = job(uid("job"), uid("t"))
        store.put_job(j)  # connects lazily, migrates, writes
        assert store.get_job(j.job_id) == j
    finally:
        store.close()
        session.execute(f"DROP KEYSPACE IF EXISTS {ks}", timeout=60)


# ---- errors ------------------------------------------------------------------------------


def test_missing_schema_is_a_one_line_history_store_error(infra: Settings) -> None:
    store = CassandraHistoryStore(infra.cassandra_hosts, infra.cassandra_port, "gnomon_test_absent")
    with pytest.raises(HistoryStoreError) as e:
        store.get_job("job_x")
    assert "gnomon.history.migrate" in str(e.value) and "\n" not in str(e.value)
    store.close()


def test_unreachable_cassandra_is_a_history_store_error() -> None:
    store = CassandraHistoryStore(["127.0.0.1"], 1, connect_timeout_s=1.0)  # nothing listens on port 1
    with pytest.raises(HistoryStoreError) as e:
        store.list_jobs("acme", 10, None)
    msg = str(e.value)
    assert msg.startswith("cassandra connect to 127.0.0.1:1: NoHostAvailable") and "\n" not in msg
    store.close()
    with pytest.raises(HistoryStoreError, match="closed"):
        store.get_job("job_x")


def test_rows_hold_codec_blobs_and_stale_dead_letters_are_deleted(
    session: Any, keyspace: str, make_store: Callable[..., CassandraHistoryStore]
) -> None:
    store = make_store()
    tenant, job_id = uid("t"), uid("job")
    dead = failed(job_id, T0, tenant)
    store.put_run(dead)
    row = session.execute(f"SELECT status, state, TTL(state) AS ttl FROM {keyspace}.runs_by_id WHERE run_id = %s",
                          (dead.run_id,)).one()
    assert row.status == "failed" and bytes(row.state) == encode(dead) and 0 < row.ttl <= 90 * 86400
    store.put_run(run(job_id, T0, RunStatus.READY, tenant))
    count = f"SELECT count(*) FROM {keyspace}.dead_letters_by_tenant WHERE tenant = %s"
    assert session.execute(count, (tenant,)).one()[0] == 1  # not deleted on write ...
    assert store.list_dead_letters(tenant, 10, None).items == []
    assert session.execute(count, (tenant,)).one()[0] == 0  # ... but by the listing that found it stale
    line_row = line(dead.run_id, 1, 1)
    store.put_log(line_row)
    ttl = session.execute(f"SELECT TTL(line) FROM {keyspace}.logs_by_run WHERE run_id = %s", (dead.run_id,)).one()[0]
    assert 0 < ttl <= 30 * 86400


# ---- write_batch: record bytes, grouped requests -------------------------------------------


def test_record_bytes_are_stored_as_the_blob_and_read_back(
    session: Any, keyspace: str, make_store: Callable[..., CassandraHistoryStore]
) -> None:
    store = make_store()
    tenant, job_id = uid("t"), uid("job")
    j, r = job(job_id, tenant, 3), failed(job_id, T0, tenant)
    raw_j, raw_r = encode(j), encode(r)
    store.write_batch(HistoryBatch(jobs=[j], runs=[r], job_blobs={job_id: raw_j}, run_blobs={r.run_id: raw_r}))
    assert store.get_job(job_id) == j and store.get_run(r.run_id) == r
    assert store.list_runs(job_id, None, 10, None).items == [r]
    assert store.list_dead_letters(tenant, 10, None).items == [r]
    blobs = [session.execute(f"SELECT state FROM {keyspace}.{table} WHERE {where}", args).one().state
             for table, where, args in [("runs_by_id", "run_id = %s", (r.run_id,)),
                                        ("runs_by_job", "job_id = %s", (job_id,)),
                                        ("dead_letters_by_tenant", "tenant = %s", (tenant,)),
                                        ("jobs_by_id", "job_id = %s", (job_id,)),
                                        ("jobs_by_tenant", "tenant = %s", (tenant,))]]
    assert [bytes(b) for b in blobs] == [raw_r, raw_r, raw_r, raw_j, raw_j]


def test_a_large_batch_is_grouped_written_whole_and_replayed_idempotently(
    session: Any, keyspace: str, make_store: Callable[..., CassandraHistoryStore], caplog: pytest.LogCaptureFixture
) -> None:
    store = make_store()
    tenant = uid("t")
    jobs = [job(uid("job"), tenant) for _ in range(30)]
    runs = [run(j.job_id, T0 + i * MINUTE, tenant=tenant) if i else failed(j.job_id, T0, tenant)
            for j in jobs for i in range(8)]
    lines = [line(r.run_id, 1, n) for r in runs for n in range(2)]
    gone = job(uid("job"), tenant)
    store.put_job(gone)
    batch = HistoryBatch(jobs=jobs, deleted_jobs=[gone.job_id], runs=runs, logs=lines,
                         run_blobs={r.run_id: encode(r) for r in runs[::2]})  # bytes for half of them
    st = store._ready()[1]
    writes = [w for j in jobs for w in store._job_writes(st, j)] + [w for r in runs for w in store._run_writes(st, r)]
    groups = store._write_groups(store._ready()[0], writes)
    assert len(groups) * 5 < len(writes)  # few requests: one per statement before
    assert all(len(g.partitions) <= WRITE_BATCH_PARTITIONS_MAX for g in groups)

    def check() -> None:
        assert [store.get_job(j.job_id) for j in jobs] == jobs and store.get_job(gone.job_id) is None
        assert {j.job_id for j in all_pages(lambda n, c: store.list_jobs(tenant, n, c), 100)[0]} == {
            j.job_id for j in jobs}
        for j in jobs:
            got = store.list_runs(j.job_id, None, 100, None).items
            assert sorted(got, key=lambda r: r.slot_ms) == [r for r in runs if r.job_id == j.job_id]
        assert all(store.get_logs(r.run_id, 10, None).items == lines[2 * i:2 * i + 2] for i, r in enumerate(runs))
        assert len(all_pages(lambda n, c: store.list_dead_letters(tenant, n, c), 100)[0]) == len(jobs)

    with caplog.at_level(logging.WARNING, logger="cassandra"):
        store.write_batch(batch)
        check()
        store.write_batch(batch)  # a replay: the same rows
        check()
    assert not [r for r in caplog.records if "Server warning" in r.getMessage()]  # no batch over a threshold


# ---- the projector on real Kafka ---------------------------------------------------------


@pytest.fixture
def topics(infra: Settings) -> Iterator[dict[str, str]]:
    from confluent_kafka.admin import AdminClient, NewTopic

    from gnomon.adapters.kafka import security_config

    prefix = f"gnomon_test_{uuid.uuid4().hex[:10]}"
    names = {"jobs": f"{prefix}.jobs", "runs": f"{prefix}.runs", "logs": f"{prefix}.run-logs"}
    admin = AdminClient({"bootstrap.servers": infra.kafka_bootstrap, **security_config()})
    for f in admin.create_topics([NewTopic(t, num_partitions=2, replication_factor=1)
                                  for t in names.values()]).values():
        f.result(30)
    try:
        yield names
    finally:
        for f in admin.delete_topics(list(names.values())).values():
            try:
                f.result(30)
            except Exception as exc:  # best effort
                print(f"could not delete topic: {exc}")


def test_projector_end_to_end(
    infra: Settings, topics: dict[str, str], make_store: Callable[..., CassandraHistoryStore]
) -> None:
    from confluent_kafka import Producer

    from gnomon.adapters.kafka import producer_config

    store = make_store()
    tenant = uid("t")
    j1, gone, aborted = job(uid("job"), tenant), job(uid("job"), tenant), job(uid("job"), tenant)
    states = [run(j1.job_id, T0 + MINUTE, RunStatus.RUNNING, tenant, attempt=1, token=1, worker_id="w",
                  lease_until_ms=T0, deadline_ms=T0), failed(j1.job_id, T0 + MINUTE, tenant)]
    ok = run(j1.job_id, T0, RunStatus.SUCCEEDED, tenant)
    lines = [line(ok.run_id, 1, i) for i in range(5)]

    p = Producer(producer_config(infra.kafka_bootstrap, **{"transactional.id": f"{topics['jobs']}-tx"}))
    p.init_transactions(30)
    p.begin_transaction()
    p.produce(topics["jobs"], key=aborted.job_id.encode(), value=encode(aborted))
    p.abort_transaction(30)  # read_committed: never projected
    p.begin_transaction()
    for j in (j1, gone):
        p.produce(topics["jobs"], key=j.job_id.encode(), value=encode(j))
    p.produce(topics["jobs"], key=gone.job_id.encode(), value=None)
    p.produce(topics["jobs"], key=b"job_poison", value=b"\x00garbage")
    for s in [ok, *states]:
        p.produce(topics["runs"], key=s.run_id.encode(), value=encode(s))
    for x in lines:
        p.produce(topics["logs"], key=x.run_id.encode(), value=encode(x))
    p.commit_transaction(30)

    group = f"{topics['jobs']}-history"
    proj = HistoryProjector(store, KafkaEventLog(infra.kafka_bootstrap), topics=topics, group_id=group, batch_max=4)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proj.stats.records < 12:
            proj.run_once(100, timeout_s=0.5)
        assert proj.stats.records == 12, proj.stats  # jobs 2 + tombstone + poison, runs 3, logs 5; not the aborted
        assert proj.stats.poison == 1
    finally:
        proj.close()
    assert store.get_job(j1.job_id) == j1
    assert store.get_job(gone.job_id) is None and store.get_job(aborted.job_id) is None
    assert store.list_jobs(tenant, 10, None).items == [j1]
    assert store.list_runs(j1.job_id, None, 10, None).items == [states[-1], ok]
    assert store.list_dead_letters(tenant, 10, None).items == [states[-1]]
    assert store.get_logs(ok.run_id, 10, None).items == lines

    # committed offsets: a new projector in the same group has nothing left to do
    again = HistoryProjector(store, KafkaEventLog(infra.kafka_bootstrap), topics=topics, group_id=group)
    try:
        assert sum(again.run_once(100, timeout_s=1.0) for _ in range(8)) == 0
    finally:
        again.close()
