"""Reading request bodies without letting a client exhaust memory, the stack or the CPU.

* The size limit is checked on ``Content-Length`` before a byte is read, and again while
  streaming (a chunked body has no length): reading stops at the limit.
* JSON nesting is counted in one linear pass before parsing: the C parser recurses, and
  a body of 100k ``[`` ends in RecursionError (a 500) instead of a 422.
* Integers are refused above ``INT_MAX_DIGITS`` digits before ``int()`` sees them
  (Python converts long digit strings in quadratic time and raises ValueError past
  4300 digits); NaN/Infinity are refused (not JSON).
* Strings must be valid Unicode: a lone surrogate (``"\\ud800"``) parses but cannot be
  encoded later (Avro, Cassandra) and would fail deep inside the command path.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from starlette.requests import Request

from gnomon.core.errors import ValidationError
from gnomon.web.problems import TooLarge

BODY_MAX_BYTES = 256 * 1024
JSON_DEPTH_MAX = 32
INT_MAX_DIGITS = 20
CONTENT_LENGTH_MAX_DIGITS = 20

# Only the bytes that change the nesting or the string state; one linear regex scan.
_STRUCTURAL_RE = re.compile(rb'["\\\[\]{}]')


async def read_bounded(request: Request, limit_bytes: int = BODY_MAX_BYTES) -> bytes:
    """The body, at most ``limit_bytes``; ``TooLarge`` before reading if the declared
    length is over, or as soon as the streamed bytes pass the limit."""
    declared = request.headers.get("content-length")
    if declared is not None:
        text = declared.strip()
        if not text.isdigit() or len(text) > CONTENT_LENGTH_MAX_DIGITS:
            raise ValidationError("Content-Length", "must be a non-negative integer")
        if int(text) > limit_bytes:
            raise TooLarge(f"request body is {int(text)} bytes; the limit is {limit_bytes}")
    chunks: list[bytes] = []
    total_bytes = 0
    async for chunk in request.stream():
        total_bytes += len(chunk)
        if total_bytes > limit_bytes:
            raise TooLarge(f"request body is over the limit of {limit_bytes} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def closed_object(body: Any, allowed: Sequence[str], *, must_be: str = "must be a JSON object") -> dict[str, Any]:
    """``body`` if it is a JSON object naming only ``allowed`` fields (listed, in that
    order, in the refusal); else ``ValidationError`` naming ``body`` (``must_be``: what it
    says) or the first unknown field."""
    if not isinstance(body, dict):
        raise ValidationError("body", must_be)
    for name in body:
        if name not in allowed:
            raise ValidationError(name, f"unknown field; allowed: {', '.join(allowed)}")
    return body


def json_depth(raw: bytes) -> int:
    """The deepest nesting of arrays/objects in ``raw`` (brackets inside strings ignored).

    Linear in ``len(raw)``; for invalid JSON the count may be off, and the parser refuses it anyway."""
    depth = deepest = 0
    in_string = False
    skip_until = -1  # the byte after a backslash is escaped
    for match in _STRUCTURAL_RE.finditer(raw):
        pos = match.start()
        if pos < skip_until:
            continue
        char = match.group()
        if in_string:
            if char == b"\\":
                skip_until = pos + 2
            elif char == b'"':
                in_string = False
        elif char == b'"':
            in_string = True
        elif char in (b"[", b"{"):
            depth += 1
            deepest = max(deepest, depth)
        elif char in (b"]", b"}"):
            depth -= 1
    return deepest


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > INT_MAX_DIGITS:
        raise ValidationError("body", f"an integer has more than {INT_MAX_DIGITS} digits")
    return int(text)


def _no_constants(name: str) -> Any:
    raise ValidationError("body", f"{name} is not JSON")


def _check_strings(value: Any, field: str) -> None:
    """Every string (and key) must encode as UTF-8: refuse lone surrogates, naming where."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValidationError(field, "contains a lone surrogate (not valid Unicode)") from None
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_strings(key, field)
            _check_strings(item, key if field == "body" else f"{field}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check_strings(item, f"{field}[{index}]")  # the core's style: target.argv[0]


def parse_json(raw: bytes) -> Any:
    """``raw`` as JSON, or ``ValidationError('body' | the offending field)``; ``{}`` if empty."""
    if not raw:
        return {}
    if json_depth(raw) > JSON_DEPTH_MAX:
        raise ValidationError("body", f"JSON is nested more than {JSON_DEPTH_MAX} levels deep")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValidationError("body", f"not UTF-8: {exc.reason} at byte {exc.start}") from None
    try:
        data = json.loads(text, parse_int=_bounded_int, parse_constant=_no_constants)
    except json.JSONDecodeError as exc:
        raise ValidationError("body", f"not valid JSON: {exc.msg} at position {exc.pos}") from None
    except RecursionError:  # belt and braces: json_depth should have refused it
        raise ValidationError("body", f"JSON is nested more than {JSON_DEPTH_MAX} levels deep") from None
    _check_strings(data, "body")
    return data
