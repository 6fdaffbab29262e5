"""Hypothesis strategies for the decider's fuzz suite (issue 21, part 3): records that the
real codec encodes (so they reach the processor through its real decode path) with
hostile values in them, for every job command, every run-events message, tenant limits
and worker adverts, and raw bytes that do not decode at all.

Each strategy draws a ``Hostile``: the bytes to append to a topic (key, value, the
partition they land on) and the object they encode (None for raw bytes). The values
aim at what the processor must survive: cron fields and zones that do not parse or
never fire, instants far in the past or future (``at_ms`` is a command's "now"),
numbers at and past every bound (Avro ``long`` is the only limit), empty, very long,
control and bidi strings, unknown pools and targets, other tenants, stale and huge
fencing tokens, unknown and misrouted run ids, outputs past the 16 KiB cap.

What they never draw, so that the good jobs of the scenario (``GOOD_TENANT``) can be
held to running on time: a command of the good tenant (an accepted pause of a good job
is no fault of the processor), a message from a real worker's id (a forged completion
with the current token is indistinguishable from the real one), a claim of a good run,
a forged trigger or skip of a good job's slot, tenant limits for the good tenant or the
defaults, an advert that offers room to the good tenant. Those are the system's trust
boundary (ACLs on the topics), not the decider's input validation.
"""

from __future__ import annotations

import functools
import json
import reprlib
from collections.abc import Callable
from dataclasses import dataclass, fields, is_dataclass, replace
from io import BytesIO
from typing import Any

from fastavro import parse_schema, schemaless_writer
from hypothesis import reject
from hypothesis import strategies as st

from gnomon import codec
from gnomon.adapters.kafka import partition_for
from gnomon.core import jobs as J
from gnomon.core import runs as R
from gnomon.core.clock import FakeClock
from gnomon.core.jobs import JobState, JobStatus
from gnomon.core.messages import Grant, LeaseAck, Stop, StopReason
from gnomon.core.model import (
    CatchUp,
    JobSpec,
    OverlapPolicy,
    Priority,
    RetryPolicy,
    Schedule,
    Target,
    TargetType,
    manual_run_id,
    slot_run_id,
)
from gnomon.core.replies import CommandResult, ResultCode
from gnomon.core.workers import WorkerAdvert
from gnomon.sim import HANDLER, TENANT
from gnomon.topology import load_topology

PARTITIONS = 4
TOPO = replace(load_topology(), partitions=PARTITIONS)
T0 = FakeClock().now_ms()  # where every SimCluster's clock starts
SECOND = 1_000
DAY = 86_400_000
LONG_MIN, LONG_MAX = -(2**63), 2**63 - 1  # Avro long
DATETIME_MAX_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z, the last instant datetime holds
DATETIME_MIN_MS = -62_135_596_800_000  # 0001-01-01T00:00:00Z

GOOD_TENANT = TENANT
VICTIM_TENANT = "victim"
GOOD_JOBS = ("good-a", "good-b", "good-c")  # per-second jobs of GOOD_TENANT, held to run on time
PROBE_PREFIX = "probe-"  # the good commands sent after hostile records (never drawn here)
GHOSTS = ("ghost-1", "ghost-2", "")  # worker ids that are not a running worker
REAL_WORKER_PREFIX = "w"  # the sim's workers are w<index>.<generation>
MANUAL_KEYS = ("k0", "k1")


def _victims() -> dict[int, str]:
    """One job of VICTIM_TENANT per partition: the hostile commands' playground."""
    out: dict[int, str] = {}
    n = 0
    while len(out) < PARTITIONS:
        job_id = f"victim-{n}"
        out.setdefault(partition_for(job_id, PARTITIONS), job_id)
        n += 1
    return out


VICTIMS = _victims()
VICTIM_JOBS = tuple(VICTIMS[p] for p in sorted(VICTIMS))
HANDLER_TARGET = Target(TargetType.HANDLER, handler=HANDLER)


def victim_spec(i: int) -> JobSpec:
    """The victims' own (valid) definitions: per second, every minute in a zone with
    catch-up all and an overlap policy, a one-time job, a daily one."""
    schedules = [Schedule(cron="* * * * * *"), Schedule(cron="*/5 * * * *", tz="Europe/Zurich"),
                 Schedule(run_at_ms=T0 + 3_600_000), Schedule(cron="0 3 * * *", tz="America/St_Johns")]
    return JobSpec(name=f"victim {i}", schedule=schedules[i % len(schedules)], target=HANDLER_TARGET,
                   catch_up=[CatchUp.ONCE, CatchUp.ALL, CatchUp.SKIP, CatchUp.ONCE][i % 4],
                   overlap=[OverlapPolicy.ALLOW, OverlapPolicy.FORBID, OverlapPolicy.ALLOW,
                            OverlapPolicy.BUFFER_ONE][i % 4],
                   retry=RetryPolicy(max_attempts=2, backoff_base_s=0.5, backoff_cap_s=1.0))


# ---- the record ---------------------------------------------------------------------------

_short = reprlib.Repr()
_short.maxstring = 120
_short.maxother = 200
_short.maxlong = 60


def _brief(value: Any) -> str:
    if is_dataclass(value) and not isinstance(value, type):
        inner = ", ".join(f"{f.name}={_brief(getattr(value, f.name))}" for f in fields(value))
        return f"{type(value).__name__}({inner})"
    if isinstance(value, tuple) and len(value) > 6:
        return f"({', '.join(_brief(v) for v in value[:6])}, ... {len(value)} items)"
    if isinstance(value, tuple):
        return f"({', '.join(_brief(v) for v in value)}{',' if len(value) == 1 else ''})"
    if isinstance(value, str | bytes):
        text = _short.repr(value)
        return text if len(value) <= 120 else f"{text}[{len(value)} chars]"
    return repr(value)


