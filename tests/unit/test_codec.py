"""gnomon.codec: round trips, framing, and that bad bytes only ever raise DecodeError."""

from __future__ import annotations

import dataclasses
import enum
import json
import types
import typing
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gnomon.codec import (
    TOPICS,
    Codec,
    DecodeError,
    EncodeError,
    decode,
    default_codec,
    encode,
    schema_for_topic,
    schema_id_for_topic,
    subject_for_topic,
    topic_types,
)
from gnomon.core.alerts import ALL_KINDS, AlertConfig
from gnomon.core.errors import InternalError, ValidationError
from gnomon.core.jobs import JobState, JobStatus, PatchJob, RegisterJob
from gnomon.core.messages import DispatchRun, LogLine, LogStream, PoisonRecord
from gnomon.core.model import JobSpec, Priority, Schedule, Target, TargetType
from gnomon.core.runs import (
    CancelRun,
    ClaimRun,
    CompleteAttempt,
    Outcome,
    ReplayRun,
    RunState,
    RunStatus,
)
from gnomon.core.tenants import LIMIT_BOUNDS, TenantLimits
from gnomon.core.validation import LATE_MAX_S

# ---- strategies ------------------------------------------------------------------------
# Derived from the dataclass type hints, for *every* field (defaulted ones included), so a
# field added to a core dataclass is exercised without touching this file.

LONG = st.integers(min_value=-(2**63), max_value=2**63 - 1)
# Mostly realistic epoch-ms values, sometimes the extremes of an Avro long.
MS = st.one_of(st.integers(0, 4_102_444_800_000), LONG)
TEXT = st.text(max_size=40)
# Where a dataclass field is narrower than its Python type says.
OVERRIDES: dict[tuple[type, str], st.SearchStrategy[Any]] = {
    (DispatchRun, "priority"): st.sampled_from([p.value for p in Priority]),  # `str`, but an Avro enum
    # TenantLimits validates itself: draw only values it accepts
    (TenantLimits, "tenant"): st.from_regex(r"\A(\*|[A-Za-z0-9._-]{1,128})\Z"),
    **{(TenantLimits, n): st.integers(lo, hi) for n, (lo, hi) in LIMIT_BOUNDS.items()},
    # so does AlertConfig
    (AlertConfig, "tenant"): st.from_regex(r"\A[A-Za-z0-9._-]{1,128}\Z"),
    (AlertConfig, "url"): st.from_regex(r"\Ahttps?://[a-z0-9]{1,20}(\.[a-z]{2,5})?(:[0-9]{2,4})?(/[a-z0-9/]{0,20})?\Z"),
    (AlertConfig, "kinds"): st.lists(st.sampled_from(ALL_KINDS), unique=True).map(tuple),
    (AlertConfig, "late_s"): st.one_of(st.none(), st.integers(0, LATE_MAX_S)),
}


def strategy_for(hint: Any, owner: type | None = None, name: str = "") -> st.SearchStrategy[Any]:
    if owner is not None and (owner, name) in OVERRIDES:
        return OVERRIDES[(owner, name)]
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        (inner,) = [a for a in typing.get_args(hint) if a is not type(None)]
        return st.none() | strategy_for(inner, owner, name)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return dataclass_strategy(hint)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return st.sampled_from(list(hint))
    if typing.get_origin(hint) is tuple:
        return st.lists(strategy_for(typing.get_args(hint)[0]), max_size=4).map(tuple)
    if hint is int:
        return MS if name.endswith("_ms") else LONG
    if hint is float:
        return st.floats(allow_nan=False)  # NaN != NaN would break equality, not the codec
    return {str: TEXT, bool: st.booleans(), bytes: st.binary(max_size=64)}[hint]


def dataclass_strategy(cls: type) -> st.SearchStrategy[Any]:
    hints = typing.get_type_hints(cls)
    return st.builds(cls, **{f.name: strategy_for(hints[f.name], cls, f.name) for f in dataclasses.fields(cls)})


ALL_TYPES: list[type] = list(dict.fromkeys(cls for t in TOPICS for cls in t.types))
ANY_MESSAGE = st.one_of([dataclass_strategy(cls) for cls in ALL_TYPES])


def assert_identical(a: Any, b: Any, path: str = "") -> None:
    """Equality plus same types all the way down (``"high" == Priority.HIGH``, ``[] == ()``
    would otherwise hide a decoded enum that is a bare str, a list that should be a tuple)."""
    assert type(a) is type(b), f"{path}: {type(a).__name__} != {type(b).__name__}"
    if dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            assert_identical(getattr(a, f.name), getattr(b, f.name), f"{path}.{f.name}")
    elif isinstance(a, tuple):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_identical(x, y, f"{path}[{i}]")
    else:
        assert a == b, path


