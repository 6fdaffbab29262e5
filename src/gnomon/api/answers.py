"""The processor's answers to the API's commands: one decider (issue 23).

The API validates what needs no state (a fast 422), writes the command to the
job-commands topic and then waits for the partition's processor to decide it: every
job command gets one ``CommandResult`` on the command-results topic, in the
processor's own transaction, naming the command by the partition and offset Kafka gave
it (``gnomon.core.replies``). ``CommandAnswers`` reads that topic from where it ended
when the API started, on a daemon thread, and hands each answer to the request waiting
for it.

An answer that does not come within the API's bound (``GNOMON_API_ANSWER_TIMEOUT_MS``,
default 5 s: a processor that is down, rebalancing or behind) is not lost: the request
answers 202 with a ``Location`` (``/v1/commands/{partition}-{offset}``) and this reader
keeps every answer it read for ``kept_s`` (default 10 minutes, at most ``kept_max``
answers, oldest out first), so a poll of that URL returns it once it came. Every API
process reads every partition, so any of them answers a poll for a command written
after it started.

Reads through the event-log port (``gnomon.eventlog``): the same code runs on Kafka and
on the in-memory log.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol

from gnomon import codec
from gnomon.core.errors import EventLogError, GnomonError
from gnomon.core.replies import CommandResult
from gnomon.eventlog.port import Reader

log = logging.getLogger(__name__)

Position = tuple[int, int]  # (partition, offset) of a command on the job-commands topic

ANSWER_TIMEOUT_S_DEFAULT = 5.0
KEPT_S_DEFAULT = 600.0
KEPT_MAX_DEFAULT = 100_000
READ_BATCH_MAX = 1000
READ_WAIT_S = 0.2
PARTITIONS_CHECK_S = 5.0  # how often the reader asks whether a grow added partitions


class AnswerSource(Protocol):
    """What a write needs of the answers (``CommandAnswers``; ``gnomon.testing``'s
    ``DecidingProducer.answers`` in API tests)."""

    def get(self, pos: Position) -> CommandResult | None: ...
    def wait(self, pos: Position, timeout_s: float) -> CommandResult | None: ...


class CommandAnswers:
    """Answers on ``topic`` (``partitions`` of them), read from their ends at ``start``.
    Thread-safe: requests wait on it from the thread pool while its thread reads."""

    def __init__(self, reader: Reader, topic: str, partitions: int, *, kept_s: float = KEPT_S_DEFAULT,
                 kept_max: int = KEPT_MAX_DEFAULT, monotonic: Callable[[], float] = time.monotonic) -> None:
        assert partitions >= 1 and kept_max >= 1 and kept_s > 0
        self._reader = reader
        self.topic = topic
        self.partitions = partitions
        self.kept_s = kept_s
        self.kept_max = kept_max
        self._monotonic = monotonic
        self._kept: OrderedDict[Position, tuple[float, CommandResult]] = OrderedDict()
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        self._started_at: dict[int, int] = {}  # partition -> where reading began (``position_at_end``)
        self._stop = threading.Event()
        self.answers_read = 0

    # ---- reading ---------------------------------------------------------------------

    def position_at_end(self, timeout_s: float = 10.0) -> None:
        """Read every partition from its current end: answers to commands written from
        now on come after it. EventLogError when an end cannot be read."""
        positions = []
        self.partitions = max(self.partitions, len(self._reader.partitions(self.topic, timeout_s)))  # grown: ADR 0012
        for p in range(self.partitions):
            _, high = self._reader.watermarks((self.topic, p), timeout_s)
            positions.append((self.topic, p, high))
        self._reader.assign(positions)
        self._started_at = {p: off for _, p, off in positions}

    def grown(self, timeout_s: float = 10.0) -> int:
        """Read the partitions a grow added (docs/adr/0012) from their start, the others
        on from where they are; how many were added. EventLogError when the metadata or
        the positions cannot be read."""
        count = len(self._reader.partitions(self.topic, timeout_s))
        if count <= self.partitions:
            return 0
        tps = [(self.topic, p) for p in range(self.partitions)]
        at = self._reader.position(tps)
        positions = [(self.topic, p, off if off >= 0 else self._started_at.get(p, 0)) for (_, p), off in at.items()]
        positions += [(self.topic, p, 0) for p in range(self.partitions, count)]
        self._reader.assign(positions)
        added, self.partitions = count - self.partitions, count
        log.info("reading %d more partitions of %s (%d in all): they were added by a grow", added, self.topic,
                 count)
        return added

    def start(self, timeout_s: float = 10.0) -> CommandAnswers:
        """``position_at_end``, then read on a daemon thread until ``close``."""
        self.position_at_end(timeout_s)
        self._thread = threading.Thread(target=self._run, name="command-answers", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        checked = self._monotonic()
        while not self._stop.is_set():
            try:
                if self._monotonic() - checked >= PARTITIONS_CHECK_S:
                    checked = self._monotonic()
                    self.grown()
                self.read_once(READ_WAIT_S)
            except EventLogError as exc:  # the broker away: requests time out to 202 meanwhile
                log.warning("reading %s: %s (retrying)", self.topic, exc)
                self._stop.wait(1.0)

    def read_once(self, timeout_s: float = 0.0) -> int:
        """Read what has come (waiting up to ``timeout_s`` for something); how many answers."""
        n = 0
        # librdkafka's batch consume waits for a full batch or the timeout: wait for one
        # record (it returns as soon as that comes), then take what else is there at once
        records = self._reader.consume(1, timeout_s)
        if not records:
            return 0
        records += self._reader.consume(READ_BATCH_MAX - 1, 0.0)
        now = self._monotonic()
        with self._changed:
            for rec in records:
                try:
                    res = codec.decode(rec.value or b"", self.topic)
                except GnomonError:
                    continue  # not ours to judge (the topic's other readers see it too)
                if not isinstance(res, CommandResult):
                    continue
                self._kept[(res.source_partition, res.source_offset)] = (now, res)
                n += 1
            self._expire(now)
            self.answers_read += n
            self._changed.notify_all()
        return n

    def _expire(self, now: float) -> None:
        while self._kept:
            pos, (at, _) = next(iter(self._kept.items()))
            if len(self._kept) <= self.kept_max and now - at < self.kept_s:
                break
            del self._kept[pos]

    # ---- answers ---------------------------------------------------------------------

    def get(self, pos: Position) -> CommandResult | None:
        """The answer to the command at ``pos`` if it came and is still kept."""
        if self._thread is None:  # no reader thread (the simulation, tests): read what has come
            self.read_once(0.0)
        with self._changed:
            kept = self._kept.get(pos)
        return None if kept is None else kept[1]

    def wait(self, pos: Position, timeout_s: float) -> CommandResult | None:
        """The answer to the command at ``pos``; None if it did not come within ``timeout_s``."""
        deadline = self._monotonic() + timeout_s
        with self._changed:
            while True:
                kept = self._kept.get(pos)
                if kept is not None:
                    return kept[1]
                left = deadline - self._monotonic()
                if left <= 0:
                    return None
                if self._thread is None:  # no reader thread (tests): read here
                    self._changed.release()
                    try:
                        self.read_once(min(left, READ_WAIT_S))
                    finally:
                        self._changed.acquire()
                else:
                    self._changed.wait(min(left, READ_WAIT_S))

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        self._reader.close()


def _message(reason: str | None, prefix: str | None, fallback: str) -> str:
    """The processor's reason without the ``"<field>: "`` its errors begin with."""
    text = reason or fallback
    if prefix and text.startswith(prefix + ": "):
        return text[len(prefix) + 2:]
    return text


def refusal(res: CommandResult) -> GnomonError:
    """The API's error for a refused command, with the processor's field and reason: the
    same problem (status, field) the API itself would give (``web.problems``). A job or
    run the tenant cannot see (missing, deleted, another tenant's) is the same 404."""
    from gnomon.core.errors import Conflict, LimitExceeded, NotFound, ValidationError
    from gnomon.core.replies import ResultCode

    if res.code is ResultCode.INVALID:
        field = res.field or "body"
        return ValidationError(field, _message(res.reason, field, "invalid"))
    if res.code is ResultCode.LIMIT:
        limit = res.limit or "limit"
        return LimitExceeded(limit, _message(res.reason, limit, "a tenant limit refused it"), field=res.field,
                             retry_after_s=res.retry_after_s)
    if res.code is ResultCode.CONFLICT:
        return Conflict(res.reason or "the job changed; read it and try again")
    if res.field == "jobId":
        return NotFound(f"no job {res.job_id!r}")
    if res.field == "runId":
        return NotFound("no such run")
    return Conflict(res.reason or "refused")