@dataclass(frozen=True)
class Hostile:
    """One record to append: ``value`` (and ``key``) on topic ``role`` of the topology, at
    ``partition``. ``obj`` is what it encodes (None: raw bytes that do not decode, or
    decode to something else than the topic carries). ``kind`` names the case."""

    kind: str
    role: str  # a Topology attribute: job_commands, run_events, tenants, workers
    key: bytes | None
    value: bytes | None
    partition: int
    obj: Any = None

    @property
    def topic(self) -> str:
        return str(getattr(TOPO, self.role))

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:  # hypothesis prints a failing example with this
        p.text(repr(self))

    def __repr__(self) -> str:
        what = _brief(self.obj) if self.obj is not None else _short.repr(self.value)
        size = "None" if self.value is None else f"{len(self.value)} bytes"
        return (f"Hostile({self.kind} on {self.role}[{self.partition}] key={_short.repr(self.key)} "
                f"value={size}: {what})")


def _job_id(obj: Any) -> str:
    return str(obj.job_id)


def _run_key(obj: Any) -> str:
    return job_of_run(str(obj.run_id))


def key_partition(key: str) -> int:
    return partition_for(key, PARTITIONS)


def job_of_run(run_id: str) -> str:
    """The key a worker writes a run's messages with (its job id): the partition of the run."""
    return run_id.partition("@")[0]


def _encoded(role: str, obj: Any) -> bytes | None:
    try:
        return codec.encode(obj, str(getattr(TOPO, role)))
    except codec.EncodeError:
        return None


def placed(objs: st.SearchStrategy[Any], role: str, key_of: Callable[[Any], str],
           kind: str | None = None) -> st.SearchStrategy[Hostile]:
    """Each object of ``objs`` encoded for topic ``role``, keyed ``key_of(obj)``, on its
    key's partition (mostly) or another one (a producer with its own partitioner), with a
    hostile key now and then. An object that does not fit the schema is not drawn (no
    producer can write it)."""
    @st.composite
    def one(draw: st.DrawFn) -> Hostile:
        obj = draw(objs)
        value = _encoded(role, obj)
        if value is None:
            reject()
        key = key_of(obj)
        raw_key = key.encode()
        partition = key_partition(key)
        how = draw(st.integers(0, 19))
        if how == 0 and role != "job_commands":  # (job commands: ``misrouted``)
            partition = draw(st.integers(0, PARTITIONS - 1))  # not where its key goes
        elif how == 1:
            raw_key = draw(st.sampled_from([b"", b"\xff\xfe\xfd", b"\x00", b"x" * 5000]))  # key and value disagree
        return Hostile(kind or type(obj).__name__, role, raw_key, value, partition, obj)

    return one()


# ---- values -------------------------------------------------------------------------------

_ALPHABET = st.characters(exclude_categories=["Cs"])  # UTF-8 encodable: every code point but surrogates
_NASTY = ["", " ", "\x00", "a\x00b", "\n", "\x1b[31m", "\u202e", "\u2028", "\ufeff", "\U0001f984", "é", "e\u0301",
          "*", "@", "a@b", "@manual:", "..", "/", "\\", "%s", "{}", "null", "NaN", "-1", "0", "default", "batch",
          "sim", "SIM", "sim ", " sim", "victim", "other", "*/", "\ud7ff", "\U0010ffff", "\x7f", "\x85"]


def long_strings() -> st.SearchStrategy[str]:
    return st.builds(lambda ch, n: ch * n, st.sampled_from(["a", "\u00e9", "\U0001f984", "\x00", "*", "9"]),
                     st.sampled_from([129, 201, 1025, 4097, 16_385]))


def texts() -> st.SearchStrategy[str]:
    """Empty, blank, control and bidi characters, very long, any Unicode (but surrogates,
    which UTF-8, hence Avro, cannot carry)."""
    return st.one_of(st.sampled_from(_NASTY), st.text(_ALPHABET, max_size=20), long_strings())


_INSTANTS = [0, -1, 1, 999, -1000, LONG_MIN, LONG_MAX, LONG_MIN + 1, LONG_MAX - 1, DATETIME_MAX_MS,
             DATETIME_MAX_MS + 1, DATETIME_MIN_MS, DATETIME_MIN_MS - 1, 2**31, -(2**31), 2**32, 2**53, -(2**53),
             10**13, 10**13 - 1, 10**14, -(10**13), 4_102_444_800_000, 32_503_680_000_000, 1_000_000_000]


def instants() -> st.SearchStrategy[int]:
    """Epoch ms around now (mostly), far in the past or future, at and past the edges of
    what datetime and the 13-digit index keys hold, and any Avro long."""
    near = st.integers(T0 - 10 * SECOND, T0 + 30 * SECOND)
    return st.one_of(
        near, near, near.map(lambda ms: ms - ms % SECOND),
        # at the edges of what the processor accepts as a command's time (a week back, 5 min ahead)
        st.sampled_from([T0 - 7 * DAY + 60 * SECOND, T0 - 6 * DAY, T0 - 3_600_000, T0 + 299 * SECOND]),
        st.sampled_from(_INSTANTS),
        st.integers(-400, 400).map(lambda d: T0 + d * DAY),
        st.integers(LONG_MIN, LONG_MAX),
    )


_NUMBERS = [0, -1, 1, 2, 3, 25, 26, 3600, 3601, 86_400, 7 * 86_400, 7 * 86_400 + 1, 2**31 - 1, 2**31, -(2**31), 2**32, 2**53 + 1, 10**15,
            LONG_MAX, LONG_MIN, LONG_MAX - 1, LONG_MIN + 1]


