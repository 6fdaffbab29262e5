"""The codec proper: topics, subjects, and encode/decode against one registry."""

from __future__ import annotations

import copy
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from io import BytesIO
from typing import Any, Protocol

from fastavro import parse_schema, schemaless_reader, schemaless_writer

from gnomon.codec._convert import Converters
from gnomon.codec._fastwrite import Writer, compile_writer, write_string
from gnomon.codec.registry import Registry, SchemaVersion
from gnomon.core.alerts import AlertConfig
from gnomon.core.calendars import Calendar
from gnomon.core.dependencies import DependencyDeclared, DependencyDropped, UpstreamEnded
from gnomon.core.errors import InternalError, ValidationError
from gnomon.core.exports import RunExport
from gnomon.core.jobs import (
    AdoptJob,
    BackfillJob,
    DeleteJob,
    JobState,
    MoveJob,
    PatchJob,
    PauseJob,
    RegisterJob,
    ResumeJob,
    RunSkipped,
    RunTriggered,
    TriggerJob,
    UpdateJob,
)
from gnomon.core.messages import DispatchRun, Grant, LeaseAck, LogLine, PoisonRecord, Stop
from gnomon.core.model import JobSpec
from gnomon.core.replies import CommandResult
from gnomon.core.runs import (
    AttemptStarted,
    CancelRun,
    ClaimRun,
    CompleteAttempt,
    Heartbeat,
    ReplayRun,
    ReturnGrant,
    RunState,
)
from gnomon.core.tenants import TenantLimits
from gnomon.core.usage import TenantUsage
from gnomon.core.workers import WorkerAdvert
from gnomon.region import topic_name
from gnomon.topology import load_topology

MAGIC = 0
HEADER_LEN = 5
NAMESPACE = "gnomon"
RETRY_AFTER_S_DEFAULT = 30.0  # a schema id the source failed to give is asked for again after this
FAILED_IDS_MAX = 1_024  # failed ids remembered at most (emptied when full: bounded whatever ids arrive)

log = logging.getLogger("gnomon.codec")


class DecodeError(ValidationError):
    """The bytes are not a gnomon value: too short, wrong magic byte, unknown schema id,
    not Avro of that schema, trailing bytes, or a record the dataclass refuses."""

    def __init__(self, message: str) -> None:
        super().__init__("value", message)


class EncodeError(InternalError):
    """The object has no schema (or none on the given topic), or does not fit it.

    An ``InternalError``, not a ``ValidationError``: what gnomon encodes it has built and
    checked itself, so a value that does not fit is a bug (the API answers 500)."""

    def __init__(self, message: str) -> None:
        super().__init__(f"value: {message}")
        self.field = "value"
        self.message = message


@dataclass(frozen=True)
class TopicSchema:
    topic: str  # exact name (a retired family: the common prefix of its topics' names)
    types: tuple[type, ...]  # the dataclasses that travel on it
    envelope: str | None  # the Avro record whose `body` is a union of `types`, if several

    @property
    def subject(self) -> str:
        """Its value subject, Confluent's TopicNameStrategy: ``<topic>-value``."""
        return f"{self.topic}-value"


