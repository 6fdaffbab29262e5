from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session", autouse=True)
def infra(request: pytest.FixtureRequest) -> None:
    """The local stack, up (started if it is not), unless every test selected brings its
    own brokers (e.g. the region cut-off test alone: the local stack's Kafka and
    Cassandra would only take CPU from its two regions). The suite runs on two xdist
    workers: a file lock keeps them from starting it twice at once."""
    import fcntl

    from gnomon.config import load
    from gnomon.infra import manager

    items = request.session.items
    own_only = bool(items) and all(item.get_closest_marker("own_brokers") is not None for item in items)
    settings = load()
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    with open(settings.state_dir / "chaos-infra.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if own_only:
            manager.fetch_jars(settings, ("kafka", "cassandra"))  # (their clusters run on these jars)
        else:
            manager.up(settings)


@pytest.fixture(autouse=True)
def close_taps() -> Iterator[None]:
    """Each scenario's tap reads until its test ends (a scenario's history may be read after
    its checker ran)."""
    yield
    from chaoslib import OPEN_TAPS

    for tap in list(OPEN_TAPS):
        tap.close()
