"""The event log (Kafka in production): a narrow port and its two implementations.

``port`` holds the interfaces, ``kafka`` the confluent-kafka adapter (the only module
that talks to Kafka for the processor and the worker), ``memory`` a deterministic
in-memory log for the simulation harness (``gnomon.sim``).
"""

from gnomon.eventlog.port import (
    OFFSET_BEGINNING,
    OFFSET_END,
    TP,
    EventLog,
    GroupConsumer,
    Producer,
    Reader,
    Record,
    TransactionalProducer,
    TransactionError,
)

__all__ = ["OFFSET_BEGINNING", "OFFSET_END", "TP", "EventLog", "GroupConsumer", "Producer", "Reader", "Record",
           "TransactionError", "TransactionalProducer"]
