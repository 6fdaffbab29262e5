"""A throwaway Confluent-REST schema registry for tests: ``GET /schemas/ids/{id}`` from
schemas/avro (the ids gnomon writes, references inlined) and any extra documents a test
adds (``/subjects/{s}/versions/{v}`` for references). Every path asked is recorded."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from gnomon.codec.registry import default_schema_dir, load_registry


def gnomon_documents() -> dict[str, dict[str, Any]]:
    return {f"/schemas/ids/{v.id}": {"schema": json.dumps(v.schema)} for v in load_registry(default_schema_dir())}


class Hits(list[str]):
    """The paths asked, in order; ``authorizations``: each request's Authorization header."""

    def __init__(self) -> None:
        super().__init__()
        self.authorizations: list[str | None] = []


class _Handler(BaseHTTPRequestHandler):
    docs: Mapping[str, Mapping[str, Any]] = {}
    hits: Hits

    def do_GET(self) -> None:
        self.hits.append(self.path)
        self.hits.authorizations.append(self.headers.get("Authorization"))
        doc = self.docs.get(self.path)
        body = json.dumps(doc if doc else {"error_code": 40403, "message": "Schema not found"}).encode()
        self.send_response(200 if doc else 404)
        self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@contextmanager
def serve(extra: Mapping[str, Mapping[str, Any]] | None = None) -> Iterator[tuple[str, list[str]]]:
    """(base URL, the paths asked so far) of a registry serving until the block ends."""
    hits = Hits()
    handler = type("Handler", (_Handler,), {"docs": {**gnomon_documents(), **(extra or {})}, "hits": hits})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", hits
    finally:
        server.shutdown()
        server.server_close()
