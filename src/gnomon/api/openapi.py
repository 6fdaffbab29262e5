"""Helpers that make /openapi.json the real contract.

FastAPI only documents what it validates. gnomon validates request bodies with the core
(so errors name the core's fields), so the request schemas are attached by hand
(``request_body``), error responses are declared per operation (``problem_responses``)
and, after FastAPI built the document, ``finish`` adds the request schemas to the
components and gives every error response the problem+json media type.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from gnomon.api import schemas
from gnomon.web.problems import PROBLEM_MEDIA_TYPE, RETRY_AFTER_S

REF = "#/components/schemas/{model}"

_PROBLEM_DESCRIPTIONS = {
    401: "missing, malformed or unknown bearer token",
    404: "no such job or run for this tenant (another tenant's ids are not found either)",
    409: "the request conflicts with the current state",
    412: "If-Match names an older version than the job's current one",
    413: "request body over the limit (checked on Content-Length before reading)",
    422: "invalid input; 'field' names it",
    503: "Kafka or the history store is unavailable; see 'outcome' before retrying",
}
_STRING = {"schema": {"type": "string"}}


def problem_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """``responses=`` entries for these error statuses, all application/problem+json
    (the media type is fixed up by ``finish``: FastAPI writes application/json)."""
    out: dict[int | str, dict[str, Any]] = {}
    for status in statuses:
        entry: dict[str, Any] = {"model": schemas.Problem, "description": _PROBLEM_DESCRIPTIONS[status]}
        if status == 401:
            entry["headers"] = {"WWW-Authenticate": {"description": "Bearer", **_STRING}}
        if status == 503:
            entry["headers"] = {"Retry-After": {"description": f"seconds; {RETRY_AFTER_S}", **_STRING}}
        out[status] = entry
    return out


def request_body(model: type[BaseModel], *, required: bool = True,
                 example: dict[str, Any] | None = None) -> dict[str, Any]:
    """An ``openapi_extra`` declaring ``model`` as the JSON body, without FastAPI validating it."""
    media: dict[str, Any] = {"schema": {"$ref": REF.format(model=model.__name__)}}
    if example is not None:
        media["example"] = example
    return {"requestBody": {"required": required, "content": {"application/json": media}}}


def _request_schemas() -> dict[str, Any]:
    _, top = models_json_schema([(m, "validation") for m in schemas.REQUEST_MODELS], ref_template=REF)
    return dict(top.get("$defs", {}))


def _problem_media_types(document: dict[str, Any]) -> None:
    for path_item in document.get("paths", {}).values():
        for operation in path_item.values():
            for status, response in operation.get("responses", {}).items():
                content = response.get("content", {})
                if status[:1] in ("4", "5") and "application/json" in content:
                    content[PROBLEM_MEDIA_TYPE] = content.pop("application/json")


def _drop_unused_fastapi_errors(document: dict[str, Any]) -> None:
    text = repr(document.get("paths", {}))
    components = document.get("components", {}).get("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        if name in components and f"/{name}'" not in text:
            del components[name]


def finish(app: FastAPI) -> Callable[[], dict[str, Any]]:
    """``app.openapi`` replacement: FastAPI's document, completed and cached."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = build()
            components = document.setdefault("components", {}).setdefault("schemas", {})
            for name, schema in _request_schemas().items():
                components.setdefault(name, schema)
            _problem_media_types(document)
            _drop_unused_fastapi_errors(document)
            app.openapi_schema = document
        return app.openapi_schema

    return openapi
