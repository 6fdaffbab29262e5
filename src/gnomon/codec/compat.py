"""Backward compatibility of two Avro schemas, by the Avro schema-resolution rules.

``incompatibilities(writer, reader)`` lists why data written with ``writer`` could not be
read with ``reader`` (empty list: the reader can read everything the writer writes).
This is the static half of the check in ``tests/unit/test_schema_compat.py``; the other
half writes generated samples with the old schema and reads them with the new one.

Rules (https://avro.apache.org/docs/1.11.1/specification/#schema-resolution):
records match by full name (or a reader alias); a reader field missing from the writer
needs a default; writer fields the reader lacks are skipped; enum symbols the writer
may send must exist in the reader unless the reader enum has a default; each branch of
a writer union must be readable; primitives may be promoted int->long->float->double and
string<->bytes; arrays, maps and fixed compare their items, values, size.
"""

from __future__ import annotations

from typing import Any

_PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
_NAMED = frozenset({"record", "error", "enum", "fixed"})
_PROMOTIONS = frozenset({
    ("int", "long"), ("int", "float"), ("int", "double"),
    ("long", "float"), ("long", "double"), ("float", "double"),
    ("string", "bytes"), ("bytes", "string"),
})


def incompatibilities(writer: Any, reader: Any) -> list[str]:
    checker = _Checker(_collect_names(writer), _collect_names(reader))
    checker.check(writer, reader, "$")
    return checker.problems


def is_backward_compatible(writer: Any, reader: Any) -> bool:
    return not incompatibilities(writer, reader)


def _collect_names(schema: Any, names: dict[str, dict[str, Any]] | None = None, ns: str = "") -> dict[str, Any]:
    names = {} if names is None else names
    if isinstance(schema, list):
        for s in schema:
            _collect_names(s, names, ns)
    elif isinstance(schema, dict):
        kind = schema.get("type")
        if kind in _NAMED:
            full = _fullname(schema["name"], schema.get("namespace", ns))
            names[full] = schema
            names.setdefault(schema["name"].rsplit(".", 1)[-1], schema)
            ns = full.rpartition(".")[0]
            for f in schema.get("fields", ()):
                _collect_names(f["type"], names, ns)
        elif kind == "array":
            _collect_names(schema["items"], names, ns)
        elif kind == "map":
            _collect_names(schema["values"], names, ns)
        elif isinstance(kind, dict | list):
            _collect_names(kind, names, ns)
    return names


def _fullname(name: str, namespace: str | None) -> str:
    return name if "." in name or not namespace else f"{namespace}.{name}"


def _short(name: str) -> str:
    return name.rsplit(".", 1)[-1]


class _Checker:
    def __init__(self, wnames: dict[str, Any], rnames: dict[str, Any]) -> None:
        self.wnames, self.rnames = wnames, rnames
        self.problems: list[str] = []
        self._seen: set[tuple[str, str]] = set()

    @staticmethod
    def _resolve(schema: Any, names: dict[str, Any]) -> Any:
        while True:
            if isinstance(schema, str) and schema not in _PRIMITIVES:
                if schema not in names:
                    raise ValueError(f"unknown named type {schema!r}")
                schema = names[schema]
            elif isinstance(schema, dict) and not isinstance(schema.get("type"), str | type(None)):
                schema = schema["type"]  # {"type": [...]} or {"type": {...}}
            elif isinstance(schema, dict) and schema["type"] not in _NAMED | {"array", "map"}:
                schema = schema["type"]  # {"type": "string", "logicalType": ...} or {"type": "a.Name"}
            else:
                return schema

    @staticmethod
    def _kind(schema: Any) -> str:
        if isinstance(schema, list):
            return "union"
        if isinstance(schema, str):
            return schema
        return str(schema["type"])

    def _name(self, schema: Any) -> str:
        return str(schema["name"]) if isinstance(schema, dict) and "name" in schema else self._kind(schema)

    def _matches(self, w: Any, r: Any) -> bool:
        """Whether reader branch ``r`` is the one a writer value of schema ``w`` resolves to."""
        wk, rk = self._kind(w), self._kind(r)
        if wk in _NAMED or rk in _NAMED:
            return wk == rk and self._same_name(w, r)
        return wk == rk or (wk, rk) in _PROMOTIONS

    @staticmethod
    def _same_name(w: dict[str, Any], r: dict[str, Any]) -> bool:
        wname = w["name"]
        return (
            _short(wname) == _short(r["name"])
            or wname in r.get("aliases", ())
            or _short(wname) in r.get("aliases", ())
        )

    def check(self, writer: Any, reader: Any, path: str) -> None:
        w = self._resolve(writer, self.wnames)
        r = self._resolve(reader, self.rnames)
        wk, rk = self._kind(w), self._kind(r)
        if wk == "union":
            for branch in w:
                b = self._resolve(branch, self.wnames)
                self.check(b, r, f"{path}<{self._name(b)}>")
            return
        if rk == "union":
            for branch in r:
                b = self._resolve(branch, self.rnames)
                if self._matches(w, b):
                    self.check(w, b, path)
                    return
            self.problems.append(f"{path}: writer type {self._name(w)} is not in the reader union")
            return
        if not self._matches(w, r):
            self.problems.append(f"{path}: writer {self._name(w)} cannot be read as {self._name(r)}")
            return
        if wk in ("record", "error"):
            key = (w["name"], r["name"])
            if key in self._seen:
                return
            self._seen.add(key)
            wfields = {f["name"]: f for f in w["fields"]}
            for rf in r["fields"]:
                wf = wfields.get(rf["name"]) or next(
                    (wfields[a] for a in rf.get("aliases", ()) if a in wfields), None
                )
                if wf is not None:
                    self.check(wf["type"], rf["type"], f"{path}.{rf['name']}")
                elif "default" not in rf:
                    self.problems.append(
                        f"{path}.{rf['name']}: new reader field without a default (old data lacks it)"
                    )
        elif wk == "enum":
            missing = [s for s in w["symbols"] if s not in r["symbols"]]
            if missing and "default" not in r:
                self.problems.append(f"{path}: enum symbols {missing} unknown to the reader (and no enum default)")
        elif wk == "fixed":
            if w["size"] != r["size"]:
                self.problems.append(f"{path}: fixed size {w['size']} != {r['size']}")
        elif wk == "array":
            self.check(w["items"], r["items"], f"{path}[]")
        elif wk == "map":
            self.check(w["values"], r["values"], f"{path}{{}}")
