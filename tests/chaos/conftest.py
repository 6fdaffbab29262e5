from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session", autouse=True)
def infra() -> None:
    from gnomon.config import load
    from gnomon.infra import manager

    manager.up(load())


@pytest.fixture(autouse=True)
def close_taps() -> Iterator[None]:
    """Each scenario's tap reads until its test ends (a scenario's history may be read after
    its checker ran)."""
    yield
    from chaoslib import OPEN_TAPS

    for tap in list(OPEN_TAPS):
        tap.close()