# ---- samples ---------------------------------------------------------------------------

SPEC = JobSpec(
    name="nightly",
    schedule=Schedule(cron="0 3 * * *", tz="Europe/Paris"),
    target=Target(TargetType.COMMAND, argv=("backup", "--all")),
    payload_json='{"a":1}',
)
RUN = RunState(
    run_id="acme.nightly@2024-01-01T02:00:00Z", job_id="acme.nightly", tenant="acme", spec=SPEC,
    slot_ms=1_704_074_400_000, not_before_ms=1_704_074_400_000, manual=False, status=RunStatus.RUNNING,
    created_at_ms=1, updated_at_ms=2, attempt=1, token=1, worker_id="w1", lease_until_ms=3, deadline_ms=4,
)
CLAIM = ClaimRun("acme.nightly@2024-01-01T02:00:00Z", "w1", 1_704_074_400_000)


# ---- round trips -----------------------------------------------------------------------


@pytest.mark.parametrize("cls", ALL_TYPES, ids=lambda c: c.__name__)
@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_round_trip_every_type(cls: type, data: st.DataObject) -> None:
    obj = data.draw(dataclass_strategy(cls))
    assert_identical(decode(encode(obj)), obj)


def test_round_trip_examples() -> None:
    for obj in (
        RUN,
        CLAIM,
        RegisterJob("acme.nightly", "acme", SPEC, 5),
        CompleteAttempt("r", "w", 3, Outcome.TIMED_OUT, 9, exit_code=None, error="boom"),
        CancelRun("acme.nightly@manual:k", "acme", 9),
        ReplayRun("acme.nightly@2024-01-01T02:00:00Z", "acme", 10, requested_by="ops"),
        PatchJob("acme.nightly", "acme", '{"priority":"high"}', 3, 11),
        PatchJob("acme.nightly", "acme", '{"payload":{"k":"\u00e9"}}', None, 12),
        dataclasses.replace(RUN, status=RunStatus.FAILED, replays=2, attempts_before_replay=6),
        JobState("j", "t", JobSpec("j", Schedule(run_at_ms=7), Target(TargetType.HTTP, url="http://x")),
                 JobStatus.DONE, None, 2, 1, 2),
        LogLine("r", "j", "t", 1, 0, LogStream.STDERR, "héllo ☃", 1),
        PoisonRecord("gnomon.runs", 3, 42, "bad", None, b"\x00\xff", 1),
        DispatchRun("r", "j", "t", 1, "default", "high", 1, 2),
    ):
        assert_identical(decode(encode(obj)), obj)


def test_framing() -> None:
    data = encode(CLAIM)
    assert data[0] == 0
    assert int.from_bytes(data[1:5], "big") == schema_id_for_topic("gnomon.run-events")
    assert int.from_bytes(encode(RUN)[1:5], "big") == schema_id_for_topic("gnomon.runs")


def test_topic_choice() -> None:
    dead = encode(RUN, topic="gnomon.dead-letters")
    assert int.from_bytes(dead[1:5], "big") == schema_id_for_topic("gnomon.dead-letters")
    assert decode(dead, topic="gnomon.dead-letters") == RUN
    with pytest.raises(DecodeError, match=r"not gnomon\.runs-value"):
        decode(dead, topic="gnomon.runs")
    # retired (the old pull path's hints): what an old cluster holds still decodes
    dispatch = DispatchRun("r", "j", "t", 1, "batch", "low", 1, 2)
    assert decode(encode(dispatch, topic="gnomon.dispatch.batch.low"), topic="gnomon.dispatch.default.high") == dispatch
    with pytest.raises(EncodeError):
        encode(CLAIM, topic="gnomon.jobs")
    with pytest.raises(EncodeError):
        encode(CLAIM, topic="gnomon.nope")
    with pytest.raises(DecodeError):
        decode(encode(CLAIM), topic="gnomon.nope")


def test_encode_rejects_what_has_no_schema() -> None:
    with pytest.raises(EncodeError):
        encode(SPEC)  # a referenced type, not a topic value
    with pytest.raises(EncodeError):
        encode({"run_id": "x"})
    with pytest.raises(EncodeError):
        encode(ClaimRun("r", "w", 2**64))  # beyond an Avro long
    with pytest.raises(EncodeError):
        encode(ClaimRun("r", None, 1))  # type: ignore[arg-type]
    with pytest.raises(EncodeError):
        encode(DispatchRun("r", "j", "t", 1, "default", "urgent", 1, 2))  # not a Priority symbol
    assert issubclass(EncodeError, InternalError) and not issubclass(EncodeError, ValidationError)


