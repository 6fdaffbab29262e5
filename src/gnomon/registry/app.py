"""The HTTP routes: the subset of Confluent Schema Registry's REST API that serializers
and deserializers (confluent-kafka, Java's ``KafkaAvroSerializer``, Kafka Connect
converters) call. Bodies are JSON (``application/vnd.schemaregistry.v1+json``); an
error is ``{"error_code": <Confluent code>, "message": ...}`` with its HTTP status.

``GET /schemas/ids/{id}?format=resolved`` returns the schema with its references
inlined (one self-contained schema, ``references`` empty), as Confluent's does for Avro.

A browser on the same machine is the threat a loopback service forgets: every request
must name an allowed host (``Host``: loopback names by default, against DNS rebinding), a
write must carry exactly a JSON media type (not ``text/plain;json``, which a page on any
origin may send without a preflight), and a body is read up to ``BODY_MAX_BYTES``.
Every path but ``/`` wants a registry user, and registering or setting a compatibility
level the admin user (``registry.auth``).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Collection
from typing import Any
from urllib.parse import urlsplit

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gnomon.registry.auth import REALM, RegistryUsers
from gnomon.registry.errors import INVALID_SCHEMA, ApiError
from gnomon.registry.service import Registry
from gnomon.registry.state import Ref, Version

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
JSON_MEDIA_TYPES = frozenset({CONTENT_TYPE, "application/vnd.schemaregistry+json", "application/json"})
BODY_MAX_BYTES = 256 * 1024  # the largest checked-in schema is ~20 KB of JSON
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")

Handler = Callable[[Request], Awaitable[Response]]


def _json(doc: Any, status: int = 200) -> Response:
    return Response(json.dumps(doc), status_code=status, media_type=CONTENT_TYPE)


def _error(exc: ApiError) -> Response:
    response = _json({"error_code": exc.code, "message": exc.message}, exc.status)
    if exc.status == 401:
        response.headers["WWW-Authenticate"] = REALM
    return response


def _version_doc(v: Version) -> dict[str, Any]:
    doc: dict[str, Any] = {"subject": v.subject, "version": v.version, "id": v.id, "schema": v.schema}
    if v.references:
        doc["references"] = [r.to_json() for r in v.references]
    return doc


def _require_json(request: Request) -> None:
    """A write must say it is JSON, exactly: a web page can send a cross-site "simple"
    request (``text/plain``, a form, ``text/plain;json``) to 127.0.0.1 without asking first,
    but not one whose media type is JSON."""
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media not in JSON_MEDIA_TYPES:
        raise ApiError(415, 415, "Content-Type must be application/vnd.schemaregistry.v1+json or application/json")


async def _read_body(request: Request) -> bytes:
    """The body, refused past ``BODY_MAX_BYTES`` (413) whatever Content-Length claims."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > BODY_MAX_BYTES:
        raise ApiError(413, 413, f"request body over {BODY_MAX_BYTES} bytes")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > BODY_MAX_BYTES:
            raise ApiError(413, 413, f"request body over {BODY_MAX_BYTES} bytes")
    return bytes(body)


def _host_allowed(request: Request, allowed: Collection[str]) -> bool:
    try:
        host = urlsplit("//" + request.headers.get("host", "")).hostname
    except ValueError:
        return False
    return host is not None and host in allowed


async def _body(request: Request) -> tuple[str, tuple[Ref, ...], str | None]:
    """(schema, references, schemaType) of a register/lookup/compatibility request."""
    _require_json(request)
    try:
        doc = json.loads(await _read_body(request))
        schema = doc["schema"]
        if not isinstance(schema, str):
            raise TypeError("schema must be a string holding the schema's JSON")
        refs = tuple(Ref(str(r["name"]), str(r["subject"]), int(r["version"])) for r in doc.get("references") or [])
        schema_type = doc.get("schemaType")
    except (ValueError, KeyError, TypeError) as exc:
        raise ApiError(422, INVALID_SCHEMA, f"Invalid request body: {exc}") from exc
    return schema, refs, schema_type if isinstance(schema_type, str) else None


def _schema_id(request: Request) -> int:
    raw = request.path_params["id"]
    try:
        return int(raw)
    except ValueError as exc:
        raise ApiError(404, 40403, f"Schema {raw} not found") from exc


async def _http_error(_: Request, exc: Exception) -> Response:
    """Unknown paths and methods answer in Confluent's error shape too."""
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    return _json({"error_code": status, "message": f"HTTP {status} {getattr(exc, 'detail', '')}".strip()}, status)


