"""Moving a job between regions, the pure core (``gnomon.core.jobs``: MoveJob, AdoptJob).

The handover property (hypothesis): over any interval schedule, any move time, any delay
before the new region adopts the job and any tick cadence in either region, the slots
the old home triggers and those the new home triggers (or records skipped, when the
adoption came so late that they were given up) are every slot of the window, each once."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gnomon.core import jobs as J
from gnomon.core.command_checks import check_command
from gnomon.core.errors import Conflict, JobNotFound, TransitionError, ValidationError
from gnomon.core.model import JobSpec, Schedule, Target, TargetType, Upstream

T0 = 1_767_225_600_000
CFG = J.SchedulerConfig(lookahead_ms=30_000)


def spec(every_s: int = 60, **extra: object) -> JobSpec:
    return JobSpec(name="j", schedule=Schedule(every_s=every_s, anchor_ms=T0), target=Target(TargetType.HANDLER,
                                                                                               handler="h"), **extra)


def registered(s: JobSpec | None = None, at_ms: int = T0) -> J.JobState:
    state = None
    for ev in J.decide(None, J.RegisterJob("j", "acme", s or spec(), at_ms)):
        state = J.evolve(state, ev)
    assert state is not None
    return state


def apply(state: J.JobState | None, events: list[J.JobEvent]) -> J.JobState | None:
    for ev in events:
        state = J.evolve(state, ev)
    return state


def test_a_move_hands_over_at_the_schedule_position() -> None:
    state = apply(registered(), J.decide_tick(registered(), T0 + 1, CFG))  # the lookahead's slots, triggered
    assert state is not None and state.next_run_at_ms == T0 + 60_000
    (moved,) = J.decide(state, J.MoveJob("j", "acme", "b", T0 + 5), region="a")
    assert moved == J.JobMovedOut("j", "b", T0 + 5)
    adopt = J.adoption_of(state, moved, "a")
    gone = J.evolve(state, moved)
    assert gone is not None
    assert (gone.status, gone.next_run_at_ms, gone.moved_to, gone.version) == (J.JobStatus.DONE, None, "b", 2)
    assert J.ended_because(gone) == "moved to region b (its later slots run there)"
    assert J.decide_tick(gone, T0 + 120_000, CFG) == []  # nothing more is scheduled here
    (adopted,) = J.decide(None, adopt, region="b")
    there = J.evolve(None, adopted)
    assert there is not None
    assert (there.status, there.next_run_at_ms, there.version, there.created_at_ms, there.scheduled_runs) == (
        J.JobStatus.ACTIVE, T0 + 60_000, 2, state.created_at_ms, state.scheduled_runs)


def test_a_paused_job_arrives_paused() -> None:
    paused = apply(registered(), J.decide(registered(), J.PauseJob("j", "acme", T0 + 1)))
    assert paused is not None
    (moved,) = J.decide(paused, J.MoveJob("j", "acme", "b", T0 + 2), region="a")
    there = apply(None, J.decide(None, J.adoption_of(paused, moved, "a"), region="b"))
    assert there is not None and there.status is J.JobStatus.PAUSED


@pytest.mark.parametrize(("state", "cmd", "region", "error", "words"), [
    (registered(), J.MoveJob("j", "acme", "b", T0), None, TransitionError, "default namespace"),
    (registered(), J.MoveJob("j", "acme", "a", T0), "a", ValidationError, "in region a already"),
    (registered(), J.MoveJob("j", "other", "b", T0), "a", JobNotFound, "does not exist"),
    (registered(spec(after=(Upstream("up"),))), J.MoveJob("j", "acme", "b", T0), "a", TransitionError,
     "upstreams or downstreams"),
])
def test_moves_refused(state: J.JobState, cmd: J.MoveJob, region: str | None, error: type[Exception],
                       words: str) -> None:
    with pytest.raises(error, match=words):
        J.decide(state, cmd, region=region)


def test_a_moved_job_takes_no_command_but_its_return() -> None:
    state = registered()
    (moved,) = J.decide(state, J.MoveJob("j", "acme", "b", T0 + 1), region="a")
    gone = J.evolve(state, moved)
    for cmd in (J.PauseJob("j", "acme", T0 + 2), J.DeleteJob("j", "acme", T0 + 2),
                J.RegisterJob("j", "acme", spec(), T0 + 2), J.MoveJob("j", "acme", "c", T0 + 2)):
        with pytest.raises(TransitionError, match="moved to region b"):
            J.decide(gone, cmd, region="a")
    adopt = J.adoption_of(state, moved, "a")
    # b refuses it (the id is taken there): it goes back, and a takes it where it left it
    with pytest.raises(Conflict, match="exists in region b already"):
        J.decide(registered(spec(every_s=120)), adopt, region="b")
    back = J.returned(adopt, "b")
    assert (back.from_region, back.returned) == ("b", True)
    again = apply(gone, J.decide(gone, back, region="a"))
    assert again is not None and again.status is J.JobStatus.ACTIVE and again.moved_to is None
    assert again.next_run_at_ms == state.next_run_at_ms
    # a return is taken only by the region the job left for it
    with pytest.raises(TransitionError, match="did not move"):
        J.decide(registered(), back, region="a")
    with pytest.raises(TransitionError, match="did not move from here"):
        J.decide(None, back, region="a")
    with pytest.raises(ValidationError):
        J.decide(None, adopt, region="a")  # (read in the region it came from)


def test_the_decider_checks_move_and_adoption_fields() -> None:
    with pytest.raises(ValidationError, match="not a region name") as bad:
        check_command(J.MoveJob("j", "acme", "B!", T0), T0)
    assert bad.value.field == "region"
    state = registered()
    adopt = J.adoption_of(state, J.JobMovedOut("j", "b", T0), "a")
    assert check_command(adopt, T0) == adopt
    with pytest.raises(ValidationError) as bad:
        check_command(J.AdoptJob("j", "acme", spec(), None, False, 0, 1, T0, "A", T0), T0)
    assert bad.value.field == "from_region"


def _triggered(state: J.JobState, ticks: list[int]) -> tuple[J.JobState, list[J.JobEvent]]:
    out: list[J.JobEvent] = []
    for now in ticks:
        events = J.decide_tick(state, now, CFG, present_since_ms=T0)
        new = apply(state, events)
        assert new is not None
        state, out = new, out + events
    return state, out


@settings(max_examples=200, deadline=None)
@given(every_s=st.integers(1, 90), move_after_ms=st.integers(0, 300_000), adopt_delay_ms=st.integers(0, 120_000),
       tick_ms=st.integers(100, 5_000))
def test_every_slot_once_across_a_move(every_s: int, move_after_ms: int, adopt_delay_ms: int, tick_ms: int) -> None:
    start = registered(spec(every_s), T0)
    move_at = T0 + move_after_ms
    state, before = _triggered(start, list(range(T0, move_at, tick_ms)))
    (moved,) = J.decide(state, J.MoveJob("j", "acme", "b", move_at), CFG, region="a")
    adopt = J.adoption_of(state, moved, "a")
    gone = J.evolve(state, moved)
    assert gone is not None and J.decide_tick(gone, move_at + 600_000, CFG) == []
    adopt_at = move_at + adopt_delay_ms
    there = apply(None, J.decide(None, J.replace(adopt, at_ms=adopt_at), CFG, region="b"))
    assert there is not None
    end = adopt_at + 200_000
    _, after = _triggered(there, list(range(adopt_at, end, tick_ms)))
    covered: list[int] = []
    for ev in [*before, *after]:
        if isinstance(ev, J.RunTriggered):
            covered.append(ev.slot_ms)
        elif isinstance(ev, J.RunSkipped):  # given up (the adoption came later than late_max): recorded
            covered.extend(J.slots_between(start.spec, ev.from_ms or ev.slot_ms, ev.slot_ms, 10_000))
    window = J.slots_between(start.spec, T0, end + CFG.lookahead_ms, 100_000)  # (the lookahead reaches past end)
    assert sorted(covered) == window[:len(covered)] and len(set(covered)) == len(covered)
    assert len(covered) >= len([s for s in window if s <= end - CFG.lookahead_ms])  # nothing left behind
    if adopt_delay_ms < CFG.misfire_grace_ms:
        assert not any(isinstance(ev, J.RunSkipped) for ev in after)  # in time: every slot runs


def test_the_cli_refuses_a_bad_region_in_one_line() -> None:
    from typer.testing import CliRunner

    from gnomon.cli import main as cli_main

    out = CliRunner().invoke(cli_main.app, ["jobs", "move", "job_x", "--to", "B!"])
    assert out.exit_code == 2, out.output
    assert out.output.strip().count("\n") == 0 and "--to: 'B!' is not a region name" in out.output