# ---- bad input -------------------------------------------------------------------------


def test_decode_error_is_a_validation_error_on_value() -> None:
    with pytest.raises(ValidationError) as info:
        decode(b"")
    assert isinstance(info.value, DecodeError)
    assert info.value.field == "value"


@pytest.mark.parametrize("data", [b"", b"\x00", b"\x00\x00\x00\x00", None, "text", 5])
def test_short_or_not_bytes(data: Any) -> None:
    with pytest.raises(DecodeError):
        decode(data)


def test_wrong_magic() -> None:
    with pytest.raises(DecodeError, match="magic"):
        decode(b"\x01" + encode(CLAIM)[1:])


def test_unknown_schema_id() -> None:
    with pytest.raises(DecodeError, match="unknown schema id 4242"):
        decode(b"\x00" + (4242).to_bytes(4, "big") + encode(CLAIM)[5:])


def test_truncated_and_trailing() -> None:
    data = encode(RUN)
    for end in range(len(data)):
        with pytest.raises(DecodeError):
            decode(data[:end])
    with pytest.raises(DecodeError, match="after the record"):
        decode(data + b"\x00")


def test_bytes_like_inputs() -> None:
    data = encode(CLAIM)
    assert decode(bytearray(data)) == CLAIM
    assert decode(memoryview(data)) == CLAIM


def _decode_or_decode_error(data: bytes) -> None:
    try:
        obj = decode(data)
    except DecodeError:
        return
    assert type(obj) in ALL_TYPES or type(obj) is JobSpec


@given(st.binary(max_size=200))
def test_garbage_raises_only_decode_error(data: bytes) -> None:
    _decode_or_decode_error(data)


