"""The result a producer reads for its job command: accepted, or refused with the same
field, limit and reason the REST API would give."""

from __future__ import annotations

from gnomon.core import jobs as J
from gnomon.core.errors import Conflict, LimitExceeded, TransitionError, ValidationError
from gnomon.core.model import JobSpec, Schedule, Target, TargetType
from gnomon.core.replies import ResultCode, result_for

PAUSE = J.PauseJob("job_1", "acme", 1_000)
SPEC = JobSpec(name="n", schedule=Schedule(cron="0 * * * *"), target=Target(TargetType.HANDLER, handler="h"))


def test_accepted_carries_the_version_and_names_the_command_by_its_offset() -> None:
    r = result_for(PAUSE, 3, 1234, 2_000, job_version=7)
    assert r.accepted and r.code is ResultCode.ACCEPTED and r.job_version == 7
    assert (r.job_id, r.tenant, r.command, r.source_partition, r.source_offset, r.at_ms) == (
        "job_1", "acme", "PauseJob", 3, 1234, 2_000)


def test_each_refusal_maps_to_its_code_with_the_details() -> None:
    invalid = result_for(PAUSE, 0, 1, 5, error=ValidationError("schedule", "never fires"))
    assert (invalid.code, invalid.field) == (ResultCode.INVALID, "schedule") and "never fires" in (invalid.reason or "")
    limit = result_for(PAUSE, 0, 1, 5, error=LimitExceeded("triggers_per_min_max", "6 in a minute",
                                                           retry_after_s=30))
    assert (limit.code, limit.limit, limit.retry_after_s) == (ResultCode.LIMIT, "triggers_per_min_max", 30)
    conflict = result_for(PAUSE, 0, 1, 5, error=Conflict("job_1 is at version 3, not 2"))
    assert conflict.code is ResultCode.CONFLICT and not conflict.accepted
    refused = result_for(PAUSE, 0, 1, 5, error=TransitionError("job job_1 does not exist"))
    assert refused.code is ResultCode.REFUSED and refused.reason == "job job_1 does not exist"


def test_a_long_reason_is_capped() -> None:
    r = result_for(PAUSE, 0, 1, 5, error=TransitionError("x" * 10_000))
    assert r.reason is not None and len(r.reason) == 2048


def test_a_job_the_sender_cannot_see_is_refused_naming_job_id_and_the_api_answers_404() -> None:
    from gnomon.api.answers import refusal
    from gnomon.core.errors import JobNotFound, NotFound

    spec = SPEC
    state = J.evolve(None, J.decide(None, J.RegisterJob("job_1", "acme", spec, 0))[0])
    for cmd, state_of in ((PAUSE, None), (J.PauseJob("job_1", "other", 1_000), state)):
        try:
            J.decide(state_of, cmd)
            raise AssertionError("accepted")
        except JobNotFound as exc:
            r = result_for(cmd, 0, 1, 5, error=exc)
        assert (r.code, r.field) == (ResultCode.REFUSED, "jobId")
        err = refusal(r)
        assert isinstance(err, NotFound) and str(err) == "no job 'job_1'"  # the same for both: nothing leaks


def test_an_accepted_retry_of_a_registration_says_already_registered() -> None:
    from gnomon import codec
    from gnomon.core.replies import ALREADY_REGISTERED
    from gnomon.testing import DecidingProducer

    spec = SPEC
    from gnomon.core.clock import FakeClock

    p = DecidingProducer(clock=FakeClock(10))

    topic = p.topo.job_commands
    first = p.send(topic, "job_1", codec.encode(J.RegisterJob("job_1", "acme", spec, 0), topic))
    again = p.send(topic, "job_1", codec.encode(J.RegisterJob("job_1", "acme", spec, 5), topic))
    assert first is not None and again is not None
    assert p.results[first].accepted and p.results[first].reason is None and p.results[first].job_version == 1
    assert p.results[again].accepted and p.results[again].reason == ALREADY_REGISTERED
    assert p.results[again].job_version == 1
