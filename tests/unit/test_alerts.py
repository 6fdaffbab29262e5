"""Alerts: the pure rules (decide, AlertMemory, DeliveryPolicy, OffsetTracker, config
checks), the signed and guarded webhook call against a real local receiver, and the
/v1/alerts endpoints in-process (no Kafka)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st

from gnomon import codec
from gnomon.alerts.policy import http_policy
from gnomon.alerts.sender import AlertDeliveryError, AlertSender
from gnomon.alerts.service import OffsetTracker
from gnomon.api.alerts import AlertService, parse_alert_body
from gnomon.api.app import CommandSink, create_app
from gnomon.core.alerts import (
    ALL_KINDS,
    AlertBook,
    AlertConfig,
    AlertKind,
    AlertMemory,
    DeliveryPolicy,
    Seen,
    decide,
)
from gnomon.core.clock import FakeClock, iso_to_ms
from gnomon.core.errors import ValidationError
from gnomon.core.model import JobSpec, Schedule, Target, TargetType
from gnomon.core.runs import RunState, RunStatus
from gnomon.core.validation import parse_job_spec
from gnomon.eventlog.memory import MemoryEventLog
from gnomon.history.memory import InMemoryHistoryStore
from gnomon.outbound.http import HttpPolicy, verify_signature
from gnomon.outbound.secrets import SecretStore
from gnomon.testing import ListProducer
from gnomon.topology import load_topology
from gnomon.web.auth import Authenticator

NOW = iso_to_ms("2026-12-01T10:00:00Z")
SLOT = NOW - 60_000
SPEC = JobSpec("nightly", Schedule(cron="* * * * *"), Target(TargetType.HANDLER, handler="h"))
CFG = AlertConfig("acme", "https://alerts.example.com/hook", late_s=5)

LOCAL_HOOKS = http_policy(["127.0.0.1/32"], True, ["1-65535"], env={})  # the test receiver: http on 127.0.0.1


def run(status: RunStatus = RunStatus.SCHEDULED, **kw: Any) -> RunState:
    base = RunState(run_id="job_a@2026-12-01T09:59:00Z", job_id="job_a", tenant="acme", spec=SPEC, slot_ms=SLOT,
                    not_before_ms=SLOT, manual=False, status=status, created_at_ms=SLOT - 30_000,
                    updated_at_ms=SLOT)
    return replace(base, **kw)


# ---- decide ------------------------------------------------------------------------------

def test_dead_letter_alerts_once_and_again_after_a_failed_replay() -> None:
    failed = run(RunStatus.FAILED, attempt=3, reason="attempts exhausted", error="boom", started_at_ms=SLOT)
    (a,) = decide(Seen.of(run(RunStatus.RUNNING, started_at_ms=SLOT)), failed, CFG, NOW)
    assert (a.kind, a.key, a.error, a.attempts) == (AlertKind.DEAD_LETTER, f"{failed.run_id}:dead_letter:0",
                                                    "boom", 3)
    assert decide(Seen.of(failed), failed, CFG, NOW) == []  # the same state again
    replayed = replace(failed, replays=1)
    (b,) = decide(Seen.of(failed), replayed, CFG, NOW)
    assert b.key.endswith(":dead_letter:1")


def test_skipped_alerts_with_its_range_and_again_after_a_reopen() -> None:
    skipped = run(RunStatus.SKIPPED, reason="catch-up: skip", skipped_from_ms=SLOT - 600_000, skipped_count=11)
    (a,) = decide(None, skipped, CFG, NOW)
    assert (a.kind, a.reason, a.skipped_count, a.skipped_from_ms) == (AlertKind.SKIPPED, "catch-up: skip", 11,
                                                                      SLOT - 600_000)
    assert decide(Seen.of(skipped), skipped, CFG, NOW) == []
    (b,) = decide(Seen.of(run(RunStatus.SCHEDULED, reopens=1)), replace(skipped, reopens=1), CFG, NOW)
    assert b.key.endswith(":skipped:1")
    # a slot on a date the job excludes was skipped as asked: no alert
    assert decide(None, run(RunStatus.SKIPPED, reason="calendar uk-bank-holidays"), CFG, NOW) == []


def test_late_uses_the_job_threshold_then_the_tenant_default() -> None:
    prev = Seen.of(run(RunStatus.RUNNING))
    started = run(RunStatus.RUNNING, started_at_ms=SLOT + 5_001, attempt_started_at_ms=SLOT + 5_001, attempt=1)
    (a,) = decide(prev, started, CFG, NOW)  # tenant default 5 s, 5.001 s late
    assert (a.kind, a.lag_ms, a.threshold_s, a.key) == (AlertKind.LATE, 5_001, 5, f"{started.run_id}:late")
    on_time = replace(started, started_at_ms=SLOT + 5_000)
    assert decide(prev, on_time, CFG, NOW) == []  # not *later* than the threshold
    own = replace(started, spec=replace(SPEC, alert_late_s=10))
    assert decide(prev, own, CFG, NOW) == []  # the job's own threshold wins
    assert decide(prev, replace(own, started_at_ms=SLOT + 10_001), CFG, NOW)[0].threshold_s == 10
    assert decide(prev, started, replace(CFG, late_s=None), NOW) == []  # no threshold anywhere
    # measured from the start time (slot + jitter), as startLagS
    assert decide(prev, replace(started, not_before_ms=SLOT + 2_000), CFG, NOW) == []
    # the start is alerted once, not on each later state of the run
    assert decide(Seen.of(started), replace(started, status=RunStatus.SUCCEEDED), CFG, NOW) == []


def test_no_config_other_tenant_or_kind_off_means_no_alert() -> None:
    failed = run(RunStatus.FAILED)
    assert decide(None, failed, None, NOW) == []
    assert decide(None, failed, replace(CFG, tenant="other"), NOW) == []
    assert decide(None, failed, replace(CFG, kinds=("late", "skipped")), NOW) == []
    assert decide(None, run(RunStatus.CANCELLED), CFG, NOW) == []
    assert decide(None, run(RunStatus.SUCCEEDED, started_at_ms=SLOT), CFG, NOW) == []


# A run's life as the ledger shows it: states in order, each a plausible next one.
@st.composite
def lives(draw: st.DrawFn) -> list[RunState]:
    states = [run(RunStatus.SCHEDULED)]
    late_ms = draw(st.integers(0, 20_000))
    for _ in range(draw(st.integers(1, 12))):
        s = states[-1]
        step = draw(st.sampled_from(["heartbeat", "start", "fail", "skip", "replay", "reopen", "succeed"]))
        if step == "start" and s.started_at_ms is None and not s.status.terminal:
            s = replace(s, status=RunStatus.RUNNING, started_at_ms=SLOT + late_ms, attempt=s.attempt + 1)
        elif step == "fail" and not s.status.terminal:
            s = replace(s, status=RunStatus.FAILED, reason="exhausted")
        elif step == "skip" and s.started_at_ms is None and not s.status.terminal:
            s = replace(s, status=RunStatus.SKIPPED, reason="paused")
        elif step == "replay" and s.status is RunStatus.FAILED:
            s = replace(s, status=RunStatus.READY, replays=s.replays + 1)
        elif step == "reopen" and s.status is RunStatus.SKIPPED:
            s = replace(s, status=RunStatus.SCHEDULED, reopens=s.reopens + 1)
        elif step == "succeed" and s.status is RunStatus.RUNNING:
            s = replace(s, status=RunStatus.SUCCEEDED)
        s = replace(s, updated_at_ms=s.updated_at_ms + 1)
        states.append(s)
    return states


def keys_of(states: list[RunState], memory: AlertMemory | None = None) -> list[str]:
    memory = memory or AlertMemory()
    return [a.key for s in states for a in memory.observe(s, CFG, NOW)]


@settings(max_examples=300)
@given(life=lives(), data=st.data())
def test_every_transition_alerts_at_most_once_and_repeats_do_not_realert(life: list[RunState],
                                                                         data: st.DataObject) -> None:
    once = keys_of(life)
    assert len(once) == len(set(once))  # at most once per kind and transition
    # each record delivered 1-3 times (at-least-once reading): the same alerts
    repeated = [s for s in life for _ in range(data.draw(st.integers(1, 3)))]
    assert keys_of(repeated) == once
    # a whole prefix read again after it (a replay from an older offset): nothing new
    cut = data.draw(st.integers(0, len(life)))
    assert keys_of(life + life[:cut]) == once
    # one alert per dead-lettering, per skip, and at most one late start
    fails = sum(1 for p, n in zip([None, *life], life, strict=False)
                if n.status is RunStatus.FAILED and (p is None or p.status is not RunStatus.FAILED))
    assert sum(k.split(":")[-2] == "dead_letter" for k in once if k.count(":") >= 2) == fails
    assert sum(k.endswith(":late") for k in once) <= 1


def test_memory_is_bounded_and_forgets_tombstoned_runs() -> None:
    memory = AlertMemory(runs_max=3)
    for i in range(10):
        memory.observe(run(run_id=f"job_a@{i}"), CFG, NOW)
    assert len(memory) == 3
    memory.forget("job_a@9")
    assert len(memory) == 2


# ---- delivery policy, offsets, config ------------------------------------------------------

def test_delivery_policy_backs_off_exponentially_up_to_the_cap() -> None:
    p = DeliveryPolicy(attempts_max=6, backoff_base_s=1, backoff_cap_s=5, timeout_s=2)
    assert [p.delay_s(n) for n in range(1, 6)] == [1, 2, 4, 5, 5]
    assert p.worst_case_s() == 6 * 2 + 1 + 2 + 4 + 5 + 5
    for bad in ({"attempts_max": 0}, {"backoff_base_s": 3, "backoff_cap_s": 1}, {"timeout_s": 0},
                {"in_flight_max": 0}):
        with pytest.raises(ValueError):
            DeliveryPolicy(**bad)  # type: ignore[arg-type]


def test_offsets_commit_only_past_settled_records() -> None:
    t, tp = OffsetTracker(), ("gnomon.runs", 0)
    t.add(tp, 10, 0)
    t.add(tp, 11, 2)  # two alerts in flight
    t.add(tp, 12, 0)
    assert t.to_commit() == {tp: 11}
    t.committed({tp: 11})
    assert t.to_commit() == {}
    t.settle(tp, 11)
    assert t.to_commit() == {}  # one of two still in flight
    t.settle(tp, 11)
    assert t.to_commit() == {tp: 13} and t.in_flight() == 0
    t.drop([tp])
    t.settle(tp, 11)  # a late settle of a revoked partition is ignored
    assert t.to_commit() == {}


def test_config_checks_name_the_field() -> None:
    cases: list[tuple[Any, str]] = [
        ({"kinds": ["late"]}, "url"),
        ({"url": "ftp://x.example.com"}, "url"),
        ({"url": "https://x.example.com/a b"}, "url"),
        ({"url": "https://x.example.com", "kinds": ["nope"]}, "kinds"),
        ({"url": "https://x.example.com", "kinds": ["late", "late"]}, "kinds"),
        ({"url": "https://x.example.com", "lateS": -1}, "lateS"),
        ({"url": "https://x.example.com", "lateS": True}, "lateS"),
        ({"url": "https://x.example.com", "secret": "s"}, "secret"),
        ({"url": "http://127.0.0.1:9/hook"}, "url"),  # plain http, port 9
        ({"url": "https://127.0.0.1/hook"}, "url"),  # loopback, refused as for HTTP targets
        ({"url": "http://alerts.example.com/hook"}, "url"),  # plain http (issue 24, finding 10)
        ({"url": "https://alerts.example.com:25/hook"}, "url"),  # not a web port
        ({"url": "http://169.254.169.254/latest"}, "url"),
        ([], "body"),
    ]
    for body, field in cases:
        with pytest.raises(ValidationError) as exc:
            parse_alert_body(body, "acme", NOW)
        assert exc.value.field == field, (body, exc.value)
    ok = parse_alert_body({"url": "http://127.0.0.1:9/hook", "lateS": 0}, "acme", NOW,
                          LOCAL_HOOKS)
    assert (ok.url, ok.kinds, ok.late_s, ok.updated_at_ms) == ("http://127.0.0.1:9/hook", ALL_KINDS, 0, NOW)
    with pytest.raises(ValidationError):
        AlertConfig("*", "https://x.example.com")


def test_book_refuses_a_record_for_another_tenant_and_tombstones_turn_alerts_off() -> None:
    book = AlertBook()
    with pytest.raises(ValidationError):
        book.apply("acme", replace(CFG, tenant="other"))
    book.apply("acme", CFG)
    assert book.get("acme") == CFG
    book.apply("acme", None)
    assert book.get("acme") is None


def test_job_alert_late_s_is_validated_and_round_trips() -> None:
    body = {"name": "n", "schedule": "* * * * *", "target": {"type": "handler", "name": "h"}, "alertLateS": 30}
    spec = parse_job_spec(body, NOW)
    assert spec.alert_late_s == 30
    state = run(spec=spec)
    assert codec.decode(codec.encode(state, load_topology().runs)) == state
    with pytest.raises(ValidationError) as exc:
        parse_job_spec({**body, "alertLateS": "soon"}, NOW)
    assert exc.value.field == "alertLateS"
    assert parse_job_spec({**body, "alertLateS": None}, NOW).alert_late_s is None


# ---- the webhook call, against a real receiver on loopback ---------------------------------

class Receiver(BaseHTTPRequestHandler):
    calls: list[dict[str, Any]] = []
    statuses: list[int] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        Receiver.calls.append({"headers": dict(self.headers), "body": body})
        self.send_response(Receiver.statuses.pop(0) if Receiver.statuses else 200)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[str]:
    Receiver.calls, Receiver.statuses = [], []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/alerts"
    server.shutdown()


def secrets_with_key(tmp_path: Any, key: str = "k3y-for-acme") -> SecretStore:
    d = tmp_path / "acme"
    d.mkdir(mode=0o700)
    (d / "http-signing-key").write_text(key)
    (d / "http-signing-key").chmod(0o600)
    return SecretStore(tmp_path)


def test_the_call_is_signed_like_http_targets(receiver: str, tmp_path: Any) -> None:
    sender = AlertSender(LOCAL_HOOKS, secrets_with_key(tmp_path))
    alert = decide(None, run(RunStatus.FAILED, error="boom"), CFG, NOW)[0]
    assert sender.send(alert, receiver, timeout_s=5) == 200
    (call,) = Receiver.calls
    h = call["headers"]
    assert verify_signature(b"k3y-for-acme", h["X-Gnomon-Timestamp"], call["body"], h["X-Gnomon-Signature"],
                            time.time())
    assert not verify_signature(b"another-key", h["X-Gnomon-Timestamp"], call["body"], h["X-Gnomon-Signature"],
                                time.time())
    assert h["Idempotency-Key"] == alert.key and h["X-Gnomon-Alert"] == "dead_letter"
    doc = json.loads(call["body"])
    assert (doc["kind"], doc["runId"], doc["error"], doc["idempotencyKey"]) == (
        "dead_letter", alert.run_id, "boom", alert.key)


def test_the_ssrf_guard_refuses_loopback_unless_allowed_and_non_2xx_fails(receiver: str, tmp_path: Any) -> None:
    alert = decide(None, run(RunStatus.FAILED), CFG, NOW)[0]
    with pytest.raises(AlertDeliveryError, match="loopback"):
        AlertSender(http_policy([], True, ["1-65535"], env={}), None).send(alert, receiver, timeout_s=5)
    assert Receiver.calls == []
    Receiver.statuses = [500]
    with pytest.raises(AlertDeliveryError, match="HTTP 500"):
        AlertSender(LOCAL_HOOKS, None).send(alert, receiver, timeout_s=5)
    assert "X-Gnomon-Signature" not in Receiver.calls[0]["headers"]  # no key: unsigned


# ---- /v1/alerts in-process -------------------------------------------------------------------

def test_alert_routes_set_get_delete_own_tenant_only() -> None:
    producer, topo = ListProducer(), load_topology()
    service = AlertService(AlertBook(), writer=producer, topic=topo.alert_configs, policy=HttpPolicy())
    auth = Authenticator({"tok-a": "acme", "tok-b": "other"})
    app = create_app(history=InMemoryHistoryStore(), commands=CommandSink(producer, topo.job_commands), auth=auth,
                     topology=topo, clock=FakeClock(NOW), alerts=service)
    client = TestClient(app)
    a, b = {"Authorization": "Bearer tok-a"}, {"Authorization": "Bearer tok-b"}
    assert client.get("/v1/alerts", headers=a).json()["configured"] is False
    r = client.put("/v1/alerts", headers=a, json={"url": "https://ops.example.com/h", "kinds": ["late"], "lateS": 9})
    assert r.status_code == 200, r.text
    assert r.json() == {"tenant": "acme", "configured": True, "url": "https://ops.example.com/h", "kinds": ["late"],
                        "lateS": 9, "updatedAt": "2026-12-01T10:00:00Z"}
    ((topic, key, value),) = producer.sent
    assert (topic, key) == (topo.alert_configs, "acme")
    assert value == AlertConfig("acme", "https://ops.example.com/h", ("late",), 9, NOW)  # decoded by ListProducer
    assert client.get("/v1/alerts", headers=b).json()["configured"] is False  # another tenant sees its own only
    bad = client.put("/v1/alerts", headers=a, json={"url": "http://10.0.0.1/h"})
    assert bad.status_code == 422 and bad.json()["field"] == "url"
    assert bad.headers["content-type"].startswith("application/problem+json")
    assert client.put("/v1/alerts", json={"url": "https://ops.example.com/h"}).status_code == 401
    assert client.delete("/v1/alerts", headers=a).json()["configured"] is False
    assert producer.sent[-1] == (topo.alert_configs, "acme", None)
    assert len(producer.sent) == 2  # the refused PUT wrote nothing


# ---- gnomon alerts set|get|delete against the in-process API ---------------------------------

@pytest.fixture
def cli_api(monkeypatch: pytest.MonkeyPatch) -> ListProducer:
    from gnomon.cli import alerts as cli_alerts
    from gnomon.client import Client

    producer, topo = ListProducer(), load_topology()
    service = AlertService(AlertBook(), writer=producer, topic=topo.alert_configs, policy=HttpPolicy())
    app = create_app(history=InMemoryHistoryStore(), commands=CommandSink(producer, topo.job_commands),
                     auth=Authenticator({"tok-a": "acme"}), topology=topo, clock=FakeClock(NOW), alerts=service)

    def make() -> Client:
        c = Client(url="http://testserver", token="tok-a")
        test_client = TestClient(app)
        test_client.headers["Authorization"] = "Bearer tok-a"
        c._http = test_client
        return c

    monkeypatch.setattr(cli_alerts, "Client", make)
    return producer


def cli(*args: str) -> Any:
    from typer.testing import CliRunner

    from gnomon.cli import main as cli_main

    return CliRunner().invoke(cli_main.app, ["alerts", *args])


def test_cli_set_get_delete(cli_api: ListProducer) -> None:
    out = cli("set", "https://ops.example.com/h", "--kinds", "dead_letter,skipped", "--late-s", "30", "--json")
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["kinds"] == ["dead_letter", "skipped"]
    out = cli("get")
    assert out.exit_code == 0 and "https://ops.example.com/h" in out.stdout and "30 s" in out.stdout
    out = cli("delete")
    assert out.exit_code == 0 and "alerts off" in out.stdout
    assert [v for _, _, v in cli_api.sent][-1] is None


@pytest.mark.parametrize(("args", "names"), [
    (["set", "ftp://x.example.com"], "URL"),
    (["set", "https://x.example.com", "--kinds", "late,nope"], "--kinds"),
    (["set", "https://x.example.com", "--late-s", "-3"], "--late-s"),
    (["set", "http://10.1.2.3/h"], "url"),  # refused by the API's SSRF check, named by it
])
def test_cli_bad_input_is_exit_2_with_one_line(cli_api: ListProducer, args: list[str], names: str) -> None:
    out = cli(*args)
    assert out.exit_code == 2, out.output
    assert names in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert cli_api.sent == []


# ---- the Alerter loop over the in-memory event log and a scripted sender ---------------------

class SpyLog:
    """The in-memory event log (one partition per topic), recording every offset commit
    its group consumers make."""

    def __init__(self) -> None:
        self.log = MemoryEventLog(FakeClock(NOW), partitions=1)
        self.commits: list[dict[tuple[str, int], int]] = []

    def group_consumer(self, group_id: str, **kw: Any) -> Any:
        consumer = self.log.group_consumer(group_id, **kw)
        commit = consumer.commit

        def recorded(offsets: Any, timeout_s: float) -> None:
            commit(offsets, timeout_s)
            self.commits.append(dict(offsets))

        consumer.commit = recorded  # type: ignore[method-assign]
        return consumer

    def end_offset(self, topic: str, partition: int) -> int:
        return self.log.end_offset(topic, partition)

    def append(self, topic: str, key: str, value: bytes | None) -> None:
        self.log.append(topic, key.encode(), value, 0)


def started(alerter: Any) -> None:
    """The alerter's first poll: it joins the group and, new, starts at the ledger's end."""
    assert alerter.run_once(0) == 0


class ScriptedSender:
    """Fails the first ``failures[key]`` calls of each alert, then delivers."""

    def __init__(self, failures: dict[str, int]) -> None:
        self.failures = failures
        self.calls: list[str] = []
        self.lock = threading.Lock()

    def send(self, alert: Any, url: str, timeout_s: float) -> int:
        with self.lock:
            self.calls.append(alert.key)
            if self.failures.get(alert.key, 0) > 0:
                self.failures[alert.key] -= 1
                raise AlertDeliveryError("HTTP 500")
        return 200


def test_alerter_retries_gives_up_and_commits_only_settled_offsets() -> None:
    from gnomon.alerts.service import Alerter

    topic = load_topology().runs
    failed = run(RunStatus.FAILED, run_id="job_a@f")
    skipped = run(RunStatus.SKIPPED, run_id="job_a@s", reason="paused")
    other = replace(failed, run_id="job_b@f", tenant="other")  # no config: no alert
    spy = SpyLog()
    book = AlertBook()
    book.apply("acme", CFG)
    sender = ScriptedSender({f"{failed.run_id}:dead_letter:0": 2, f"{skipped.run_id}:skipped:0": 99})
    given_up: list[str] = []
    alerter = Alerter(book, sender, DeliveryPolicy(attempts_max=3, backoff_base_s=0.01, backoff_cap_s=0.02,
                                                   in_flight_max=1),  # type: ignore[arg-type]
                      log=spy, clock=FakeClock(NOW), on_given_up=lambda a, _why: given_up.append(a.key))
    started(alerter)
    assert spy.commits == [{(topic, 0): 0}]  # the end, committed at once
    for s in (failed, skipped, other, failed):  # the last: the same state again
        spy.append(topic, s.run_id, codec.encode(s, topic))
    spy.append(topic, "job_a@gone", None)  # a tombstone
    assert alerter.run_once() == 5
    assert alerter.wait_idle(10)
    alerter.commit()
    assert sorted(sender.calls) == sorted([f"{failed.run_id}:dead_letter:0"] * 3 + [f"{skipped.run_id}:skipped:0"] * 3)
    assert given_up == [f"{skipped.run_id}:skipped:0"]
    s = alerter.stats
    assert (s.alerts, s.delivered, s.given_up, s.retries, s.no_config, s.tombstones) == (2, 1, 1, 4, 1, 1)
    assert spy.commits[-1] == {(topic, 0): 5}  # everything settled: past the last record
    # never past a record whose alert was in flight: 1 (the skipped one pending) or the end
    assert {c[(topic, 0)] for c in spy.commits[1:]} <= {1, 5}, spy.commits
    alerter.close()


def test_a_record_read_again_after_a_revoke_alerts_again() -> None:
    """Partitions revoked while an alert is still being delivered: the records after the
    last commit are read again (by this process too) and must raise their alerts again,
    not be remembered as raised and committed past (then a crash would lose the alert)."""
    from gnomon.alerts.service import Alerter

    topic = load_topology().runs
    failed = run(RunStatus.FAILED, run_id="job_a@f")
    spy = SpyLog()
    book = AlertBook()
    book.apply("acme", CFG)
    sender = ScriptedSender({})
    alerter = Alerter(book, sender, DeliveryPolicy(attempts_max=1, backoff_base_s=0.01, backoff_cap_s=0.02),
                      log=spy, clock=FakeClock(NOW))  # type: ignore[arg-type]
    started(alerter)
    spy.append(topic, failed.run_id, codec.encode(failed, topic))
    alerter.run_once()
    assert alerter.wait_idle(10)

    alerter._on_revoke([(topic, 0)])
    alerter.consumer.seek((topic, 0), 0)  # the partition came back: its records are read again
    alerter.run_once()  # the same record, read again after the partition came back
    assert alerter.wait_idle(10)
    assert sender.calls == [f"{failed.run_id}:dead_letter:0"] * 2
    alerter.close()


class HangingSender:
    """Blocks every call for tenant ``slow`` until released; delivers the others at once."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls: list[str] = []
        self.lock = threading.Lock()

    def send(self, alert: Any, url: str, timeout_s: float) -> int:
        with self.lock:
            self.calls.append(alert.key)
        if alert.tenant == "slow":
            self.release.wait(10)
        return 200


