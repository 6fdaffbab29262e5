"""The processor: one decider per partition. ``task`` applies the core's decisions to one
partition's state (no Kafka there); ``runtime`` is the consume-transform-produce loop that
feeds it records and commits its outputs in one Kafka transaction; ``waiting`` grants
waiting runs across the partitions a processor owns; ``standby``, ``savepoint``,
``attempts``, ``history_mark``, ``adverts``, ``usage`` and ``stores`` are the pieces the
runtime keeps around it.

(This package was ``gnomon.streams`` until 2026-12; the top-level ``streams/`` directory,
which holds the topic topology, keeps its name.)"""
