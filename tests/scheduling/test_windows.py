import time as clock
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduling.windows import (
    Calendar,
    CalendarError,
    Segment,
    Window,
    active_window,
    check,
    next_transition,
    transitions,
    validate,
    value_at,
    week_segments,
)

BERLIN = "Europe/Berlin"
NEW_YORK = "America/New_York"
MON_FRI = frozenset(range(5))
FRI, SAT, SUN = 4, 5, 6


def local(tz, *args, fold=0):
    return datetime(*args, tzinfo=ZoneInfo(tz), fold=fold)


def utc(*args):
    return datetime(*args, tzinfo=UTC)


def day_night(tz=BERLIN, exceptions=()):
    return Calendar(tz, (Window(MON_FRI, time(8), time(20), "A", "day"),), "B", frozenset(exceptions))


def spans(calendar, start, end):
    """(entered, left) UTC instants of every stretch spent away from the baseline in (start, end]."""
    found, entered = [], None
    for change in transitions(calendar, start, end):
        if change.to_value != calendar.baseline:
            entered = change.at
        else:
            found.append((entered, change.at))
    return found


# Daylight saving time


@pytest.mark.parametrize(
    ("tz", "day", "starts_at"),
    [
        (BERLIN, date(2026, 3, 27), utc(2026, 3, 27, 7)),  # Friday before spring forward: CET
        (BERLIN, date(2026, 3, 30), utc(2026, 3, 30, 6)),  # Monday after: CEST
        (BERLIN, date(2026, 10, 23), utc(2026, 10, 23, 6)),  # Friday before fall back: CEST
        (BERLIN, date(2026, 10, 26), utc(2026, 10, 26, 7)),  # Monday after: CET
        (NEW_YORK, date(2026, 3, 6), utc(2026, 3, 6, 13)),  # EST
        (NEW_YORK, date(2026, 3, 9), utc(2026, 3, 9, 12)),  # EDT
        (NEW_YORK, date(2026, 10, 30), utc(2026, 10, 30, 12)),  # EDT
        (NEW_YORK, date(2026, 11, 2), utc(2026, 11, 2, 13)),  # EST
    ],
)
def test_window_starts_at_local_wall_clock_time_on_both_sides_of_dst(tz, day, starts_at):
    calendar = day_night(tz)
    midnight = local(tz, day.year, day.month, day.day)
    changes = transitions(calendar, midnight, midnight + timedelta(days=1))
    assert [(c.at, c.local.hour, c.to_value) for c in changes] == [
        (starts_at, 8, "A"),
        (starts_at + timedelta(hours=12), 20, "B"),
    ]
    assert changes[0].at.tzinfo is UTC
    assert changes[0].local.tzinfo == ZoneInfo(tz)


def test_night_window_lasts_as_long_as_the_wall_clock_says():
    calendar = Calendar(BERLIN, (Window({SAT}, time(22), time(6), "night"),), "day")
    assert spans(calendar, utc(2026, 3, 28), utc(2026, 3, 30)) == [(utc(2026, 3, 28, 21), utc(2026, 3, 29, 4))]
    assert spans(calendar, utc(2026, 10, 24), utc(2026, 10, 26)) == [(utc(2026, 10, 24, 20), utc(2026, 10, 25, 5))]


def test_time_inside_spring_forward_gap_means_the_end_of_the_gap():
    calendar = Calendar(BERLIN, (Window({SUN}, time(2, 30), time(4), "X"),), "B")
    # 02:30 does not exist on 2026-03-29: the window starts at 03:00 CEST, 01:00Z.
    assert spans(calendar, utc(2026, 3, 28), utc(2026, 3, 30)) == [(utc(2026, 3, 29, 1), utc(2026, 3, 29, 2))]
    assert value_at(calendar, utc(2026, 3, 29, 0, 59)) == "B"
    assert value_at(calendar, utc(2026, 3, 29, 1)) == "X"

    new_york = Calendar(NEW_YORK, (Window({SUN}, time(2, 30), time(3, 30), "X"),), "B")
    assert spans(new_york, utc(2026, 3, 8), utc(2026, 3, 9)) == [(utc(2026, 3, 8, 7), utc(2026, 3, 8, 7, 30))]


