"""How far history has read the run ledger, in the processor's own time.

A finished run may leave processor state (a tombstone on gnomon.runs) only once the
history projector has its final state. The projector commits its position on the
ledger (consumer group ``gnomon-history``) after it has written the records before it.

``HistoryWatermark`` samples, every ``interval_ms`` between two steps of the processor,
the pair (T = now, E = the ledger partition's committed end offset). Every record this
partition's owner committed before T lies below E - 1: its own transaction's commit
marker lies after it and before E. So once the projector's committed offset C >= E - 1,
everything committed before T is in history, and ``until_ms(p)`` answers the latest
such T. The check is conservative: an idle projector (or none) holds purging back,
never the other way round.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable

from gnomon import region as regions
from gnomon.core.clock import Clock
from gnomon.core.errors import EventLogError
from gnomon.eventlog.port import EventLog

log = logging.getLogger("gnomon.processor.history")

HISTORY_GROUP_ID = "gnomon-history"  # the projector's group (gnomon.history.projector.GROUP_ID)


class HistoryWatermark:
    def __init__(self, log: EventLog, ledger_topic: str, clock: Clock, *, group_id: str = HISTORY_GROUP_ID,
                 region: str | None = None, interval_ms: int = 5_000, samples_max: int = 120,
                 timeout_s: float = 2.0) -> None:
        """``group_id``: the projector's group as named in the default namespace;
        ``region``: the ledger's namespace (gnomon.region), whose id of it is read."""
        self.topic = ledger_topic
        self.group_id = regions.group_id(group_id, region)
        self.clock = clock
        self.interval_ms = interval_ms
        self.samples_max = samples_max  # per partition; oldest dropped (history lagging that far waits)
        self.timeout_s = timeout_s
        self._samples: dict[int, deque[tuple[int, int]]] = {}
        self._until: dict[int, int] = {}
        # partition -> records of the ledger after the projector's committed position, at
        # the last sample (end - 1 - committed: the last offset is a commit marker)
        self.lag: dict[int, int] = {}
        self._last_ms = -(10**15)
        # never subscribes: it only reads the projector group's committed offsets (no join)
        self._consumer = log.reader(self.group_id, config={"enable.auto.commit": False,
                                                           "isolation.level": "read_committed"})

    def until_ms(self, partition: int) -> int | None:
        return self._until.get(partition)

    def poll(self, partitions: Iterable[int]) -> None:
        """Take a sample if one is due. Call between steps (no transaction of ours open)."""
        now = self.clock.now_ms()
        if now - self._last_ms < self.interval_ms:
            return
        self._last_ms = now
        parts = sorted(partitions)
        if not parts:
            return
        try:
            got = self._consumer.committed([(self.topic, p) for p in parts], self.timeout_s)
            committed = {p: -1 if off is None else off for (_, p), off in got.items()}
            for p in parts:
                _, end = self._consumer.watermarks((self.topic, p), self.timeout_s)
                self._observe(p, now, int(end), committed.get(p, -1))
        except EventLogError as exc:
            log.warning("cannot read the history projector's position (%s); purging waits", exc)

    def forget(self, partition: int) -> None:
        self._samples.pop(partition, None)
        self._until.pop(partition, None)
        self.lag.pop(partition, None)

    def _observe(self, partition: int, now_ms: int, end: int, committed: int) -> None:
        self.lag[partition] = max(0, end - 1 - committed) if committed >= 0 else max(0, end)
        samples = self._samples.setdefault(partition, deque())
        samples.append((now_ms, end))
        while len(samples) > self.samples_max:
            samples.popleft()
        while samples and committed >= 0 and committed >= samples[0][1] - 1:
            self._until[partition] = samples.popleft()[0]

    def close(self) -> None:
        self._consumer.close()
