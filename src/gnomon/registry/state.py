"""The registry as data: subject versions with their global ids, compatibility settings,
the records of the Kafka store, and the import of the checked-in registry.

Every change is a :class:`Record`; :func:`apply` folds one into a :class:`State`, so the
state after a restart is the fold of the store topic. Records are JSON, keyed like
Confluent's ``_schemas`` topic (``{"keytype": "SCHEMA", "subject": ..., "version": ...}``,
``{"keytype": "CONFIG", "subject": ...}``), so compaction keeps the last of each.

Ids: gnomon's own ids (``schemas/avro/registry.json``) are below :data:`OUTSIDE_MIN_ID`
and stay exactly as checked in; a schema registered through the API gets the next id
above every id known and at least :data:`OUTSIDE_MIN_ID`, so gnomon's future ids never
collide with another service's.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gnomon.codec import registry as checked_in
from gnomon.registry.errors import StoreMismatch

OUTSIDE_MIN_ID = 1000
"""The first id handed to a schema registered through the API; checked-in ids stay below."""

DEFAULT_COMPATIBILITY = "FULL_TRANSITIVE"


@dataclass(frozen=True)
class Ref:
    """A Confluent schema reference: the named type ``name`` comes from ``subject`` ``version``."""

    name: str
    subject: str
    version: int

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "subject": self.subject, "version": self.version}


@dataclass(frozen=True)
class Version:
    """One version of one subject: its global id and the schema text as registered."""

    subject: str
    version: int
    id: int
    schema: str  # the schema's JSON text, as registered (a checked-in .avsc file verbatim)
    references: tuple[Ref, ...] = ()


@dataclass(frozen=True)
class Record:
    """One record of the store topic: a subject version, or a compatibility setting
    (``subject`` None: the global one)."""

    keytype: str  # "SCHEMA" | "CONFIG"
    subject: str | None
    version: Version | None = None
    compatibility: str | None = None

    def key(self) -> bytes:
        doc: dict[str, Any] = {"keytype": self.keytype, "subject": self.subject}
        if self.version is not None:
            doc["version"] = self.version.version
        return _dumps(doc)

    def value(self) -> bytes:
        if self.version is not None:
            v = self.version
            return _dumps({"subject": v.subject, "version": v.version, "id": v.id, "schema": v.schema,
                           "references": [r.to_json() for r in v.references]})
        return _dumps({"compatibilityLevel": self.compatibility})


def schema_record(v: Version) -> Record:
    return Record("SCHEMA", v.subject, version=v)


def config_record(subject: str | None, level: str) -> Record:
    return Record("CONFIG", subject, compatibility=level)


def _dumps(doc: Mapping[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def parse_record(key: bytes, value: bytes | None) -> Record:
    """A store record from its Kafka key and value; ValueError if it is not one."""
    try:
        k = json.loads(key)
        keytype, subject = k["keytype"], k.get("subject")
        if value is None:
            raise ValueError("a tombstone (the registry never deletes)")
        doc = json.loads(value)
        if keytype == "SCHEMA":
            refs = tuple(Ref(str(r["name"]), str(r["subject"]), int(r["version"])) for r in doc.get("references", []))
            version = Version(str(doc["subject"]), int(doc["version"]), int(doc["id"]), str(doc["schema"]), refs)
            if (version.subject, version.version) != (subject, k.get("version")):
                raise ValueError(f"key {k} does not match its value ({version.subject} v{version.version})")
            return Record("SCHEMA", version.subject, version=version)
        if keytype == "CONFIG":
            return Record("CONFIG", subject, compatibility=str(doc["compatibilityLevel"]))
        raise ValueError(f"unknown keytype {keytype!r}")
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"not a registry record (key {key[:200]!r}): {exc}") from exc


@dataclass(frozen=True)
class State:
    by_id: Mapping[int, Version] = field(default_factory=dict)
    subjects: Mapping[str, tuple[Version, ...]] = field(default_factory=dict)  # oldest first
    compatibility: Mapping[str | None, str] = field(default_factory=dict)  # None: global

    def versions(self, subject: str) -> tuple[Version, ...]:
        return self.subjects.get(subject, ())

    def version(self, subject: str, version: int) -> Version | None:
        return next((v for v in self.versions(subject) if v.version == version), None)

    def level(self, subject: str | None = None) -> str:
        """The subject's compatibility level, else the global one, else FULL_TRANSITIVE."""
        if subject is not None and subject in self.compatibility:
            return self.compatibility[subject]
        return self.compatibility.get(None, DEFAULT_COMPATIBILITY)

    def next_id(self) -> int:
        """The id for a schema registered through the API."""
        return max(OUTSIDE_MIN_ID, max(self.by_id, default=0) + 1)

    def next_version(self, subject: str) -> int:
        return max((v.version for v in self.versions(subject)), default=0) + 1


