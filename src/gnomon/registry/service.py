"""The registry's operations over a :class:`~gnomon.registry.state.State` and a store.

Every change is written to the store (the Kafka topic) *before* it is applied in memory,
so what the API answered is what a restart reads back. One process is the only writer
(``gnomon infra up`` starts one); a lock serialises registrations within it.

gnomon's own subjects (those of ``schemas/avro/registry.json``) are read-only through
the API: their versions come from the checked-in files, and registering the very same
schema again just returns its id. Their compatibility level is :data:`OWN_LEVEL`, the
rule ``python -m gnomon.codec register`` holds them to (their history is not all
forward compatible), so ``POST /compatibility`` pre-checks a gnomon schema change as
the checked-in registry will.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, Protocol

from gnomon.core.errors import InfraError
from gnomon.registry import compat, schemas
from gnomon.registry.errors import (
    INCOMPATIBLE,
    INVALID_COMPATIBILITY,
    INVALID_SCHEMA,
    INVALID_VERSION,
    OPERATION_NOT_PERMITTED,
    SCHEMA_NOT_FOUND,
    STORE_ERROR,
    SUBJECT_NOT_FOUND,
    VERSION_NOT_FOUND,
    ApiError,
)
from gnomon.registry.state import Record, Ref, State, Version, apply, config_record, schema_record

VERSION_MAX = 2**31 - 1
OWN_LEVEL = "BACKWARD_TRANSITIVE"
RESERVED_PREFIX = "gnomon."  # subjects only gnomon's checked-in schemas may fill


class Store(Protocol):
    def append(self, records: Sequence[Record]) -> None:
        """Write ``records`` durably (acknowledged by Kafka) or raise InfraError."""


class MemoryStore:
    """A store in a list (unit tests; and what a restart would read back)."""

    def __init__(self, records: Sequence[Record] = ()) -> None:
        self.records: list[Record] = list(records)

    def append(self, records: Sequence[Record]) -> None:
        self.records.extend(records)


def parse_version(raw: str) -> int | None:
    """A version path segment: an int in [1, 2^31-1], or None for "latest" (and -1)."""
    if raw in ("latest", "-1"):
        return None
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if not 1 <= n <= VERSION_MAX:
        raise ApiError(422, INVALID_VERSION, f"The specified version '{raw}' is not a valid version id. "
                                             'Allowed values are between [1, 2^31-1] and the string "latest"')
    return n


class Registry:
    def __init__(self, state: State, store: Store, own_subjects: frozenset[str] = frozenset()) -> None:
        self.state = state
        self.store = store
        self.own_subjects = own_subjects
        # an id whose write failed may still reach the store (a timed-out produce stays
        # queued): never hand it out again in this process
        self._id_floor = 0
        self._lock = threading.Lock()
        self._resolved: dict[int, Any] = {}

    # --- reads ---------------------------------------------------------------------

    def subjects(self) -> list[str]:
        return sorted(self.state.subjects)

    def _versions(self, subject: str) -> tuple[Version, ...]:
        versions = self.state.versions(subject)
        if not versions:
            raise ApiError(404, SUBJECT_NOT_FOUND, f"Subject '{subject}' not found.")
        return versions

    def versions(self, subject: str) -> list[int]:
        return [v.version for v in self._versions(subject)]

    def version(self, subject: str, raw_version: str) -> Version:
        wanted = parse_version(raw_version)
        versions = self._versions(subject)
        if wanted is None:
            return versions[-1]
        found = next((v for v in versions if v.version == wanted), None)
        if found is None:
            raise ApiError(404, VERSION_NOT_FOUND, f"Version {wanted} not found.")
        return found

    def by_id(self, schema_id: int) -> Version:
        v = self.state.by_id.get(schema_id)
        if v is None:
            raise ApiError(404, SCHEMA_NOT_FOUND, f"Schema {schema_id} not found")
        return v

    def resolved(self, schema_id: int) -> Any:
        """The self-contained schema of ``schema_id`` (references inlined)."""
        if schema_id not in self._resolved:
            self._resolved[schema_id] = schemas.resolve_version(self.state, self.by_id(schema_id))
        return self._resolved[schema_id]

    def subject_versions_of(self, schema_id: int) -> list[Version]:
        """Every subject version with this id (one: ids are not shared between subjects)."""
        return [self.by_id(schema_id)]

    def lookup(self, subject: str, schema: str, references: tuple[Ref, ...], schema_type: str | None) -> Version:
        """The version of ``subject`` that is this schema (``POST /subjects/{s}``)."""
        versions = self._versions(subject)
        found = self._same(versions, self._resolve_submitted(schema, references, schema_type))
        if found is None:
            raise ApiError(404, SCHEMA_NOT_FOUND, "Schema not found")
        return found

    def level(self, subject: str | None = None) -> str:
        if subject is not None and self.is_own(subject):
            return OWN_LEVEL
        return self.state.level(subject)

    def is_own(self, subject: str) -> bool:
        """gnomon's subjects, registered or not: every name under ``gnomon.`` is reserved,
        so a later release's new subject can never meet an outsider's version of it."""
        return subject in self.own_subjects or subject.startswith(RESERVED_PREFIX)

    def mode(self, subject: str | None = None) -> str:
        return "READONLY" if subject is not None and self.is_own(subject) else "READWRITE"

    # --- checks --------------------------------------------------------------------

    def _resolve_submitted(self, schema: str, references: tuple[Ref, ...], schema_type: str | None) -> Any:
        if schema_type not in (None, "", "AVRO"):
            raise ApiError(422, INVALID_SCHEMA, f"Invalid schema: only AVRO schemas are supported, not {schema_type}")
        return schemas.resolve(self.state, schema, references)

    def _same(self, versions: Sequence[Version], resolved: Any) -> Version | None:
        ident = schemas.identity(resolved)
        return next((v for v in versions if schemas.identity(self.resolved(v.id)) == ident), None)

    def problems(self, subject: str, resolved: Any, level: str, upto: Version | None = None) -> list[str]:
        versions = self.state.versions(subject)
        if upto is not None:
            versions = tuple(v for v in versions if v.version <= upto.version)
        return compat.problems(level, resolved, [(v.version, self.resolved(v.id)) for v in versions])

    def test_compatibility(
        self, subject: str, raw_version: str | None, schema: str, references: tuple[Ref, ...],
        schema_type: str | None,
    ) -> list[str]:
        """Why ``schema`` is not compatible (``POST /compatibility/subjects/{s}/versions[/{v}]``):
        with one version at the subject's level but not transitively, or, without a
        version, with every version the level asks for."""
        resolved = self._resolve_submitted(schema, references, schema_type)
        level = self.level(subject)
        if raw_version is None:
            return self.problems(subject, resolved, level)
        if not self.state.versions(subject) and parse_version(raw_version) is None:
            return []  # nothing registered yet: anything is compatible with "latest"
        one = self.version(subject, raw_version)
        return compat.problems(level.removesuffix("_TRANSITIVE"), resolved, [(one.version, self.resolved(one.id))])

    # --- writes --------------------------------------------------------------------

    def _write(self, records: Sequence[Record]) -> None:
        try:
            self.store.append(records)
        except InfraError as exc:
            ids = [r.version.id for r in records if r.version is not None]
            self._id_floor = max([self._id_floor, *(i + 1 for i in ids)])
            raise ApiError(500, STORE_ERROR, f"Error while registering: the store refused the write: {exc}") from exc
        for r in records:
            self.state = apply(self.state, r)

    def register(self, subject: str, schema: str, references: tuple[Ref, ...], schema_type: str | None) -> Version:
        """Register ``schema`` as the next version of ``subject`` (idempotent)."""
        with self._lock:
            resolved = self._resolve_submitted(schema, references, schema_type)
            same = self._same(self.state.versions(subject), resolved)
            if same is not None:
                return same
            if self.is_own(subject):
                raise ApiError(422, OPERATION_NOT_PERMITTED,
                               f"Subject {subject} is in read-only mode: it is gnomon's own ({RESERVED_PREFIX}* is "
                               "reserved), its versions come from gnomon's checked-in schemas "
                               "(schemas/avro/registry.json)")
            level = self.level(subject)
            problems = self.problems(subject, resolved, level)
            if problems:
                raise ApiError(409, INCOMPATIBLE,
                               f'Schema being registered is incompatible with an earlier schema for subject '
                               f'"{subject}" ({level}), details: {problems}')
            v = Version(subject, self.state.next_version(subject), max(self.state.next_id(), self._id_floor),
                        schema, references)
            self._write([schema_record(v)])
            self._resolved[v.id] = resolved
            return v

    def set_level(self, subject: str | None, level: str) -> str:
        if level not in compat.LEVELS:
            raise ApiError(422, INVALID_COMPATIBILITY,
                           f"Invalid compatibility level {level!r}; valid values are {', '.join(compat.LEVELS)}")
        if subject is not None and self.is_own(subject):
            raise ApiError(422, OPERATION_NOT_PERMITTED,
                           f"Subject {subject} is in read-only mode: it is gnomon's own, held to {OWN_LEVEL} "
                           "by python -m gnomon.codec register")
        with self._lock:
            self._write([config_record(subject, level)])
        return level