@given(st.sampled_from(sorted(default_codec.registry.by_id)), st.binary(max_size=200))
def test_garbage_after_a_valid_header_raises_only_decode_error(schema_id: int, body: bytes) -> None:
    _decode_or_decode_error(b"\x00" + schema_id.to_bytes(4, "big") + body)


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(ANY_MESSAGE, st.data())
def test_corrupted_records_raise_only_decode_error(obj: Any, data: st.DataObject) -> None:
    raw = bytearray(encode(obj))
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(5, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    _decode_or_decode_error(bytes(raw))


def test_invalid_utf8_and_bad_enum_index() -> None:
    header = encode(LogLine("r", "j", "t", 1, 0, LogStream.STDOUT, "", 1))[:5]
    bad_utf8 = b"\x02\xff" + b"\x00" * 20
    with pytest.raises(DecodeError):
        decode(header + bad_utf8)
    # run_id "", job_id "", tenant "", attempt 0, seq 0, stream index 99 (zigzag 198)
    with pytest.raises(DecodeError):
        decode(header + b"\x00\x00\x00\x00\x00" + bytes([0xC6, 0x01]) + b"\x00\x00")


# ---- schemas agree with the dataclasses ------------------------------------------------


def _records(schema: Any, out: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    if isinstance(schema, list):
        for s in schema:
            _records(s, out)
    elif isinstance(schema, dict):
        if schema.get("type") == "record":
            out.setdefault(schema["name"], schema)
            for f in schema["fields"]:
                _records(f["type"], out)
        elif isinstance(schema.get("type"), dict | list):
            _records(schema["type"], out)
    return out


def _current_records(cls: type) -> list[tuple[str, dict[str, Any]]]:
    """(subject, record schema) for every subject whose latest schema contains ``cls``."""
    out = []
    for subject in default_codec.registry.subjects():
        record = _records(default_codec.registry.latest(subject).schema, {}).get(f"gnomon.{cls.__name__}")
        if record is not None:
            out.append((subject, record))
    return out


def _json_value(value: Any) -> Any:
    """A dataclass default as it would appear as an Avro default in JSON."""
    if dataclasses.is_dataclass(value):
        return {f.name: _json_value(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple):
        return [_json_value(v) for v in value]
    return value


DATACLASSES = [*ALL_TYPES, JobSpec, Schedule, Target, type(SPEC.retry)]


@pytest.mark.parametrize("cls", DATACLASSES, ids=lambda c: c.__name__)
def test_schema_fields_match_dataclass(cls: type) -> None:
    """Every field on both sides; dataclass defaults are the Avro defaults; ``T | None``
    is ``["null", T]`` with default null. Fails when a core dataclass changes without a
    new schema version (see schemas/README.md)."""
    found = _current_records(cls)
    assert found, f"no registered schema has gnomon.{cls.__name__}"
    for subject, record in found:
        _check_record(cls, record, subject)


def _check_record(cls: type, record: dict[str, Any], subject: str) -> None:
    avro = {f["name"]: f for f in record["fields"]}
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    assert list(avro) == list(fields), f"{subject}: schema fields differ from the dataclass (names or order)"
    for name, f in fields.items():
        a, where = avro[name], f"{subject} {cls.__name__}.{name}"
        if typing.get_origin(hints[name]) in (typing.Union, types.UnionType):
            assert isinstance(a["type"], list) and a["type"][0] == "null", f"{where}: expected ['null', T]"
            assert "default" in a and a["default"] is None, f"{where}: optional needs default null"
        if f.default is not dataclasses.MISSING:
            assert "default" in a, f"{where}: the dataclass has a default, the schema has not"
            assert a["default"] == _json_value(f.default), where
        elif f.default_factory is not dataclasses.MISSING:
            assert "default" in a, f"{where}: the dataclass has a default, the schema has not"
            assert a["default"] == _json_value(f.default_factory()), where


def test_every_topic_is_registered() -> None:
    for t in TOPICS:
        name = t.topic if t.topic != "gnomon.dispatch" else "gnomon.dispatch.default.normal"
        assert subject_for_topic(name) == t.subject
        schema = schema_for_topic(name)
        assert schema["name"] == (t.envelope or f"gnomon.{t.types[0].__name__}")
        assert not any(k.startswith("__") for k in schema)
        json.dumps(schema)  # a registry-ready, self-contained document
        assert topic_types(name) == t.types
    with pytest.raises(KeyError):
        schema_for_topic("gnomon.unknown")


def test_schema_for_topic_returns_a_copy() -> None:
    schema_for_topic("gnomon.runs")["fields"].clear()
    assert schema_for_topic("gnomon.runs")["fields"]
    assert decode(encode(RUN)) == RUN


# ---- reframe: one encode for a state on two topics ----------------------------------------


def test_reframe_reuses_the_body_under_the_other_topics_schema_id() -> None:
    on_runs = encode(RUN, "gnomon.runs")
    again = default_codec.reframe(on_runs, RUN, "gnomon.runs", "gnomon.dead-letters")
    assert again == encode(RUN, "gnomon.dead-letters")  # byte for byte: the same schema, another id
    assert again[:5] != on_runs[:5]
    assert_identical(decode(again, "gnomon.dead-letters"), RUN)


def test_reframe_encodes_when_the_bytes_or_the_schemas_differ() -> None:
    foreign = encode(RUN, "gnomon.dead-letters")  # not the runs ledger's header: encoded afresh
    assert default_codec.reframe(foreign, RUN, "gnomon.runs", "gnomon.dead-letters") == foreign
    codec = Codec(default_codec.registry)
    key = ("gnomon.runs", "gnomon.dead-letters", RunState)
    codec._same_body[key] = False  # as if dead-letters' subject held another schema version
    assert codec.reframe(b"\0\0\0\0\0junk", RUN, "gnomon.runs", "gnomon.dead-letters") == foreign


# ---- a state's spec written once: the spliced encoding is Avro's own ------------------------


def _plain(obj: Any, topic: str) -> bytes:
    from io import BytesIO

    from fastavro import schemaless_writer

    w = default_codec._writers[(topic, type(obj))]
    buf = BytesIO()
    buf.write(w.header)
    schemaless_writer(buf, w.schema, w.to_record(obj))
    return buf.getvalue()


@pytest.mark.parametrize(("cls", "topic"), [(RunState, "gnomon.runs"), (RunState, "gnomon.dead-letters"),
                                            (JobState, "gnomon.jobs")], ids=lambda x: getattr(x, "__name__", x))
@settings(max_examples=80, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_spliced_encoding_is_byte_for_byte_avros(cls: type, topic: str, data: st.DataObject) -> None:
    assert default_codec._writers[(topic, cls)].splice is not None  # (the states with a spec are spliced)
    obj = data.draw(dataclass_strategy(cls))
    other = data.draw(dataclass_strategy(cls))
    sharing = dataclasses.replace(other, spec=obj.spec)  # another state, the same spec object: from the cache
    for o in (obj, obj, sharing):
        assert encode(o, topic) == _plain(o, topic)
        assert_identical(decode(encode(o, topic)), o)


def test_a_changed_spec_is_written_anew() -> None:
    first = encode(RUN, "gnomon.runs")
    renamed = dataclasses.replace(RUN, spec=dataclasses.replace(RUN.spec, name="renamed"))
    assert encode(renamed, "gnomon.runs") != first
    assert decode(encode(renamed, "gnomon.runs")).spec.name == "renamed"
