"""Calendars in the engine: their days, a spec naming them, and a schedule
that skips them (fires with the calendar are the fires without it, less
those on its days, each skipped day standing for itself by one marker)."""

from __future__ import annotations

from datetime import UTC, date, datetime
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.strategies import CALENDAR_CRONS, CALENDAR_ZONES, calendar_days
from wheel.engine.calendars import Calendar, CalendarDays, parse_calendar
from wheel.engine.profiles import split_spec
from wheel.engine.schedule import compile_schedule, with_calendars
from wheel.engine.spec import Cron, Interval, IntervalMode, JobSpec, Once
from wheel.errors import InvalidArgument

DAY = 86_400_000
# 2026-12-04 is a Friday.
FRIDAY = int(datetime(2026, 12, 4, tzinfo=UTC).timestamp() * 1000)


def _ms(y: int, mo: int, d: int, h: int = 0, mi: int = 0, *, tz: str = "UTC") -> int:
    return int(datetime(y, mo, d, h, mi, tzinfo=ZoneInfo(tz)).timestamp() * 1000)


def test_a_calendar_holds_its_dates_ranges_and_weekdays() -> None:
    cal = parse_calendar(["2026-12-25"], [("2026-12-30", "2027-01-02")], ["Sat", "sunday"])
    days = cal.days()
    held = [d for d in range(date(2026, 12, 20).toordinal(), date(2027, 1, 6).toordinal())]
    got = [date.fromordinal(d).isoformat() for d in held if days.holds(d)]
    assert got == [
        "2026-12-20",
        "2026-12-25",
        "2026-12-26",
        "2026-12-27",
        "2026-12-30",
        "2026-12-31",
        "2027-01-01",
        "2027-01-02",
        "2027-01-03",
    ]
    assert cal.weekdays == ("sat", "sun")
    assert Calendar.from_json(cal.to_json()) == cal


@pytest.mark.parametrize(
    ("dates", "ranges", "weekdays", "field"),
    [
        (["2026-13-01"], [], [], "calendar.dates[0]"),
        (["2026-12-01", "12/02/2026"], [], [], "calendar.dates[1]"),
        ([], [("2026-12-02", "2026-12-01")], [], "calendar.ranges[0].to"),
        ([], [("x", "2026-12-01")], [], "calendar.ranges[0].from"),
        ([], [], ["sat", "someday"], "calendar.weekdays[1]"),
        ([], [], [], "calendar"),
    ],
)
def test_bad_calendar_days_name_their_field(
    dates: list[str], ranges: list[tuple[str, str]], weekdays: list[str], field: str
) -> None:
    with pytest.raises(InvalidArgument) as e:
        parse_calendar(dates, ranges, weekdays)
    assert e.value.field == field


def test_skip_calendars_appear_in_json_only_when_set() -> None:
    spec = JobSpec(name="j", handler="h", schedule=Interval(period_ms=1000))
    assert "skip_calendars" not in spec.to_dict()
    named = JobSpec(
        name="j", handler="h", schedule=Interval(period_ms=1000), skip_calendars=("hol", "wk")
    )
    assert named.to_dict()["skip_calendars"] == ["hol", "wk"]
    assert JobSpec.from_json(named.to_json()) == named
    assert JobSpec.from_json(spec.to_json()).skip_calendars == ()
    # The calendars are the profile's: jobs skipping other days differ in it.
    assert split_spec(named)[0] != split_spec(spec)[0]


@pytest.mark.parametrize(
    ("names", "field"),
    [
        (("ok", ""), "spec.skip_calendars[1]"),
        (("a\0b",), "spec.skip_calendars[0]"),
        (("x" * 201,), "spec.skip_calendars[0]"),
        (("a", "b", "a"), "spec.skip_calendars[2]"),
        (tuple(f"c{i}" for i in range(17)), "spec.skip_calendars"),
    ],
)
def test_bad_skip_calendars_name_their_field(names: tuple[str, ...], field: str) -> None:
    spec = JobSpec(name="j", handler="h", schedule=Once(at_ms=1), skip_calendars=names)
    with pytest.raises(InvalidArgument) as e:
        spec.validate()
    assert e.value.field == field


