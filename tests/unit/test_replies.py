"""The result a producer reads for its job command: accepted, or refused with the same
field, limit and reason the REST API would give."""

from __future__ import annotations

from gnomon.core import jobs as J
from gnomon.core.errors import Conflict, LimitExceeded, TransitionError, ValidationError
from gnomon.core.replies import ResultCode, result_for

PAUSE = J.PauseJob("job_1", "acme", 1_000)


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