def longs() -> st.SearchStrategy[int]:
    return st.one_of(st.sampled_from(_NUMBERS), st.integers(-5, 100), st.integers(LONG_MIN, LONG_MAX))


def floats() -> st.SearchStrategy[float]:
    return st.one_of(st.sampled_from([0.0, -0.0, 0.5, 1.0, -1.0, 86_400.0, 86_401.0, 1e308, -1e308, 5e-324]),
                     st.floats(allow_nan=True, allow_infinity=True))


_CRONS = [
    "61 * * * *", "* 24 * * *", "* * 32 * *", "* * * 13 *", "* * * * 8", "60 * * * * *", "*/0 * * * *",
    "1-0 * * * *", "5-1 * * * *", "*/99999999999999999999 * * * *", "99999999999999999999 * * * *", "-1 * * * *",
    "0 0 31 2 *", "0 0 30 2 *", "0 0 29 2 *", "0 0 31 4 *", "0 0 * * 1#6", "0 0 * * 1#5", "0 0 L * *",
    "0 0 LW * *", "0 0 15W * *", "0 0 * * 5L", "* * * * * * *", "* * * *", "*", "", " ", "\t* * * * *",
    "@reboot", "@yearly", "@HOURLY", "@", "@every 5s", "* * * * * *", "*/2 * * * * *", "0 * * * *",
    "0 0 1 1 *", "0 2 * 3 0", "30 2 * * *", "? * * * *", "* * ? * *", "a b c d e", "JAN * * * *",
    "* * * JAN-DEC MON-SUN", "* * * jan mon", "\u0663 * * * *", "\uff11 * * * *", "1,2,3,,4 * * * *",
    "0-59/61 * * * *", ",", "*/1 */1 */1 */1 */1", "0 0 0 * * *", "* * * * * 7", "* * * * 0-7",
    "0\x00 * * * *", "* * * * *\n* * * * *", "0 0 1 1 * 2099",
]
_CRON_ATOMS = ["*", "0", "59", "60", "61", "-1", "*/0", "*/7", "1-5", "5-1", "L", "W", "#", "?", "1,2", ",", "",
               "99999999999999999999", "JAN", "MON", "1#6", "L-3", "15W", "*/1"]


def crons() -> st.SearchStrategy[str]:
    fields5 = st.lists(st.sampled_from(_CRON_ATOMS), min_size=4, max_size=7).map(" ".join)
    return st.one_of(st.sampled_from(_CRONS), fields5, texts())


_ZONES = ["UTC", "Europe/Zurich", "America/St_Johns", "Asia/Kathmandu", "Pacific/Chatham", "Etc/GMT+14",
          "Etc/GMT-14", "Australia/Lord_Howe", "America/Santiago", "", "utc", "Mars/Phobos", "Europe/Zürich",
          "../../etc/passwd", "/etc/localtime", "Europe/../UTC", "posixrules", "right/UTC", "Factory", "EST5EDT",
          "UTC\x00", " UTC", "America/Argentina/ComodRivadavia", "localtime", "Etc/GMT+15", "GMT0", "W-SU",
          "\u202eUTC"]


def zones() -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(_ZONES), texts())


def schedules() -> st.SearchStrategy[Schedule]:
    return st.one_of(
        st.builds(Schedule, cron=crons(), tz=zones(), run_at_ms=st.none()),
        st.builds(Schedule, cron=st.none(), tz=zones(), run_at_ms=instants()),
        st.builds(Schedule, cron=st.none(), tz=zones(), run_at_ms=st.none()),  # neither
        st.builds(Schedule, cron=crons(), tz=zones(), run_at_ms=instants()),  # both
    )


def targets() -> st.SearchStrategy[Target]:
    opt = st.one_of(st.none(), texts())
    return st.one_of(
        st.just(HANDLER_TARGET),
        st.builds(Target, type=st.sampled_from(TargetType), handler=opt, url=st.one_of(
            opt, st.sampled_from(["http://169.254.169.254/latest", "file:///etc/passwd", "http://", "https://x"])),
            argv=st.lists(texts(), max_size=4).map(tuple), image=opt),
        st.builds(Target, type=st.just(TargetType.COMMAND),
                  argv=st.integers(0, 3000).map(lambda n: ("x",) * n)),
    )


def payloads() -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from(["null", "{}", "", "{", "NaN", "Infinity", "1e999", '{"a":1,"a":2}', '"\\ud800"', "[]",
                         '{"fail_attempts": 99}', "\x00"]),
        st.sampled_from([900, 1001, 20_000]).map(lambda n: "[" * n + "]" * n),  # past json's recursion limit
        texts(),
    )


_VALID_SPEC = JobSpec(name="fuzz", schedule=Schedule(cron="0 * * * *"), target=HANDLER_TARGET)


def few_hostile(cls: type, valid: dict[str, st.SearchStrategy[Any]], hostile: dict[str, st.SearchStrategy[Any]],
                max_bad: int = 2) -> st.SearchStrategy[Any]:
    """``cls`` built from values the API accepts but for at most ``max_bad`` fields, which
    are hostile: a record gets past all checks but one or two, so each check, and what
    lies behind it, is reached (and a failure names its field)."""
    names = sorted(hostile)

    @st.composite
    def build(draw: st.DrawFn) -> Any:
        bad = draw(st.sets(st.sampled_from(names), max_size=max_bad))
        return cls(**{k: draw(hostile[k] if k in bad else v) for k, v in valid.items()})

    return build()


