"""gnomon's schema registry: the subset of Confluent Schema Registry's REST API that
serializers use, for producers and consumers that do not import gnomon (docs/adr/0009).

* :mod:`.state`: the registry as data (subject versions, ids, compatibility settings),
  the records of its Kafka store, and the import of ``schemas/avro/registry.json``;
* :mod:`.compat`: compatibility levels (FULL_TRANSITIVE by default) over
  :mod:`gnomon.codec.compat`;
* :mod:`.service`: the operations (register, look up, ...), raising :class:`.errors.ApiError`;
* :mod:`.kafka_store`: the compacted topic (``Topology.schemas``) that makes ids durable;
* :mod:`.app`: the HTTP routes; ``python -m gnomon.registry`` serves them.

Nothing else in gnomon needs the registry at run time: the codec reads the packaged
schema files, whose ids the registry imports unchanged.
"""

from __future__ import annotations