# What travels on each topic, by its topology role (names come from the topology).
_VALUES: tuple[tuple[str, tuple[type, ...], str | None], ...] = (
    # CancelRun and ReplayRun come here from the API (the only writer of this topic); read
    # from the run-events topic, which workers write, they are refused
    ("job_commands", (RegisterJob, UpdateJob, PauseJob, ResumeJob, DeleteJob, TriggerJob, PatchJob, CancelRun,
                      ReplayRun, BackfillJob, MoveJob, AdoptJob), f"{NAMESPACE}.JobCommand"),
    ("run_events", (RunTriggered, RunSkipped, ClaimRun, Heartbeat, CompleteAttempt, CancelRun, ReplayRun,
                    AttemptStarted, ReturnGrant), f"{NAMESPACE}.RunCommand"),
    ("jobs", (JobState,), None),
    ("runs", (RunState,), None),
    ("dead_letters", (RunState,), None),
    ("run_exports", (RunExport,), None),
    ("worker_inbox", (Grant, Stop, LeaseAck), f"{NAMESPACE}.WorkerMessage"),
    ("run_logs", (LogLine,), None),
    ("poison", (PoisonRecord,), None),
    ("command_results", (CommandResult,), None),
    ("workers", (WorkerAdvert,), None),
    ("tenants", (TenantLimits,), None),
    ("tenant_usage", (TenantUsage,), None),
    ("alert_configs", (AlertConfig,), None),
    ("calendars", (Calendar,), None),
    ("dependencies", (DependencyDeclared, DependencyDropped, UpstreamEnded), f"{NAMESPACE}.DependencyMessage"),
)
# The default namespace's names: a region's topic (gnomon.region) carries what the
# default one of its role carries, under that one's subject (``topic_schema``).
_TOPOLOGY = load_topology(region=None)
# Topics no longer written, whose subjects stay registered (their ids are reserved, and
# what an old cluster still holds decodes): docs/operations.md, "Migrations".
RETIRED: tuple[TopicSchema, ...] = (
    TopicSchema("gnomon.run-history", (RunState,), None),  # until 2026-12-04: exports read run-exports
    # until 2026-12-04, the old pull path's hints on gnomon.dispatch.<pool>.<priority>: one
    # subject for the family (``_RETIRED_FAMILY``)
    TopicSchema("gnomon.dispatch", (DispatchRun,), None),
)
_RETIRED_FAMILY = "gnomon.dispatch."
TOPICS: tuple[TopicSchema, ...] = (*(
    TopicSchema(getattr(_TOPOLOGY, role), types, envelope) for role, types, envelope in _VALUES
), *RETIRED)
# Types that are not a topic's value but are registered (as references) and decodable.
_EXTRA_TYPES: tuple[type, ...] = (JobSpec,)
_BY_TOPIC = {t.topic: t for t in TOPICS}
_BY_SUBJECT = {t.subject: t for t in TOPICS}
_BY_REGIONAL_TOPIC: dict[str, TopicSchema] = {}  # a region's topic -> its default one's (found once)


def _regional(topic: str) -> TopicSchema | None:
    """The schema of ``topic`` if it is a region's name (``gnomon.region.topic_name``)
    of a topic that has one: that topic's, subject included (one subject per role, for
    every region)."""
    head, _, rest = topic.partition(".")
    if head == NAMESPACE:
        region, _, tail = rest.partition(".")
        base = f"{NAMESPACE}.{tail}"
    else:
        region, base = head, rest
    t = _BY_TOPIC.get(base)
    try:
        if t is None or topic_name(base, region) != topic:
            return None
    except ValueError:  # not a region's name
        return None
    _BY_REGIONAL_TOPIC[topic] = t
    return t


def topic_schema(topic: str) -> TopicSchema:
    """What travels on ``topic`` (on a region's topic: what travels on the default
    namespace's topic of its role). Raises ``KeyError`` for a topic without a value schema."""
    t = _BY_TOPIC.get(topic) or _BY_REGIONAL_TOPIC.get(topic) or _regional(topic)
    if t is not None:
        return t
    if topic.startswith(_RETIRED_FAMILY):
        return _BY_TOPIC[_RETIRED_FAMILY.rstrip(".")]
    raise KeyError(f"no value schema for topic {topic!r}")


def _record_fields(schema: Any, out: dict[str, frozenset[str]]) -> dict[str, frozenset[str]]:
    """Avro record fullname -> its field names, for every record inside ``schema``."""
    if isinstance(schema, list):
        for s in schema:
            _record_fields(s, out)
    elif isinstance(schema, dict):
        kind = schema.get("type")
        if kind == "record":
            out.setdefault(schema["name"], frozenset(f["name"] for f in schema["fields"]))
            for f in schema["fields"]:
                _record_fields(f["type"], out)
        elif kind == "array":
            _record_fields(schema["items"], out)
        elif kind == "map":
            _record_fields(schema["values"], out)
        elif isinstance(kind, dict | list):
            _record_fields(kind, out)
    return out


def _types_of_subject(subject: str, schema: Any) -> tuple[type, ...]:
    if subject in _BY_SUBJECT:
        return _BY_SUBJECT[subject].types
    return tuple(c for c in _EXTRA_TYPES if schema.get("name") == f"{NAMESPACE}.{c.__name__}")


# A job's spec is most of what a run or job state encodes (65 % of a RunState's encode),
# and the processor writes a run's state several times and a per-second job's state
# every slot, each with the same JobSpec object. So a state with a ``spec`` field is
# written in three parts, the fields before it, the spec, the fields after it (Avro's
# binary form of a record is its fields' forms one after the other), and the spec's
# bytes are kept by object identity (with the object: its id is not reused meanwhile).
# Bounded in entries and bytes (a spec's payload may be large), per writer; emptied when full.
SPEC_FIELD = "spec"
SPEC_CACHE_ENTRIES_MAX = 4_096
SPEC_CACHE_BYTES_MAX = 8 * 1024 * 1024