_GOOD_SCHEDULES = [Schedule(cron="0 * * * *"), Schedule(cron="*/5 * * * * *"), Schedule(cron="* * * * * *"),
                   Schedule(cron="0 0 29 2 *", tz="Pacific/Chatham"), Schedule(cron="30 2 * 3 0", tz="Europe/Zurich"),
                   Schedule(run_at_ms=T0 + 60 * SECOND), Schedule(run_at_ms=T0 + 400 * DAY, tz="Asia/Kathmandu")]


def specs() -> st.SearchStrategy[JobSpec]:
    """Specs the API accepts, but for one or two hostile fields."""
    valid: dict[str, st.SearchStrategy[Any]] = {
        "name": st.sampled_from(["fuzz", "\u00e9" * 200]), "schedule": st.sampled_from(_GOOD_SCHEDULES),
        "target": st.sampled_from([HANDLER_TARGET, Target(TargetType.COMMAND, argv=("true",)),
                                   Target(TargetType.HTTP, url="https://example.com/hook")]),
        "payload_json": st.sampled_from(["null", '{"a":[1,2]}']), "priority": st.sampled_from(Priority),
        "timeout_s": st.sampled_from([1, 60, 604_800]),
        "retry": st.sampled_from([RetryPolicy(), RetryPolicy(1, 0.0, 0.0), RetryPolicy(25, 86_400.0, 86_400.0)]),
        "catch_up": st.sampled_from(CatchUp), "pool": st.sampled_from(["default", "batch"]),
        "secrets": st.sampled_from([(), ("a", "b-2")]), "jitter_s": st.sampled_from([0, 3600]),
        "overlap": st.sampled_from(OverlapPolicy), "alert_late_s": st.sampled_from([None, 0, 604_800]),
    }
    hostile: dict[str, st.SearchStrategy[Any]] = {
        "name": texts(), "schedule": schedules(), "target": targets(), "payload_json": payloads(),
        "timeout_s": longs(), "retry": st.builds(RetryPolicy, max_attempts=longs(), backoff_base_s=floats(),
                                                 backoff_cap_s=floats()),
        "pool": st.one_of(st.sampled_from(["nope", "Default", "gpu", ""]), texts()),
        "secrets": st.lists(texts(), max_size=20).map(tuple), "jitter_s": longs(),
        "alert_late_s": longs(),
    }
    return few_hostile(JobSpec, valid, hostile)


_VALID_PATCHES: list[dict[str, Any]] = [  # each one the API accepts: they move the victims around
    {"priority": "high"}, {"schedule": "*/5 * * * * *"}, {"schedule": "* * * * * *", "catchUp": "all"},
    {"jitterS": 3600}, {"timeoutS": 604_800}, {"runAt": "2026-01-01T00:00:30Z"}, {"pool": "batch"},
    {"overlap": "bufferOne"}, {"overlap": "replace"}, {"retry": {"max": 25, "backoffS": 86_400, "backoffCapS": 86_400}},
    {"timezone": "Pacific/Chatham"}, {"schedule": "0 0 29 2 *"}, {"schedule": "30 2 * 3 0", "timezone": "Europe/Zurich"},
    {"alertLateS": 604_800}, {"secrets": ["a", "b"]}, {"payload": {"fail_attempts": 99}}, {"catchUp": "skip"},
    {"name": "\u00e9" * 200}, {"schedule": "@yearly"}, {"target": {"type": "command", "argv": ["true"]}},
]


def patches() -> st.SearchStrategy[str]:
    """``PatchJob.patch_json``: objects with good and bad fields, and text that is not
    JSON, or not an object, or nested past the recursion limit."""
    json_value = st.recursive(
        st.one_of(st.none(), st.booleans(), st.integers(LONG_MIN, LONG_MAX), st.integers().map(lambda i: i * 10**30),
                  st.floats(allow_nan=False, allow_infinity=False), texts()),
        lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(texts(), inner, max_size=3)),
        max_leaves=6)
    field_values = {
        "name": st.one_of(st.just("renamed"), json_value), "schedule": st.one_of(crons(), json_value),
        "timezone": st.one_of(zones(), json_value),
        "runAt": st.one_of(st.sampled_from(["2026-01-01T00:00:10Z", "9999-12-31T23:59:59Z", "0001-01-01T00:00:00Z",
                                            "2026-01-01T00:00:10", "2026-13-01T00:00:00Z", "now", "",
                                            "2026-01-01T00:00:10+25:00", "+275760-09-13T00:00:00Z"]), json_value),
        "target": st.one_of(st.just({"type": "handler", "name": HANDLER}),
                            st.dictionaries(st.sampled_from(["type", "name", "url", "argv", "image", "x"]),
                                            json_value, max_size=3)),
        "payload": json_value, "priority": st.one_of(st.sampled_from(["high", "HIGH", ""]), json_value),
        "timeoutS": st.one_of(longs(), json_value),
        "retry": st.one_of(st.dictionaries(st.sampled_from(["max", "backoffS", "backoffCapS", "x"]),
                                           st.one_of(longs(), floats().filter(lambda f: f == f), json_value),
                                           max_size=3), json_value),
        "catchUp": json_value, "pool": st.one_of(st.sampled_from(["default", "batch", "gpu"]), json_value),
        "secrets": json_value, "jitterS": st.one_of(longs(), json_value), "overlap": json_value,
        "alertLateS": st.one_of(longs(), json_value), "unknown": json_value,
    }
    obj = st.fixed_dictionaries({}, optional=field_values)
    return st.one_of(
        st.sampled_from(_VALID_PATCHES).map(lambda d: json.dumps(d, separators=(",", ":"), sort_keys=True)),
        obj.map(lambda d: json.dumps(d, separators=(",", ":"), sort_keys=True)),
        obj.map(lambda d: json.dumps(d, allow_nan=True)).map(lambda s: s.replace("0.5", "NaN")),
        payloads(),
        json_value.map(json.dumps),
    )


