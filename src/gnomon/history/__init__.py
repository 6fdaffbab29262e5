"""Queryable history: the read model the API serves, projected from Kafka.

* ``InMemoryHistoryStore`` (``gnomon.history.memory``): pure, for tests and the
  in-memory runner.
* ``CassandraHistoryStore`` (``gnomon.history.cassandra``): production; schema in
  ``schemas/cql``, applied by ``gnomon.history.migrate``.
* ``HistoryProjector`` (``gnomon.history.projector``): gnomon.jobs, gnomon.runs and
  gnomon.run-logs -> a store.

Both stores implement ``gnomon.ports.HistoryStore`` plus ``write_batch`` and
``forget_job`` (``gnomon.history.base.ProjectionStore``), and page identically
(``gnomon.history._paging``). Only the in-memory store is imported here; the others
import cassandra-driver / confluent-kafka.
"""

from gnomon.history.base import HistoryBatch, ProjectionStore
from gnomon.history.memory import InMemoryHistoryStore

__all__ = ["HistoryBatch", "InMemoryHistoryStore", "ProjectionStore"]