def test_one_tenants_hanging_webhook_does_not_delay_another_tenants_alerts() -> None:
    """Tenant ``slow`` holds at most 2 of the 4 delivery places; its third and fourth
    alerts wait in its backlog (1 place) or are given up (backlog full); tenant ``acme``'s
    alerts are delivered meanwhile, and the commit never passes an unsettled record."""
    from gnomon.alerts.service import Alerter

    topic = load_topology().runs
    states = [replace(run(RunStatus.FAILED, run_id=f"slow_{i}@f"), tenant="slow", job_id=f"slow_{i}")
              for i in range(4)]
    states += [run(RunStatus.FAILED, run_id=f"job_{i}@f") for i in range(3)]  # tenant acme
    spy = SpyLog()
    book = AlertBook()
    book.apply("acme", CFG)
    book.apply("slow", replace(CFG, tenant="slow"))
    sender = HangingSender()
    given_up: list[tuple[str, str]] = []
    alerter = Alerter(book, sender, DeliveryPolicy(attempts_max=1, in_flight_max=4, tenant_in_flight_max=2,
                                                   tenant_backlog_max=1),
                      log=spy, clock=FakeClock(NOW), on_given_up=lambda a, why: given_up.append((a.key, why)))
    started(alerter)
    for s in states:
        spy.append(topic, s.run_id, codec.encode(s, topic))
    alerter.run_once()
    acme = {f"job_{i}@f:dead_letter:0" for i in range(3)}
    deadline = time.monotonic() + 10
    while not acme <= set(sender.calls) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert acme <= set(sender.calls), sender.calls  # delivered while slow's webhook hangs
    slow_calls = [k for k in sender.calls if k.startswith("slow_")]
    assert slow_calls == ["slow_0@f:dead_letter:0", "slow_1@f:dead_letter:0"]  # its 2 places, no more
    assert [k for k, _ in given_up] == ["slow_3@f:dead_letter:0"]  # the backlog (1) was full
    assert "tenant slow" in given_up[0][1]
    alerter.commit()
    assert all(c[(topic, 0)] == 0 for c in spy.commits)  # slow_0 is still in delivery
    sender.release.set()
    assert alerter.wait_idle(10)
    assert "slow_2@f:dead_letter:0" in sender.calls  # the waiting one went when a place freed
    alerter.commit()
    assert spy.commits[-1] == {(topic, 0): 7}
    s = alerter.stats
    assert (s.delivered, s.given_up, s.backlog_full) == (6, 1, 1)
    alerter.close()


def test_delivery_policy_refuses_a_tenant_cap_below_one() -> None:
    with pytest.raises(ValueError, match="tenant_in_flight_max"):
        DeliveryPolicy(tenant_in_flight_max=0)