# ---- ids ----------------------------------------------------------------------------------


def _not_probe(s: str) -> bool:
    return not s.startswith(PROBE_PREFIX)


def hostile_job_ids() -> st.SearchStrategy[str]:
    victims = st.sampled_from(VICTIM_JOBS)  # (half the time: so that commands get past the checks)
    return st.one_of(victims, victims, victims, st.sampled_from(GOOD_JOBS),
                     st.integers(0, 9).map(lambda i: f"h-{i}"), texts().filter(_not_probe))


def hostile_tenants() -> st.SearchStrategy[str]:
    """Never the good tenant itself (its own commands are not hostile)."""
    victim = st.just(VICTIM_TENANT)
    return st.one_of(victim, victim, victim, st.sampled_from(["other", "", "*", "SIM", "sim ", "victim\x00"]),
                     texts()).filter(lambda t: t != GOOD_TENANT)


def _slot_ids(job_ids: tuple[str, ...]) -> st.SearchStrategy[str]:
    return st.builds(lambda j, k, off: slot_run_id(j, T0 + k * SECOND + off), st.sampled_from(job_ids),
                     st.integers(-2, 40), st.sampled_from([0, 0, 0, 1, 500]))


def victim_run_ids() -> st.SearchStrategy[str]:
    return st.one_of(_slot_ids(VICTIM_JOBS),
                     st.builds(manual_run_id, st.sampled_from(VICTIM_JOBS), st.sampled_from(MANUAL_KEYS)))


def good_run_ids() -> st.SearchStrategy[str]:
    return _slot_ids(GOOD_JOBS)


def odd_run_ids() -> st.SearchStrategy[str]:
    """Not any run's: garbage, unknown jobs, ids past what the index keys expect."""
    return st.one_of(
        st.sampled_from(["", "@", "x@", "@x", "no-at", "\x00@\x00", "victim-0@manual:", "a@b@c",
                         "victim-0@9999-12-31T23:59:59Z", "victim-0@0001-01-01T00:00:00Z", "victim-0\x00@manual:k0"]),
        texts(),
        st.builds(lambda j, t: f"{j}@{t}", hostile_job_ids(), texts()),
    )


def worker_ids() -> st.SearchStrategy[str]:
    """Never a running worker's id (the sim's are w<index>.<generation>)."""
    return st.one_of(st.sampled_from(GHOSTS), texts()).filter(
        lambda w: not (w.startswith(REAL_WORKER_PREFIX) and w[1:2].isdigit()))


def tokens() -> st.SearchStrategy[int]:
    """Stale (0, 1, 2: a ghost's claim of a victim run gets 1), negative, huge."""
    return st.one_of(st.integers(-1, 4), longs())


def outputs() -> st.SearchStrategy[str | None]:
    return st.one_of(st.none(), st.sampled_from(['{"ok":true}', "not json", "", "null"]), texts(),
                     st.sampled_from([16 * 1024, 16 * 1024 + 1, 300_000]).map(lambda n: '"' + "x" * (n - 2) + '"'),
                     st.just('"' + "\U0001f984" * 4097 + '"'))  # 16 KiB of characters, 64 KiB of bytes


# ---- job commands (gnomon.job-commands) ---------------------------------------------------


_NEAR = st.integers(T0 - 10 * SECOND, T0 + 30 * SECOND)  # a command's time the processor accepts
_FRESH_IDS = st.integers(0, 9).map(lambda i: f"h-{i}")


def _job_command(cls: type, valid: dict[str, st.SearchStrategy[Any]] | None = None,
                 hostile: dict[str, st.SearchStrategy[Any]] | None = None,
                 job_ids: st.SearchStrategy[str] = st.sampled_from(VICTIM_JOBS)) -> st.SearchStrategy[Hostile]:
    """A job command of the victims' tenant on a victim (or a fresh id), with one or two
    hostile fields; now and then one that is hostile all over."""
    v = {"job_id": job_ids, "tenant": st.just(VICTIM_TENANT), "at_ms": _NEAR, **(valid or {})}
    h = {"job_id": hostile_job_ids(), "tenant": hostile_tenants(), "at_ms": instants(), **(hostile or {})}
    return placed(st.one_of(few_hostile(cls, v, h), few_hostile(cls, h, h, 0)), "job_commands", _job_id)


def _run_command_on_job_topic(cls: type, **extra: st.SearchStrategy[Any]) -> st.SearchStrategy[Hostile]:
    manual = st.builds(manual_run_id, st.sampled_from(VICTIM_JOBS), st.sampled_from(MANUAL_KEYS))
    v = {"run_id": st.one_of(manual, victim_run_ids()), "tenant": st.just(VICTIM_TENANT), "at_ms": _NEAR,
         **{k: st.just("fuzz") for k in extra}}
    h = {"run_id": st.one_of(victim_run_ids(), good_run_ids(), odd_run_ids()), "tenant": hostile_tenants(),
         "at_ms": instants(), **extra}
    return placed(st.one_of(few_hostile(cls, v, h), few_hostile(cls, h, h, 0)), "job_commands", _run_key)


_BACKFILL_SLOTS = st.one_of(
    st.lists(instants(), max_size=5).map(tuple),
    st.lists(st.integers(-30, 30).map(lambda k: T0 + k * SECOND), max_size=8).map(tuple),
    st.integers(0, 3000).map(lambda n: tuple(T0 - (i + 1) * SECOND for i in range(n))),
    st.integers(1, 1001).map(lambda n: (T0 - 5 * SECOND,) * n))


