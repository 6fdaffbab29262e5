"""Exclusion calendars (issue 25; docs/schedules.md "Calendars"): the pure parts
(``core.calendars``: the API's rules, the date check in the calendar's zone, the book),
the scheduler's decision (a slot on an excluded date is recorded skipped with the reason,
never silently; a calendar's skip is no run for maxRuns), and the simulation with the
clock: a calendar excluding today's date skips today's slot and runs tomorrow's."""

from __future__ import annotations

import pytest

from gnomon.core import jobs as J
from gnomon.core import runs as R
from gnomon.core.calendars import CalendarBook, calendar_to_json, parse_calendar
from gnomon.core.clock import iso_to_ms
from gnomon.core.errors import ValidationError
from gnomon.core.validation import parse_job_spec
from gnomon.sim import SimCluster

T0 = iso_to_ms("2026-12-24T00:00:00Z")
HOLIDAYS = {"timezone": "Europe/London", "dates": ["2026-12-25", {"from": "2026-12-24", "to": "2026-12-26"},
                                                   "2027-01-01"]}


def test_a_calendar_merges_its_ranges_and_checks_dates_in_its_zone() -> None:
    cal = parse_calendar("acme", "uk-bank-holidays", HOLIDAYS, T0)
    assert [(r.first, r.last) for r in cal.ranges] == [("2026-12-24", "2026-12-26"), ("2027-01-01", "2027-01-01")]
    assert cal.days() == 4
    assert cal.excludes(iso_to_ms("2026-12-26T23:30:00Z"))  # 23:30 GMT, still the 26th in London
    assert not cal.excludes(iso_to_ms("2026-12-27T00:00:00Z"))
    ny = parse_calendar("acme", "ny", {"timezone": "America/New_York", "dates": ["2027-01-01"]}, T0)
    assert not ny.excludes(iso_to_ms("2027-01-01T03:00:00Z"))  # 22:00 on the 31st in New York
    assert ny.excludes(iso_to_ms("2027-01-02T03:00:00Z"))  # 22:00 on the 1st
    assert calendar_to_json(cal)["dates"] == [{"from": "2026-12-24", "to": "2026-12-26"}, "2027-01-01"]


@pytest.mark.parametrize(("name", "data", "field"), [
    ("Bad Name", HOLIDAYS, "name"),
    ("ok", {"dates": ["2026-13-01"]}, "dates[0]"),
    ("ok", {"dates": [{"from": "2026-12-26", "to": "2026-12-24"}]}, "dates[0].to"),
    ("ok", {"dates": [{"from": "2026-01-01", "to": "2027-06-01"}]}, "dates[0].to"),
    ("ok", {"dates": [{"from": "2026-01-01", "until": "2026-01-02"}]}, "dates[0].until"),
    ("ok", {"dates": "2026-12-25"}, "dates"),
    ("ok", {"dates": ["2026-12-25"] * 1001}, "dates"),
    ("ok", {"timezone": "Mars/Olympus", "dates": []}, "timezone"),
    ("ok", {"dates": [], "colour": "red"}, "colour"),
])
def test_bad_calendars_name_the_field(name: str, data: object, field: str) -> None:
    with pytest.raises(ValidationError) as err:
        parse_calendar("acme", name, data, T0)
    assert err.value.field == field


def test_the_book_refuses_a_record_whose_key_names_another_calendar() -> None:
    book = CalendarBook()
    cal = parse_calendar("acme", "h", HOLIDAYS, T0)
    with pytest.raises(ValidationError):
        book.apply("other/h", cal)
    book.apply("acme/h", cal)
    assert book.get("acme", "h") == cal and book.get("other", "h") is None
    assert book.missing("acme", ["h", "x"]) == ["x"]
    book.apply("acme/h", None)
    assert book.of_tenant("acme") == []


