"""The compiled Avro writers (``gnomon.codec._fastwrite``) write what fastavro writes,
byte for byte, for every type on every topic and for the schema features they cover
(defaults of missing fields, unions either way round, arrays, maps, doubles, records
in unions by tuple notation)."""

from __future__ import annotations

from io import BytesIO
from typing import Any

import pytest
from fastavro import parse_schema, schemaless_writer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.unit.test_codec import ALL_TYPES, dataclass_strategy

from gnomon.codec import TOPICS, default_codec
from gnomon.codec._codec import topic_schema
from gnomon.codec._fastwrite import compile_writer, write_long


def by_fastavro(schema: Any, datum: Any) -> bytes:
    buf = BytesIO()
    schemaless_writer(buf, schema, datum)
    return buf.getvalue()


def by_compiled(schema: Any, datum: Any) -> bytes:
    write = compile_writer(schema)
    assert write is not None
    out = bytearray()
    write(datum, out)
    return bytes(out)


def test_every_topic_schema_compiles() -> None:
    for t in TOPICS:
        w = default_codec._writers.get((t.topic, t.types[0]))
        if w is not None:
            assert w.fast is not None, t.topic
            assert w.splice is None or (w.splice.after_fast is not None and w.splice.spec_fast is not None)


@pytest.mark.parametrize("cls", ALL_TYPES, ids=lambda c: c.__name__)
@settings(max_examples=40, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_same_bytes_as_fastavro_for_every_type(cls: type, data: st.DataObject) -> None:
    obj = data.draw(dataclass_strategy(cls))
    for t in TOPICS:
        w = default_codec._writers.get((t.topic, cls))
        if w is None:
            continue
        record = w.to_record(obj)
        assert by_compiled(w.schema, record) == by_fastavro(w.schema, record), (t.topic, cls.__name__)
        # and the codec's own output (spliced, spec cached) is fastavro's under the header
        assert default_codec.encode(obj, t.topic) == w.header + by_fastavro(w.schema, record)


SCHEMA = parse_schema({
    "type": "record", "name": "t.R", "fields": [
        {"name": "l", "type": "long"},
        {"name": "i", "type": "int"},
        {"name": "b", "type": "boolean"},
        {"name": "d", "type": "double"},
        {"name": "f", "type": "float"},
        {"name": "s", "type": "string"},
        {"name": "y", "type": "bytes"},
        {"name": "e", "type": {"type": "enum", "name": "t.E", "symbols": [f"s{i}" for i in range(70)]}},
        {"name": "nl", "type": ["null", "long"]},
        {"name": "ln", "type": ["long", "null"], "default": 7},
        {"name": "ns", "type": ["null", "string"], "default": None},
        {"name": "missing", "type": ["null", "string"]},
        {"name": "a", "type": {"type": "array", "items": "string"}},
        {"name": "m", "type": {"type": "map", "values": "long"}},
        {"name": "sub", "type": {"type": "record", "name": "t.S", "fields": [{"name": "x", "type": "long"}]}},
        {"name": "again", "type": "t.S"},
        {"name": "u", "type": [{"type": "record", "name": "t.A", "fields": [{"name": "p", "type": "string"}]},
                               {"type": "record", "name": "t.B", "fields": [{"name": "q", "type": "long"}]}]},
        {"name": "dflt", "type": "long", "default": 42},
    ]})

LONGS = st.integers(-(2**63), 2**63 - 1)
INTS = st.integers(-(2**31), 2**31 - 1)
DATUM = st.fixed_dictionaries({
    "l": LONGS, "i": INTS, "b": st.booleans(), "d": st.floats(allow_nan=False),
    "f": st.floats(width=32, allow_nan=False), "s": st.text(max_size=20), "y": st.binary(max_size=20),
    "e": st.sampled_from([f"s{i}" for i in range(70)]), "nl": st.none() | LONGS,
    "ns": st.none() | st.text(max_size=5), "a": st.lists(st.text(max_size=5), max_size=3),
    "m": st.dictionaries(st.text(max_size=5), LONGS, max_size=3), "sub": st.fixed_dictionaries({"x": LONGS}),
    "again": st.fixed_dictionaries({"x": LONGS}),
    "u": st.one_of(st.tuples(st.just("t.A"), st.fixed_dictionaries({"p": st.text(max_size=5)})),
                   st.tuples(st.just("t.B"), st.fixed_dictionaries({"q": LONGS}))),
}, optional={"ln": st.none() | LONGS})


@settings(max_examples=300)
@given(DATUM)
def test_the_same_bytes_as_fastavro_for_every_feature(datum: dict[str, Any]) -> None:
    assert by_compiled(SCHEMA, datum) == by_fastavro(SCHEMA, datum)


@given(LONGS)
def test_longs_are_zigzag_varints(n: int) -> None:
    out = bytearray()
    write_long(out, n)
    assert bytes(out) == by_fastavro(parse_schema({"type": "record", "name": "t.L", "fields": [
        {"name": "n", "type": "long"}]}), {"n": n})


def test_what_does_not_fit_raises_and_the_codec_says_so() -> None:
    with pytest.raises(OverflowError):
        write_long(bytearray(), 2**63)
    with pytest.raises(TypeError):
        by_compiled(SCHEMA, {"l": None})
    import dataclasses

    from tests.unit.test_codec import RUN

    from gnomon.codec import EncodeError
    with pytest.raises(EncodeError, match="does not fit its schema"):
        default_codec.encode(dataclasses.replace(RUN, attempt=None))  # type: ignore[arg-type]
    assert topic_schema("gnomon.runs").topic == "gnomon.runs"


def test_unsupported_schemas_are_left_to_fastavro() -> None:
    fixed = parse_schema({"type": "record", "name": "t.F", "fields": [
        {"name": "h", "type": {"type": "fixed", "name": "t.H", "size": 2}}]})
    assert compile_writer(fixed) is None
    assert compile_writer(parse_schema("long")) is None
