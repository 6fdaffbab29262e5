"""The registry's errors: an API error carries Confluent's HTTP status and error code."""

from __future__ import annotations

from gnomon.core.errors import GnomonError, InfraError

# Confluent Schema Registry error codes (the ``error_code`` of an error body).
SUBJECT_NOT_FOUND = 40401
VERSION_NOT_FOUND = 40402
SCHEMA_NOT_FOUND = 40403
INCOMPATIBLE = 409
INVALID_SCHEMA = 42201
INVALID_VERSION = 42202
INVALID_COMPATIBILITY = 42203
OPERATION_NOT_PERMITTED = 42205
STORE_ERROR = 50001


class ApiError(GnomonError):
    """A refused request: answered ``status`` with ``{"error_code": code, "message": ...}``."""

    def __init__(self, status: int, code: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


class StoreMismatch(InfraError):
    """The store topic contradicts the checked-in registry (an id or a subject version
    with other contents): the registry refuses to start."""
