"""The HTTP routes: the subset of Confluent Schema Registry's REST API that serializers
and deserializers (confluent-kafka, Java's ``KafkaAvroSerializer``, Kafka Connect
converters) call. Bodies are JSON (``application/vnd.schemaregistry.v1+json``); an
error is ``{"error_code": <Confluent code>, "message": ...}`` with its HTTP status.

``GET /schemas/ids/{id}?format=resolved`` returns the schema with its references
inlined (one self-contained schema, ``references`` empty), as Confluent's does for Avro.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gnomon.registry.errors import INVALID_SCHEMA, ApiError
from gnomon.registry.service import Registry
from gnomon.registry.state import Ref, Version

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"

Handler = Callable[[Request], Awaitable[Response]]


def _json(doc: Any, status: int = 200) -> Response:
    return Response(json.dumps(doc), status_code=status, media_type=CONTENT_TYPE)


def _error(exc: ApiError) -> Response:
    return _json({"error_code": exc.code, "message": exc.message}, exc.status)


def _version_doc(v: Version) -> dict[str, Any]:
    doc: dict[str, Any] = {"subject": v.subject, "version": v.version, "id": v.id, "schema": v.schema}
    if v.references:
        doc["references"] = [r.to_json() for r in v.references]
    return doc


def _require_json(request: Request) -> None:
    """A write must say it is JSON: a web page can send a cross-site "simple" request
    (text/plain, a form) to 127.0.0.1 without asking first, but not one of JSON."""
    if "json" not in request.headers.get("content-type", "").lower():
        raise ApiError(415, 415, "Content-Type must be application/vnd.schemaregistry.v1+json or application/json")


async def _body(request: Request) -> tuple[str, tuple[Ref, ...], str | None]:
    """(schema, references, schemaType) of a register/lookup/compatibility request."""
    _require_json(request)
    try:
        doc = json.loads(await request.body())
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


def create_app(registry: Registry) -> Starlette:
    def route(path: str, fn: Callable[[Request], Awaitable[Any]], methods: list[str]) -> Route:
        async def endpoint(request: Request) -> Response:
            try:
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
            doc = json.loads(await req.body())
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
        route("/", root, ["GET"]),
        route("/subjects", subjects, ["GET"]),
        route("/subjects/{subject}/versions", versions, ["GET"]),
        route("/subjects/{subject}/versions", register, ["POST"]),
        route("/subjects/{subject}/versions/{version}", version, ["GET"]),
        route("/subjects/{subject}/versions/{version}/schema", version_schema, ["GET"]),
        route("/subjects/{subject}", lookup, ["POST"]),
        route("/schemas/ids/{id}", by_id, ["GET"]),
        route("/schemas/ids/{id}/schema", by_id_schema, ["GET"]),
        route("/schemas/ids/{id}/subjects", id_subjects, ["GET"]),
        route("/schemas/ids/{id}/versions", id_versions, ["GET"]),
        route("/schemas/types", types, ["GET"]),
        route("/config", config, ["GET", "PUT"]),
        route("/config/{subject}", config, ["GET", "PUT"]),
        route("/compatibility/subjects/{subject}/versions", compatibility, ["POST"]),
        route("/compatibility/subjects/{subject}/versions/{version}", compatibility, ["POST"]),
        route("/mode", mode, ["GET"]),
        route("/mode/{subject}", mode, ["GET"]),
    ])