def create_app(registry: Registry, allowed_hosts: Collection[str] = LOOPBACK_HOSTS,
               users: RegistryUsers | None = None) -> Starlette:
    """The app; ``allowed_hosts``: the names a request's ``Host`` may carry (port aside);
    ``users``: who may read and write (``registry.auth``; None: anyone, for tests of the
    other rules, and ``python -m gnomon.registry --no-auth``)."""
    hosts = frozenset(h.lower() for h in allowed_hosts)

    def route(path: str, fn: Callable[[Request], Awaitable[Any]], methods: list[str], *,
              writes: frozenset[str] = frozenset(), public: bool = False) -> Route:
        """``writes``: the methods that change the registry (the admin user only);
        ``public``: served without credentials."""
        async def endpoint(request: Request) -> Response:
            try:
                if not _host_allowed(request, hosts):
                    raise ApiError(421, 421, "Host not served here (allowed: " + ", ".join(sorted(hosts)) + ")")
                if users is not None and not public:
                    users.may(request.headers.get("authorization"), write=request.method in writes)
                result = await fn(request)
            except ApiError as exc:
                return _error(exc)
            return result if isinstance(result, Response) else _json(result)

        return Route(path, endpoint, methods=methods)

    r = registry

    async def root(_: Request) -> Any:
        return {}

    async def subjects(_: Request) -> Any:
        return r.subjects()

    async def versions(req: Request) -> Any:
        return r.versions(req.path_params["subject"])

    async def version(req: Request) -> Any:
        return _version_doc(r.version(req.path_params["subject"], req.path_params["version"]))

    async def version_schema(req: Request) -> Any:
        return Response(r.version(req.path_params["subject"], req.path_params["version"]).schema,
                        media_type=CONTENT_TYPE)

    async def register(req: Request) -> Any:
        schema, refs, schema_type = await _body(req)
        # a registration waits for Kafka's acknowledgement: off the event loop
        v = await run_in_threadpool(r.register, req.path_params["subject"], schema, refs, schema_type)
        return {"id": v.id, "version": v.version, "subject": v.subject}

    async def lookup(req: Request) -> Any:
        schema, refs, schema_type = await _body(req)
        return _version_doc(r.lookup(req.path_params["subject"], schema, refs, schema_type))

    async def by_id(req: Request) -> Any:
        sid = _schema_id(req)
        v = r.by_id(sid)
        if req.query_params.get("format") == "resolved":
            return {"schema": json.dumps(r.resolved(sid))}
        doc: dict[str, Any] = {"schema": v.schema}
        if v.references:
            doc["references"] = [ref.to_json() for ref in v.references]
        return doc

    async def by_id_schema(req: Request) -> Any:
        sid = _schema_id(req)
        if req.query_params.get("format") == "resolved":
            return Response(json.dumps(r.resolved(sid)), media_type=CONTENT_TYPE)
        return Response(r.by_id(sid).schema, media_type=CONTENT_TYPE)

    async def id_subjects(req: Request) -> Any:
        return [v.subject for v in r.subject_versions_of(_schema_id(req))]

    async def id_versions(req: Request) -> Any:
        return [{"subject": v.subject, "version": v.version} for v in r.subject_versions_of(_schema_id(req))]

    async def types(_: Request) -> Any:
        return ["AVRO"]

    async def _level_body(req: Request) -> str:
        _require_json(req)
        try:
            doc = json.loads(await _read_body(req))
            return str(doc["compatibility"]).upper()
        except (ValueError, KeyError, TypeError) as exc:
            raise ApiError(422, 42203, f'Invalid request body: expected {{"compatibility": LEVEL}} ({exc})') from exc

    async def config(req: Request) -> Any:
        subject = req.path_params.get("subject")
        if req.method == "PUT":
            return {"compatibility": await run_in_threadpool(r.set_level, subject, await _level_body(req))}
        return {"compatibilityLevel": r.level(subject)}

    async def compatibility(req: Request) -> Any:
        schema, refs, schema_type = await _body(req)
        problems = r.test_compatibility(req.path_params["subject"], req.path_params.get("version"), schema, refs,
                                        schema_type)
        doc: dict[str, Any] = {"is_compatible": not problems}
        if req.query_params.get("verbose", "").lower() == "true":
            doc["messages"] = problems
        return doc

    async def mode(req: Request) -> Any:
        return {"mode": r.mode(req.path_params.get("subject"))}

    return Starlette(exception_handlers={404: _http_error, 405: _http_error}, routes=[
        route("/", root, ["GET"], public=True),
        route("/subjects", subjects, ["GET"]),
        route("/subjects/{subject}/versions", versions, ["GET"]),
        route("/subjects/{subject}/versions", register, ["POST"], writes=frozenset({"POST"})),
        route("/subjects/{subject}/versions/{version}", version, ["GET"]),
        route("/subjects/{subject}/versions/{version}/schema", version_schema, ["GET"]),
        route("/subjects/{subject}", lookup, ["POST"]),
        route("/schemas/ids/{id}", by_id, ["GET"]),
        route("/schemas/ids/{id}/schema", by_id_schema, ["GET"]),
        route("/schemas/ids/{id}/subjects", id_subjects, ["GET"]),
        route("/schemas/ids/{id}/versions", id_versions, ["GET"]),
        route("/schemas/types", types, ["GET"]),
        route("/config", config, ["GET", "PUT"], writes=frozenset({"PUT"})),
        route("/config/{subject}", config, ["GET", "PUT"], writes=frozenset({"PUT"})),
        route("/compatibility/subjects/{subject}/versions", compatibility, ["POST"]),
        route("/compatibility/subjects/{subject}/versions/{version}", compatibility, ["POST"]),
        route("/mode", mode, ["GET"]),
        route("/mode/{subject}", mode, ["GET"]),
    ])