def _write_with(schema: Any, fast: Writer | None, out: bytearray, datum: Any) -> None:
    """``datum`` as ``schema``: by its compiled writer, or by fastavro."""
    if fast is not None:
        fast(datum, out)
        return
    part = BytesIO()
    schemaless_writer(part, schema, datum)
    out += part.getvalue()


@dataclass(frozen=True)
class _Splice:
    """A record schema cut around its ``spec`` field, each part parsed (and its writer
    compiled, ``_fastwrite``) on its own."""

    before: Any
    spec: Any
    after: Any
    cache: dict[int, tuple[Any, bytes]]  # id(spec) -> (the spec, held so the id stays its, its bytes)
    before_strings: tuple[str, ...] | None = None  # the fields before, when all are strings: written here
    cached_bytes: list[int] = field(default_factory=lambda: [0])  # (a frozen dataclass's one mutable count)
    before_fast: Writer | None = None
    spec_fast: Writer | None = None
    after_fast: Writer | None = None

    def write(self, out: bytearray, record: Any, spec_obj: Any) -> None:
        if self.before_strings is not None:
            for name in self.before_strings:
                write_string(out, record[name])
        else:
            _write_with(self.before, self.before_fast, out, record)
        hit = self.cache.get(id(spec_obj))
        if hit is not None and hit[0] is spec_obj:
            out += hit[1]
        else:
            part = bytearray()
            _write_with(self.spec, self.spec_fast, part, record[SPEC_FIELD])
            data = bytes(part)
            if len(self.cache) >= SPEC_CACHE_ENTRIES_MAX or self.cached_bytes[0] + len(data) > SPEC_CACHE_BYTES_MAX:
                self.cache.clear()
                self.cached_bytes[0] = 0
            self.cache[id(spec_obj)] = (spec_obj, data)
            self.cached_bytes[0] += len(data)
            out += data
        _write_with(self.after, self.after_fast, out, record)


def _splice(schema: Any) -> _Splice | None:
    """``schema`` cut around a required ``spec`` field of record type, or None."""
    if not isinstance(schema, dict) or schema.get("type") != "record":
        return None
    names = [f["name"] for f in schema["fields"]]
    if SPEC_FIELD not in names:
        return None
    i = names.index(SPEC_FIELD)
    spec_type = schema["fields"][i]["type"]
    spec_name = spec_type.get("name") if isinstance(spec_type, dict) else spec_type
    named = dict(schema.get("__named_schemas", {}))
    if not isinstance(spec_name, str) or spec_name not in named:
        return None  # (a union, or not a named record: written whole)

    def part(fields: list[Any], suffix: str) -> Any:
        return parse_schema({"type": "record", "name": f"{schema['name']}{suffix}", "fields": fields},
                            named_schemas=dict(named))

    before = schema["fields"][:i]
    strings = tuple(f["name"] for f in before) if all(f["type"] == "string" for f in before) else None
    before_s, spec_s = part(before, "Before"), parse_schema(named[spec_name], named_schemas=dict(named))
    after_s = part(schema["fields"][i + 1:], "After")
    return _Splice(before_s, spec_s, after_s, {}, strings, before_fast=compile_writer(before_s),
                   spec_fast=compile_writer(spec_s), after_fast=compile_writer(after_s))


@dataclass(frozen=True)
class _Writer:
    header: bytes
    schema: Any
    to_record: Callable[[Any], Any]
    splice: _Splice | None = None
    fast: Writer | None = None  # the schema's compiled writer (None: fastavro writes it)


@dataclass(frozen=True)
class _Reader:
    subject: str
    writer_schema: Any
    reader_schema: Any | None  # None: the id is its subject's latest version, no resolution
    to_object: Callable[[Any], Any]


# ---- a schema source: the writer's schema of an id this codec does not know ---------------


@dataclass(frozen=True)
class FetchedSchema:
    """The schema a writer used, as a schema source gives it: its subject and version and
    its Avro JSON text, self-contained (references inlined, Confluent's ``format=resolved``)."""

    subject: str
    version: int
    schema_json: str = field(repr=False)


