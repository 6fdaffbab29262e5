"""Tenants as data: TenantLimits, TenantBook, UsageBook, core.admission, the feed's
record handling, and the topology/codec/ACL entries of the two topics."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gnomon import codec
from gnomon.config import load
from gnomon.core import admission
from gnomon.core.errors import LimitExceeded, ValidationError
from gnomon.core.tenants import (
    BUILT_IN_DEFAULTS,
    DEFAULTS_KEY,
    LIMIT_BOUNDS,
    TenantBook,
    TenantLimits,
)
from gnomon.core.usage import TenantUsage, UsageBook, parse_usage_key, usage_key
from gnomon.core.validation import parse_job_spec
from gnomon.feeds.tenants import apply_record
from gnomon.infra import acls
from gnomon.infra.topics import topic_specs
from gnomon.topology import load_topology

NOW = 1_800_000_000_000
TENANTS, USAGE = "gnomon.tenants", "gnomon.tenant-usage"


def spec(**over: Any) -> Any:
    body = {"name": "n", "schedule": "0 * * * *", "target": {"type": "command", "argv": ["true"]}}
    body.update(over)
    return parse_job_spec(body, NOW)


# ---- TenantLimits ---------------------------------------------------------------------------


@pytest.mark.parametrize("field", sorted(LIMIT_BOUNDS))
@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "3", None])
def test_limits_refuse_values_out_of_bounds(field: str, bad: Any) -> None:
    with pytest.raises(ValidationError) as exc:
        TenantLimits("acme", **{field: bad})
    assert exc.value.field == field


@pytest.mark.parametrize("field", sorted(LIMIT_BOUNDS))
def test_limits_accept_their_bounds(field: str) -> None:
    low, high = LIMIT_BOUNDS[field]
    assert getattr(TenantLimits("acme", **{field: low}), field) == low
    assert getattr(TenantLimits("acme", **{field: high}), field) == high
    with pytest.raises(ValidationError):
        TenantLimits("acme", **{field: high + 1})


@pytest.mark.parametrize("name", ["", "a/b", "a b", "x" * 129, "é\u202e"])
def test_limits_refuse_bad_tenant_names(name: str) -> None:
    with pytest.raises(ValidationError) as exc:
        TenantLimits(name)
    assert exc.value.field == "tenant"


def test_limits_of_a_record_are_the_limit_fields_only() -> None:
    assert set(TenantLimits("acme", updated_at_ms=5).limits()) == set(LIMIT_BOUNDS)


# ---- TenantBook -----------------------------------------------------------------------------


def test_book_defaults_records_and_tombstones() -> None:
    book = TenantBook()
    assert book.limits("acme") == TenantLimits("acme") and not book.configured("acme")
    assert book.defaults() is BUILT_IN_DEFAULTS
    book.apply(DEFAULTS_KEY, TenantLimits(DEFAULTS_KEY, jobs_max=10, updated_at_ms=3))
    assert book.limits("acme") == TenantLimits("acme", jobs_max=10, updated_at_ms=3)  # the defaults, named
    book.apply("acme", TenantLimits("acme", jobs_max=99))
    assert book.limits("acme").jobs_max == 99 and book.configured("acme")
    assert book.limits("other").jobs_max == 10
    assert [t.tenant for t in book.all()] == [DEFAULTS_KEY, "acme"]
    book.apply("acme", None)  # tombstone: back to the defaults
    assert book.limits("acme").jobs_max == 10 and not book.configured("acme")
    book.apply(DEFAULTS_KEY, None)
    assert book.limits("acme") == TenantLimits("acme")
    book.apply("nobody", None)  # a tombstone for an unknown tenant is harmless


def test_book_refuses_a_key_naming_another_tenant_and_too_many_tenants() -> None:
    book = TenantBook(tenants_max=1)
    with pytest.raises(ValidationError):
        book.apply("acme", TenantLimits("other"))
    book.apply("acme", TenantLimits("acme"))
    book.apply("acme", TenantLimits("acme", jobs_max=2))  # replacing is not adding
    with pytest.raises(ValidationError):
        book.apply("other", TenantLimits("other"))


# ---- UsageBook ------------------------------------------------------------------------------


def usage(tenant: str, partition: int, jobs: int = 0, backlog: int = 0, running: int = 0, triggers: int = 0,
          at_ms: int = NOW) -> TenantUsage:
    return TenantUsage(tenant, partition, jobs, backlog, running, triggers, at_ms)


def test_usage_key_round_trips() -> None:
    assert usage_key("acme", 7) == "acme/7" == usage("acme", 7).key
    assert parse_usage_key("a.b-c/12") == ("a.b-c", 12)
    for bad in ("acme", "/3", "acme/", "acme/x", "acme/-1"):
        with pytest.raises(ValidationError):
            parse_usage_key(bad)


def test_usage_book_sums_over_partitions_and_forgets_tombstones() -> None:
    book = UsageBook()
    assert book.totals("acme") == {"jobs": 0, "backlog": 0, "running": 0, "triggers_last_min": 0, "at_ms": 0}
    book.apply("acme/0", usage("acme", 0, jobs=2, backlog=1, running=3, triggers=4, at_ms=NOW))
    book.apply("acme/5", usage("acme", 5, jobs=5, backlog=2, running=0, triggers=1, at_ms=NOW - 10))
    book.apply("other/5", usage("other", 5, jobs=1))
    book.apply("acme/0", usage("acme", 0, jobs=3, at_ms=NOW + 5))  # the latest per partition counts
    assert book.totals("acme") == {"jobs": 8, "backlog": 2, "running": 0, "triggers_last_min": 1,
                                   "at_ms": NOW - 10}
    assert book.tenants() == ["acme", "other"]
    book.apply("acme/5", None)
    book.apply("acme/0", None)
    book.apply("acme/9", None)
    assert book.tenants() == ["other"] and book.totals("acme")["jobs"] == 0


def test_usage_book_refuses_a_key_naming_another_partition() -> None:
    with pytest.raises(ValidationError):
        UsageBook().apply("acme/1", usage("acme", 2))
    with pytest.raises(ValidationError):
        UsageBook().apply("acme/1", usage("other", 1))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 7), st.integers(0, 1000)
                          | st.none())))
def test_usage_totals_are_the_sum_of_the_latest_per_partition(records: list[tuple[str, int, int | None]]) -> None:
    book, latest = UsageBook(), {}
    for tenant, part, jobs in records:
        book.apply(usage_key(tenant, part), None if jobs is None else usage(tenant, part, jobs=jobs))
        latest[(tenant, part)] = jobs
    for tenant in ("a", "b"):
        assert book.totals(tenant)["jobs"] == sum(j or 0 for (t, _), j in latest.items() if t == tenant)


# ---- admission ------------------------------------------------------------------------------


def test_registration_over_jobs_max_is_422_naming_the_limit() -> None:
    limits = TenantLimits("acme", jobs_max=3)
    admission.check_registration(limits, spec(), jobs=2, backlog=0, now_ms=NOW)
    with pytest.raises(LimitExceeded) as exc:
        admission.check_registration(limits, spec(), jobs=3, backlog=0, now_ms=NOW)
    assert exc.value.limit == "jobs_max" and exc.value.retry_after_s is None


def test_schedule_faster_than_interval_min_is_refused_naming_schedule() -> None:
    limits = TenantLimits("acme", interval_min_s=300)
    admission.check_schedule(limits, spec(schedule="*/5 * * * *"), NOW)
    with pytest.raises(LimitExceeded) as exc:
        admission.check_schedule(limits, spec(schedule="*/4 * * * *"), NOW)
    assert (exc.value.limit, exc.value.field, exc.value.retry_after_s) == ("interval_min_s", "schedule", None)
    # a one-time job has no interval
    admission.check_schedule(limits, spec(schedule=None, runAt="2099-01-01T00:00:00Z"), NOW)


def test_one_time_job_over_backlog_is_429() -> None:
    limits = TenantLimits("acme", backlog_max=2)
    one_time = spec(schedule=None, runAt="2099-01-01T00:00:00Z")
    admission.check_registration(limits, spec(), jobs=0, backlog=5, now_ms=NOW)  # cron jobs: no backlog check
    admission.check_registration(limits, one_time, jobs=0, backlog=1, now_ms=NOW)
    with pytest.raises(LimitExceeded) as exc:
        admission.check_registration(limits, one_time, jobs=0, backlog=2, now_ms=NOW)
    assert exc.value.limit == "backlog_max" and exc.value.retry_after_s is not None
    assert exc.value.retry_after_s >= 1


@settings(max_examples=300, deadline=None)
@given(limit=st.integers(1, 50), count=st.integers(0, 100), age_ms=st.integers(0, 59_999) | st.none())
def test_trigger_refused_iff_count_reaches_the_limit(limit: int, count: int, age_ms: int | None) -> None:
    limits = TenantLimits("acme", triggers_per_min_max=limit)
    oldest = None if age_ms is None else NOW - age_ms
    try:
        admission.check_trigger(limits, backlog=0, triggers_last_min=count, oldest_trigger_ms=oldest, now_ms=NOW)
    except LimitExceeded as exc:
        assert count >= limit
        assert exc.limit == "triggers_per_min_max"
        assert exc.retry_after_s is not None and 1 <= exc.retry_after_s <= 60
        if oldest is not None:  # waiting that long lets the oldest leave the window
            assert NOW + exc.retry_after_s * 1000 >= oldest + 60_000
    else:
        assert count < limit


@settings(max_examples=200, deadline=None)
@given(limit=st.integers(1, 50), backlog=st.integers(0, 100))
def test_trigger_refused_iff_backlog_reaches_its_limit(limit: int, backlog: int) -> None:
    limits = TenantLimits("acme", backlog_max=limit)
    try:
        admission.check_trigger(limits, backlog=backlog, triggers_last_min=0, oldest_trigger_ms=None, now_ms=NOW)
    except LimitExceeded as exc:
        assert backlog >= limit and exc.limit == "backlog_max" and (exc.retry_after_s or 0) >= 1
    else:
        assert backlog < limit


# ---- codec, feed records, topology, ACLs -----------------------------------------------------


def test_both_values_round_trip_on_their_topics() -> None:
    limits = TenantLimits("acme", concurrency_max=7, jobs_max=8, interval_min_s=9, backlog_max=10,
                          triggers_per_min_max=11, updated_at_ms=NOW)
    assert codec.decode(codec.encode(limits, TENANTS), topic=TENANTS) == limits
    u = usage("acme", 3, 1, 2, 3, 4)
    assert codec.decode(codec.encode(u, USAGE), topic=USAGE) == u
    assert codec.schema_id_for_topic(TENANTS) == 45 and codec.schema_id_for_topic(USAGE) == 60


def test_feed_records_apply_and_bad_ones_are_skipped() -> None:
    book, ubook = TenantBook(), UsageBook()
    ok = codec.encode(TenantLimits("acme", jobs_max=4), TENANTS)
    assert apply_record(book, ubook, TENANTS, "acme", ok, tenants_topic=TENANTS) == 1
    assert book.limits("acme").jobs_max == 4
    assert apply_record(book, ubook, TENANTS, "other", ok, tenants_topic=TENANTS) == 0  # key != value
    assert apply_record(book, ubook, TENANTS, "acme", b"\x00junk", tenants_topic=TENANTS) == 0
    assert apply_record(book, ubook, TENANTS, "acme", codec.encode(usage("acme", 0), USAGE),
                        tenants_topic=TENANTS) == 0  # another topic's schema
    assert apply_record(book, ubook, USAGE, "acme/0", codec.encode(usage("acme", 0, jobs=2), USAGE),
                        tenants_topic=TENANTS) == 1
    assert apply_record(book, ubook, USAGE, "acme", codec.encode(usage("acme", 0), USAGE),
                        tenants_topic=TENANTS) == 0  # bad key
    assert apply_record(book, None, USAGE, "acme/1", codec.encode(usage("acme", 1), USAGE),
                        tenants_topic=TENANTS) == 0  # a processor does not keep usage
    assert ubook.totals("acme")["jobs"] == 2
    assert apply_record(book, ubook, TENANTS, "acme", None, tenants_topic=TENANTS) == 1  # tombstone
    assert not book.configured("acme")


def test_topics_are_declared_compacted_single_partition() -> None:
    topo = load_topology()
    assert (topo.tenants, topo.tenant_usage) == (TENANTS, USAGE)
    specs = {s.name: s for s in topic_specs(load().topology_path)}
    for name in (TENANTS, USAGE):
        assert specs[name].partitions == 1 and specs[name].cleanup_policy == "compact"


def test_acls_of_the_tenant_topics() -> None:
    topo = load_topology()
    table = acls.grants(topo)
    assert acls.roles_with(table, topo.tenants, "WRITE") == {"api"}
    assert acls.roles_with(table, topo.tenants, "READ") == {"api", "processor"}
    assert acls.roles_with(table, topo.tenant_usage, "WRITE") == {"processor"}
    assert acls.roles_with(table, topo.tenant_usage, "READ") == {"api"}
    api_reads = {g.name for g in table if g.role == "api" and g.operation == "READ" and g.resource == acls.TOPIC}
    # + its commands' answers, the alert configs (/v1/alerts) and calendars (/v1/calendars) it writes
    assert api_reads == {topo.tenants, topo.tenant_usage, topo.command_results, topo.alert_configs, topo.calendars}
    groups = {(g.role, g.name) for g in table if g.resource == acls.GROUP}
    assert {("api", "gnomon-tenants"), ("processor", "gnomon-tenants")} <= groups


# ---- TenantFeed over a fake consumer ---------------------------------------------------------


def _memory_log(logs: dict[str, list[tuple[bytes | None, bytes | None]]]) -> Any:
    from gnomon.core.clock import FakeClock
    from gnomon.eventlog.memory import MemoryEventLog

    log = MemoryEventLog(FakeClock(NOW), partitions=1)
    for topic, records in logs.items():
        for k, v in records:
            log.append(topic, k, v, 0)
    return log


def test_feed_loads_both_topics_from_the_beginning_then_polls() -> None:
    from gnomon.core.clock import FakeClock
    from gnomon.feeds import tenants as tenant_feed

    logs: dict[str, list[tuple[bytes | None, bytes | None]]] = {
        TENANTS: [(b"acme", codec.encode(TenantLimits("acme", jobs_max=1), TENANTS)),
                  (b"*", codec.encode(TenantLimits("*", jobs_max=50), TENANTS)),
                  (b"bad", b"\x00\x00\x00\x00\x2dgarbage"),
                  (b"acme", codec.encode(TenantLimits("acme", jobs_max=2), TENANTS)),
                  (b"gone", None)],
        USAGE: [(b"acme/0", codec.encode(usage("acme", 0, jobs=3), USAGE)),
                (b"acme/1", codec.encode(usage("acme", 1, jobs=4), USAGE))],
    }
    log = _memory_log(logs)
    book, ubook = TenantBook(), UsageBook()
    feed = tenant_feed.TenantFeed("b:1", load_topology(), book, ubook, FakeClock(NOW), role="api", log=log)
    assert feed.feed.consumer.group_id == "gnomon-tenants"  # type: ignore[attr-defined]
    assert feed.load(5) == 6  # the garbage record skipped
    assert book.limits("acme").jobs_max == 2 and book.limits("other").jobs_max == 50
    assert ubook.totals("acme")["jobs"] == 7
    assert feed.poll() == 0
    log.append(USAGE, b"acme/1", None, 0)
    assert feed.poll() == 1 and ubook.totals("acme")["jobs"] == 3
    feed.close()


def test_a_processor_feed_reads_limits_only() -> None:
    from gnomon.core.clock import FakeClock
    from gnomon.feeds import tenants as tenant_feed

    log = _memory_log({TENANTS: [], USAGE: [(b"acme/0", codec.encode(usage("acme", 0, jobs=3), USAGE))]})
    feed = tenant_feed.TenantFeed("b:1", load_topology(), TenantBook(), None, FakeClock(NOW), log=log)
    assert feed.feed.topics == [TENANTS]
    assert feed.load(1) == 0  # empty topic: nothing to wait for


def test_usage_not_refreshed_for_three_minutes_is_left_out() -> None:
    book = UsageBook()
    book.apply("a/0", TenantUsage("a", 0, 5, 1, 2, 0, at_ms=1_000))
    book.apply("a/1", TenantUsage("a", 1, 7, 0, 1, 0, at_ms=170_000))
    assert book.totals("a")["jobs"] == 12  # no time given: everything
    assert book.totals("a", now_ms=182_000)["jobs"] == 7  # partition 0 not counted for 180 s
    assert book.totals("a", now_ms=182_000)["at_ms"] == 170_000
