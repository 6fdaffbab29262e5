"""``api.answers.CommandAnswers`` on the in-memory event log: it reads the processor's
answers from where the topic ended when it started, hands each to the write waiting for
its (partition, offset), keeps them for polling within bounds, and skips what it cannot
decode."""

from __future__ import annotations

import threading

from gnomon import codec
from gnomon.api.answers import CommandAnswers
from gnomon.core import jobs as J
from gnomon.core.clock import FakeClock
from gnomon.core.replies import CommandResult, result_for
from gnomon.eventlog.memory import MemoryEventLog

TOPIC = "gnomon.command-results"


def answer(log: MemoryEventLog, partition: int, offset: int, job_id: str = "job_1") -> CommandResult:
    res = result_for(J.PauseJob(job_id, "acme", 1), partition, offset, 2, job_version=offset + 1)
    log.append(TOPIC, job_id.encode(), codec.encode(res, TOPIC), partition)
    return res


def test_it_reads_from_the_end_and_answers_by_position() -> None:
    log = MemoryEventLog(FakeClock(0), partitions=2)
    answer(log, 0, 7)  # before the API started: not its business
    answers = CommandAnswers(log.reader("t"), TOPIC, 2)
    answers.position_at_end()
    assert answers.wait((0, 7), 0.0) is None
    mine = answer(log, 1, 3)
    log.append(TOPIC, b"x", b"not avro", 1)  # skipped, not fatal
    assert answers.wait((1, 3), 1.0) == mine
    assert answers.get((1, 3)) == mine and answers.get((0, 7)) is None


def test_a_waiting_write_wakes_when_the_reader_thread_reads_its_answer() -> None:
    log = MemoryEventLog(FakeClock(0), partitions=1)
    answers = CommandAnswers(log.reader("t"), TOPIC, 1).start()
    try:
        got: list[CommandResult | None] = []
        waiter = threading.Thread(target=lambda: got.append(answers.wait((0, 5), 10.0)))
        waiter.start()
        res = answer(log, 0, 5)
        waiter.join(10.0)
        assert got == [res]
    finally:
        answers.close()


def test_answers_are_kept_within_their_bounds() -> None:
    now = [0.0]
    log = MemoryEventLog(FakeClock(0), partitions=1)
    answers = CommandAnswers(log.reader("t"), TOPIC, 1, kept_s=60.0, kept_max=3, monotonic=lambda: now[0])
    answers.position_at_end()
    for off in range(5):
        answer(log, 0, off)
    answers.read_once()
    assert [answers.get((0, o)) is not None for o in range(5)] == [False, False, True, True, True]
    now[0] = 61.0
    answer(log, 0, 9)
    answers.read_once()
    assert [answers.get((0, o)) is not None for o in (2, 3, 4, 9)] == [False, False, False, True]


def test_recent_jobs_answer_until_history_has_the_version_then_history_wins() -> None:
    from dataclasses import replace

    from gnomon.api.recent import RecentJobs
    from gnomon.core.model import JobSpec, Schedule, Target, TargetType

    now = [0.0]
    recent = RecentJobs(kept_s=60.0, monotonic=lambda: now[0])
    spec = JobSpec(name="n", schedule=Schedule(cron="0 * * * *"), target=Target(TargetType.HANDLER, handler="h"))
    kept = J.JobState("job_1", "acme", spec, J.JobStatus.ACTIVE, 3_600_000, 2, 0, 0)
    recent.put(kept)
    assert recent.newest("job_1", None) is kept
    older = replace(kept, version=1, status=J.JobStatus.PAUSED)
    assert recent.newest("job_1", older) is kept  # history behind
    same = replace(kept, next_run_at_ms=7_200_000)  # the processor moved on without a new version
    assert recent.newest("job_1", same) is same
    now[0] = 61.0
    assert recent.newest("job_1", None) is None  # kept no longer


def test_partitions_added_by_a_grow_are_read_from_their_start() -> None:
    log = MemoryEventLog(FakeClock(0), partitions=2)
    answers = CommandAnswers(log.reader("t"), TOPIC, 2)
    answers.position_at_end()
    before = answer(log, 1, 4)
    assert answers.grown() == 0
    log.add_partitions([TOPIC], 4)
    new = answer(log, 3, 0, "job_9")  # written before the reader knew of partition 3
    assert answers.grown() == 2 and answers.partitions == 4
    assert answers.wait((1, 4), 1.0) == before
    assert answers.wait((3, 0), 1.0) == new
    assert answers.grown() == 0
