"""Job commands produced straight to Kafka, from a team's own service: the producer side
of the job-event contract (docs/job-events.md).

    from gnomon.events import JobEvents

    with JobEvents(tenant="acme") as events:          # GNOMON_KAFKA_BOOTSTRAP, role "producer",
                                                      # $GNOMON_COMMAND_KEY_FILE signs
        job_id = events.register({"name": "nightly close", "schedule": "0 2 * * *",
                                  "timezone": "Europe/Paris",
                                  "target": {"type": "handler", "name": "close"}},
                                 idempotency_key="billing-close")
        events.pause(job_id)
    # leaving the block waits until Kafka acknowledged every command (acks=all)

Every command is validated here with the rules the REST API uses (``parse_job_spec``,
``apply_patch``), so a bad definition fails at once with a ``ValidationError`` naming
the field, and nothing is sent. Commands are produced asynchronously and batched (one
idempotent producer, acks=all, lz4): ``flush()`` waits for the broker's acknowledgement
and raises ``EventLogError`` if any command could not be written. Ordering holds per
job: every command of a job is keyed by its job id, so they land on one partition in
the order they were sent.

What the processor does with a command is decided there: admission (the tenant's
limits), version checks and the state machine apply exactly as to the API's commands.
It answers every command on the command-results topic (``gnomon.core.replies``), which
holds every tenant's answers, so a team's credential cannot read it: a team's service
reads its own answers through the REST API (``GET /v1/commands/{partition}-{offset}``,
with the tenant's API token). With ``replies=True``, ``results()`` waits for them:

    with JobEvents(tenant="acme", replies=True, answers_url="https://gnomon.example",
                   api_token=token) as events:
        events.register(spec, idempotency_key="k")
        for result in events.results():        # in the order the commands were sent
            if not result.accepted:
                print(result.code, result.field, result.reason)
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import httpx

from gnomon import codec
from gnomon.core import jobs as J
from gnomon.core.clock import Clock, SystemClock
from gnomon.core.command_auth import OPERATOR, CommandKey, sign
from gnomon.core.command_checks import JOB_ID_MAX_CHARS as JOB_ID_MAX_CHARS
from gnomon.core.command_checks import check_job_id
from gnomon.core.errors import EventLogError, GnomonError, ValidationError
from gnomon.core.model import JobSpec, idempotent_job_id, is_derived_job_id, random_job_id
from gnomon.core.replies import CommandResult, ResultCode
from gnomon.core.validation import (
    DEFAULT_POOLS,
    check_patch,
    parse_job_spec,
    reject_control_chars,
    validate_idempotency_key,
)
from gnomon.eventlog.port import EventLog, Producer, Reader
from gnomon.topology import Topology, load_topology

# a team's service: writes signed job commands, reads their answers, nothing else (docs/adr/0006,
# decision 4); the API's own principal ("api") also writes configuration and is not handed out
KAFKA_ROLE_DEFAULT = "producer"
FLUSH_TIMEOUT_S = 30.0
ERRORS_KEPT_MAX = 100  # delivery errors remembered until the next flush (the count is exact)
RESULTS_GROUP = "gnomon-events"  # a group id librdkafka needs; nothing is committed (assigned partitions)
CLIENT_ID = "gnomon-events"


RESULTS_TIMEOUT_S = 60.0
ANSWER_POLL_S = 0.1  # between rounds of GET /v1/commands/{id} for the answers still pending
API_TIMEOUT_S = 10.0
_FAILED = ("", -1, -1)  # a command Kafka did not write (its slot in the send order)


@dataclass
class Deliveries:
    """What the broker said about the commands sent since the last flush."""

    sent: int = 0
    acknowledged: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)


class JobEvents:
    """Produce job commands for one tenant. Not thread-safe: one per thread, or a lock."""

    def __init__(self, tenant: str, bootstrap: str | None = None, *, role: str | None = KAFKA_ROLE_DEFAULT,
                 log: EventLog | None = None, topology: Topology | None = None, clock: Clock | None = None,
                 pools: frozenset[str] | None = None, linger_ms: int = 20, replies: bool = False,
                 command_key: CommandKey | None = None, answers_url: str | None = None,
                 api_token: str | None = None) -> None:
        """``log``: where the commands go (default: Kafka at ``bootstrap``, else
        ``GNOMON_KAFKA_BOOTSTRAP``, as principal ``role``; the in-memory log in tests).
        ``command_key``: the tenant's key that signs every command (default: the file
        ``$GNOMON_COMMAND_KEY_FILE``, else the tenant's file in the local keys directory;
        ``gnomon.command_keys``). The processor refuses a command not signed by its tenant.
        ``answers_url``/``api_token``: with ``replies``, where the answers are read: the
        REST API, as the tenant (a team's service); without them, the answers topic itself
        (the API's own principal, operators' tools, the in-memory log)."""
        if not isinstance(tenant, str) or not tenant.strip():
            raise ValidationError("tenant", "must be a non-empty string")
        reject_control_chars(tenant, "tenant")
        self.tenant = tenant
        if command_key is None:
            from gnomon.command_keys import key_for_producer
            from gnomon.config import load

            command_key = key_for_producer(load(), tenant)
        if command_key.tenant not in (tenant, OPERATOR):
            raise ValidationError("command_key", f"the key {command_key.key_id!r} is tenant "
                                                 f"{command_key.tenant!r}'s, not {tenant!r}'s")
        self.command_key = command_key
        self.topo = topology or load_topology()
        self.clock = clock or SystemClock()
        self.pools = pools if pools is not None else frozenset(self.topo.pools) or DEFAULT_POOLS
        if replies and answers_url is not None and not api_token:
            raise ValidationError("api_token", "reading answers through the API needs the tenant's API token")
        if replies and answers_url is None and log is None and role == KAFKA_ROLE_DEFAULT:
            raise ValidationError("answers_url", "a team's producer reads its answers through the API: give "
                                  "answers_url (the API's URL) and api_token (the tenant's token); its Kafka "
                                  "credential cannot read the answers topic, which holds every tenant's")
        if log is None:
            from gnomon.config import load
            from gnomon.eventlog.kafka import KafkaEventLog

            log = KafkaEventLog(bootstrap or load().kafka_bootstrap, role=role)
        self._producer: Producer = log.producer(client_id=CLIENT_ID, config={
            "linger.ms": linger_ms, "batch.num.messages": 10_000})
        self.deliveries = Deliveries()
        # replies: where each command landed (partition, offset), in the order sent, and
        # a reader of the results topic positioned at its end before the first send
        self._replies = replies
        self._sent: list[tuple[str, int, int] | None] = []  # (job id, partition, offset); None: not acked yet
        self._waiting: list[tuple[str, int, int]] = []  # written, answer not returned yet (send order)
        self._early: dict[tuple[int, int], CommandResult] = {}  # answers found before a results() timed out
        self._consumer: Reader | None = None
        self._started_at: dict[int, int] = {}  # results partition -> where reading began
        self._api: httpx.Client | None = None
        if replies and answers_url is not None:
            self._api = httpx.Client(base_url=answers_url.rstrip("/"), timeout=API_TIMEOUT_S,
                                     headers={"Authorization": f"Bearer {api_token}"})
        elif replies:
            self._consumer = log.reader(RESULTS_GROUP, client_id=CLIENT_ID, config={
                "enable.partition.eof": False, "fetch.wait.max.ms": 50})
            self._start_reading()

    # ---- commands --------------------------------------------------------------------

    def register(self, spec: Mapping[str, Any] | JobSpec, *, job_id: str | None = None,
                 idempotency_key: str | None = None) -> str:
        """Register a job (the REST API's JSON shape, or a ``JobSpec``); returns its id.
        With ``idempotency_key`` the id is derived from the tenant and the key, as
        ``POST /v1/jobs`` with ``Idempotency-Key`` does, so a retry registers nothing new."""
        now = self.clock.now_ms()
        if job_id is not None and idempotency_key is not None:
            raise ValidationError("job_id", "give a job id or an idempotency key, not both")
        if idempotency_key is not None:
            job_id = idempotent_job_id(self.tenant, validate_idempotency_key(idempotency_key))
        elif job_id is not None and is_derived_job_id(job_id):
            raise ValidationError("job_id", "ids of the form job_<16 hex digits> are derived from an idempotency "
                                            "key: pass idempotency_key instead, or choose another id")
        job_id = self._job_id(job_id if job_id is not None else random_job_id())
        parsed = spec if isinstance(spec, JobSpec) else parse_job_spec(spec, now, pools=self.pools)
        self._send(J.RegisterJob(job_id, self.tenant, parsed, now, idempotency_key=idempotency_key))
        return job_id

    def patch(self, job_id: str, changes: Mapping[str, Any], *, expected_version: int | None = None) -> None:
        """Change some fields (the REST PATCH body); the processor merges them into the
        job's current definition and, with ``expected_version``, refuses a stale edit."""
        if not isinstance(changes, Mapping) or not changes:
            raise ValidationError("patch", "must be a non-empty JSON object")
        # validated against a template spec for the field names and values; the merge
        # itself happens in the processor on the job's current definition
        check_patch(dict(changes), self.clock.now_ms(), pools=self.pools)
        if expected_version is not None and (not isinstance(expected_version, int) or expected_version < 1):
            raise ValidationError("expected_version", "must be a version number (1 or more)")
        self._send(J.PatchJob(self._job_id(job_id), self.tenant, J.canonical_patch(dict(changes)),
                              expected_version, self.clock.now_ms()))

    def pause(self, job_id: str) -> None:
        self._send(J.PauseJob(self._job_id(job_id), self.tenant, self.clock.now_ms()))

    def resume(self, job_id: str) -> None:
        self._send(J.ResumeJob(self._job_id(job_id), self.tenant, self.clock.now_ms()))

    def delete(self, job_id: str) -> None:
        self._send(J.DeleteJob(self._job_id(job_id), self.tenant, self.clock.now_ms()))

    def trigger(self, job_id: str, idempotency_key: str) -> str:
        """Run a job now; returns the run id (``{job_id}@manual:{key}``): the same key
        again is the same run."""
        from gnomon.core.model import manual_run_id

        key = validate_idempotency_key(idempotency_key)
        job_id = self._job_id(job_id)
        self._send(J.TriggerJob(job_id, self.tenant, key, self.clock.now_ms()))
        return manual_run_id(job_id, key)

    # ---- delivery --------------------------------------------------------------------

    def flush(self, timeout_s: float = FLUSH_TIMEOUT_S) -> Deliveries:
        """Wait until Kafka acknowledged every command sent so far. Raises
        ``EventLogError`` naming how many were not written (and the first reasons)."""
        left = self._producer.flush(timeout_s)
        done, self.deliveries = self.deliveries, Deliveries()
        if left:
            raise EventLogError(f"{left} of {done.sent} job commands not acknowledged by Kafka within {timeout_s}s")
        if done.failed:
            raise EventLogError(f"{done.failed} of {done.sent} job commands not written: {'; '.join(done.errors[:3])}")
        return done

    def results(self, timeout_s: float = RESULTS_TIMEOUT_S) -> list[CommandResult]:
        """The processor's answers to every command sent (and written) since the last
        call that returned, in the order they were sent; flushes first. Raises
        ``EventLogError`` if some did not come within ``timeout_s`` (a processor down or
        behind: the commands are safe in Kafka and will be applied): call it again to
        keep waiting for the same answers. A command Kafka refused has no answer (the
        flush raised for it)."""
        if self._consumer is None and self._api is None:
            raise ValidationError("replies", "this JobEvents was made without replies=True")
        deadline = time.monotonic() + timeout_s
        self.flush(timeout_s)
        sent, self._sent = self._sent, []
        self._waiting += [e for e in sent if e is not None and e is not _FAILED]
        wanted = {(p, o): i for i, (_, p, o) in enumerate(self._waiting)}  # position -> index in send order
        if self._api is not None:
            return self._results_from_api(wanted, deadline, timeout_s)
        assert self._consumer is not None
        if wanted:
            self._read_up_to(max(p for p, _ in wanted))
        found = self._found_early(wanted)
        while len(found) < len(wanted):
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._gave_up(wanted, found, timeout_s)
            for rec in self._consumer.consume(1000, min(0.2, left)):
                try:
                    res = codec.decode(rec.value or b"", self.topo.command_results)
                except GnomonError:
                    continue  # not ours to judge; the topic's other readers see it too
                if isinstance(res, CommandResult) and (key := (res.source_partition, res.source_offset)) in wanted:
                    found[wanted[key]] = res
        self._waiting = []
        return [found[i] for i in sorted(found)]

    def _results_from_api(self, wanted: dict[tuple[int, int], int], deadline: float,
                          timeout_s: float) -> list[CommandResult]:
        """``results()`` through ``GET /v1/commands/{partition}-{offset}``: each answer
        once the API has read it (another tenant's command stays pending there)."""
        assert self._api is not None
        found = self._found_early(wanted)
        while True:
            for (partition, offset), i in wanted.items():
                if i not in found and (res := self._answer_of(partition, offset)) is not None:
                    found[i] = res
            if len(found) == len(wanted):
                break
            if time.monotonic() >= deadline:
                raise self._gave_up(wanted, found, timeout_s)
            time.sleep(ANSWER_POLL_S)
        self._waiting = []
        return [found[i] for i in sorted(found)]

    def _found_early(self, wanted: dict[tuple[int, int], int]) -> dict[int, CommandResult]:
        """The answers a results() that timed out had found already (index in send order)."""
        return {wanted[key]: self._early.pop(key) for key in [k for k in self._early if k in wanted]}

    def _gave_up(self, wanted: dict[tuple[int, int], int], found: dict[int, CommandResult],
                 timeout_s: float) -> EventLogError:
        """Keep what was found for the next call, which waits for the rest; the error to raise."""
        for key, i in wanted.items():
            if i in found:
                self._early[key] = found[i]
        return EventLogError(f"{len(wanted) - len(found)} of {len(wanted)} command results did not arrive within "
                             f"{timeout_s}s (is a processor running?); call results() again to keep waiting")

    def _answer_of(self, partition: int, offset: int) -> CommandResult | None:
        assert self._api is not None
        try:
            resp = self._api.get(f"/v1/commands/{partition}-{offset}")
        except httpx.HTTPError as exc:
            raise EventLogError(f"cannot read the answer to command {partition}-{offset} from the API: {exc}") \
                from exc
        if resp.status_code != 200:
            raise EventLogError(f"the API answered {resp.status_code} for command {partition}-{offset}: "
                                f"{resp.text[:200]}")
        body = resp.json()
        if body.get("status") == "pending":
            return None
        return CommandResult(job_id=body["jobId"], tenant=self.tenant, command=body["command"],
                             source_partition=partition, source_offset=offset, code=ResultCode(body["code"]),
                             at_ms=0, field=body.get("field"), reason=body.get("reason"), limit=body.get("limit"),
                             retry_after_s=body.get("retryAfterS"), job_version=body.get("version"))

    def close(self, timeout_s: float = FLUSH_TIMEOUT_S) -> None:
        try:
            self.flush(timeout_s)
        finally:
            if self._consumer is not None:
                self._consumer.close()
                self._consumer = None
            if self._api is not None:
                self._api.close()
                self._api = None

    def __enter__(self) -> JobEvents:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is None:
            self.close()
        else:  # the caller's error first; deliveries are still attempted
            try:
                self._producer.flush(FLUSH_TIMEOUT_S)
            finally:
                if self._consumer is not None:
                    self._consumer.close()
                    self._consumer = None
                if self._api is not None:
                    self._api.close()
                    self._api = None

    def _job_id(self, job_id: str) -> str:
        return check_job_id(job_id)  # the processor's own rule (core.command_checks)

    def _send(self, cmd: J.JobCommand) -> None:
        value = codec.encode(cmd, self.topo.job_commands)
        d = self.deliveries
        slot = len(self._sent)
        if self._replies:
            self._sent.append(None)
        sent = self._sent

        def on_delivery(err: str | None, partition: int, offset: int) -> None:
            if err is None:
                d.acknowledged += 1
                if self._replies:
                    sent[slot] = (cmd.job_id, partition, offset)
                return
            d.failed += 1
            if self._replies:
                sent[slot] = _FAILED  # not written: no answer will come
            if len(d.errors) < ERRORS_KEPT_MAX:
                d.errors.append(f"{cmd.job_id}: {err}")

        try:  # (waits while the local queue is full)
            key = cmd.job_id.encode()
            self._producer.produce(self.topo.job_commands, key, value, on_delivery=on_delivery,
                                   headers=sign(self.command_key, self.topo.job_commands, key, value))
        except EventLogError as exc:  # e.g. a record too large: nothing was queued
            if self._replies:
                sent[slot] = _FAILED
            raise EventLogError(f"could not send {type(cmd).__name__} for {cmd.job_id}: {exc}") from exc
        d.sent += 1
        self._producer.poll(0)

    def _start_reading(self) -> None:
        """Read every partition of the results topic from its current end: answers to
        commands sent from now on come after it."""
        assert self._consumer is not None
        topic = self.topo.command_results
        count = max(self.topo.partitions, len(self._consumer.partitions(topic, 10.0)))  # grown: docs/adr/0012
        positions = [(topic, p, self._consumer.watermarks((topic, p), 10.0)[1]) for p in range(count)]
        self._consumer.assign(positions)
        self._started_at = {p: off for _, p, off in positions}

    def _read_up_to(self, partition: int) -> None:
        """A command went to a partition added by a grow since reading began: read the new
        partitions from their start, the others on from where they are."""
        assert self._consumer is not None
        topic = self.topo.command_results
        if partition < len(self._started_at):
            return
        count = max(partition + 1, len(self._consumer.partitions(topic, 10.0)))
        at = self._consumer.position([(topic, p) for p in range(len(self._started_at))])
        positions = [(topic, p, off if off >= 0 else self._started_at[p]) for (_, p), off in at.items()]
        positions += [(topic, p, 0) for p in range(len(self._started_at), count)]
        self._consumer.assign(positions)
        self._started_at.update({p: 0 for p in range(len(self._started_at), count)})
