from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session", autouse=True)
def infra() -> None:
    """The local stack, up (started if it is not). The suite runs on two xdist workers:
    a file lock keeps them from starting it twice at once."""
    import fcntl

    from gnomon.config import load
    from gnomon.infra import manager

    settings = load()
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    with open(settings.state_dir / "chaos-infra.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        manager.up(settings)


@pytest.fixture(autouse=True)
def close_taps() -> Iterator[None]:
    """Each scenario's tap reads until its test ends (a scenario's history may be read after
    its checker ran)."""
    yield
    from chaoslib import OPEN_TAPS

    for tap in list(OPEN_TAPS):
        tap.close()


# The order within each lane (`make test` runs the own_brokers tests beside the others,
# tests/lanes.sh): the broker-outage test, whose start-lag bounds are tight, runs first, so
# its outage and freeze fall on test_chaos's quiet stretch (every processor down for 45 s),
# and the history outage's window (Cassandra down) falls on the broker-loss test. In
# alphabetical order the broker-outage test's thaw fell on Cassandra's restart (a JVM start
# on a 2-core box) and its start lag p99 after the thaw reached 15 s (2026-12-04).
ORDER = ("test_broker_outage.py", "test_broker_loss.py", "test_chaos.py", "test_history_outage.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Reorders this directory's tests among themselves (by ``ORDER``); others stay put."""
    here = [i for i, item in enumerate(items) if item.path.name in ORDER]
    ranked = sorted((items[i] for i in here), key=lambda item: ORDER.index(item.path.name))  # stable
    for i, item in zip(here, ranked, strict=True):
        items[i] = item