def test_window_wholly_inside_the_gap_does_not_run_that_day():
    calendar = Calendar(BERLIN, (Window({SUN}, time(2), time(2, 30), "X"),), "B")
    assert transitions(calendar, utc(2026, 3, 28), utc(2026, 3, 30)) == []
    assert value_at(calendar, utc(2026, 3, 29, 1)) == "B"
    # A week later, in summer time, it runs as configured.
    assert spans(calendar, utc(2026, 4, 4), utc(2026, 4, 6)) == [(utc(2026, 4, 5, 0), utc(2026, 4, 5, 0, 30))]


def test_windows_touching_inside_the_gap_still_touch():
    calendar = Calendar(
        BERLIN, (Window({SUN}, time(1), time(2, 30), "X", "x"), Window({SUN}, time(2, 30), time(4), "Y", "y")), "B"
    )
    changes = transitions(calendar, utc(2026, 3, 28), utc(2026, 3, 30))
    assert [(c.at, c.from_value, c.to_value) for c in changes] == [
        (utc(2026, 3, 29, 0), "B", "X"),
        (utc(2026, 3, 29, 1), "X", "Y"),
        (utc(2026, 3, 29, 2), "Y", "B"),
    ]


def test_repeated_local_time_means_its_first_occurrence():
    calendar = Calendar(BERLIN, (Window({SUN}, time(2, 30), time(3, 30), "X"),), "B")
    # Starts at the first 02:30 (CEST, 00:30Z); 03:30 happens once, in CET: two real hours.
    assert spans(calendar, utc(2026, 10, 24), utc(2026, 10, 26)) == [
        (utc(2026, 10, 25, 0, 30), utc(2026, 10, 25, 2, 30))
    ]
    assert value_at(calendar, local(BERLIN, 2026, 10, 25, 2, 45, fold=0)) == "X"
    assert value_at(calendar, local(BERLIN, 2026, 10, 25, 2, 45, fold=1)) == "X"


def test_window_inside_the_repeated_hour_runs_once():
    calendar = Calendar(BERLIN, (Window({SUN}, time(2), time(2, 30), "X"),), "B")
    assert spans(calendar, utc(2026, 10, 24), utc(2026, 10, 26)) == [(utc(2026, 10, 25, 0), utc(2026, 10, 25, 0, 30))]
    assert value_at(calendar, local(BERLIN, 2026, 10, 25, 2, 15, fold=1)) == "B"

    new_york = Calendar(NEW_YORK, (Window({SUN}, time(1, 30), time(1, 45), "X"),), "B")
    assert spans(new_york, utc(2026, 11, 1), utc(2026, 11, 2)) == [(utc(2026, 11, 1, 5, 30), utc(2026, 11, 1, 5, 45))]
    assert value_at(new_york, local(NEW_YORK, 2026, 11, 1, 1, 40, fold=1)) == "B"


# Evaluation


def test_midnight_crossing_window_is_active_after_midnight():
    night = Window({FRI}, time(22), time(6), "N", "night")
    calendar = Calendar(BERLIN, (night,), "D")
    assert active_window(calendar, local(BERLIN, 2026, 5, 15, 21, 59)) is None
    assert active_window(calendar, local(BERLIN, 2026, 5, 15, 22)) == night
    assert active_window(calendar, local(BERLIN, 2026, 5, 16, 3)) == night
    assert value_at(calendar, local(BERLIN, 2026, 5, 16, 6)) == "D"
    assert value_at(calendar, local(BERLIN, 2026, 5, 17, 3)) == "D"  # Saturday night: no window starts Saturday


def test_window_stays_active_when_a_fall_back_crosses_midnight_backwards():
    # America/Goose_Bay, 2010-11-07: at 00:01 ADT the clock went back to 23:01 AST on Saturday.
    sunday = Window({SUN}, time(0), time(6), "X")
    calendar = Calendar("America/Goose_Bay", (sunday,), "B")
    assert active_window(calendar, utc(2010, 11, 7, 3, 30)) == sunday  # the wall clock reads Saturday 23:29
    assert spans(calendar, utc(2010, 11, 6), utc(2010, 11, 8)) == [(utc(2010, 11, 7, 3), utc(2010, 11, 7, 10))]