JOB_COMMAND_KINDS: dict[str, st.SearchStrategy[Hostile]] = {
    "RegisterJob": _job_command(J.RegisterJob, {"spec": specs()}, {"spec": specs()},
                                job_ids=st.one_of(_FRESH_IDS, st.sampled_from(VICTIM_JOBS))),
    "UpdateJob": _job_command(J.UpdateJob, {"spec": specs()}, {"spec": specs()}),
    "PatchJob": _job_command(J.PatchJob, {"patch_json": patches(), "expected_version": st.sampled_from([None, 1, 2])},
                             {"patch_json": patches(), "expected_version": longs()}),
    "PauseJob": _job_command(J.PauseJob),
    "ResumeJob": _job_command(J.ResumeJob),
    "DeleteJob": _job_command(J.DeleteJob),
    "TriggerJob": _job_command(J.TriggerJob, {"idempotency_key": st.sampled_from([*MANUAL_KEYS, "k-new", "a" * 128])},
                               {"idempotency_key": texts()}),
    "BackfillJob": _job_command(J.BackfillJob, {"slots_ms": st.lists(
        st.integers(-30, 1).map(lambda k: T0 + k * SECOND), min_size=1, max_size=8, unique=True).map(tuple)},
        {"slots_ms": _BACKFILL_SLOTS}),
    # regions (ADR 0013): this cluster is the default namespace, where nothing moves, and
    # an adoption is the processors' word (operator-signed): both refused, nothing changes
    "MoveJob": _job_command(J.MoveJob, {"to_region": st.sampled_from(["a", "b"])}, {"to_region": texts()}),
    "AdoptJob": _job_command(
        J.AdoptJob,
        {"spec": specs(), "next_run_at_ms": st.one_of(st.none(), _NEAR), "paused": st.booleans(),
         "scheduled_runs": st.integers(0, 5), "version": st.integers(1, 5), "created_at_ms": _NEAR,
         "from_region": st.sampled_from(["a", "b"]), "returned": st.booleans()},
        {"spec": specs(), "next_run_at_ms": st.one_of(st.none(), instants()), "paused": st.booleans(),
         "scheduled_runs": longs(), "version": longs(), "created_at_ms": instants(), "from_region": texts(),
         "returned": st.booleans()},
        job_ids=st.one_of(_FRESH_IDS, st.sampled_from(VICTIM_JOBS))),
    "CancelRun": _run_command_on_job_topic(R.CancelRun, reason=texts()),
    "ReplayRun": _run_command_on_job_topic(R.ReplayRun, requested_by=texts()),
}


def job_commands() -> st.SearchStrategy[Hostile]:
    return st.one_of(*JOB_COMMAND_KINDS.values())


@st.composite
def misrouted(draw: st.DrawFn, records: st.SearchStrategy[Hostile]) -> Hostile:
    """A record on another partition than its key's: a producer with its own partitioner
    (or none). A job command there reaches a processor that does not own its job."""
    h = draw(records)
    other = draw(st.integers(1, PARTITIONS - 1))
    return replace(h, partition=(h.partition + other) % PARTITIONS)


# ---- run-events (workers' messages, and what else the topic's schema carries) --------------


def _run_ids_for_workers() -> st.SearchStrategy[str]:
    # (the victims' manual runs wait READY: a ghost's claim gets one, and its reports then
    # carry the current token, so they reach the completion and retry paths)
    manual = st.builds(manual_run_id, st.sampled_from(VICTIM_JOBS), st.sampled_from(MANUAL_KEYS))
    return st.one_of(manual, victim_run_ids(), good_run_ids(), odd_run_ids())


def _worker_message(cls: type, run_ids: st.SearchStrategy[str], **extra: st.SearchStrategy[Any]
                    ) -> st.SearchStrategy[Hostile]:
    return placed(st.builds(cls, run_id=run_ids, worker_id=worker_ids(), at_ms=instants(), **extra),
                  "run_events", _run_key)


def _forged_trigger(cls: type, **extra: st.SearchStrategy[Any]) -> st.SearchStrategy[Hostile]:
    """A RunTriggered / RunSkipped written to run-events by someone else than the
    processor: of a victim's or an unknown job, never of a good job's slot."""
    def build(job_id: str, slot_ms: int, tenant: str, **kw: Any) -> Any:
        try:
            run_id = slot_run_id(job_id, slot_ms)
        except (ValueError, OverflowError, OSError):  # no date: a run id no slot has
            run_id = f"{job_id}@{slot_ms}"
        return cls(run_id=run_id, job_id=job_id, tenant=tenant, slot_ms=slot_ms, **kw)

    return placed(st.builds(build, job_id=st.one_of(st.sampled_from(VICTIM_JOBS), hostile_job_ids()),
                     slot_ms=instants(), tenant=st.one_of(st.just(VICTIM_TENANT), hostile_tenants()),
                     spec=specs(), at_ms=instants(), advances=st.booleans(),
                     advance_to_ms=st.one_of(st.none(), instants()), **extra).filter(
        lambda t: not (t.job_id in GOOD_JOBS and t.tenant == GOOD_TENANT)), "run_events", _job_id)