def apply(state: State, record: Record) -> State:
    """``state`` with ``record`` applied. A subject version already present is replaced
    (compaction may keep either copy of a rewritten record; they are equal)."""
    if record.version is not None:
        v = record.version
        by_id = {**state.by_id, v.id: v}
        kept = tuple(x for x in state.versions(v.subject) if x.version != v.version)
        versions = tuple(sorted((*kept, v), key=lambda x: x.version))
        return replace(state, by_id=by_id, subjects={**state.subjects, v.subject: versions})
    assert record.compatibility is not None
    return replace(state, compatibility={**state.compatibility, record.subject: record.compatibility})


def fold(records: Iterable[Record], state: State | None = None) -> State:
    state = State() if state is None else state
    for r in records:
        state = apply(state, r)
    return state


# --- the checked-in registry ---------------------------------------------------------


def checked_in_versions(directory: Path | None = None) -> list[Version]:
    """Every version of ``schemas/avro/registry.json``, with its id, in id order; the
    schema text is the .avsc file verbatim."""
    reg = checked_in.load_registry(directory)
    out = []
    for sv in reg:
        text = (reg.directory / sv.file).read_text()
        refs = tuple(Ref(r.name, r.subject, r.version) for r in sv.references)
        out.append(Version(sv.subject, sv.version, sv.id, text, refs))
    return out


def import_checked_in(state: State, versions: Iterable[Version]) -> list[Record]:
    """The records that bring the checked-in ``versions`` into ``state``: the ones the
    store lacks. Raises :class:`StoreMismatch` naming the first contradiction (an id, or
    a subject version, that the store holds with other contents): checked-in ids are
    canonical, so the store must agree with them or the registry does not start."""
    missing: list[Record] = []
    for v in versions:
        if v.id >= OUTSIDE_MIN_ID:
            raise StoreMismatch(f"checked-in schema id {v.id} ({v.subject} v{v.version}) is not below "
                                f"{OUTSIDE_MIN_ID}, the first id of schemas registered through the API")
        stored = state.by_id.get(v.id)
        same_slot = state.version(v.subject, v.version)
        if stored is not None and stored != v:
            raise StoreMismatch(
                f"schema id {v.id} is {stored.subject} v{stored.version} in the store but {v.subject} "
                f"v{v.version} in registry.json" if (stored.subject, stored.version) != (v.subject, v.version)
                else f"schema id {v.id} ({v.subject} v{v.version}) differs between the store and "
                     "registry.json (schema text or references)")
        if same_slot is not None and same_slot.id != v.id:
            raise StoreMismatch(f"{v.subject} v{v.version} is schema id {same_slot.id} in the store but "
                                f"{v.id} in registry.json")
        if stored is None:
            missing.append(schema_record(v))
    return missing


def own_subjects(versions: Iterable[Version]) -> frozenset[str]:
    """gnomon's subjects, read-only through the API: those with a version of gnomon's own
    (an id below OUTSIDE_MIN_ID), including ones a newer release wrote to the store."""
    return frozenset(v.subject for v in versions if v.id < OUTSIDE_MIN_ID)
