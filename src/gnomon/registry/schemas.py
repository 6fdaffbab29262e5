"""Parsing a registered or submitted schema into a self-contained one.

A version's schema may use named types of other subjects through Confluent references
(gnomon's ``gnomon.JobSpec``); :func:`resolve` inlines them with the codec's own
:func:`gnomon.codec.registry.build_schema`, so the registry and the codec parse alike.
:func:`identity` is what two schemas must share to be "the same schema" (register is
idempotent, lookup finds it): the canonical JSON of the resolved schema, so a schema
sent with its references inlined matches the version that references them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gnomon.codec import registry as codec_registry
from gnomon.registry.errors import INVALID_SCHEMA, ApiError
from gnomon.registry.state import Ref, State, Version


def _codec_view(state: State) -> codec_registry.Registry:
    """``state`` as the codec's Registry (what build_schema looks references up in)."""
    versions = {
        v.id: codec_registry.SchemaVersion(
            id=v.id, subject=v.subject, version=v.version, file="", sha256="",
            references=tuple(codec_registry.Reference(r.name, r.subject, r.version) for r in v.references),
            raw=json.loads(v.schema), schema=None,
        )
        for v in state.by_id.values()
    }
    return codec_registry.Registry(Path("."), versions)


def resolve(state: State, schema: str, references: tuple[Ref, ...]) -> Any:
    """The self-contained parsed schema (fastavro's form, internal keys removed).

    Raises :class:`ApiError` 422 (invalid schema) for bad JSON, an invalid Avro schema
    or a reference to a subject version that does not exist."""
    try:
        raw = json.loads(schema)
    except ValueError as exc:
        raise ApiError(422, INVALID_SCHEMA, f"Invalid schema: not JSON ({exc})") from exc
    for ref in references:
        if state.version(ref.subject, ref.version) is None:
            raise ApiError(422, INVALID_SCHEMA,
                           f"Invalid schema: reference {ref.name} names {ref.subject} version {ref.version}, "
                           "which does not exist")
    refs = tuple(codec_registry.Reference(r.name, r.subject, r.version) for r in references)
    try:
        parsed = codec_registry.build_schema(raw, refs, _codec_view(state))
    except Exception as exc:  # fastavro's SchemaParseException, UnknownType, RegistryError, ...
        raise ApiError(422, INVALID_SCHEMA, f"Invalid schema: {exc}") from exc
    return strip(parsed)


def resolve_version(state: State, v: Version) -> Any:
    return resolve(state, v.schema, v.references)


def strip(schema: Any) -> Any:
    """``schema`` without fastavro's internal ``__...`` keys (plain Avro JSON again)."""
    if isinstance(schema, dict):
        return {k: strip(x) for k, x in schema.items() if not k.startswith("__")}
    if isinstance(schema, list):
        return [strip(x) for x in schema]
    return schema


def identity(resolved: Any) -> str:
    """Canonical JSON of a resolved schema: equal for the same schema however written."""
    return json.dumps(resolved, sort_keys=True, separators=(",", ":"))
