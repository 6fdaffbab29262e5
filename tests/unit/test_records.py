"""core.records.replace: the same objects as dataclasses.replace, faster where exact."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.unit.test_codec import assert_identical, dataclass_strategy

from gnomon.core import records
from gnomon.core.jobs import JobState
from gnomon.core.runs import RunConfig, RunState


@pytest.mark.parametrize("cls", [RunState, JobState], ids=lambda c: c.__name__)
@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_replace_matches_dataclasses_replace(cls: type, data: st.DataObject) -> None:
    base, donor = data.draw(dataclass_strategy(cls)), data.draw(dataclass_strategy(cls))
    names = data.draw(st.sets(st.sampled_from([f.name for f in dataclasses.fields(cls)])))
    changes: dict[str, Any] = {n: getattr(donor, n) for n in names}
    got, want = records.replace(base, **changes), dataclasses.replace(base, **changes)
    assert type(got) is cls
    assert_identical(got, want)
    assert got == want and hash(got) == hash(want)
    assert_identical(base, dataclasses.replace(base))  # the original is untouched
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.run_id = "x" if cls is RunState else got.job_id  # type: ignore[misc, union-attr]


def test_a_class_that_checks_itself_still_does() -> None:
    cfg = RunConfig()
    assert records.replace(cfg, lease_ms=5_000).lease_ms == 5_000
    with pytest.raises(AssertionError):
        records.replace(cfg, lease_ms=0)  # __post_init__ ran: dataclasses.replace


@settings(max_examples=5)
@given(run=dataclass_strategy(RunState))
def test_an_unknown_field_is_refused(run: RunState) -> None:
    with pytest.raises(TypeError):
        records.replace(run, no_such_field=1)
