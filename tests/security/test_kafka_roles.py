"""Issue 50, findings 2 and 3 (and the configuration half of 4), on real Kafka: what the
credential a team's service holds may do, and what the API's own credential may not.

Before: docs/job-events.md told an operator to hand every team's service the ``api``
credential, the REST API's own. That credential could write ``gnomon.run-events`` (one
unsigned CompleteAttempt, with a token counted 1, 2, 3 and a worker id shown to tenants,
ended another tenant's running run as succeeded with forged output) and the
configuration topics (``gnomon.tenants``, ``gnomon.calendars``, ``gnomon.alert-configs``:
a tenant raised its own limits, skipped another tenant's slots with a calendar, and
re-routed another tenant's alerts), and read every tenant's alert webhook URLs.

Now (docs/adr/0006, decision 4) a team's service holds the ``producer`` credential: it
writes signed job commands, nothing else, and reads their answers through the REST API; the ``api`` credential
stays with the API's processes and no longer writes run-events, which only workers (and
the processor) write. Kafka refuses each forbidden write and read with
TOPIC_AUTHORIZATION_FAILED before any processor sees a byte of it.

Checked against the code before: with ``TEAM_ROLE = "api"`` and the old ACL table (the
tree before this change, ``gnomon infra up`` re-applies it) every write below was
delivered and every read allowed (the answers topic, the alert configurations, limits and
calendars). Needs ``python -m gnomon.infra up``."""

from __future__ import annotations

import secrets
import time

import pytest
import test_infra_auth
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition
from test_infra_auth import QUIET, SHORT_S, _produce

from gnomon import codec
from gnomon.adapters.kafka import consumer_config, producer_config
from gnomon.config import Settings
from gnomon.core.alerts import AlertConfig
from gnomon.core.calendars import Calendar, parse_calendar
from gnomon.core.jobs import PauseJob
from gnomon.core.runs import CompleteAttempt, Outcome
from gnomon.core.tenants import TenantLimits
from gnomon.topology import Topology, load_topology

pytestmark = pytest.mark.integration

TEAM_ROLE = "producer"  # what docs/job-events.md tells an operator to hand a team's service
infra = test_infra_auth.infra  # the same fixture: `python -m gnomon.infra up`, its settings


def _forged_report(topo: Topology) -> tuple[str, bytes]:
    """A worker's report that another tenant's run succeeded, as finding 2 forged it."""
    run_id = f"victim-{secrets.token_hex(4)}@1764547200000"
    now = int(time.time() * 1000)
    report = CompleteAttempt(run_id, "worker-1", 1, Outcome.SUCCEEDED, now, exit_code=0, started_at_ms=now - 1000,
                             output='{"forged": true}')
    return run_id.partition("@")[0], codec.encode(report, topo.run_events)


def _configuration(topo: Topology) -> list[tuple[str, str, bytes]]:
    """One record per configuration topic, as finding 3 wrote them: a tenant's own limits
    raised, a calendar skipping every day of another tenant's, another tenant's alerts sent
    to the writer's URL."""
    now = int(time.time() * 1000)
    limits = TenantLimits("acme", concurrency_max=100_000, triggers_per_min_max=6_000, updated_at_ms=now)
    alerts = AlertConfig("globex", "https://attacker.example/hook", updated_at_ms=now)
    cal: Calendar = parse_calendar("globex", "holidays", {"timezone": "UTC", "dates": [
        {"from": "2027-01-01", "to": "2027-12-31"}]}, now)
    return [(topo.tenants, "acme", codec.encode(limits, topo.tenants)),
            (topo.calendars, cal.key, codec.encode(cal, topo.calendars)),
            (topo.alert_configs, "globex", codec.encode(alerts, topo.alert_configs))]


def _first_error(c: Consumer) -> int | None:
    deadline = time.monotonic() + SHORT_S
    while time.monotonic() < deadline:
        msg = c.poll(0.5)
        if msg is not None:
            assert msg.error() is not None, f"read {msg.topic()}@{msg.offset()}"
            if msg.error().code() != KafkaError.GROUP_AUTHORIZATION_FAILED:  # the group it has no grant for
                return int(msg.error().code())
    return None


def _denied(err: KafkaError | None) -> bool:
    return err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_the_api_credential_cannot_report_runs(infra: Settings) -> None:
    """Finding 2: run reports come from workers only; neither the API's principal nor a
    team's may write run-events."""
    topo = load_topology()
    key, forged = _forged_report(topo)
    for role in ("api", TEAM_ROLE):
        err = _produce(producer_config(infra.kafka_bootstrap, role=role), topo.run_events, key, forged)
        assert _denied(err), (role, err)
    # the worker's credential still reports (the processor fences it by worker id and token)
    ok = _produce(producer_config(infra.kafka_bootstrap, role="worker"), topo.run_events, key, forged)
    assert ok is None, ok


def test_a_teams_credential_writes_no_configuration(infra: Settings) -> None:
    """Finding 3: tenant limits, calendars and alert configurations are written by the
    API's principal only (after its admin-role and tenant checks), never by a team's."""
    topo = load_topology()
    team = producer_config(infra.kafka_bootstrap, role=TEAM_ROLE)
    for topic, key, value in _configuration(topo):
        assert _denied(_produce(team, topic, key, value)), topic
    for topic in (topo.jobs, topo.runs, topo.worker_inbox, topo.dependencies, topo.tenant_usage):
        assert _denied(_produce(team, topic, "x", b"forged")), topic


def test_a_teams_credential_reads_nothing_of_another_tenant(infra: Settings) -> None:
    """Finding 4's Kafka half: every tenant's command answers, alert webhook URLs, limits,
    calendars, and every topic that holds another tenant's jobs, runs, logs or grants are
    closed to a team's service (it reads its own answers through the REST API, which checks
    the tenant: tests/unit/test_events.py)."""
    topo = load_topology()
    c = Consumer({**consumer_config(infra.kafka_bootstrap, "gnomon-events", role=TEAM_ROLE), "logger": QUIET})
    try:
        closed = (topo.command_results, topo.alert_configs, topo.tenants, topo.tenant_usage, topo.calendars, topo.jobs, topo.runs,
                  topo.run_logs, topo.run_events, topo.worker_inbox, topo.dead_letters, topo.dependencies,
                  topo.run_exports)
        for topic in closed:
            err = c.list_topics(topic, timeout=SHORT_S).topics[topic].error
            assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, (topic, err)
        # the commands topic it writes (WRITE implies DESCRIBE): its records, other tenants'
        # commands, are not fetched
        c.assign([TopicPartition(topo.job_commands, p, OFFSET_BEGINNING) for p in range(topo.partitions)])
        assert _first_error(c) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    finally:
        c.close()


def test_a_teams_credential_writes_job_commands(infra: Settings) -> None:
    """What a team's service is for: its (signed) commands reach the processor's topic."""
    topo = load_topology()
    job_id = "roletest-" + secrets.token_hex(4)  # no such job: the processor refuses the pause (unsigned)
    value = codec.encode(PauseJob(job_id, "acme", int(time.time() * 1000)), topo.job_commands)
    assert _produce(producer_config(infra.kafka_bootstrap, role=TEAM_ROLE), topo.job_commands, job_id, value) is None
