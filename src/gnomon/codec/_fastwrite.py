"""Avro binary writers compiled from a parsed schema: straight-line Python per record.

fastavro's writer walks the schema for every record it writes (a dict lookup per field
and a type test per union branch): about 0.6-0.9 µs per field here, 12 µs for the 29
fields after a RunState's spec. The same bytes from generated code that knows the
schema already cost about half (``bench``-style figures in docs/benchmarks.md, "CPU
budget per run"). Reading stays with fastavro: its C reader is faster than Python.

``compile_writer(schema)`` takes a fastavro-parsed schema (full names, named types in
``__named_schemas``) and returns ``write(datum, out: bytearray)`` for the dicts the
converters make (``gnomon.codec._convert``), or None when the schema has a type it does
not handle (fastavro then writes it). It writes what fastavro writes for the same dict,
byte for byte (``tests/unit/test_codec_fastwrite.py`` checks that over generated
records): a field missing from the dict takes its schema default; a union with null is
null for None and its other branch otherwise; a union of records takes fastavro's tuple
notation ``(record name, value)``. A value of the wrong type raises (TypeError,
AttributeError, KeyError...), as fastavro does, and the codec turns that into an
EncodeError.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

_PRIMITIVE = {"null", "boolean", "int", "long", "float", "double", "string", "bytes"}

Writer = Callable[[Any, bytearray], None]


class Unsupported(Exception):
    """The schema has a type this compiler leaves to fastavro."""


def write_long(out: bytearray, n: int) -> None:
    """Avro's long: zig-zag, then base-128 groups, least significant first."""
    z = (n << 1) ^ (n >> 63)
    if z < 0x80:
        if z < 0:
            raise OverflowError(f"{n} does not fit a long")
        out.append(z)
        return
    if z >> 64:
        raise OverflowError(f"{n} does not fit a long")
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)


def write_string(out: bytearray, s: str) -> None:
    data = s.encode()
    write_long(out, len(data))
    out += data


def write_bytes(out: bytearray, b: bytes) -> None:
    write_long(out, len(b))
    out += b


_PACK_DOUBLE = struct.Struct("<d").pack
_PACK_FLOAT = struct.Struct("<f").pack


