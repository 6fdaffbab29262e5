"""A schema source over the schema registry's HTTP API: how a process of an older release
reads records a newer release wrote with a schema id it was not packaged with.

``Codec.decode`` meets such an id during a rolling upgrade (schemas/README.md, "Rolling
out"). With this source installed (``install_registry_source``, at the start of every
long-running process) it asks the registry, as Confluent's deserializers do:

- ``GET /schemas/ids/{id}?format=resolved``: the writer's schema, self-contained;
- ``GET /schemas/ids/{id}/versions``: its subject and version,

as the registry's read-only user (``registry.auth``: HTTP Basic,
``credentials/registry-reader.json``), each request bounded by ``timeout_s``. The codec
then reads the id's records with its own latest version of the subject (Avro schema
resolution) and keeps the reader: one question per id and process. A known id never
touches the network, and a registry that does not answer costs a ``DecodeError`` (the
record goes to gnomon.poison, as without the source) and a question again after
``RETRY_AFTER_S``.

``$GNOMON_CODEC_FETCH_UNKNOWN=0`` turns it off.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import httpx

from gnomon.codec._codec import RETRY_AFTER_S_DEFAULT, Codec, FetchedSchema
from gnomon.core.errors import InfraError

if TYPE_CHECKING:
    from gnomon.config import Settings

FETCH_UNKNOWN_ENV = "GNOMON_CODEC_FETCH_UNKNOWN"
TIMEOUT_S = 2.0  # each request's (connect, read, write, pool) timeout
RETRY_AFTER_S = RETRY_AFTER_S_DEFAULT
SCHEMA_NOT_FOUND = 40403  # Confluent's error_code of a 404 for an id it does not have
_OFF = frozenset({"0", "false", "no", "off"})
_ON = frozenset({"", "1", "true", "yes", "on"})

log = logging.getLogger("gnomon.codec")


class SchemaFetchError(InfraError):
    """The registry did not give the schema: unreachable, refused, or an unexpected answer."""


class Response(Protocol):
    @property
    def status_code(self) -> int: ...

    @property
    def content(self) -> bytes: ...


class HttpClient(Protocol):
    """What the source sends with: an ``httpx.Client`` (or a starlette TestClient)."""

    def get(self, url: str, *, params: Mapping[str, str] | None = None,
            auth: tuple[str, str] | None = None) -> Response: ...


@dataclass(frozen=True)
class RegistrySchemaSource:
    """``SchemaSource`` over the registry at ``url`` (Confluent's REST API).

    ``auth``: (user, password) for HTTP Basic, None for none; ``timeout_s``: each
    request's timeout; ``client``: a client to send with instead, with its own timeout
    (tests: a starlette TestClient over the registry app)."""

    url: str
    auth: tuple[str, str] | None = field(default=None, repr=False)
    timeout_s: float = TIMEOUT_S
    client: HttpClient | None = field(default=None, repr=False, compare=False)

    def fetch(self, schema_id: int) -> FetchedSchema | None:
        schema_doc = self._get(f"/schemas/ids/{schema_id}", {"format": "resolved"})
        if schema_doc is None:
            return None
        versions_doc = self._get(f"/schemas/ids/{schema_id}/versions")
        if versions_doc is None:
            return None
        return fetched_schema(schema_id, schema_doc, versions_doc)

    def _get(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        """The JSON answer of ``GET path``; None for Confluent's "schema not found"."""
        url = self.url.rstrip("/") + path
        try:
            response: Response
            if self.client is not None:
                response = self.client.get(url, params=params, auth=self.auth)
            else:
                response = httpx.get(url, params=params, auth=self.auth, timeout=self.timeout_s)
        except httpx.HTTPError as e:
            raise SchemaFetchError(f"GET {url}: {type(e).__name__}: {e}") from e
        return answer(path, response.status_code, response.content)


def answer(path: str, status: int, body: bytes) -> Any:
    """The JSON of a registry's answer to ``GET path``; None when it is a 404 "schema not
    found"; else SchemaFetchError saying what it was."""
    try:
        doc = json.loads(body)
    except ValueError:  # (UnicodeDecodeError too)
        doc = None
    if status == 404 and isinstance(doc, dict) and doc.get("error_code") == SCHEMA_NOT_FOUND:
        return None
    if status != 200:
        message = doc.get("message") if isinstance(doc, dict) else None
        raise SchemaFetchError(f"GET {path} answered {status}" + (f": {message}" if message else ""))
    if doc is None:
        raise SchemaFetchError(f"GET {path} answered 200 without JSON")
    return doc


def fetched_schema(schema_id: int, schema_doc: Any, versions_doc: Any) -> FetchedSchema:
    """The answers of ``/schemas/ids/{id}?format=resolved`` (``{"schema": "<json>"}``) and
    ``/schemas/ids/{id}/versions`` (``[{"subject": ..., "version": ...}]``) as one
    FetchedSchema: the first subject version (gnomon's registry gives an id one subject)."""
    schema = schema_doc.get("schema") if isinstance(schema_doc, dict) else None
    if not isinstance(schema, str):
        raise SchemaFetchError(f"/schemas/ids/{schema_id} answered without a schema string")
    first = versions_doc[0] if isinstance(versions_doc, list) and versions_doc else None
    subject = first.get("subject") if isinstance(first, dict) else None
    version = first.get("version") if isinstance(first, dict) else None
    if not isinstance(subject, str) or not isinstance(version, int) or isinstance(version, bool):
        raise SchemaFetchError(f"/schemas/ids/{schema_id}/versions answered without a subject and version")
    return FetchedSchema(subject, version, schema)


def fetch_unknown(env: Mapping[str, str]) -> bool:
    """``$GNOMON_CODEC_FETCH_UNKNOWN``: on unless 0/false/no/off."""
    raw = env.get(FETCH_UNKNOWN_ENV, "").strip().lower()
    if raw in _OFF:
        return False
    if raw in _ON:
        return True
    raise SystemExit(f"gnomon: {FETCH_UNKNOWN_ENV}={raw!r} must be 1 (ask the schema registry for unknown schema "
                     "ids, the default) or 0")


def registry_auth(settings: Settings) -> tuple[str, str] | None:
    """The registry's read-only user from the credentials directory (never made here: a
    password this process invented would not be the registry's); None if there is none."""
    from gnomon import credentials

    try:
        cred = credentials.read(settings.credentials_dir, credentials.REGISTRY_READER)
    except credentials.CredentialError as e:
        log.warning("schema registry: %s; unknown schema ids are asked for without credentials", e)
        return None
    return None if cred is None else (cred.username, cred.password)


def install_registry_source(settings: Settings | None = None, codec: Codec | None = None) -> RegistrySchemaSource | None:
    """Let ``codec`` (the process-wide ``gnomon.codec.default_codec``) ask the schema registry
    (``Settings.registry_url``) for schema ids it does not know; None, and nothing changed,
    when ``$GNOMON_CODEC_FETCH_UNKNOWN`` is 0. No network here: the first unknown id asks."""
    if not fetch_unknown(os.environ):
        return None
    if settings is None:
        from gnomon.config import load

        settings = load()
    if codec is None:
        from gnomon.codec import default_codec

        codec = default_codec
    source = RegistrySchemaSource(settings.registry_url, registry_auth(settings))
    codec.use_schema_source(source, retry_after_s=RETRY_AFTER_S)
    log.debug("unknown schema ids are asked of the schema registry at %s (%s=0: not)", source.url,
              FETCH_UNKNOWN_ENV)
    return source