RUN_EVENT_KINDS: dict[str, st.SearchStrategy[Hostile]] = {
    # a claim of a good run by a ghost would take it from its worker (the legacy pull
    # path grants any READY run to whoever claims it): victims' and unknown runs only
    "ClaimRun": _worker_message(R.ClaimRun, st.one_of(
        st.builds(manual_run_id, st.sampled_from(VICTIM_JOBS), st.sampled_from(MANUAL_KEYS)), victim_run_ids(),
        odd_run_ids())),
    "Heartbeat": _worker_message(R.Heartbeat, _run_ids_for_workers(), token=tokens()),
    "CompleteAttempt": _worker_message(
        R.CompleteAttempt, _run_ids_for_workers(), token=tokens(), outcome=st.sampled_from(R.Outcome),
        exit_code=st.one_of(st.none(), longs()), error=st.one_of(st.none(), texts()),
        started_at_ms=st.one_of(st.none(), instants()), output=outputs()),
    "AttemptStarted": _worker_message(R.AttemptStarted, _run_ids_for_workers(), token=tokens(),
                                      started_at_ms=instants()),
    "ReturnGrant": _worker_message(R.ReturnGrant, _run_ids_for_workers(), token=tokens(), reason=texts()),
    "RunTriggered": _forged_trigger(J.RunTriggered, not_before_ms=instants(), manual=st.booleans(),
                                    backfill=st.booleans()),
    "RunSkipped": _forged_trigger(J.RunSkipped, reason=texts(), count=longs(),
                                  from_ms=st.one_of(st.none(), instants())),
    # the API's commands, read from the topic workers write: refused whoever sends them
    "CancelRun@run-events": placed(st.builds(R.CancelRun, run_id=_run_ids_for_workers(),
                                      tenant=st.one_of(st.just(GOOD_TENANT), hostile_tenants()),
                                      at_ms=instants(), reason=texts()), "run_events", _run_key,
                                      "CancelRun@run-events"),
    "ReplayRun@run-events": placed(st.builds(R.ReplayRun, run_id=_run_ids_for_workers(),
                                      tenant=st.one_of(st.just(GOOD_TENANT), hostile_tenants()),
                                      at_ms=instants(), requested_by=texts()), "run_events", _run_key,
                                      "ReplayRun@run-events"),
}


def run_events() -> st.SearchStrategy[Hostile]:
    return st.one_of(*RUN_EVENT_KINDS.values())


# ---- feeds: tenant limits (gnomon.tenants) and worker adverts (gnomon.workers) -------------

_PROTECTED_TENANT_KEYS = frozenset({GOOD_TENANT, "*"})


@functools.cache
def _parsed_schema(topic: str) -> Any:
    return parse_schema(codec.default_codec.registry.latest(codec.subject_for_topic(topic)).schema)


def _raw_avro(role: str, record: dict[str, Any]) -> bytes | None:
    """``record`` written with the topic's latest schema, bypassing the dataclass (whose
    checks would refuse the values): what a producer in another language could write."""
    topic = str(getattr(TOPO, role))
    schema = _parsed_schema(topic)
    buf = BytesIO()
    buf.write(bytes([codec.MAGIC]) + codec.schema_id_for_topic(topic).to_bytes(4, "big"))
    try:
        schemaless_writer(buf, schema, record)
    except Exception:  # does not fit the schema: not a record anyone can write
        return None
    return buf.getvalue()


@st.composite
def tenant_limits(draw: st.DrawFn) -> Hostile:
    tenant = draw(st.one_of(st.just(VICTIM_TENANT), hostile_tenants(), st.just("other")))
    key = draw(st.one_of(st.just(tenant), hostile_tenants()))
    if key in _PROTECTED_TENANT_KEYS:
        key = VICTIM_TENANT  # (a value naming a protected tenant under another key is refused: key and value differ)
    limit = st.one_of(st.sampled_from([1, 2, 100, 0, -1, 31 * 86_400, 31 * 86_400 + 1, 10**9]), longs())
    record = {"tenant": tenant, "concurrency_max": draw(limit), "jobs_max": draw(limit),
              "interval_min_s": draw(limit), "backlog_max": draw(limit), "triggers_per_min_max": draw(limit),
              "updated_at_ms": draw(instants())}
    value = _raw_avro("tenants", record)
    if draw(st.integers(0, 9)) == 0:
        value = None  # a tombstone
    return Hostile("TenantLimits", "tenants", key.encode(), value, key_partition(key), record)


def _advert_is_harmless(a: WorkerAdvert) -> bool:
    """An advert that offers no room to the good tenant's runs, and is no real worker's."""
    real = a.worker_id.startswith(REAL_WORKER_PREFIX) and a.worker_id[1:2].isdigit()
    offers_good = a.pool == "default" and (not a.tenants or GOOD_TENANT in a.tenants)
    return not real and not offers_good


def adverts() -> st.SearchStrategy[Hostile]:
    return placed(st.builds(
        WorkerAdvert, worker_id=worker_ids(), pool=st.one_of(st.sampled_from(["default", "batch", "gpu"]), texts()),
        slots=longs(), running=longs(), staged=longs(), interval_ms=longs(), at_ms=instants(), leaving=st.booleans(),
        stage_max=longs(), long_running=longs(),
        tenants=st.one_of(st.just((VICTIM_TENANT,)), st.lists(hostile_tenants(), max_size=3).map(tuple)),
    ).filter(_advert_is_harmless), "workers", lambda a: str(a.worker_id), "WorkerAdvert")


# ---- raw bytes ----------------------------------------------------------------------------

