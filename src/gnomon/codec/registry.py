"""The checked-in schema registry: ``schemas/avro/registry.json`` and its ``.avsc`` files.

``registry.json`` maps a schema id (the 4 bytes after the magic byte on the wire) to one
version of one subject::

    {"schemas": {"5": {"subject": "gnomon.runs-value", "version": 1,
                       "file": "RunState.v1.avsc", "sha256": "...",
                       "references": [{"name": "gnomon.JobSpec",
                                       "subject": "gnomon.JobSpec", "version": 1}]}}}

``references`` are Confluent-style schema references: the named types the file uses but
does not define (e.g. ``gnomon.JobSpec``) come from that subject's version. Every
version is loaded into a *self-contained* parsed schema (references inlined at their
first use), so fastavro needs no shared named-type table and schema resolution between
two versions works like between two unrelated files.

Registered files are immutable: ``sha256`` pins their bytes (see schemas/README.md).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from fastavro import parse_schema

from gnomon._data import AVRO, data_path
from gnomon.core.errors import InternalError

Schema = Any  # a JSON-like Avro schema: str | list | dict

_NAMED = ("record", "enum", "fixed", "error")


def default_schema_dir() -> Path:
    """``$GNOMON_AVRO_DIR``, or the registry packaged with gnomon (``gnomon/_data/avro``:
    in a checkout a symlink to ``schemas/avro``, in a wheel a copy of it)."""
    env = os.environ.get("GNOMON_AVRO_DIR")
    if env:
        return Path(env)
    return data_path(AVRO)


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass(frozen=True)
class Reference:
    name: str  # the named type used, e.g. "gnomon.JobSpec" (informational, like Confluent)
    subject: str
    version: int


@dataclass(frozen=True)
class SchemaVersion:
    id: int
    subject: str
    version: int
    file: str
    sha256: str
    references: tuple[Reference, ...]
    raw: Schema = field(repr=False, compare=False)  # the file's JSON, as written
    schema: Schema = field(repr=False, compare=False)  # parsed, self-contained


class RegistryError(InternalError):
    """registry.json or a schema file is malformed (a build error, not a data error)."""


class Registry:
    def __init__(self, directory: Path, versions: Mapping[int, SchemaVersion]) -> None:
        self.directory = directory
        self.by_id: dict[int, SchemaVersion] = dict(versions)
        self._by_subject: dict[str, list[SchemaVersion]] = {}
        for v in sorted(self.by_id.values(), key=lambda v: v.version):
            self._by_subject.setdefault(v.subject, []).append(v)

    def subjects(self) -> list[str]:
        return sorted(self._by_subject)

    def versions(self, subject: str) -> list[SchemaVersion]:
        """Every registered version of ``subject``, oldest first."""
        return list(self._by_subject[subject])

    def latest(self, subject: str) -> SchemaVersion:
        return self._by_subject[subject][-1]

    def lookup(self, subject: str, version: int) -> SchemaVersion:
        for v in self._by_subject.get(subject, ()):
            if v.version == version:
                return v
        raise RegistryError(f"no version {version} of subject {subject!r}")

    def __iter__(self) -> Iterator[SchemaVersion]:
        return iter(sorted(self.by_id.values(), key=lambda v: v.id))


def load_registry(directory: Path | None = None) -> Registry:
    directory = directory or default_schema_dir()
    try:
        doc = json.loads((directory / "registry.json").read_text())
        entries = {int(k): v for k, v in doc["schemas"].items()}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise RegistryError(f"cannot read {directory / 'registry.json'}: {e}") from e
    loaded: dict[int, SchemaVersion] = {}
    # A version may only reference versions with a smaller id (registered before it).
    for sid, entry in sorted(entries.items()):
        try:
            refs = tuple(Reference(r["name"], r["subject"], int(r["version"])) for r in entry.get("references", []))
            raw = json.loads((directory / entry["file"]).read_text())
            version = SchemaVersion(
                id=sid, subject=entry["subject"], version=int(entry["version"]), file=entry["file"],
                sha256=entry.get("sha256", ""), references=refs, raw=raw, schema=None,
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise RegistryError(f"schema id {sid}: {exc}") from exc
        try:
            schema = build_schema(raw, refs, Registry(directory, loaded))
        except RegistryError:
            raise
        except Exception as exc:  # fastavro's SchemaParseException, UnknownType, ...
            raise RegistryError(f"schema id {sid} ({entry['file']}): {exc}") from exc
        loaded[sid] = replace(version, schema=schema)
    return Registry(directory, loaded)


def build_schema(raw: Schema, references: tuple[Reference, ...], registry: Registry) -> Schema:
    """Parse ``raw`` with its references and return a self-contained parsed schema."""
    named: dict[str, Any] = {}
    _load_references(references, registry, named, seen={})
    parsed = parse_schema(copy.deepcopy(raw), named)
    expanded = _inline(parsed, named, defined=set())
    return parse_schema(expanded)


def _load_references(
    refs: tuple[Reference, ...], registry: Registry, named: dict[str, Any], seen: dict[str, int]
) -> None:
    for ref in refs:
        if ref.subject in seen:
            if seen[ref.subject] != ref.version:
                raise RegistryError(f"two versions of {ref.subject} referenced: {seen[ref.subject]} and {ref.version}")
            continue
        seen[ref.subject] = ref.version
        target = registry.lookup(ref.subject, ref.version)
        _load_references(target.references, registry, named, seen)
        parse_schema(copy.deepcopy(target.raw), named)


def _inline(schema: Schema, named: Mapping[str, Any], defined: set[str]) -> Schema:
    """Replace the first use of each referenced name by its definition (depth first)."""
    if isinstance(schema, str):
        if schema in named and schema not in defined:
            return _inline(named[schema], named, defined)
        return schema
    if isinstance(schema, list):
        return [_inline(s, named, defined) for s in schema]
    if isinstance(schema, dict):
        kind = schema.get("type")
        if kind in _NAMED:
            name = schema["name"]
            if name in defined:
                return name
            defined.add(name)
        out: dict[str, Any] = {}
        for k, v in schema.items():
            if k.startswith("__"):
                continue
            if k == "type" or k == "items" or k == "values":
                out[k] = _inline(v, named, defined)
            elif k == "fields":
                out[k] = [{**f, "type": _inline(f["type"], named, defined)} for f in v]
            else:
                out[k] = copy.deepcopy(v)
        return out
    return schema
