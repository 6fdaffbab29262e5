"""The event-log port's contract (tests/eventlog_contract.py) on the in-memory log."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest

from eventlog_contract import EventLogContract
from gnomon.core.clock import FakeClock
from gnomon.eventlog.memory import MemoryEventLog

_names = itertools.count()


class TestMemoryEventLog(EventLogContract):
    @pytest.fixture
    def log(self) -> MemoryEventLog:
        return MemoryEventLog(FakeClock(), partitions=1)

    @pytest.fixture
    def new_topic(self, log: MemoryEventLog) -> Callable[[int], str]:
        def make(partitions: int) -> str:
            name = f"contract.{next(_names)}"
            log.topic_partitions[name] = partitions
            return name

        return make
