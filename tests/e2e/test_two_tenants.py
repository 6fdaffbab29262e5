"""Two tenants, each with exactly what docs/job-events.md and docs/security.md tell an
operator to hand a team: the ``producer`` Kafka credential, the tenant's command key and
the tenant's API token (issue 50). Each sets up its own job, alert webhook and calendar;
then each tries to read, change or learn of the other's over Kafka, the REST API and the
UI, and neither can: Kafka refuses every read and every write but signed commands; a
command about the other's job is answered in the words an unknown job gets; a command
claiming the other tenant is refused, and its answer is the other tenant's to read; the
API and the UI answer 404 or show nothing; and at the end the other's job, alerts and
calendar are as they were."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from harness import NEVER_DUE, OTHER_TOKEN, TOKEN, Stack, job_or_none, wait_for

from gnomon import command_keys
from gnomon.adapters.kafka import consumer_config, producer_config
from gnomon.client import ApiError, Client
from gnomon.config import load
from gnomon.core.errors import EventLogError
from gnomon.events import JobEvents
from gnomon.topology import load_topology

pytestmark = pytest.mark.integration

SHORT_S = 6.0


@dataclass
class Team:
    tenant: str
    token: str
    client: Client
    job_id: str = ""
    calendar: str = ""
    hook: str = ""

    def events(self, stack: Stack, **kw: Any) -> JobEvents:
        """A producer with what an operator hands this team (role ``producer``, its key)."""
        return JobEvents(self.tenant, load().kafka_bootstrap, replies=True, answers_url=stack.api_url,
                         api_token=self.token, **kw)


@pytest.fixture
def teams(stack: Stack) -> Iterator[tuple[Team, Team]]:
    command_keys.ensure(command_keys.keys_dir(load()), "other")  # `gnomon tenants command-key other`
    pair = (Team("acme", TOKEN, Client(stack.api_url, TOKEN)),
            Team("other", OTHER_TOKEN, Client(stack.api_url, OTHER_TOKEN)))
    for team in pair:
        tag = secrets.token_hex(4)
        with team.events(stack) as ev:
            team.job_id = ev.register({"name": f"{team.tenant}-{tag}", "schedule": NEVER_DUE,
                                       "target": {"type": "command", "argv": ["true"]}},
                                      idempotency_key=f"two-tenants-{tag}")
            [res] = ev.results(timeout_s=60)
        assert res.accepted, res
        wait_for(lambda t=team: job_or_none(t.client, t.job_id), 30, f"{team.tenant}'s job in history")
        team.hook = f"http://127.0.0.1:1025/{team.tenant}-{tag}"  # (never called: no run of theirs fails)
        team.client.set_alerts({"url": team.hook})
        team.calendar = f"closed-{tag}"
        team.client.put_calendar(team.calendar, {"timezone": "UTC", "dates": ["2027-12-25"]})
    yield pair
    for team in pair:
        with team.events(stack) as ev:
            ev.delete(team.job_id)
        team.client.delete_alerts()
        team.client.delete_calendar(team.calendar)


def _status(call: Any) -> int:
    try:
        call()
    except ApiError as exc:
        return exc.status
    return 200


def _produce(conf: dict[str, Any], topic: str, value: bytes) -> KafkaError | None:
    result: list[KafkaError | None] = []
    p = Producer({**conf, "message.timeout.ms": int(SHORT_S * 1000), "linger.ms": 0})
    p.produce(topic, key=b"x", value=value, on_delivery=lambda err, _m: result.append(err))
    p.flush(SHORT_S + 5)
    return result[0] if result else None


def _kafka_closed(me: Team) -> None:
    """What the ``producer`` credential can reach on Kafka: no topic to read (answers,
    alert configs, calendars, limits, jobs, runs, logs), no configuration to write."""
    topo, bootstrap = load_topology(), load().kafka_bootstrap
    c = Consumer(consumer_config(bootstrap, "gnomon-events", role="producer"))
    try:
        for topic in (topo.command_results, topo.alert_configs, topo.calendars, topo.tenants, topo.tenant_usage,
                      topo.jobs, topo.runs, topo.run_logs, topo.dead_letters):
            err = c.list_topics(topic, timeout=SHORT_S).topics[topic].error
            assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, (me.tenant, topic, err)
    finally:
        c.close()
    conf = producer_config(bootstrap, role="producer")
    for topic in (topo.alert_configs, topo.calendars, topo.tenants, topo.run_events):
        err = _produce(conf, topic, b"forged")
        assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, (me.tenant, topic, err)


def _commands_on(ev: JobEvents, job_id: str) -> None:
    ev.pause(job_id)
    ev.resume(job_id)
    ev.patch(job_id, {"name": "taken"})
    ev.trigger(job_id, "k-" + secrets.token_hex(3))
    ev.delete(job_id)


def _attack(stack: Stack, me: Team, them: Team) -> None:
    # Kafka: commands about their job, as myself, answered as for a job that does not exist
    unknown = "job_" + secrets.token_hex(8)
    with me.events(stack) as ev:
        _commands_on(ev, them.job_id)
        _commands_on(ev, unknown)
        answers = ev.results(timeout_s=60)
    theirs, none = answers[:5], answers[5:]
    for a, b in zip(theirs, none, strict=True):
        assert not a.accepted and a.code == b.code and a.field == b.field, (a, b)
        assert (a.reason or "").replace(them.job_id, "<id>") == (b.reason or "").replace(unknown, "<id>"), (a, b)
        assert them.tenant not in (a.reason or ""), a
    # Kafka: commands claiming to be them, signed with my key: refused (signature), and the
    # answers are theirs to read, not mine
    with me.events(stack) as forger:
        forger.tenant = them.tenant
        forger.pause(them.job_id)
        forger.delete(them.job_id)
        with pytest.raises(EventLogError, match="2 of 2 command results did not arrive"):
            forger.results(timeout_s=5)
        forged = [(p, o) for _, p, o in forger._waiting]  # where Kafka wrote them (none answered to me)
    assert len(forged) == 2
    for p, o in forged:
        assert me.client._call("GET", f"/v1/commands/{p}-{o}")["status"] == "pending"
        answer = wait_for(lambda p=p, o=o: (lambda a: a if a["status"] != "pending" else None)(
            them.client._call("GET", f"/v1/commands/{p}-{o}")), 30, "their answer to the forged command")
        assert answer["code"] == "refused" and answer["field"] == "signature", answer
    _kafka_closed(me)

    # the REST API: their job, its runs and its answers as unknown ones; my own settings only
    for call in (lambda: me.client.get_job(them.job_id), lambda: me.client.list_runs(them.job_id),
                 lambda: me.client.pause(them.job_id), lambda: me.client.get_calendar(them.calendar)):
        assert _status(call) == 404
    page: dict[str, Any] = {"cursor": None}
    while True:  # every page of my listing
        page = me.client.list_jobs(limit=100, cursor=page["cursor"])
        assert them.job_id not in str(page["items"])
        if not page["cursor"]:
            break
    assert me.client.get_alerts()["url"] == me.hook
    listed = str(me.client.list_calendars())
    assert me.calendar in listed and them.calendar not in listed
    assert me.client._call("GET", "/v1/tenant")["tenant"] == me.tenant

    # the UI, signed in with my token
    with httpx.Client(base_url=stack.api_url, follow_redirects=False, timeout=10) as ui:
        r = ui.post("/ui/login", data={"token": me.token}, headers={"Origin": stack.api_url})
        assert r.status_code == 303, r.text
        assert ui.get(f"/ui/jobs/{them.job_id}").status_code == 404
        assert ui.get(f"/ui/jobs/{them.job_id}/runs").status_code == 404
        for page in ("/ui/jobs", "/ui/calendars", "/ui/dead-letters"):
            r = ui.get(page)
            assert r.status_code == 200 and them.job_id not in r.text and them.calendar not in r.text, page


def test_neither_tenant_can_read_change_or_learn_of_the_others(stack: Stack, teams: tuple[Team, Team]) -> None:
    acme, other = teams
    before = {t.tenant: (job_or_none(t.client, t.job_id), t.client.get_alerts(), t.client.get_calendar(t.calendar))
              for t in teams}
    _attack(stack, acme, other)
    _attack(stack, other, acme)
    after = {t.tenant: (job_or_none(t.client, t.job_id), t.client.get_alerts(), t.client.get_calendar(t.calendar))
             for t in teams}
    assert after == before  # each one's job (status, version, spec), alerts and calendar as they were