class SchemaSource(Protocol):
    """Where ``Codec.decode`` asks for a schema id it does not know (``use_schema_source``):
    gnomon's schema registry (``gnomon.codec.remote``) during a rolling upgrade, when a
    newer release writes a newer version of a subject."""

    def fetch(self, schema_id: int) -> FetchedSchema | None:
        """The schema ``schema_id`` names; None if the source has no such id. Any exception
        is a failure to answer (the codec reports it as a DecodeError and asks again later)."""
        ...


@dataclass(frozen=True)
class _Remote:
    source: SchemaSource
    retry_after_s: float
    monotonic_s: Callable[[], float]


class _FetchFailed(Exception):
    """Why an unknown schema id has no reader (a DecodeError's reason)."""


def _top_level_mismatch(writer: Any, reader: Any) -> str | None:
    """Why records of ``writer`` cannot resolve to ``reader`` at all (another record, or not
    a record), else None. Finer differences (a union branch or an enum symbol this reader
    lacks) fail only the records that use them, when they are read."""
    if not isinstance(writer, dict) or writer.get("type") != "record":
        return "its schema is not a record"
    namespace = reader["name"].rpartition(".")[0]
    aliases = {f"{namespace}.{a}" if namespace and "." not in a else a for a in reader.get("aliases", ())}
    if writer["name"] != reader["name"] and writer["name"] not in aliases:
        return f"its record {writer['name']} does not resolve to this release's {reader['name']}"
    return None


