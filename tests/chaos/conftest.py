from __future__ import annotations

import pytest


@pytest.fixture(scope="session", autouse=True)
def infra() -> None:
    from gnomon.config import load
    from gnomon.infra import manager

    manager.up(load())
