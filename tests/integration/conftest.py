"""Shared fixture: the local stack (Kafka + Cassandra), started once per session if needed."""

from __future__ import annotations

import pytest

from gnomon.config import Settings, load
from gnomon.infra import kafka, manager
from gnomon.infra.errors import InfraError


@pytest.fixture(scope="session")
def infra() -> Settings:
    """Settings of a running stack; ``manager.up`` is idempotent (fast when already up)."""
    settings = load()
    try:
        manager.up(settings, kafka_nodes=kafka.running_layout(settings) or 1)
    except InfraError as exc:
        pytest.fail(f"gnomon infra up failed: {exc}", pytrace=False)
    return settings
