"""Per-job jitter: a scheduled run starts at a deterministic offset in [slot, slot +
jitterS]; its id keeps the nominal slot; manual runs start at once."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from gnomon.cli.main import app
from gnomon.core import jobs as J
from gnomon.core.clock import iso_to_ms
from gnomon.core.model import JobSpec, Schedule, Target, TargetType, jitter_offset_ms, slot_run_id
from gnomon.core.validation import job_spec_to_json, parse_job_spec

T0 = iso_to_ms("2026-12-01T00:00:00Z")
CMD = Target(TargetType.COMMAND, argv=("true",))


@given(st.text(min_size=1, max_size=20), st.integers(0, 2**40), st.integers(0, 3600))
def test_the_offset_is_in_range_and_deterministic(job_id: str, slot_ms: int, jitter_s: int) -> None:
    off = jitter_offset_ms(job_id, slot_ms, jitter_s)
    assert 0 <= off <= jitter_s * 1000
    assert off == jitter_offset_ms(job_id, slot_ms, jitter_s)


def test_offsets_spread_over_the_window() -> None:
    offs = [jitter_offset_ms(f"job{i}", T0, 5) for i in range(1000)]
    assert min(offs) < 500 and max(offs) > 4500  # not all on the same offset
    assert {o // 1000 for o in offs} >= {0, 1, 2, 3, 4}  # every second of the window used


@given(st.integers(0, 30))
def test_a_triggered_run_keeps_its_slot_and_starts_jittered(jitter_s: int) -> None:
    spec = JobSpec(name="j", schedule=Schedule(cron="*/10 * * * * *"), target=CMD, jitter_s=jitter_s)
    state = None
    for ev in J.decide(state, J.RegisterJob("job1", "t", spec, T0)):
        state = J.evolve(state, ev)
    assert state is not None
    triggers = [e for e in J.decide_tick(state, T0 + 1_000) if isinstance(e, J.RunTriggered)]
    assert triggers
    for t in triggers:
        assert t.run_id == slot_run_id("job1", t.slot_ms)
        assert t.not_before_ms == t.slot_ms + jitter_offset_ms("job1", t.slot_ms, jitter_s)
        assert t.slot_ms <= t.not_before_ms <= t.slot_ms + jitter_s * 1000


def test_manual_triggers_are_not_jittered() -> None:
    spec = JobSpec(name="j", schedule=Schedule(cron="*/10 * * * * *"), target=CMD, jitter_s=30)
    state = None
    for ev in J.decide(state, J.RegisterJob("job1", "t", spec, T0)):
        state = J.evolve(state, ev)
    (run,) = J.decide(state, J.TriggerJob("job1", "t", "k1", T0 + 5))
    assert isinstance(run, J.RunTriggered) and run.not_before_ms == T0 + 5


def test_jitter_is_validated_and_round_trips() -> None:
    body = {"name": "j", "schedule": "*/10 * * * * *", "target": {"type": "command", "argv": ["true"]},
            "jitterS": 7}
    spec = parse_job_spec(body, T0)
    assert spec.jitter_s == 7 and parse_job_spec(job_spec_to_json(spec), T0) == spec
    for bad in (-1, 3601, 1.5, "5"):
        try:
            parse_job_spec({**body, "jitterS": bad}, T0)
        except Exception as exc:
            assert getattr(exc, "field", None) == "jitterS"
        else:
            raise AssertionError(f"jitterS={bad!r} accepted")


def test_cron_next_shows_the_jittered_starts() -> None:
    result = CliRunner().invoke(app, ["cron", "next", "*/10 * * * * *", "--after", "2026-12-01T00:00:00Z",
                                      "--count", "3", "--jitter-s", "5", "--job", "job_abc", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    for slot, start in zip(out["next"], out["starts"], strict=True):
        offset = jitter_offset_ms("job_abc", iso_to_ms(slot), 5)
        assert iso_to_ms(start) == iso_to_ms(slot) + offset
    missing = CliRunner().invoke(app, ["cron", "next", "* * * * *", "--jitter-s", "5"])
    assert missing.exit_code == 2 and "--job" in missing.output
