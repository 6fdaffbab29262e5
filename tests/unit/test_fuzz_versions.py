"""Records of every registered schema version, with random values (issue 21, point 2: "the
same holds for ... registry-decoded records of any compatible version").

A producer may write any version of a subject that the registry still serves (its Avro
deserializer reads them all: docs/job-events.md). fastavro generates random records of
each version of every subject the processor reads (job commands, run events, worker
adverts, tenant limits): random strings, numbers and union branches, so most carry
values no sender of gnomon's would write. Each is framed with its version's schema id
and appended to its topic in the simulation, while a good per-second job runs. Then the
processor has not stopped, every job-commands record got exactly one answer or went to
poison, a good command sent after them is accepted, no poison record says a value
reached a bug, and every slot of the good job started on time.
"""

from __future__ import annotations

import io
import logging
import random
from collections import Counter

import pytest
from fastavro import schemaless_writer
from fastavro.utils import generate_many

from gnomon import codec
from gnomon.adapters.kafka import partition_for
from gnomon.codec.registry import SchemaVersion, load_registry
from gnomon.core import jobs as J
from gnomon.core.errors import GnomonError
from gnomon.core.messages import PoisonRecord
from gnomon.core.model import JobSpec, Schedule, Target, TargetType
from gnomon.core.replies import CommandResult, ResultCode
from gnomon.sim import HANDLER, TENANT, SimCluster

PARTITIONS = 4
RECORDS_PER_VERSION = 150
GOOD = JobSpec(name="good", schedule=Schedule(cron="* * * * * *"), target=Target(TargetType.HANDLER, handler=HANDLER))
GNOMON_ERRORS = {cls.__name__ for cls in (GnomonError, *GnomonError.__subclasses__())} | {
    sub.__name__ for cls in GnomonError.__subclasses__() for sub in cls.__subclasses__()}


def _versions(topic_role: str) -> list[SchemaVersion]:
    from gnomon.topology import load_topology

    subject = f"{getattr(load_topology(), topic_role)}-value"
    return [v for v in load_registry() if v.subject == subject]


def _iso(ms: int) -> str:
    from gnomon.core.clock import ms_to_iso

    return ms_to_iso(ms)


def _framed(version: SchemaVersion, record: object) -> bytes:
    out = io.BytesIO()
    out.write(b"\x00" + version.id.to_bytes(4, "big"))
    schemaless_writer(out, version.schema, record)
    return out.getvalue()


def _steer(record: object, now_ms: int, rng: random.Random) -> bytes:
    """Steer some fields where checks would stop a purely random record at the door (so
    the rest reaches the state machine): most instants near now, some ids and tenants
    those of real jobs and runs. The key: the record's job id when it has one (so it lands
    where its job would), else a random one."""
    body = record.get("body", record) if isinstance(record, dict) else None
    if isinstance(body, dict):
        for field in ("at_ms", "slot_ms", "not_before_ms", "started_at_ms"):
            if isinstance(body.get(field), int) and rng.random() < 0.8:
                body[field] = now_ms + rng.randint(-60_000, 60_000)
        # (the good tenant's own commands, and reports under its real workers, are not
        # hostile: they may pause its job. So the good job is only named by another tenant.)
        if "tenant" in body and rng.random() < 0.5:
            body["tenant"] = "victim"
        if "job_id" in body and rng.random() < 0.5:
            body["job_id"] = "good" if body.get("tenant") == "victim" and rng.random() < 0.3 else "victim"
        if "run_id" in body and rng.random() < 0.5:
            body["run_id"] = f"victim@{_iso(now_ms - now_ms % 1000 + rng.randint(-5, 5) * 1000)}"
        if "spec" in body and isinstance(body["spec"], dict) and rng.random() < 0.5:
            body["spec"]["schedule"] = {"cron": rng.choice(["* * * * * *", "*/3 * * * * *", "0 * * * *"]),
                                        "tz": "UTC", "run_at_ms": None}
            body["spec"]["pool"] = "default"
        for field in ("job_id", "run_id", "worker_id", "tenant"):
            if isinstance(body.get(field), str):
                return str(body[field]).partition("@")[0].encode()
    return b"k%d" % rng.randrange(1000)


@pytest.mark.parametrize("role", ["job_commands", "run_events", "workers", "tenants"])
def test_random_records_of_every_schema_version_stop_nothing(role: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.CRITICAL)  # thousands of refusals are logged at WARNING
    rng = random.Random(f"versions/{role}")
    random.seed(f"versions/{role}")  # fastavro's generator draws from the random module
    c = SimCluster(seed=7, processors=1, workers=1, partitions=PARTITIONS)
    c.submit(J.RegisterJob("good", TENANT, GOOD, c.clock.now_ms()))
    c.submit(J.RegisterJob("victim", "victim", GOOD, c.clock.now_ms()))
    c.run_for(3_000, faults=False)
    start_ms = c.clock.now_ms()
    topic = getattr(c.topo, role)
    sent: list[tuple[int, int]] = []
    versions = _versions(role)
    assert versions, role
    for version in versions:
        for record in generate_many(version.schema, RECORDS_PER_VERSION):
            key = _steer(record, c.clock.now_ms(), rng)
            p = partition_for(key.decode(errors="replace"), PARTITIONS)
            offset = c.log.append(topic, key, _framed(version, record), p)
            sent.append((p, offset if isinstance(offset, int) else -1))
        c.run_for(500, faults=False)
    probe_at = c.clock.now_ms()
    c.submit(J.RegisterJob("probe", TENANT, GOOD, probe_at))
    c.run_for(5_000, faults=False)

    poison = [codec.decode(r.value or b"", topic=c.topo.poison) for r in c.log.records(c.topo.poison)]
    bugs = [p.reason for p in poison if isinstance(p, PoisonRecord)
            and (p.offset < 0 or p.reason.partition(":")[0] not in GNOMON_ERRORS)
            and not p.reason.startswith(("DecodeError", "the processor stopped"))]
    assert not bugs, bugs[:5]
    answers: Counter[tuple[int, int]] = Counter()
    results = [codec.decode(r.value or b"", topic=c.topo.command_results)
               for r in c.log.records(c.topo.command_results)]
    for res in results:
        assert isinstance(res, CommandResult)
        answers[(res.source_partition, res.source_offset)] += 1
    if role == "job_commands":
        poisoned = Counter((p.partition, p.offset) for p in poison if p.source_topic == topic)
        for p, offset in sent:
            assert answers[(p, offset)] + poisoned[(p, offset)] == 1, (p, offset, answers[(p, offset)])
    probe = [r for r in results if r.job_id == "probe"]
    assert [r.code for r in probe] == [ResultCode.ACCEPTED], probe
    final = {s.run_id: s for s in c.ledger()}
    good = [s for s in final.values() if s.job_id == "good" and start_ms <= s.slot_ms <= c.clock.now_ms() - 2_000]
    assert len(good) >= (c.clock.now_ms() - 2_000 - start_ms) // 1000 - 1
    late = [s.run_id for s in good if s.started_at_ms is None or s.started_at_ms - s.not_before_ms > 500]
    assert not late, late[:5]
    assert c.processor("p0").transactions > 0 and len(sent) == len(versions) * RECORDS_PER_VERSION