class _Compiler:
    def __init__(self, named: dict[str, Any]) -> None:
        self.named = named
        self.ns: dict[str, Any] = {
            "_wl": write_long, "_ws": write_string, "_wb": write_bytes, "_pd": _PACK_DOUBLE, "_pf": _PACK_FLOAT,
        }
        self.functions: dict[str, str] = {}  # record full name -> its function's name
        self.sources: list[str] = []
        self._n = 0

    def _name(self, prefix: str) -> str:
        self._n += 1
        return f"{prefix}{self._n}"

    def record(self, schema: dict[str, Any]) -> str:
        """The name of the function writing ``schema`` (a record), compiled once."""
        full = schema["name"]
        fn = self.functions.get(full)
        if fn is not None:
            return fn
        fn = self.functions[full] = self._name("_rec")
        lines = [f"def {fn}(d, out):"]
        for f in schema["fields"]:
            name = f["name"]
            if "default" in f:
                get = f"d.get({name!r}, {self._const(f['default'])})"
            elif f["type"] == "null" or (isinstance(f["type"], list) and "null" in f["type"]):
                get = f"d.get({name!r})"  # (fastavro: missing and nullable is null)
            else:
                get = f"d[{name!r}]"
            var = self._name("v")
            lines.append(f"    {var} = {get}")
            lines.extend("    " + line for line in self.value(f["type"], var))
        if len(lines) == 1:
            lines.append("    pass")
        self.sources.append("\n".join(lines))
        return fn

    def _const(self, value: Any) -> str:
        name = self._name("_c")
        self.ns[name] = value
        return name

    def value(self, t: Any, var: str) -> list[str]:
        """Lines writing ``var`` as type ``t``."""
        if isinstance(t, str):
            if t in _PRIMITIVE:
                return self.primitive(t, var)
            if t in self.named:
                return self.value(self.named[t], var)
            raise Unsupported(f"unknown type {t!r}")
        if isinstance(t, list):
            return self.union(t, var)
        if not isinstance(t, dict):
            raise Unsupported(f"type {t!r}")
        kind = t.get("type")
        if "logicalType" in t:
            raise Unsupported(f"logical type {t['logicalType']!r}")
        if kind == "record":
            return [f"{self.record(t)}({var}, out)"]
        if kind == "enum":
            symbols = t["symbols"]
            table = self._name("_enum")
            self.ns[table] = {s: bytes(_long_bytes(i)) for i, s in enumerate(symbols)}
            return [f"out += {table}[{var}]"]
        if kind == "array":
            item = self._name("i")
            body = self.value(t["items"], item)
            return [f"if {var}:", f"    _wl(out, len({var}))", f"    for {item} in {var}:",
                    *("        " + line for line in body), "out.append(0)"]
        if kind == "map":
            key, val = self._name("k"), self._name("m")
            body = self.value(t["values"], val)
            return [f"if {var}:", f"    _wl(out, len({var}))", f"    for {key}, {val} in {var}.items():",
                    f"        _ws(out, {key})", *("        " + line for line in body), "out.append(0)"]
        if kind in _PRIMITIVE:
            return self.primitive(kind, var)
        if kind == "fixed":
            raise Unsupported("fixed")
        if isinstance(kind, (dict, list, str)):
            return self.value(kind, var)
        raise Unsupported(f"type {t!r}")

    @staticmethod
    def primitive(t: str, var: str) -> list[str]:
        if t == "null":
            return [f"if {var} is not None:", f"    raise TypeError('{{!r}} is not null'.format({var}))"]
        if t == "boolean":
            return [f"out.append(1 if {var} else 0)"]
        if t in ("int", "long"):
            return [f"_wl(out, {var})"]
        if t == "double":
            return [f"out += _pd({var})"]
        if t == "float":
            return [f"out += _pf({var})"]
        if t == "string":
            return [f"_ws(out, {var})"]
        return [f"_wb(out, {var})"]  # bytes

    def union(self, branches: list[Any], var: str) -> list[str]:
        others = [b for b in branches if b != "null"]
        if len(branches) == 2 and len(others) == 1:
            null_at = branches.index("null")
            body = self.value(others[0], var)
            return [f"if {var} is None:", f"    out.append({2 * null_at})", "else:",
                    f"    out.append({2 * (1 - null_at)})", *("    " + line for line in body)]
        # a union of named records (an envelope's body): fastavro's tuple notation
        records: list[tuple[int, dict[str, Any]]] = []
        for i, b in enumerate(branches):
            schema = self.named.get(b) if isinstance(b, str) else b
            if not isinstance(schema, dict) or schema.get("type") != "record":
                raise Unsupported(f"union {branches!r}")
            records.append((i, schema))
        branch, inner = self._name("b"), self._name("u")
        lines = [f"{branch}, {inner} = {var}"]
        for i, schema in records:
            lines.append(f"{'elif' if i else 'if'} {branch} == {schema['name']!r}:")
            lines.append(f"    _wl(out, {i})")
            lines.append(f"    {self.record(schema)}({inner}, out)")
        lines.extend(["else:", f"    raise ValueError(f'{{{branch}!r}} is not a branch of the union')"])
        return lines


def _long_bytes(n: int) -> bytearray:
    out = bytearray()
    write_long(out, n)
    return out


def compile_writer(schema: Any) -> Writer | None:
    """``write(datum, out)`` for a parsed record schema, or None (fastavro writes it)."""
    if not isinstance(schema, dict) or schema.get("type") != "record":
        return None
    named = dict(schema.get("__named_schemas", {}))
    named.setdefault(schema["name"], schema)
    compiler = _Compiler(named)
    try:
        top = compiler.record(schema)
    except Unsupported:
        return None
    source = "\n\n".join(compiler.sources)
    exec(compile(source, f"<gnomon.codec writer {schema['name']}>", "exec"), compiler.ns)
    fn: Writer = compiler.ns[top]
    return fn
