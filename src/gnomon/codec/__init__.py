"""Avro codec for every value gnomon puts on Kafka.

Wire format (Confluent framing)::

    byte 0     magic byte 0
    bytes 1-4  schema id, big-endian: an id of schemas/avro/registry.json
    bytes 5-   Avro binary (fastavro ``schemaless_writer``) of the topic's value schema

One value schema per topic, like the Confluent subject ``<topic>-value`` (the retired
``gnomon.dispatch.*`` topics shared ``gnomon.dispatch-value``). A topic carrying several
message types wraps them in an envelope record whose ``body`` is a union:
``gnomon.JobCommand``, ``gnomon.RunCommand``, ``gnomon.WorkerMessage``.

``encode`` writes with the latest version of the subject; ``decode`` reads any
registered version and resolves it to the latest (fastavro schema resolution), so old
records stay readable after a schema change. ``decode`` raises only ``DecodeError`` (a
``ValidationError``), which lets a processor route a bad record to gnomon.poison.

    >>> decode(encode(ClaimRun("j@2024-01-01T00:00:00Z", "w1", 0)))
    ClaimRun(run_id='j@2024-01-01T00:00:00Z', worker_id='w1', at_ms=0)

A schema id that is not in this release's registry (a newer release wrote it, during a
rolling upgrade) is refused, unless the codec has a schema source
(``Codec.use_schema_source``): then it asks the source once for the writer's schema and
reads the id's records with the subject's latest version here, like an older version's.
``gnomon.codec.remote.install_registry_source`` gives ``default_codec`` the schema
registry as its source (the long-running processes do at start; off with
``GNOMON_CODEC_FETCH_UNKNOWN=0``). Known ids never ask.

Schemas are parsed and converters generated once, at import. ``Codec(load_registry(d))``
builds an independent codec on another schema directory (tests, tooling).
"""

from __future__ import annotations

from gnomon.codec._codec import (
    HEADER_LEN,
    MAGIC,
    TOPICS,
    Codec,
    DecodeError,
    EncodeError,
    FetchedSchema,
    SchemaSource,
    TopicSchema,
    topic_schema,
)
from gnomon.codec.registry import default_schema_dir, load_registry

__all__ = [
    "HEADER_LEN",
    "MAGIC",
    "TOPICS",
    "Codec",
    "DecodeError",
    "EncodeError",
    "FetchedSchema",
    "SchemaSource",
    "TopicSchema",
    "decode",
    "default_codec",
    "encode",
    "reframe",
    "schema_for_topic",
    "schema_id_for_topic",
    "subject_for_topic",
    "topic_types",
]


def subject_for_topic(topic: str) -> str:
    """``<topic>-value`` (``gnomon.dispatch-value`` for every retired ``gnomon.dispatch.*``)."""
    return topic_schema(topic).subject


def topic_types(topic: str) -> tuple[type, ...]:
    """The dataclasses that may travel on ``topic``."""
    return topic_schema(topic).types


default_codec = Codec(load_registry(default_schema_dir()))

encode = default_codec.encode
reframe = default_codec.reframe
decode = default_codec.decode
schema_for_topic = default_codec.schema_for_topic
schema_id_for_topic = default_codec.schema_id_for_topic