def test_a_skipped_weekend_is_one_marker_a_day() -> None:
    s = Interval(period_ms=1000)
    weekend = parse_calendar([], [], ["sat", "sun"]).days()
    compiled = with_calendars(compile_schedule(s), s, weekend)
    last_friday = FRIDAY + DAY - 1000
    fires = compiled.fires_between(last_friday - 1, FRIDAY + 3 * DAY + 2000, 100)
    assert fires == [
        last_friday,
        FRIDAY + DAY,  # Saturday's marker
        FRIDAY + 2 * DAY,  # Sunday's
        FRIDAY + 3 * DAY,
        FRIDAY + 3 * DAY + 1000,
        FRIDAY + 3 * DAY + 2000,
    ]
    assert [compiled.skips(f) for f in fires] == [False, True, True, False, False, False]
    # A skipped fire reached some other way moves on to the next day.
    assert compiled.next_fire(FRIDAY + DAY + 5000) == FRIDAY + 2 * DAY


def test_a_cron_skips_by_its_own_time_zone() -> None:
    # 00:30 in Tokyo on Saturday is still Friday in UTC.
    s = Cron(expr="30 0 * * *", time_zone="Asia/Tokyo")
    weekend = parse_calendar([], [], ["sat", "sun"]).days()
    compiled = with_calendars(compile_schedule(s), s, weekend)
    saturday = _ms(2026, 12, 5, 0, 30, tz="Asia/Tokyo")
    assert compiled.skips(saturday)
    fires = compiled.fires_between(saturday - 1, saturday + 3 * DAY - 1, 10)
    assert [compiled.skips(f) for f in fires] == [True, True, False]


def test_a_fixed_delay_moves_on_a_period_after_the_skipped_day() -> None:
    s = Interval(period_ms=60_000, mode=IntervalMode.FIXED_DELAY, start_at_ms=FRIDAY + DAY + 10)
    days = parse_calendar(["2026-12-05"], [], []).days()
    compiled = with_calendars(compile_schedule(s), s, days)
    assert compiled.completion_driven
    assert compiled.skips(FRIDAY + DAY + 10)
    assert compiled.after_skip(FRIDAY + DAY + 10) == FRIDAY + 2 * DAY + 60_000


def test_every_weekday_skipped_never_fires() -> None:
    s = Interval(period_ms=3_600_000)
    days = parse_calendar([], [], ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]).days()
    compiled = with_calendars(compile_schedule(s), s, days)
    marker = compiled.next_fire(FRIDAY)
    assert marker is not None and compiled.skips(marker)


@settings(max_examples=60, deadline=None)
@given(expr=CALENDAR_CRONS, zone=CALENDAR_ZONES, cal=calendar_days())
def test_fires_with_a_calendar_are_fires_without_less_its_days(
    expr: str, zone: str, cal: tuple[Calendar, CalendarDays]
) -> None:
    _, days = cal
    s = Cron(expr=expr, time_zone=zone)
    plain = compile_schedule(s)
    skipping = with_calendars(plain, s, days)
    start = _ms(2026, 11, 30)
    end = _ms(2027, 1, 12)
    everything = plain.fires_between(start, end, 100_000)
    got = skipping.fires_between(start, end, 100_000)
    tz = ZoneInfo(zone)

    def local(f: int) -> int:
        return datetime.fromtimestamp(f // 1000, tz=tz).toordinal()

    run = [f for f in got if not skipping.skips(f)]
    assert run == [f for f in everything if not days.holds(local(f))]
    # Every skipped day the schedule passes shows once: its first fire (the
    # day the range starts in may have had its first fire before).
    first_day = local(start)
    markers = [f for f in got if skipping.skips(f) and local(f) > first_day]
    first_of_day: dict[int, int] = {}
    for f in everything:
        if days.holds(local(f)) and local(f) > first_day:
            first_of_day.setdefault(local(f), f)
    assert markers == sorted(first_of_day.values())


@settings(max_examples=40, deadline=None)
@given(
    period_s=st.sampled_from([1, 7, 3600, 5400, 86_400, 90_000]),
    cal=calendar_days(),
)
def test_interval_fires_skip_utc_days(period_s: int, cal: tuple[Calendar, CalendarDays]) -> None:
    _, days = cal
    s = Interval(period_ms=period_s * 1000, start_at_ms=_ms(2026, 11, 30, 5))
    plain = compile_schedule(s)
    skipping = with_calendars(plain, s, days)
    start = _ms(2026, 11, 30)
    end = start + 3 * DAY if period_s < 60 else _ms(2027, 1, 12)
    everything = plain.fires_between(start, end, 1_000_000)
    got = skipping.fires_between(start, end, 1_000_000)
    run = [f for f in got if not skipping.skips(f)]
    assert run == [f for f in everything if not days.holds(f // DAY + 719_163)]