def test_weekday_set_selects_the_starting_days():
    calendar = Calendar("UTC", (Window({0, 2, 4}, time(9), time(17), "A"),), "B")
    noon = [value_at(calendar, utc(2026, 5, 11 + n, 12)) for n in range(7)]
    assert noon == ["A", "B", "A", "B", "A", "B", "B"]


def test_start_equal_to_end_is_a_full_day():
    calendar = Calendar("UTC", (Window({2}, time(6), time(6), "A"),), "B")
    assert value_at(calendar, utc(2026, 5, 13, 5, 59)) == "B"
    assert value_at(calendar, utc(2026, 5, 13, 6)) == "A"
    assert value_at(calendar, utc(2026, 5, 14, 5, 59)) == "A"
    assert value_at(calendar, utc(2026, 5, 14, 6)) == "B"


def test_holiday_monday_keeps_the_baseline_all_day():
    easter_monday = date(2026, 4, 6)
    calendar = day_night(exceptions={easter_monday})
    assert value_at(calendar, local(BERLIN, 2026, 4, 6, 12)) == "B"
    assert transitions(calendar, local(BERLIN, 2026, 4, 6), local(BERLIN, 2026, 4, 7)) == []
    assert value_at(calendar, local(BERLIN, 2026, 4, 7, 12)) == "A"


def test_window_started_the_evening_before_a_holiday_runs_to_its_end():
    night = Window({FRI}, time(22), time(6), "N", "night")
    saturday_off = Calendar(BERLIN, (night,), "D", frozenset({date(2026, 5, 16)}))
    assert value_at(saturday_off, local(BERLIN, 2026, 5, 16, 5, 59)) == "N"
    assert value_at(saturday_off, local(BERLIN, 2026, 5, 16, 6)) == "D"

    friday_off = Calendar(BERLIN, (night,), "D", frozenset({date(2026, 5, 15)}))
    assert value_at(friday_off, local(BERLIN, 2026, 5, 15, 23)) == "D"
    assert value_at(friday_off, local(BERLIN, 2026, 5, 16, 3)) == "D"


def test_evaluation_requires_an_aware_datetime():
    calendar = day_night()
    naive = datetime(2026, 5, 11, 12)
    with pytest.raises(ValueError, match="timezone-aware"):
        active_window(calendar, naive)
    with pytest.raises(ValueError, match="timezone-aware"):
        value_at(calendar, naive)
    with pytest.raises(ValueError, match="timezone-aware"):
        next_transition(calendar, naive)
    with pytest.raises(ValueError, match="start must be"):
        transitions(calendar, naive, utc(2026, 5, 12))
    with pytest.raises(ValueError, match="end must be"):
        transitions(calendar, utc(2026, 5, 10), naive)


def test_evaluating_an_invalid_calendar_raises():
    calendar = Calendar("Nowhere/Special", (), "B")
    with pytest.raises(CalendarError, match="Unknown time zone"):
        value_at(calendar, utc(2026, 5, 11))


def test_evaluating_a_pool_tick_is_cheap():
    zones = [BERLIN, NEW_YORK, "Asia/Tokyo", "UTC", "America/Santiago"]
    calendars = [day_night(zones[n % len(zones)]) for n in range(500)]
    now = utc(2026, 3, 29, 1, 30)
    began = clock.perf_counter()
    for calendar in calendars:
        for node in range(20):
            value_at(calendar, now + timedelta(seconds=node))
    assert clock.perf_counter() - began < 0.5


# Validation


def test_valid_calendar_has_no_errors():
    calendar = Calendar(
        BERLIN,
        (
            Window(MON_FRI, time(8), time(20), "A", "day"),
            Window(MON_FRI, time(20), time(8), "C", "night"),  # touches both ends of "day"
            Window({SAT}, time(8), time(8), "W", "weekend"),  # 24 h touching Friday's night window
        ),
        "B",
    )
    assert validate(calendar) == []
    check(calendar)


def test_overlap_on_the_same_day_names_both_windows_day_and_range():
    calendar = Calendar(
        BERLIN, (Window(MON_FRI, time(8), time(20), "A", "day"), Window({FRI}, time(19), time(23), "C", "late")), "B"
    )
    assert validate(calendar) == [
        "Windows 'day' (Mon–Fri 08:00–20:00) and 'late' (Fri 19:00–23:00) overlap on Friday 19:00–20:00."
    ]