_SCHEMA_IDS = sorted(v.id for v in codec.default_codec.registry)
_SAMPLE_OBJECTS: list[Any] = [
    J.PauseJob(VICTIM_JOBS[0], VICTIM_TENANT, T0),
    J.RegisterJob("h-raw", VICTIM_TENANT, _VALID_SPEC, T0),
    R.Heartbeat(slot_run_id(GOOD_JOBS[0], T0 + 5 * SECOND), "ghost-1", 1, T0),
    J.BackfillJob(VICTIM_JOBS[1], VICTIM_TENANT, (T0 - 60_000, T0 - 120_000), T0),
]
_OTHER_TOPICS_OBJECTS: list[tuple[str, Any]] = [
    # valid records of other topics: the processor decodes whatever schema id a record names
    ("jobs", JobState(GOOD_JOBS[0], GOOD_TENANT, _VALID_SPEC, JobStatus.PAUSED, None, 99, T0, T0)),
    ("jobs", JobState(VICTIM_JOBS[0], VICTIM_TENANT, _VALID_SPEC, JobStatus.ACTIVE, T0, 1, T0, T0)),
    ("runs", R.RunState(slot_run_id(GOOD_JOBS[0], T0 + 5 * SECOND), GOOD_JOBS[0], GOOD_TENANT, _VALID_SPEC,
                        T0 + 5 * SECOND, T0 + 5 * SECOND, False, R.RunStatus.SUCCEEDED, T0, T0)),
    ("worker_inbox", Stop("ghost-1", slot_run_id(GOOD_JOBS[0], T0 + 5 * SECOND), 1, StopReason.STALE, "x", T0)),
    ("worker_inbox", Grant("ghost-1", manual_run_id(VICTIM_JOBS[0], "k0"), VICTIM_JOBS[0], VICTIM_TENANT, 1, 1, T0, T0,
                           _VALID_SPEC, T0, T0)),
    ("worker_inbox", LeaseAck("ghost-1", slot_run_id(GOOD_JOBS[1], T0 + 5 * SECOND), 1, T0, T0)),
    ("workers", WorkerAdvert("ghost-1", "gpu", 1, 0, 0, 1000, T0)),
    ("command_results", CommandResult(VICTIM_JOBS[0], VICTIM_TENANT, "PauseJob", 0, 0, ResultCode.ACCEPTED, T0)),
    ("job_commands", J.PauseJob(VICTIM_JOBS[0], VICTIM_TENANT, T0)),  # a job command on run-events
    ("job_commands", J.RegisterJob("h-cross", VICTIM_TENANT, _VALID_SPEC, T0)),
    ("run_events", R.Heartbeat(manual_run_id(VICTIM_JOBS[0], "k0"), "ghost-1", 1, T0)),  # a run message on job-commands
    ("run_events", J.RunSkipped(slot_run_id(VICTIM_JOBS[0], T0 + 600_000), VICTIM_JOBS[0], VICTIM_TENANT,
                                _VALID_SPEC, T0 + 600_000, "forged", T0)),
]


def _header(schema_id: int) -> bytes:
    return bytes([codec.MAGIC]) + schema_id.to_bytes(4, "big")


@st.composite
def raw_records(draw: st.DrawFn) -> Hostile:
    """Bytes that are not a record of the topic: bad framing, unknown or foreign schema
    ids, truncated or padded Avro, flipped bytes, other topics' records, tombstones."""
    role = draw(st.sampled_from(["job_commands", "run_events"]))
    topic = str(getattr(TOPO, role))
    own_id = codec.schema_id_for_topic(topic)
    sample = draw(st.sampled_from(_SAMPLE_OBJECTS))
    good = codec.encode(sample, str(getattr(TOPO, "job_commands" if isinstance(sample, J.JOB_COMMANDS)
                                                else "run_events")))
    case = draw(st.sampled_from(["empty", "short", "magic", "unknown-id", "foreign-id", "truncated", "padded",
                                 "flipped", "garbage", "huge-length", "tombstone", "other-topic"]))
    obj: Any = None
    value: bytes | None
    if case == "empty":
        value = b""
    elif case == "short":
        value = draw(st.binary(min_size=1, max_size=4))
    elif case == "magic":
        value = bytes([draw(st.integers(1, 255))]) + good[1:]
    elif case == "unknown-id":
        value = _header(draw(st.one_of(st.sampled_from([0, max(_SCHEMA_IDS) + 1, 2**31, 2**32 - 1]),
                                       st.integers(0, 2**32 - 1).filter(lambda i: i not in _SCHEMA_IDS)))) + good[5:]
    elif case == "foreign-id":
        value = _header(draw(st.sampled_from(_SCHEMA_IDS))) + draw(st.one_of(st.just(good[5:]), st.binary(max_size=64)))
    elif case == "truncated":
        value = good[:draw(st.integers(5, len(good) - 1))]
    elif case == "padded":
        value = good + draw(st.binary(min_size=1, max_size=16))
    elif case == "flipped":
        i = draw(st.integers(5, len(good) - 1))
        value = good[:i] + bytes([good[i] ^ draw(st.integers(1, 255))]) + good[i + 1:]
    elif case == "garbage":
        value = _header(own_id) + draw(st.binary(max_size=64))
    elif case == "huge-length":
        # a union branch, then a string length or an array block count of 2**62
        value = _header(own_id) + draw(st.sampled_from([b"\x00", b"\x02", b"\x10", b"\x12"])) \
            + b"\xfe\xff\xff\xff\xff\xff\xff\xff\x7f" + draw(st.binary(max_size=8))
    elif case == "tombstone":
        value = None
    else:
        other_role, obj = draw(st.sampled_from(_OTHER_TOPICS_OBJECTS))
        value = codec.encode(obj, str(getattr(TOPO, other_role)))
    key = draw(st.sampled_from([VICTIM_JOBS[0], GOOD_JOBS[0], "", "\x00"])).encode()
    return Hostile(f"raw:{case}", role, key, value, draw(st.integers(0, PARTITIONS - 1)), obj)


def feeds() -> st.SearchStrategy[Hostile]:
    return st.one_of(tenant_limits(), adverts())


def everything() -> st.SearchStrategy[Hostile]:
    return st.one_of(job_commands(), run_events(), feeds(), raw_records())
