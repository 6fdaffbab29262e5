"""Shared by every test directory.

This directory has no ``__init__.py``, so pytest puts it on ``sys.path`` for this file:
modules kept here (``history_contract``, the HistoryStore contract suite) are importable
from any test module. Their asserts are rewritten like a test module's.
"""

import logging
from collections.abc import Iterator

import pytest

pytest.register_assert_rewrite("history_contract", "eventlog_contract")

# Speed is measured in bench/, not asserted: hypothesis's per-example deadline (200 ms by
# default) fails tests on a loaded 2-core CI box (the services start while the unit suite
# runs). Examples stay bounded by each test's max_examples.
from hypothesis import settings  # noqa: E402

settings.register_profile("gnomon", deadline=None)
settings.load_profile("gnomon")


@pytest.fixture
def quiet_logs() -> Iterator[None]:
    """Warnings and below off for one test: the simulations' faults and poisoned records
    log thousands of expected lines ("transaction failed", "poison ..."). A module that
    wants it for every test says ``pytestmark = pytest.mark.usefixtures("quiet_logs")``."""
    logging.disable(logging.WARNING)
    yield
    logging.disable(logging.NOTSET)