def test_crossing_window_overlapping_next_morning_is_refused():
    calendar = Calendar(
        BERLIN,
        (Window(MON_FRI, time(8), time(20), "A", "day"), Window({SUN, FRI}, time(22), time(9), "N", "night")),
        "B",
    )
    assert validate(calendar) == [
        "Windows 'day' (Mon–Fri 08:00–20:00) and 'night' (Fri, Sun 22:00–09:00) overlap on Monday 08:00–09:00."
    ]


def test_overlap_on_several_days_is_one_error():
    calendar = Calendar("UTC", (Window(MON_FRI, time(8), time(20), "A"), Window(MON_FRI, time(6), time(9), "C")), "B")
    assert validate(calendar) == [
        "Windows #1 (Mon–Fri 08:00–20:00) and #2 (Mon–Fri 06:00–09:00) overlap on "
        "Monday, Tuesday, Wednesday, Thursday, Friday 08:00–09:00."
    ]


def test_overlap_across_midnight_says_so():
    calendar = Calendar("UTC", (Window({SUN}, time(22), time(2), "A"), Window({SUN}, time(23), time(1), "C")), "B")
    assert validate(calendar) == [
        "Windows #1 (Sun 22:00–02:00) and #2 (Sun 23:00–01:00) overlap on Sunday 23:00–01:00 (next day)."
    ]


def test_all_errors_are_reported_together():
    calendar = Calendar(
        "Mars/Olympus_Mons",
        (
            Window(set(), time(8), time(9), "A", "empty"),
            Window({7}, time(8), time(9), "A", "eighth"),
            Window({0}, time(8, 0, 30), time(9, tzinfo=UTC), "A", "precise"),
        ),
        "B",
    )
    assert validate(calendar) == [
        "Unknown time zone 'Mars/Olympus_Mons'.",
        "Window 'empty' (08:00–09:00) has no weekdays.",
        "Window 'eighth' (08:00–09:00) has weekdays outside 0 (Monday) to 6 (Sunday): [7].",
        "Window 'precise' (Mon 08:00–09:00) start must be a whole minute.",
        "Window 'precise' (Mon 08:00–09:00) end must be a local time without a time zone.",
    ]
    with pytest.raises(CalendarError) as raised:
        check(calendar)
    assert len(raised.value.errors) == 5


# Transitions


def test_day_night_week_has_ten_transitions():
    calendar = day_night()
    monday = local(BERLIN, 2026, 5, 11)
    changes = transitions(calendar, monday, monday + timedelta(days=7))
    assert len(changes) == 10
    assert [(c.local.weekday(), c.local.hour, c.from_value, c.to_value) for c in changes[:2]] == [
        (0, 8, "B", "A"),
        (0, 20, "A", "B"),
    ]
    assert {c.local.weekday() for c in changes} == set(range(5))
    assert all(c.window == calendar.windows[0] for c in changes if c.to_value == "A")
    assert all(c.window is None for c in changes if c.to_value == "B")


def test_adjacent_windows_with_the_same_value_make_no_transition():
    merged = Calendar(
        BERLIN,
        (Window(MON_FRI, time(8), time(12), "A", "morning"), Window(MON_FRI, time(12), time(20), "A", "afternoon")),
        "B",
    )
    monday = local(BERLIN, 2026, 5, 11)
    assert [c.at for c in transitions(merged, monday, monday + timedelta(days=7))] == [
        c.at for c in transitions(day_night(), monday, monday + timedelta(days=7))
    ]


def test_adjacent_windows_with_different_values_switch_directly():
    afternoon = Window({0}, time(12), time(20), "C", "afternoon")
    calendar = Calendar(BERLIN, (Window({0}, time(8), time(12), "A", "morning"), afternoon), "B")
    changes = transitions(calendar, local(BERLIN, 2026, 5, 11), local(BERLIN, 2026, 5, 12))
    assert [(c.local.hour, c.from_value, c.to_value) for c in changes] == [
        (8, "B", "A"),
        (12, "A", "C"),
        (20, "C", "B"),
    ]
    assert changes[1].window == afternoon


def test_window_with_the_baseline_value_changes_nothing():
    calendar = Calendar(BERLIN, (Window(MON_FRI, time(8), time(20), "B"),), "B")
    assert transitions(calendar, utc(2026, 5, 11), utc(2026, 5, 18)) == []


