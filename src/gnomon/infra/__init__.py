"""Fetch and run gnomon's JVM components (Kafka in KRaft mode, Cassandra) without Docker.

The jars come from Maven Central (``mvn dependency:copy-dependencies``, cached in
``~/.m2``); everything else (configs, data, logs, pid files) lives under the state dir
(``Settings.state_dir``). Entry points: :mod:`gnomon.infra.manager` (``up``, ``down``,
``status``) and ``python -m gnomon.infra``.
"""
