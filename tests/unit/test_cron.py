"""Cron parsing and next-fire times, including daylight saving in three zones."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gnomon.core.clock import iso_to_ms, ms_to_iso
from gnomon.core.cron import CronSchedule
from gnomon.core.errors import ValidationError


def fires(expr: str, tz: str, after: str, n: int) -> list[str]:
    return [ms_to_iso(x) for x in CronSchedule.parse(expr, tz).next_n(iso_to_ms(after), n)]


def test_six_fields_means_seconds_first() -> None:
    assert fires("*/5 * * * * *", "UTC", "2026-03-07T00:00:02Z", 3) == [
        "2026-03-07T00:00:05Z", "2026-03-07T00:00:10Z", "2026-03-07T00:00:15Z"]


def test_macros_expand() -> None:
    assert CronSchedule.parse("@hourly").expr == "0 * * * *"
    assert fires("@daily", "Europe/London", "2026-06-01T12:00:00Z", 1) == ["2026-06-01T23:00:00Z"]


@pytest.mark.parametrize(
    ("expr", "tz", "field"),
    [("61 * * * *", "UTC", "schedule"), ("* * *", "UTC", "schedule"), ("@sometimes", "UTC", "schedule"),
     ("* * * * *", "Mars/Olympus", "timezone"), ("0 0 31 2 *", "UTC", "schedule"), ("", "UTC", "schedule")],
)
def test_bad_expressions_name_their_field(expr: str, tz: str, field: str) -> None:
    with pytest.raises(ValidationError) as err:
        CronSchedule.parse(expr, tz)
    assert err.value.field == field


# ---- daylight saving: Debian cron semantics ------------------------------------------------

def test_new_york_spring_forward_fixed_time_runs_right_after_the_jump() -> None:
    # 2026-03-08 02:00 EST -> 03:00 EDT; 02:30 does not exist
    assert fires("30 2 * * *", "America/New_York", "2026-03-07T12:00:00Z", 2) == [
        "2026-03-08T07:00:00Z",  # 03:00 EDT, right after the jump
        "2026-03-09T06:30:00Z",  # 02:30 EDT
    ]


def test_new_york_fall_back_fixed_time_runs_once() -> None:
    # 2026-11-01 01:00-02:00 happens twice; 01:30 runs once (first occurrence, EDT)
    assert fires("30 1 * * *", "America/New_York", "2026-10-31T12:00:00Z", 2) == [
        "2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"]


def test_new_york_fall_back_subhourly_follows_wall_clock() -> None:
    got = fires("*/30 * * * *", "America/New_York", "2026-11-01T04:50:00Z", 5)
    # 01:00 EDT, 01:30 EDT, 01:00 EST, 01:30 EST, 02:00 EST: every wall-clock slot of both hours
    assert got == ["2026-11-01T05:00:00Z", "2026-11-01T05:30:00Z", "2026-11-01T06:00:00Z",
                   "2026-11-01T06:30:00Z", "2026-11-01T07:00:00Z"]


def test_london_spring_forward_and_fall_back() -> None:
    # 2026-03-29 01:00 GMT -> 02:00 BST
    assert fires("30 1 * * *", "Europe/London", "2026-03-28T12:00:00Z", 2) == [
        "2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z"]
    # 2026-10-25 01:00-02:00 twice
    assert fires("30 1 * * *", "Europe/London", "2026-10-24T12:00:00Z", 2) == [
        "2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"]


def test_lord_howe_half_hour_shift() -> None:
    # Lord Howe: +10:30 standard, +11 summer; 2026-10-04 02:00 -> 02:30
    assert fires("15 2 * * *", "Australia/Lord_Howe", "2026-10-02T12:00:00Z", 3) == [
        "2026-10-02T15:45:00Z",  # 02:15 +10:30 on Oct 3
        "2026-10-03T15:30:00Z",  # 02:15 missing on Oct 4 -> right after the jump, 02:30 +11
        "2026-10-04T15:15:00Z",  # 02:15 +11
    ]
    # 2027-04-04 02:00 +11 -> 01:30 +10:30: 01:45 happens twice, runs once
    assert fires("45 1 * * *", "Australia/Lord_Howe", "2027-04-02T12:00:00Z", 3) == [
        "2027-04-02T14:45:00Z", "2027-04-03T14:45:00Z", "2027-04-04T15:15:00Z"]


@settings(max_examples=200, deadline=None)
@given(
    expr=st.sampled_from(["*/7 * * * *", "0 */3 * * *", "15,45 9-17 * * 1-5", "*/20 * * * * *", "0 0 1 * *"]),
    tz=st.sampled_from(["UTC", "America/New_York", "Europe/London", "Australia/Lord_Howe", "Asia/Kolkata"]),
    after=st.integers(min_value=1_700_000_000_000, max_value=1_900_000_000_000),
)
def test_fire_times_strictly_increase_and_are_whole_seconds(expr: str, tz: str, after: int) -> None:
    got = CronSchedule.parse(expr, tz).next_n(after, 5)
    assert len(got) == 5
    assert got[0] > after
    assert all(b > a for a, b in itertools.pairwise(got))
    assert all(x % 1000 == 0 for x in got)