def test_transitions_cover_start_exclusive_end_inclusive():
    calendar = day_night()
    eight, twenty = local(BERLIN, 2026, 5, 11, 8), local(BERLIN, 2026, 5, 11, 20)
    assert [c.local.hour for c in transitions(calendar, eight, twenty)] == [20]
    assert [c.local.hour for c in transitions(calendar, eight - timedelta(microseconds=1), eight)] == [8]
    assert transitions(calendar, eight, eight) == []
    with pytest.raises(ValueError, match="before start"):
        transitions(calendar, twenty, eight)


def test_next_transition_looks_ahead_over_the_weekend():
    calendar = day_night()
    upcoming = next_transition(calendar, local(BERLIN, 2026, 5, 15, 21))
    assert (upcoming.local, upcoming.to_value) == (local(BERLIN, 2026, 5, 18, 8), "A")
    assert next_transition(calendar, local(BERLIN, 2026, 5, 18, 8)).local == local(BERLIN, 2026, 5, 18, 20)


def test_next_transition_is_none_beyond_the_horizon():
    assert next_transition(Calendar(BERLIN, (), "B"), utc(2026, 5, 11)) is None
    christmas = frozenset(date(2026, 12, 21) + timedelta(days=n) for n in range(14))
    calendar = day_night(exceptions=christmas)
    assert next_transition(calendar, utc(2026, 12, 19)) is None
    found = next_transition(calendar, utc(2026, 12, 19), horizon=timedelta(days=30))
    assert found.local == local(BERLIN, 2027, 1, 4, 8)


# Week timeline


def test_week_segments_draw_day_night():
    segments = week_segments(day_night(), date(2026, 3, 23))  # the week of the spring change: same picture
    monday = date(2026, 3, 23)
    assert segments[:3] == [
        Segment(monday, 0, 480, "B", ""),
        Segment(monday, 480, 1200, "A", "day"),
        Segment(monday, 1200, 1440, "B", ""),
    ]
    assert segments[-2:] == [Segment(date(2026, 3, 28), 0, 1440, "B", ""), Segment(date(2026, 3, 29), 0, 1440, "B", "")]
    assert len(segments) == 5 * 3 + 2


def test_week_segments_split_a_crossing_window_at_midnight():
    calendar = Calendar("UTC", (Window({FRI}, time(22), time(6), "N", "night"),), "D")
    segments = week_segments(calendar, date(2026, 5, 15))  # a Friday: the timeline may start any day
    assert segments[:4] == [
        Segment(date(2026, 5, 15), 0, 1320, "D", ""),
        Segment(date(2026, 5, 15), 1320, 1440, "N", "night"),
        Segment(date(2026, 5, 16), 0, 360, "N", "night"),
        Segment(date(2026, 5, 16), 360, 1440, "D", ""),
    ]


def test_week_segments_join_a_daily_24h_window():
    calendar = Calendar("UTC", (Window(range(7), time(6), time(6), "A", "all"),), "B", frozenset({date(2026, 5, 13)}))
    segments = week_segments(calendar, date(2026, 5, 11))
    assert [(s.day.day, s.start_minute, s.end_minute, s.value) for s in segments] == [
        (11, 0, 1440, "A"),
        (12, 0, 1440, "A"),
        (13, 0, 360, "A"),  # the holiday: only the window started the day before
        (13, 360, 1440, "B"),
        (14, 0, 360, "B"),
        (14, 360, 1440, "A"),
        (15, 0, 1440, "A"),
        (16, 0, 1440, "A"),
        (17, 0, 1440, "A"),
    ]


# Properties

ZONES = [BERLIN, NEW_YORK, "America/Santiago", "Australia/Lord_Howe", "Asia/Kolkata", "UTC"]
FIXED_ZONES = ["UTC", "Asia/Kolkata", "Asia/Tokyo"]


def _offset_changes(tz):
    zone, hour = ZoneInfo(tz), utc(2026, 1, 1)
    found = []
    while hour.year == 2026:
        if (hour + timedelta(hours=1)).astimezone(zone).utcoffset() != hour.astimezone(zone).utcoffset():
            found.append(hour)
        hour += timedelta(hours=1)
    return found