class Codec:
    """Encode/decode against one registry. Everything is prepared in ``__init__``."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        # Converters per subject, generated against the fields of its latest schema (one
        # subject may lag behind another that carries the same record, e.g. dead-letters).
        self._to_avro: dict[str, dict[type, Callable[[Any], Any]]] = {}
        self._from_name: dict[str, dict[str, Callable[[Any], Any]]] = {}
        for subject in registry.subjects():
            latest = registry.latest(subject).schema
            conv = Converters(_record_fields(latest, {}))
            for cls in _types_of_subject(subject, latest):
                conv.add(cls)
            self._to_avro[subject] = conv.to_avro
            self._from_name[subject] = {f"{NAMESPACE}.{c.__name__}": fn for c, fn in conv.from_avro.items()}
        # A topic whose subject is not registered yet has no writer (encode raises
        # EncodeError), so that registering it (python -m gnomon.codec) stays possible.
        self._writers: dict[tuple[str, type], _Writer] = {
            (t.topic, cls): self._writer(t, cls) for t in TOPICS if t.subject in self._to_avro for cls in t.types
        }
        # A type's default topic is the first that lists it (RunState -> the runs ledger).
        self._default_writers: dict[type, _Writer] = {}
        for (_, cls), w in self._writers.items():
            self._default_writers.setdefault(cls, w)
        self._readers: dict[int, _Reader] = {v.id: self._reader(v) for v in registry}
        self._same_body: dict[tuple[str, str, type], bool] = {}  # (from topic, to topic, type): one schema
        # Ids not in the registry, asked of a schema source (``use_schema_source``; none: refused).
        self._remote: _Remote | None = None
        self._fetched: set[int] = set()  # ids whose reader came from the source
        self._failed: dict[int, tuple[float, str]] = {}  # id -> (when it failed, monotonic s; why)
        self._fetch_lock = threading.Lock()

    def _writer(self, t: TopicSchema, cls: type) -> _Writer:
        latest = self.registry.latest(t.subject)
        enc = self._to_avro[t.subject][cls]
        if t.envelope is None:
            to_record = enc
        else:
            name = f"{NAMESPACE}.{cls.__name__}"

            def to_record(obj: Any) -> Any:
                return {"body": (name, enc(obj))}  # fastavro's tuple notation: union branch by name

        return _Writer(bytes([MAGIC]) + latest.id.to_bytes(4, "big"), latest.schema, to_record,
                       _splice(latest.schema) if t.envelope is None else None, compile_writer(latest.schema))

    def _reader(self, v: SchemaVersion) -> _Reader:
        latest = self.registry.latest(v.subject)
        return _Reader(
            v.subject, v.schema, None if latest.id == v.id else latest.schema,
            self._to_object(latest.schema, self._from_name[v.subject]),
        )

    # ---- ids this registry does not have: a schema source's -----------------------------

    def use_schema_source(self, source: SchemaSource | None, *, retry_after_s: float = RETRY_AFTER_S_DEFAULT,
                          monotonic_s: Callable[[], float] = time.monotonic) -> None:
        """Ask ``source`` for a schema id ``decode`` does not know (once per id: the reader
        is kept), and read its records with the subject's latest version here (Avro schema
        resolution, as for an older version). An id the source failed to give is asked for
        again only ``retry_after_s`` later (by ``monotonic_s``); meanwhile ``decode`` refuses
        it at once. None: unknown ids are refused, and readers fetched before are dropped."""
        with self._fetch_lock:
            for schema_id in self._fetched:
                del self._readers[schema_id]
            self._fetched.clear()
            self._failed.clear()
            self._remote = None if source is None else _Remote(source, retry_after_s, monotonic_s)

    def _unknown(self, schema_id: int) -> _Reader:
        """The reader of an id the registry lacks, from the schema source; else DecodeError."""
        remote = self._remote
        if remote is None:
            raise DecodeError(f"unknown schema id {schema_id}")
        with self._fetch_lock:  # one fetch at a time: a burst of records of a new id asks once
            r = self._readers.get(schema_id)
            if r is not None:
                return r
            now_s = remote.monotonic_s()
            failed = self._failed.get(schema_id)
            if failed is not None and now_s - failed[0] < remote.retry_after_s:
                raise DecodeError(f"unknown schema id {schema_id}: {failed[1]} ({now_s - failed[0]:.0f} s ago; "
                                  f"asked again {remote.retry_after_s:g} s after a failure)")
            try:
                r = self._fetch_reader(remote.source, schema_id)
            except Exception as e:  # _FetchFailed, or a bug on the way: decode raises DecodeError only
                reason = str(e) if isinstance(e, _FetchFailed) else f"{type(e).__name__}: {e}"
                if len(self._failed) >= FAILED_IDS_MAX:
                    self._failed.clear()
                self._failed[schema_id] = (now_s, reason)
                log.warning("unknown schema id %d: %s", schema_id, reason)
                raise DecodeError(f"unknown schema id {schema_id}: {reason}") from None
            self._failed.pop(schema_id, None)
            self._readers[schema_id] = r
            self._fetched.add(schema_id)
            return r

    def _fetch_reader(self, source: SchemaSource, schema_id: int) -> _Reader:
        """A reader of ``schema_id`` from ``source``'s writer schema to this codec's latest
        version of its subject. Raises ``_FetchFailed`` with the reason."""
        try:
            fetched = source.fetch(schema_id)
        except Exception as e:  # the source's own error, httpx's, anything: a reason, not a crash
            raise _FetchFailed(f"asking the schema registry failed: {type(e).__name__}: {e}") from e
        if fetched is None:
            raise _FetchFailed("not in the schema registry either")
        if fetched.subject not in self._from_name:
            raise _FetchFailed(f"the schema registry has it as {fetched.subject!r}, a subject this release "
                               "does not read")
        try:
            raw = json.loads(fetched.schema_json)
            writer = parse_schema(raw)
        except Exception as e:  # ValueError, fastavro's SchemaParseException, UnknownType, ...
            raise _FetchFailed(f"{fetched.subject} v{fetched.version}: not an Avro schema: "
                               f"{type(e).__name__}: {e}") from e
        latest = self.registry.latest(fetched.subject)
        mismatch = _top_level_mismatch(writer, latest.schema)
        if mismatch is not None:
            raise _FetchFailed(f"{fetched.subject} v{fetched.version}: {mismatch}")
        log.info("schema id %d (%s v%d) is not in this release's registry: read from the schema registry and "
                 "resolved to v%d (a newer release writes it: upgrade this process)", schema_id, fetched.subject,
                 fetched.version, latest.version)
        return self._reader(SchemaVersion(schema_id, fetched.subject, fetched.version, file="", sha256="",
                                          references=(), raw=raw, schema=writer))

    @staticmethod
    def _to_object(schema: Any, from_name: dict[str, Callable[[Any], Any]]) -> Callable[[Any], Any]:
        name = schema["name"]
        if name in from_name:
            return from_name[name]
        if [f["name"] for f in schema["fields"]][:1] == ["body"]:

            def unwrap(record: Any) -> Any:
                branch, body = record["body"]
                return from_name[branch](body)

            return unwrap

        def unknown(record: Any) -> Any:
            raise TypeError(f"no dataclass for {name}")

        return unknown

    # ---- API ----------------------------------------------------------------------------

    def encode(self, obj: Any, topic: str | None = None) -> bytes:
        """Confluent-framed Avro of ``obj`` with the latest schema of its topic.

        ``topic`` picks among the topics the type travels on (RunState: the runs ledger
        by default, or the dead letters).
        """
        try:
            if topic is None:
                w = self._default_writers[type(obj)]
            else:
                w = self._writers[(topic_schema(topic).topic, type(obj))]
        except KeyError:
            where = f"on topic {topic!r}" if topic is not None else "on any topic"
            raise EncodeError(f"{type(obj).__name__} has no registered value schema {where}") from None
        out = bytearray(w.header)
        try:
            if w.splice is not None:
                w.splice.write(out, w.to_record(obj), getattr(obj, SPEC_FIELD))
            else:
                _write_with(w.schema, w.fast, out, w.to_record(obj))
        except Exception as e:  # TypeError/ValueError/OverflowError/AttributeError/KeyError...
            raise EncodeError(f"{type(obj).__name__} does not fit its schema: {type(e).__name__}: {e}") from e
        return bytes(out)

    def reframe(self, data: bytes, obj: Any, from_topic: str, to_topic: str) -> bytes:
        """``obj`` encoded for ``to_topic``, given ``data``: ``obj`` encoded for
        ``from_topic``. When both topics' subjects hold the same latest schema (a run's
        state on the ledger and on the dead-letters topic), the body is the same
        bytes under the other schema id: no second encode. Otherwise ``encode``."""
        key = (topic_schema(from_topic).topic, topic_schema(to_topic).topic, type(obj))
        same = self._same_body.get(key)
        if same is None:
            w_from, w_to = self._writers.get(key[::2]), self._writers.get(key[1:])
            same = w_from is not None and w_to is not None and w_from.schema == w_to.schema
            self._same_body[key] = same
        if not same or data[:HEADER_LEN] != self._writers[key[::2]].header:
            return self.encode(obj, to_topic)
        return self._writers[key[1:]].header + data[HEADER_LEN:]

    def header(self, cls: type) -> bytes | None:
        """The 5 bytes (magic byte, schema id) ``encode(obj)`` starts with for an ``obj``
        of type ``cls`` and no ``topic``; None if ``cls`` has no registered schema."""
        w = self._default_writers.get(cls)
        return None if w is None else w.header

    def decode(self, data: bytes | bytearray | memoryview, topic: str | None = None) -> Any:
        """The dataclass that was encoded. With ``topic``, the schema id must belong to
        that topic's subject. Raises ``DecodeError`` and nothing else."""
        if not isinstance(data, bytes | bytearray | memoryview):
            raise DecodeError(f"expected bytes, got {type(data).__name__}")
        n = len(data)
        if n < HEADER_LEN:
            raise DecodeError(f"{n} bytes: shorter than the 5-byte header (magic byte + schema id)")
        if data[0] != MAGIC:
            raise DecodeError(f"magic byte {data[0]}, expected {MAGIC}")
        schema_id = int.from_bytes(data[1:HEADER_LEN], "big")
        r = self._readers.get(schema_id)
        if r is None:
            r = self._unknown(schema_id)
        if topic is not None:
            try:
                expected = topic_schema(topic).subject
            except KeyError as e:
                raise DecodeError(str(e)) from None
            if r.subject != expected:
                raise DecodeError(f"schema id {schema_id} is {r.subject}, not {expected}")
        fp = BytesIO(data)
        fp.seek(HEADER_LEN)
        try:
            record = schemaless_reader(
                fp, r.writer_schema, r.reader_schema, return_record_name=True, return_record_name_override=True
            )
        except Exception as e:  # EOFError, UnicodeDecodeError, IndexError, SchemaResolutionError...
            raise DecodeError(f"not Avro of schema id {schema_id}: {type(e).__name__}: {e}") from e
        if fp.tell() != n:
            raise DecodeError(f"{n - fp.tell()} bytes after the record (schema id {schema_id})")
        try:
            return r.to_object(record)
        except Exception as e:
            raise DecodeError(f"schema id {schema_id}: cannot build the object: {type(e).__name__}: {e}") from e

    def schema_for_topic(self, topic: str) -> dict[str, Any]:
        """The latest value schema of ``topic``: fastavro-parsed (full names) and
        self-contained (referenced types such as gnomon.JobSpec inlined at first use),
        without fastavro's private ``__`` keys, so ``json.dumps`` gives a schema a
        registry accepts. A fresh copy."""
        schema = self.registry.latest(topic_schema(topic).subject).schema
        return copy.deepcopy({k: v for k, v in schema.items() if not k.startswith("__")})

    def schema_id_for_topic(self, topic: str) -> int:
        """The schema id ``encode`` writes for ``topic``."""
        return self.registry.latest(topic_schema(topic).subject).id