def test_a_slot_on_an_excluded_date_is_recorded_skipped_with_the_reason() -> None:
    cal = parse_calendar("t", "h", HOLIDAYS, T0)
    spec = parse_job_spec({"name": "j", "schedule": "0 9 * * *", "timezone": "Europe/London", "maxRuns": 2,
                           "excludeCalendars": ["h"], "target": {"type": "handler", "name": "h"}}, T0)
    (reg,) = J.decide(None, J.RegisterJob("j", "t", spec, T0))
    state = J.evolve(None, reg)
    assert state is not None
    decided: list[J.JobEvent] = []
    now = T0
    while now < iso_to_ms("2027-01-05T00:00:00Z") and state.status is J.JobStatus.ACTIVE:
        for ev in J.decide_tick(state, now, calendars=(cal,)):
            state = J.evolve(state, ev)  # type: ignore[assignment]
            decided.append(ev)
        now += 3_600_000
    skipped = [ev for ev in decided if isinstance(ev, J.RunSkipped)]
    runs = [ev for ev in decided if isinstance(ev, J.RunTriggered)]
    assert [ev.slot_ms for ev in skipped] == [iso_to_ms(f"2026-12-{d}T09:00:00Z") for d in (24, 25, 26)]
    assert {ev.reason for ev in skipped} == {"calendar h"}
    # the skips are no runs: maxRuns 2 are the 27th and the 28th
    assert [ev.slot_ms for ev in runs] == [iso_to_ms("2026-12-27T09:00:00Z"), iso_to_ms("2026-12-28T09:00:00Z")]
    assert state.status is J.JobStatus.DONE and state.scheduled_runs == 2
    with pytest.raises(ValidationError) as err:
        parse_job_spec({"name": "j", "schedule": "0 9 * * *", "excludeCalendars": ["h", "h"],
                        "target": {"type": "handler", "name": "h"}}, T0)
    assert err.value.field == "excludeCalendars"


@pytest.mark.usefixtures("quiet_logs")
@pytest.mark.parametrize("seed", range(2), ids=lambda s: f"seed-{s}")
def test_a_calendar_excluding_today_skips_todays_slot_and_runs_tomorrows(seed: int) -> None:
    c = SimCluster(seed, processors=2, workers=2, partitions=4)
    c.clock.set(iso_to_ms("2026-12-25T11:58:00Z"))
    c.put_calendar("xmas", ["2026-12-25"], tz="Europe/London")
    c.run_for(2_000, faults=False)
    c.register("noon", "0 0 12 * * *", exclude_calendars=("xmas",))
    c.register("unknown", "0 0 12 * * *", exclude_calendars=("nope",))  # refused: no such calendar
    c.run_for(180_000, faults=False)  # past today's noon
    c.clock.set(iso_to_ms("2026-12-26T11:58:00Z"))  # a day later (the processors see an absence)
    c.run_for(180_000, faults=False)
    c.heal(10_000)
    runs: dict[str, R.RunState] = {}
    for state in c.ledger():
        runs[state.run_id] = state
    today, tomorrow = runs["noon@2026-12-25T12:00:00Z"], runs["noon@2026-12-26T12:00:00Z"]
    assert today.status is R.RunStatus.SKIPPED and today.reason == "calendar xmas" and today.started_at_ms is None
    assert tomorrow.status is R.RunStatus.SUCCEEDED
    assert "unknown" not in c.jobs()
    rep = c.history_report(never_due=["unknown"])  # (refused: no such calendar)
    assert rep.missed == 0 and rep.duplicates == 0 and not rep.problems, f"{rep.summary()} {rep.problems[:5]}"


def test_a_backfill_leaves_the_excluded_slots_out() -> None:
    from gnomon.api.backfill import plan_backfill
    from gnomon.core.calendars import excluded_by

    cal = parse_calendar("t", "h", {"dates": ["2026-12-25"]}, T0)
    spec = parse_job_spec({"name": "j", "schedule": "0 9 * * *", "excludeCalendars": ["h"],
                           "target": {"type": "handler", "name": "h"}}, T0)
    state = J.JobState("j", "t", spec, J.JobStatus.ACTIVE, iso_to_ms("2026-12-27T09:00:00Z"), 1, T0, T0)
    send, ids, left, skip = plan_backfill(state, T0, iso_to_ms("2026-12-26T23:00:00Z"), lambda _: None,
                                          lambda s: excluded_by((cal,), s) is not None)
    assert send == [iso_to_ms("2026-12-24T09:00:00Z"), iso_to_ms("2026-12-26T09:00:00Z")]
    assert skip == ["j@2026-12-25T09:00:00Z"] and left == [] and len(ids) == 2


def test_a_command_naming_an_unknown_calendar_reads_them_unless_a_later_read_did() -> None:
    from gnomon.processor.catch_up import CatchUpGate

    gate = CatchUpGate(skew_ms=1_000, reads_per_s_max=3)
    assert gate.should_read(made_at_ms=10_000, now_s=0.0)  # nothing read yet
    gate.read_done(began_ms=10_100)
    # a command made just after (the PUT came in between): the read may have missed it
    assert gate.should_read(made_at_ms=10_200, now_s=0.1)
    gate.read_done(began_ms=12_000)
    assert not gate.should_read(made_at_ms=10_500, now_s=0.2)  # began 1.5 s after it was made: covered
    assert gate.should_read(made_at_ms=11_500, now_s=0.3)  # within the clock skew: read again
    assert not gate.should_read(made_at_ms=20_000, now_s=0.4)  # the fourth read in a second: no
    assert gate.should_read(made_at_ms=20_000, now_s=1.5)  # a second later: yes
