"""The one exception tree of gnomon.

::

    GnomonError
    ├── ValidationError      bad input; carries the offending field (API -> 4xx problem+json)
    ├── NotFound             no such job / run
    ├── Conflict             the request contradicts current state (e.g. tenant mismatch)
    ├── TransitionError      a lifecycle transition that the state machine forbids
    │   ├── JobNotFound      ... on a job the sender cannot see (also a NotFound)
    │   └── RunNotFound      ... on a run the sender cannot see (also a NotFound)
    ├── LimitExceeded        a tenant limit refuses it (API -> 422, or 429 with Retry-After)
    ├── Unauthenticated      a job command's signature does not prove its tenant (core.command_auth)
    ├── InternalError        a bug of gnomon's own (e.g. codec.EncodeError): API -> 500
    │   └── RegistryError    the packaged schema registry is unreadable (codec.registry)
    ├── InfraError           a real component misbehaved (Kafka, Cassandra, RocksDB, process)
    │   ├── EventLogError    Kafka produce/consume/transaction failures
    │   ├── StateStoreError  RocksDB failures
    │   ├── HistoryStoreError Cassandra failures
    │   ├── CredentialError  a credentials file unreadable or malformed (gnomon.credentials)
    │   ├── SecretError      a tenant's secret missing or unsafe on a worker (outbound.secrets)
    │   └── SandboxError     a sandbox or container runtime cannot be set up (worker.sandbox)
    ├── PolicyError          a pool's policy file refused (worker.policy)
    ├── TargetRefused        the outbound guard refused an HTTP target (outbound.netguard)
    └── ApiError ...         the SDK's and the registry's answers (client, registry.errors)

Adapters translate their library's exceptions into these, so callers catch one tree.
A few exceptions are control flow, not errors, and stay outside it on purpose (HTTP
answers of the web layer, the UI's redirects, a codec fast path's fallback, a record
too large for its savepoint, which the processor turns into a poison record):
``tests/unit/test_error_tree.py`` lists them and checks every other exception of
``gnomon`` is in the tree.
"""

from __future__ import annotations


class GnomonError(Exception):
    """Root of every error gnomon raises on purpose."""


class ValidationError(GnomonError):
    """Input that gnomon refuses. ``field`` is a dotted path such as ``retry.max``."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class NotFound(GnomonError):
    pass


class Conflict(GnomonError):
    pass


class TransitionError(GnomonError):
    pass


class JobNotFound(TransitionError, NotFound):
    """A job command for a job the sender cannot see (missing, deleted, another
    tenant's): the processor's refusal names ``field`` ``jobId`` (``core.replies``) and
    the API answers 404 for all three alike."""

    field = "jobId"


class RunNotFound(TransitionError, NotFound):
    """A cancel or replay of a run the sender cannot see (missing, purged, another
    tenant's): refused naming ``runId``; the API answers 404 alike."""

    field = "runId"


class InternalError(GnomonError):
    """gnomon broke its own rules (e.g. a value that does not fit its schema): never the
    caller's fault, so the API answers 500, not 4xx."""


class InfraError(GnomonError):
    pass


class EventLogError(InfraError):
    pass


class StateStoreError(InfraError):
    pass


class HistoryStoreError(InfraError):
    pass


class LimitExceeded(GnomonError):
    """A tenant limit (``core.tenants``) refuses the request. ``limit`` names it
    (``jobs_max``...); ``field`` is the request field at fault, if one is;
    ``retry_after_s`` is set when waiting helps (the API answers 429 with Retry-After),
    None when it does not (422)."""

    def __init__(self, limit: str, message: str, *, field: str | None = None,
                 retry_after_s: int | None = None) -> None:
        super().__init__(f"{limit}: {message}")
        self.limit = limit
        self.field = field
        self.message = message
        self.retry_after_s = retry_after_s