DST_INSTANTS = [instant for tz in ZONES for instant in _offset_changes(tz)]
TIMES = st.one_of(
    st.sampled_from([0, 60, 90, 120, 150, 180, 1380, 1410]), st.integers(0, 95).map(lambda quarter: quarter * 15)
)
WINDOWS = st.builds(
    lambda days, start, end, value, name: Window(days, time(*divmod(start, 60)), time(*divmod(end, 60)), value, name),
    st.frozensets(st.integers(0, 6), min_size=1),
    TIMES,
    TIMES,
    st.sampled_from("ABC"),
    st.sampled_from(["", "w1", "w2"]),
)
INSTANTS = st.one_of(
    st.builds(
        lambda base, minutes: base + timedelta(minutes=minutes), st.sampled_from(DST_INSTANTS), st.integers(-4320, 4320)
    ),
    st.builds(lambda minutes: utc(2026, 1, 1) + timedelta(minutes=minutes), st.integers(0, 366 * 1440)),
)


@st.composite
def calendars_and_instants(draw, zones=ZONES):
    tz = draw(st.sampled_from(zones))
    t = draw(INSTANTS)
    windows = []
    for candidate in draw(st.lists(WINDOWS, min_size=1, max_size=8)):
        if not validate(Calendar(tz, (*windows, candidate), "B")):
            windows.append(candidate)
    today = t.astimezone(ZoneInfo(tz)).date()
    exceptions = draw(st.frozensets(st.integers(-9, 1).map(lambda n: today + timedelta(days=n)), max_size=4))
    return Calendar(tz, tuple(windows), draw(st.sampled_from("ABC")), exceptions), t


@settings(max_examples=300)
@given(calendars_and_instants())
def test_value_at_agrees_with_transitions(case):
    calendar, t = case
    since = t - timedelta(days=8)
    changes = transitions(calendar, since, t)
    assert all(earlier.at < later.at for earlier, later in zip(changes, changes[1:], strict=False))
    value = value_at(calendar, since)
    for change in changes:
        assert change.from_value == value != change.to_value
        assert change.local == change.at.astimezone(ZoneInfo(calendar.tz))
        assert value_at(calendar, change.at - timedelta(microseconds=1)) == change.from_value
        assert value_at(calendar, change.at) == change.to_value
        assert active_window(calendar, change.at) == change.window
        value = change.to_value
    assert value_at(calendar, t) == value
    window = active_window(calendar, t)
    assert value == (calendar.baseline if window is None else window.value)
    upcoming = next_transition(calendar, t)
    assert upcoming is None or (upcoming.at > t and upcoming.from_value == value)


def wall_clock_value(calendar, t):
    """The value found by reading windows against the wall clock, valid where the zone never changes offset."""
    wall = t.astimezone(ZoneInfo(calendar.tz)).replace(tzinfo=None)
    for day in (wall.date() - timedelta(days=1), wall.date()):
        if day in calendar.exceptions:
            continue
        for window in calendar.windows:
            start = datetime.combine(day, window.start)
            end = datetime.combine(day if window.end > window.start else day + timedelta(days=1), window.end)
            if day.weekday() in window.weekdays and start <= wall < end:
                return window.value
    return calendar.baseline


@settings(max_examples=200)
@given(calendars_and_instants(zones=FIXED_ZONES))
def test_value_at_matches_the_wall_clock_in_fixed_offset_zones(case):
    calendar, t = case
    assert value_at(calendar, t) == wall_clock_value(calendar, t)
    week_start = t.astimezone(ZoneInfo(calendar.tz)).date() - timedelta(days=3)
    for segment in week_segments(calendar, week_start):
        for minute in (segment.start_minute, segment.end_minute - 1):
            wall = datetime.combine(segment.day, time(*divmod(minute, 60)), tzinfo=ZoneInfo(calendar.tz))
            assert value_at(calendar, wall) == segment.value


@given(calendars_and_instants())
def test_week_segments_cover_every_day_exactly(case):
    calendar, t = case
    week_start = t.astimezone(ZoneInfo(calendar.tz)).date()
    segments = week_segments(calendar, week_start)
    for n in range(7):
        day = [s for s in segments if s.day == week_start + timedelta(days=n)]
        assert day[0].start_minute == 0
        assert day[-1].end_minute == 1440
        assert all(a.end_minute == b.start_minute for a, b in zip(day, day[1:], strict=False))
        assert all(s.start_minute < s.end_minute for s in day)
