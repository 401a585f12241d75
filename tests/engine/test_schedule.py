"""Schedule semantics: exact UTC instants on real zones and DST dates.

Offsets used in the hand computations below (all 2026):
  America/New_York  EST -5 / EDT -4. Gap 03-08: 02:00 EST (07:00Z) -> 03:00 EDT.
                    Fold 11-01: 02:00 EDT (06:00Z) -> 01:00 EST; 01:00..01:59 twice.
  Europe/London     GMT 0 / BST +1. Gap 03-29: 01:00 GMT (01:00Z) -> 02:00 BST.
                    Fold 10-25: 02:00 BST (01:00Z) -> 01:00 GMT; 01:00..01:59 twice.
  Australia/Lord_Howe  LHST +10:30 / LHDT +11 (a 30 minute shift).
                    Fold 04-05: 02:00 LHDT (04-04 15:00Z) -> 01:30 LHST; 01:30..01:59 twice.
                    Gap 10-04: 02:00 LHST (10-03 15:30Z) -> 02:30 LHDT.
  America/Santiago  -04 / -03, changing at midnight. Fold 04-04: 24:00 -03 (04-05 03:00Z)
                    -> 23:00 -04; 23:00..23:59 twice. Gap 09-06: 00:00 -04 (04:00Z) -> 01:00 -03.
  Asia/Tokyo        JST +9, no DST.
"""

from __future__ import annotations

import itertools
import time
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wheel.engine.schedule import CompiledSchedule, SkippedFire, compile_schedule
from wheel.engine.spec import Cron, DstFold, DstGap, Interval, IntervalMode, Once
from wheel.errors import InvalidArgument

GAP, SKIP = DstGap.FIRE_AT_TRANSITION, DstGap.SKIP
FIRST, BOTH = DstFold.FIRST, DstFold.BOTH
NY = "America/New_York"
LONDON = "Europe/London"
LORD_HOWE = "Australia/Lord_Howe"
SANTIAGO = "America/Santiago"
TOKYO = "Asia/Tokyo"
MIN = 60_000
HOUR = 3_600_000
DAY = 86_400_000


def utc(y: int, mo: int, d: int, h: int = 0, mi: int = 0, s: int = 0) -> int:
    return int(datetime(y, mo, d, h, mi, s, tzinfo=UTC).timestamp()) * 1000


def cron(
    expr: str, zone: str = "UTC", gap: DstGap = GAP, fold: DstFold = FIRST, **kw: int
) -> CompiledSchedule:
    return compile_schedule(Cron(expr=expr, time_zone=zone, dst_gap=gap, dst_fold=fold), **kw)


def fires(c: CompiledSchedule, after: int, until: int) -> list[int]:
    return c.fires_between(after, until, 10_000)


def quarter_hours(start: int, end: int) -> list[int]:
    """Every quarter hour in [start, end]."""
    return list(range(start, end + 1, 15 * MIN))


# -- America/New_York ---------------------------------------------------------------


@pytest.mark.parametrize("fold", [FIRST, BOTH])
def test_ny_gap_daily_fires_once_at_the_transition(fold: DstFold) -> None:
    c = cron("30 2 * * *", NY, GAP, fold)
    assert fires(c, utc(2026, 3, 7), utc(2026, 3, 10)) == [
        utc(2026, 3, 7, 7, 30),  # 02:30 EST
        utc(2026, 3, 8, 7, 0),  # 02:30 does not exist: 03:00 EDT, the transition
        utc(2026, 3, 9, 6, 30),  # 02:30 EDT
    ]
    assert c.skipped_between(utc(2026, 3, 7), utc(2026, 3, 10)) == []


def test_ny_gap_daily_skip_does_not_fire_that_day_and_reports_it() -> None:
    c = cron("30 2 * * *", NY, SKIP)
    assert fires(c, utc(2026, 3, 7), utc(2026, 3, 10)) == [
        utc(2026, 3, 7, 7, 30),
        utc(2026, 3, 9, 6, 30),
    ]
    assert c.next_fire(utc(2026, 3, 7, 7, 30)) == utc(2026, 3, 9, 6, 30)
    assert c.skipped_between(utc(2026, 3, 7), utc(2026, 3, 10)) == [
        SkippedFire(at_ms=utc(2026, 3, 8, 7, 0), wall_time="2026-03-08T02:30:00")
    ]
    # Reported exactly once over consecutive windows that split at the fires.
    assert c.skipped_between(utc(2026, 3, 7, 7, 30), utc(2026, 3, 8, 7, 0)) != []
    assert c.skipped_between(utc(2026, 3, 8, 7, 0), utc(2026, 3, 9, 6, 30)) == []


@pytest.mark.parametrize("gap", [GAP, SKIP])
def test_ny_gap_hourly_the_missing_hour_collapses_into_the_transition(gap: DstGap) -> None:
    c = cron("0 * * * *", NY, gap)
    # 00:00 EST, 01:00 EST, [02:00 missing] 03:00 EDT = transition, 04:00 EDT.
    assert fires(c, utc(2026, 3, 8, 4), utc(2026, 3, 8, 8)) == [
        utc(2026, 3, 8, 5),
        utc(2026, 3, 8, 6),
        utc(2026, 3, 8, 7),
        utc(2026, 3, 8, 8),
    ]
    skipped = c.skipped_between(utc(2026, 3, 8, 4), utc(2026, 3, 8, 8))
    expected = [SkippedFire(at_ms=utc(2026, 3, 8, 7), wall_time="2026-03-08T02:00:00")]
    assert skipped == (expected if gap is SKIP else [])


def test_ny_gap_half_past_hourly_differs_between_policies() -> None:
    # 01:30 EST = 06:30Z; 02:30 missing; 03:30 EDT = 07:30Z.
    at_transition = cron("30 * * * *", NY, GAP)
    skip = cron("30 * * * *", NY, SKIP)
    window = (utc(2026, 3, 8, 6), utc(2026, 3, 8, 8))
    assert fires(at_transition, *window) == [
        utc(2026, 3, 8, 6, 30),
        utc(2026, 3, 8, 7),
        utc(2026, 3, 8, 7, 30),
    ]
    assert fires(skip, *window) == [utc(2026, 3, 8, 6, 30), utc(2026, 3, 8, 7, 30)]


@pytest.mark.parametrize("gap", [GAP, SKIP])
def test_ny_gap_quarter_hourly_four_missing_fires_are_one(gap: DstGap) -> None:
    c = cron("*/15 * * * *", NY, gap)
    # 01:00..01:45 EST = 06:00..06:45Z, then 02:00..02:45 do not exist and
    # collapse into 03:00 EDT = 07:00Z (itself a fire), then every 15 minutes.
    expected = quarter_hours(utc(2026, 3, 8, 6), utc(2026, 3, 8, 8))
    assert fires(c, utc(2026, 3, 8, 5, 59), utc(2026, 3, 8, 8)) == expected
    assert c.count_between(utc(2026, 3, 8, 6, 45), utc(2026, 3, 8, 7), 100) == 1
    assert c.next_fire(utc(2026, 3, 8, 6, 45)) == utc(2026, 3, 8, 7)
    assert c.next_fire(utc(2026, 3, 8, 7) - 1) == utc(2026, 3, 8, 7)
    skipped = c.skipped_between(utc(2026, 3, 8, 6), utc(2026, 3, 8, 8))
    if gap is SKIP:
        assert [s.wall_time[11:] for s in skipped] == [
            "02:00:00",
            "02:15:00",
            "02:30:00",
            "02:45:00",
        ]
        assert {s.at_ms for s in skipped} == {utc(2026, 3, 8, 7)}
    else:
        assert skipped == []


@pytest.mark.parametrize("gap", [GAP, SKIP])
def test_ny_fold_daily_half_past_two_is_not_in_the_fold(gap: DstGap) -> None:
    for fold in (FIRST, BOTH):
        c = cron("30 2 * * *", NY, gap, fold)
        assert fires(c, utc(2026, 10, 31), utc(2026, 11, 3)) == [
            utc(2026, 10, 31, 6, 30),  # 02:30 EDT
            utc(2026, 11, 1, 7, 30),  # 02:30 EST, once: 02:30 happens once
            utc(2026, 11, 2, 7, 30),
        ]


def test_ny_fold_hourly_first_fires_the_first_one_only() -> None:
    c = cron("0 * * * *", NY, GAP, FIRST)
    # 00:00 EDT, 01:00 EDT, [01:00 EST not again], 02:00 EST, 03:00 EST.
    assert fires(c, utc(2026, 11, 1, 3, 30), utc(2026, 11, 1, 8)) == [
        utc(2026, 11, 1, 4),
        utc(2026, 11, 1, 5),
        utc(2026, 11, 1, 7),
        utc(2026, 11, 1, 8),
    ]


def test_ny_fold_hourly_both_fires_both_instants() -> None:
    c = cron("0 * * * *", NY, GAP, BOTH)
    assert fires(c, utc(2026, 11, 1, 3, 30), utc(2026, 11, 1, 8)) == [
        utc(2026, 11, 1, 4),
        utc(2026, 11, 1, 5),  # 01:00 EDT
        utc(2026, 11, 1, 6),  # 01:00 EST
        utc(2026, 11, 1, 7),
        utc(2026, 11, 1, 8),
    ]


def test_ny_fold_quarter_hourly_per_policy() -> None:
    first = cron("*/15 * * * *", NY, GAP, FIRST)
    both = cron("*/15 * * * *", NY, GAP, BOTH)
    window = (utc(2026, 11, 1, 4, 59), utc(2026, 11, 1, 7, 15))
    # first: 01:00..01:45 EDT = 05:00..05:45Z, then 02:00 EST = 07:00Z.
    assert fires(first, *window) == [
        *quarter_hours(utc(2026, 11, 1, 5), utc(2026, 11, 1, 5, 45)),
        utc(2026, 11, 1, 7),
        utc(2026, 11, 1, 7, 15),
    ]
    # both: also 01:00..01:45 EST = 06:00..06:45Z: every quarter hour of real time.
    assert fires(both, *window) == quarter_hours(utc(2026, 11, 1, 5), utc(2026, 11, 1, 7, 15))


def test_ny_fold_next_fire_from_inside_the_fold() -> None:
    first = cron("*/15 * * * *", NY, GAP, FIRST)
    both = cron("*/15 * * * *", NY, GAP, BOTH)
    # 06:10Z is 01:10 EST, the second occurrence.
    assert first.next_fire(utc(2026, 11, 1, 6, 10)) == utc(2026, 11, 1, 7)
    assert both.next_fire(utc(2026, 11, 1, 6, 10)) == utc(2026, 11, 1, 6, 15)
    # 05:50Z is 01:50 EDT; the next fire under `both` is 01:00 EST, a wall time
    # EARLIER than 01:50.
    assert both.next_fire(utc(2026, 11, 1, 5, 50)) == utc(2026, 11, 1, 6)
    assert first.next_fire(utc(2026, 11, 1, 5, 50)) == utc(2026, 11, 1, 7)
    hourly_both = cron("0 * * * *", NY, GAP, BOTH)
    assert hourly_both.next_fire(utc(2026, 11, 1, 5)) == utc(2026, 11, 1, 6)


# -- Europe/London --------------------------------------------------------------------


def test_london_gap() -> None:
    at_transition = cron("30 1 * * *", LONDON, GAP)
    skip = cron("30 1 * * *", LONDON, SKIP)
    window = (utc(2026, 3, 28), utc(2026, 3, 31))
    # 01:30 GMT = 01:30Z; 03-29 01:30 does not exist -> 02:00 BST = 01:00Z;
    # 01:30 BST = 00:30Z.
    assert fires(at_transition, *window) == [
        utc(2026, 3, 28, 1, 30),
        utc(2026, 3, 29, 1),
        utc(2026, 3, 30, 0, 30),
    ]
    assert fires(skip, *window) == [utc(2026, 3, 28, 1, 30), utc(2026, 3, 30, 0, 30)]
    assert skip.skipped_between(*window) == [
        SkippedFire(at_ms=utc(2026, 3, 29, 1), wall_time="2026-03-29T01:30:00")
    ]


def test_london_fold() -> None:
    window = (utc(2026, 10, 24), utc(2026, 10, 27))
    # 01:30 BST = 00:30Z (10-24 and 10-25), 01:30 GMT = 01:30Z (10-25 again, 10-26).
    assert fires(cron("30 1 * * *", LONDON, GAP, FIRST), *window) == [
        utc(2026, 10, 24, 0, 30),
        utc(2026, 10, 25, 0, 30),
        utc(2026, 10, 26, 1, 30),
    ]
    assert fires(cron("30 1 * * *", LONDON, GAP, BOTH), *window) == [
        utc(2026, 10, 24, 0, 30),
        utc(2026, 10, 25, 0, 30),
        utc(2026, 10, 25, 1, 30),
        utc(2026, 10, 26, 1, 30),
    ]
    hourly = (utc(2026, 10, 24, 22, 30), utc(2026, 10, 25, 2))
    # 00:00 BST = 23:00Z, 01:00 BST = 00:00Z, 01:00 GMT = 01:00Z, 02:00 GMT = 02:00Z.
    assert fires(cron("0 * * * *", LONDON, GAP, BOTH), *hourly) == [
        utc(2026, 10, 24, 23),
        utc(2026, 10, 25, 0),
        utc(2026, 10, 25, 1),
        utc(2026, 10, 25, 2),
    ]
    assert fires(cron("0 * * * *", LONDON, GAP, FIRST), *hourly) == [
        utc(2026, 10, 24, 23),
        utc(2026, 10, 25, 0),
        utc(2026, 10, 25, 2),
    ]


# -- Australia/Lord_Howe (30 minute shifts) ---------------------------------------------


def test_lord_howe_fold_of_thirty_minutes() -> None:
    window = (utc(2026, 4, 4, 13, 59), utc(2026, 4, 4, 17))
    # Hourly is not in the fold (01:30..01:59 is): 01:00 LHDT = 14:00Z,
    # 02:00 LHST = 15:30Z, 03:00 LHST = 16:30Z, under both policies.
    for fold in (FIRST, BOTH):
        assert fires(cron("0 * * * *", LORD_HOWE, GAP, fold), *window) == [
            utc(2026, 4, 4, 14),
            utc(2026, 4, 4, 15, 30),
            utc(2026, 4, 4, 16, 30),
        ]
    # Quarter hours: 01:30 and 01:45 happen twice (14:30/14:45Z LHDT, 15:00/15:15Z LHST).
    first = fires(
        cron("*/15 * * * *", LORD_HOWE, GAP, FIRST),
        utc(2026, 4, 4, 14, 20),
        utc(2026, 4, 4, 15, 45),
    )
    assert first == [
        utc(2026, 4, 4, 14, 30),
        utc(2026, 4, 4, 14, 45),
        utc(2026, 4, 4, 15, 30),
        utc(2026, 4, 4, 15, 45),
    ]
    both = fires(
        cron("*/15 * * * *", LORD_HOWE, GAP, BOTH), utc(2026, 4, 4, 14, 20), utc(2026, 4, 4, 15, 45)
    )
    assert both == quarter_hours(utc(2026, 4, 4, 14, 30), utc(2026, 4, 4, 15, 45))
    # 02:30 LHST = 16:00Z, once.
    assert fires(cron("30 2 * * *", LORD_HOWE, GAP, BOTH), *window) == [utc(2026, 4, 4, 16)]


def test_lord_howe_gap_of_thirty_minutes() -> None:
    window = (utc(2026, 10, 3, 14), utc(2026, 10, 3, 17))
    # 01:00 LHST = 14:30Z; 02:00 does not exist -> 02:30 LHDT = 15:30Z; 03:00 LHDT = 16:00Z.
    assert fires(cron("0 * * * *", LORD_HOWE, GAP), *window) == [
        utc(2026, 10, 3, 14, 30),
        utc(2026, 10, 3, 15, 30),
        utc(2026, 10, 3, 16),
        utc(2026, 10, 3, 17),
    ]
    skip = cron("0 * * * *", LORD_HOWE, SKIP)
    assert fires(skip, *window) == [
        utc(2026, 10, 3, 14, 30),
        utc(2026, 10, 3, 16),
        utc(2026, 10, 3, 17),
    ]
    assert skip.skipped_between(*window) == [
        SkippedFire(at_ms=utc(2026, 10, 3, 15, 30), wall_time="2026-10-04T02:00:00")
    ]
    # 02:30 exists (first valid instant): every policy fires it at 15:30Z.
    for gap in (GAP, SKIP):
        assert fires(cron("30 2 * * *", LORD_HOWE, gap), *window) == [utc(2026, 10, 3, 15, 30)]
    # 02:00 and 02:15 collapse into 02:30 = 15:30Z, which is itself a fire.
    q = fires(cron("*/15 * * * *", LORD_HOWE, GAP), utc(2026, 10, 3, 14, 59), utc(2026, 10, 3, 16))
    assert q == [
        utc(2026, 10, 3, 15),
        utc(2026, 10, 3, 15, 15),
        utc(2026, 10, 3, 15, 30),
        utc(2026, 10, 3, 15, 45),
        utc(2026, 10, 3, 16),
    ]


# -- America/Santiago (changes at midnight) ---------------------------------------------


def test_santiago_midnight_gap_and_late_evening_fold() -> None:
    window = (utc(2026, 9, 5), utc(2026, 9, 8))
    # 09-05 00:00 -04 = 04:00Z; 09-06 00:00 is missing -> 01:00 -03 = 04:00Z;
    # 09-07 00:00 -03 = 03:00Z.
    assert fires(cron("0 0 * * *", SANTIAGO, GAP), *window) == [
        utc(2026, 9, 5, 4),
        utc(2026, 9, 6, 4),
        utc(2026, 9, 7, 3),
    ]
    assert fires(cron("0 0 * * *", SANTIAGO, SKIP), *window) == [
        utc(2026, 9, 5, 4),
        utc(2026, 9, 7, 3),
    ]
    fold_window = (utc(2026, 4, 4, 12), utc(2026, 4, 6))
    # 04-04 23:30 -03 = 04-05 02:30Z, again 23:30 -04 = 03:30Z; 04-05 23:30 -04 = 04-06 03:30Z.
    assert fires(cron("30 23 * * *", SANTIAGO, GAP, FIRST), *fold_window) == [
        utc(2026, 4, 5, 2, 30)
    ]
    assert fires(cron("30 23 * * *", SANTIAGO, GAP, BOTH), *fold_window) == [
        utc(2026, 4, 5, 2, 30),
        utc(2026, 4, 5, 3, 30),
    ]


# -- zones without DST ------------------------------------------------------------------


@pytest.mark.parametrize("zone", [TOKYO, "UTC"])
@pytest.mark.parametrize("gap", [GAP, SKIP])
@pytest.mark.parametrize("fold", [FIRST, BOTH])
def test_zone_without_dst_fires_every_day_24_hours_apart(
    zone: str, gap: DstGap, fold: DstFold
) -> None:
    c = cron("30 2 * * *", zone, gap, fold)
    got = fires(c, utc(2026, 1, 1), utc(2027, 1, 1))
    assert len(got) == 365
    assert all(b - a == DAY for a, b in itertools.pairwise(got))
    # 2026-01-01 02:30 JST is 2025-12-31 17:30Z, before the window.
    assert got[0] == (utc(2026, 1, 1, 17, 30) if zone == TOKYO else utc(2026, 1, 1, 2, 30))
    assert c.skipped_between(utc(2026, 1, 1), utc(2027, 1, 1)) == []


# -- seconds field ------------------------------------------------------------------------


def test_seconds_field_comes_first() -> None:
    every10 = cron("*/10 * * * * *")
    assert fires(every10, utc(2026, 5, 1), utc(2026, 5, 1, 0, 1)) == [
        utc(2026, 5, 1, 0, 0, s) for s in (10, 20, 30, 40, 50)
    ] + [utc(2026, 5, 1, 0, 1)]
    # second=30 minute=0 hour=12: 12:00:30 daily (not "minute 30").
    c = cron("30 0 12 * * *", TOKYO)
    assert c.next_fire(utc(2026, 5, 1)) == utc(2026, 5, 1, 3, 0, 30)
    assert c.next_fire(utc(2026, 5, 1, 3, 0, 30)) == utc(2026, 5, 2, 3, 0, 30)


def test_seconds_in_a_gap_collapse_too() -> None:
    # 02:30:00, :20, :40 on 03-08 do not exist: one fire at 03:00 EDT = 07:00Z.
    c = cron("*/20 30 2 * * *", NY, GAP)
    assert fires(c, utc(2026, 3, 7, 12), utc(2026, 3, 9)) == [utc(2026, 3, 8, 7)]
    s = cron("*/20 30 2 * * *", NY, SKIP)
    assert fires(s, utc(2026, 3, 7, 12), utc(2026, 3, 9)) == []
    assert len(s.skipped_between(utc(2026, 3, 7, 12), utc(2026, 3, 9))) == 3


def test_every_second_across_a_gap_is_one_fire_at_the_transition_and_quick() -> None:
    c = cron("* * * * * *", NY, GAP)
    start = time.perf_counter()
    got = fires(c, utc(2026, 3, 8, 6, 59, 58), utc(2026, 3, 8, 7, 0, 2))
    assert time.perf_counter() - start < 0.5  # 3,600 missing wall times are jumped over
    # 01:59:59 EST, then 02:00:00..02:59:59 collapse into 03:00:00 EDT.
    assert got == [utc(2026, 3, 8, 6, 59, 59), *(utc(2026, 3, 8, 7, 0, s) for s in range(3))]
    skip = cron("* * * * * *", NY, SKIP)
    assert fires(skip, utc(2026, 3, 8, 6, 59, 58), utc(2026, 3, 8, 7, 0, 1)) == [
        utc(2026, 3, 8, 6, 59, 59),
        utc(2026, 3, 8, 7),
        utc(2026, 3, 8, 7, 0, 1),
    ]
    assert len(skip.skipped_between(utc(2026, 3, 8, 6), utc(2026, 3, 8, 7), 10_000)) == 3600
    assert len(skip.skipped_between(utc(2026, 3, 8, 6), utc(2026, 3, 8, 7), 10)) == 10


def test_a_cron_that_only_matches_missing_wall_times_under_skip_never_fires() -> None:
    # 02:30 on the second Sunday of March never exists in New York.
    expr = "30 2 * 3 0#2"
    skip = cron(expr, NY, SKIP)
    assert skip.next_fire(utc(2026, 1, 1)) is None
    assert skip.fires_between(utc(2026, 1, 1), utc(2030, 1, 1), 10) == []
    assert [s.at_ms for s in skip.skipped_between(utc(2026, 1, 1), utc(2028, 1, 1))] == [
        utc(2026, 3, 8, 7),
        utc(2027, 3, 14, 7),
    ]
    assert cron(expr, NY, GAP).fires_between(utc(2026, 1, 1), utc(2028, 1, 1), 10) == [
        utc(2026, 3, 8, 7),
        utc(2027, 3, 14, 7),
    ]


def test_times_beyond_the_calendar_have_no_fires() -> None:
    c = cron("0 0 1 1 *")
    assert c.next_fire(2**53) is None
    assert c.next_fire(utc(9999, 6, 1)) is None
    assert c.fires_between(2**53, 2**54, 10) == []
    assert c.next_fire(utc(2026, 12, 31)) == utc(2027, 1, 1)


def test_sub_second_after_is_exclusive() -> None:
    c = cron("* * * * * *")
    assert c.next_fire(utc(2026, 5, 1) - 1) == utc(2026, 5, 1)
    assert c.next_fire(utc(2026, 5, 1)) == utc(2026, 5, 1) + 1000
    assert c.next_fire(utc(2026, 5, 1) + 999) == utc(2026, 5, 1) + 1000


def test_aliases_and_calendar_features() -> None:
    assert cron("@hourly").next_fire(utc(2026, 5, 1, 0, 30)) == utc(2026, 5, 1, 1)
    assert cron("0 0 L * *").next_fire(utc(2026, 2, 1)) == utc(2026, 2, 28)
    assert cron("0 0 29 2 *").next_fire(utc(2026, 1, 1)) == utc(2028, 2, 29)


# -- once and intervals -------------------------------------------------------------------


def test_once() -> None:
    c = compile_schedule(Once(at_ms=5_000))
    assert c.next_fire(4_999) == 5_000
    assert c.next_fire(5_000) is None
    assert c.fires_between(0, 10_000, 10) == [5_000]
    assert c.fires_between(5_000, 10_000, 10) == []
    assert c.count_between(0, 4_999, 10) == 0
    assert c.next_after_completion(6_000) is None
    assert not c.completion_driven


def test_fixed_rate_future_start() -> None:
    c = compile_schedule(Interval(period_ms=500, start_at_ms=10_000))
    assert c.next_fire(0) == 10_000
    assert c.next_fire(10_000) == 10_500
    assert c.next_fire(10_499) == 10_500
    assert c.fires_between(9_000, 11_500, 100) == [10_000, 10_500, 11_000, 11_500]
    assert c.fires_between(9_000, 11_500, 2) == [10_000, 10_500]
    assert c.count_between(9_000, 11_500, 100) == 4
    assert c.count_between(9_000, 11_500, 3) == 3
    assert c.next_after_completion(20_000) is None
    assert not c.completion_driven


def test_fixed_rate_start_in_the_past_has_no_drift() -> None:
    c = compile_schedule(Interval(period_ms=60_000, start_at_ms=7))
    now = utc(2026, 5, 1, 12, 0, 30) + 123
    nxt = c.next_fire(now)
    assert nxt is not None
    assert nxt > now >= nxt - 60_000
    assert (nxt - 7) % 60_000 == 0
    # Arithmetic, not iteration: counting half a century of minutes is instant.
    start = time.perf_counter()
    assert c.count_between(0, utc(2026, 1, 1), 10**12) == (utc(2026, 1, 1) - 7) // 60_000 + 1
    assert c.count_between(0, utc(2026, 1, 1), 5) == 5
    assert time.perf_counter() - start < 0.01


def test_fixed_rate_huge_period() -> None:
    period = 10 * 366 * DAY
    c = compile_schedule(Interval(period_ms=period, start_at_ms=2**53 - period))
    assert c.next_fire(0) == 2**53 - period
    assert c.next_fire(2**53 - period) == 2**53
    assert c.fires_between(0, 2**53, 10) == [2**53 - period, 2**53]
    assert c.jittered(2**53) == 2**53  # no jitter configured


def test_fixed_delay_is_completion_driven() -> None:
    c = compile_schedule(
        Interval(period_ms=1_000, mode=IntervalMode.FIXED_DELAY, start_at_ms=5_000)
    )
    assert c.completion_driven
    assert c.next_fire(0) == 5_000
    assert c.next_fire(5_000) is None
    assert c.next_after_completion(7_345) == 8_345
    assert c.fires_between(0, 100_000, 10) == [5_000]
    assert c.count_between(5_000, 100_000, 10) == 0


# -- jitter -------------------------------------------------------------------------------


def test_jitter_is_deterministic_bounded_and_spread() -> None:
    spec = Interval(period_ms=HOUR, start_at_ms=0)
    a = compile_schedule(spec, jitter_ms=60_000, job_id=42)
    b = compile_schedule(spec, jitter_ms=60_000, job_id=42)
    other = compile_schedule(spec, jitter_ms=60_000, job_id=43)
    fire_times = [k * HOUR for k in range(500)]
    delays = [a.jittered(f) - f for f in fire_times]
    assert delays == [b.jittered(f) - f for f in fire_times]
    assert delays == [a.jittered(f) - f for f in fire_times]
    assert all(0 <= d <= 60_000 for d in delays)
    assert len(set(delays)) > 450
    assert sum(delays) / len(delays) == pytest.approx(30_000, rel=0.15)
    assert delays != [other.jittered(f) - f for f in fire_times]
    # Pinned: the hash is the same in every process and release (no hash()).
    assert a.jittered(0) == compile_schedule(spec, jitter_ms=60_000, job_id=42).jittered(0)
    assert a.jittered(7 * HOUR) - 7 * HOUR == delays[7]
    assert [a.jittered(k * HOUR) - k * HOUR for k in range(3)] == PINNED_DELAYS


# splitmix64-derived delays for job 42, jitter 60 s, fires at 0, 1 h, 2 h.
PINNED_DELAYS = [38_203, 33_185, 837]


def test_jitter_never_reaches_the_next_fire() -> None:
    c = compile_schedule(Interval(period_ms=100, start_at_ms=0), jitter_ms=10_000, job_id=9)
    delays = [c.jittered(f) - f for f in range(0, 100_000, 100)]
    assert all(0 <= d < 100 for d in delays)
    assert len(set(delays)) > 50
    # Lord Howe: the collapsed gap fire at 15:30Z is only 30 minutes before 16:00Z.
    lh = cron("0 * * * *", LORD_HOWE, GAP, jitter_ms=2 * HOUR, job_id=5)
    for job in range(50):
        lh = cron("0 * * * *", LORD_HOWE, GAP, jitter_ms=2 * HOUR, job_id=job)
        assert (
            utc(2026, 10, 3, 15, 30) <= lh.jittered(utc(2026, 10, 3, 15, 30)) < utc(2026, 10, 3, 16)
        )
    once = compile_schedule(Once(at_ms=1_000), jitter_ms=500, job_id=1)
    assert 1_000 <= once.jittered(1_000) <= 1_500


def test_no_jitter_means_on_time() -> None:
    c = cron("*/5 * * * *")
    assert c.jittered(utc(2026, 5, 1)) == utc(2026, 5, 1)


# -- validation -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "why"),
    [
        ("61 * * * *", "out of range"),
        ("* * *", "has 3 fields"),
        ("garbage", "has 1 fields"),
        ("* * * * * * *", "has 7 fields"),
        ("0 25 * * *", "out of range"),
        ("*/0 * * * *", ""),
        ("0 0 30 2 *", "never matches"),
        ("H * * * *", "deterministic"),
        ("R * * * *", "deterministic"),
        ("0 0 * * H(0-3)", "deterministic"),
        ("", "non-empty"),
        ("   ", "non-empty"),
        ("@reboot", ""),
        ("a b c d e", "not a valid cron expression"),
    ],
)
def test_invalid_cron_expressions_name_the_field(expr: str, why: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        cron(expr)
    assert e.value.field == "spec.schedule.cron.expr"
    assert why in e.value.reason


@pytest.mark.parametrize(
    "zone", ["Mars/Olympus_Mons", "", "localtime", "../../etc/passwd", "EST5EDT7"]
)
def test_unknown_time_zone_names_the_field(zone: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        cron("* * * * *", zone)
    assert e.value.field == "spec.schedule.cron.time_zone"


def test_invalid_interval_and_jitter_name_the_field() -> None:
    with pytest.raises(InvalidArgument) as e:
        compile_schedule(Interval(period_ms=0))
    assert e.value.field == "spec.schedule.interval.period_ms"
    with pytest.raises(InvalidArgument) as e:
        compile_schedule(Interval(period_ms=10, start_at_ms=-1))
    assert e.value.field == "spec.schedule.interval.start_at_ms"
    with pytest.raises(InvalidArgument) as e:
        compile_schedule(Once(at_ms=10), jitter_ms=-1)
    assert e.value.field == "spec.jitter_ms"


# -- properties against an independent reference ------------------------------------------

# (zone, a UTC instant near one of its 2026 transitions)
TRANSITIONS = [
    (NY, utc(2026, 3, 8, 7)),
    (NY, utc(2026, 11, 1, 6)),
    (LONDON, utc(2026, 3, 29, 1)),
    (LONDON, utc(2026, 10, 25, 1)),
    (LORD_HOWE, utc(2026, 4, 4, 15)),
    (LORD_HOWE, utc(2026, 10, 3, 15, 30)),
    (SANTIAGO, utc(2026, 4, 5, 3)),
    (SANTIAGO, utc(2026, 9, 6, 4)),
    (TOKYO, utc(2026, 3, 8, 7)),
    ("UTC", utc(2026, 3, 8, 7)),
]

SECONDS = {"0": {0}, "15": {15}, "*/30": {0, 30}}
MINUTES = {
    "*": set(range(60)),
    "*/5": set(range(0, 60, 5)),
    "*/7": set(range(0, 60, 7)),
    "*/15": set(range(0, 60, 15)),
    "0": {0},
    "30": {30},
    "0,45": {0, 45},
    "10-20": set(range(10, 21)),
}
HOURS = {
    "*": set(range(24)),
    "*/2": set(range(0, 24, 2)),
    "*/3": set(range(0, 24, 3)),
    "1": {1},
    "2": {2},
    "1,2": {1, 2},
    "1-3": {1, 2, 3},
    "0-2": {0, 1, 2},
    "0,23": {0, 23},
}
STEP_S = 15  # every candidate second in the grammar is a multiple of 15


def reference_fires(
    seconds: set[int],
    minutes: set[int],
    hours: set[int],
    zone_name: str,
    after_s: int,
    until_s: int,
    gap: DstGap,
    fold: DstFold,
) -> tuple[list[int], list[SkippedFire]]:
    """Scan UTC instants (not wall times) and decide each by the policy."""
    zone = ZoneInfo(zone_name)

    def matches(wall: datetime) -> bool:
        return wall.second in seconds and wall.minute in minutes and wall.hour in hours

    def offset(s: int) -> timedelta:
        off = datetime.fromtimestamp(s, zone).utcoffset()
        assert off is not None
        return off

    fired: list[int] = []
    skipped: list[SkippedFire] = []
    first = after_s - after_s % STEP_S + STEP_S
    for s in range(first, until_s + 1, STEP_S):
        local = datetime.fromtimestamp(s, zone)
        fire = False
        before, now = offset(s - STEP_S), offset(s)
        if now > before:
            # s is where a gap ends: which missing wall times matched?
            utc_wall = datetime.fromtimestamp(s, UTC).replace(tzinfo=None)
            wall = utc_wall + before
            while wall < utc_wall + now:
                if matches(wall):
                    fire = gap is DstGap.FIRE_AT_TRANSITION
                    if gap is DstGap.SKIP:
                        skipped.append(SkippedFire(at_ms=s * 1000, wall_time=wall.isoformat()))
                wall += timedelta(seconds=STEP_S)
        if matches(local) and (local.fold == 0 or fold is DstFold.BOTH):
            fire = True
        if fire:
            fired.append(s * 1000)
    return fired, skipped


@settings(deadline=None, max_examples=60)
@given(
    sec=st.sampled_from(sorted(SECONDS)),
    with_seconds=st.booleans(),
    minute=st.sampled_from(sorted(MINUTES)),
    hour=st.sampled_from(sorted(HOURS)),
    where=st.sampled_from(TRANSITIONS),
    shift_ms=st.integers(-6 * HOUR, 2 * HOUR),
    gap=st.sampled_from(list(DstGap)),
    fold=st.sampled_from(list(DstFold)),
)
def test_cron_fires_agree_with_an_instant_scan(
    sec: str,
    with_seconds: bool,
    minute: str,
    hour: str,
    where: tuple[str, int],
    shift_ms: int,
    gap: DstGap,
    fold: DstFold,
) -> None:
    zone, transition = where
    if not with_seconds:
        sec = "0"
    expr = f"{sec} {minute} {hour} * * *" if with_seconds else f"{minute} {hour} * * *"
    c = cron(expr, zone, gap, fold)
    after = transition + shift_ms
    until = after + 8 * HOUR
    got = c.fires_between(after, until, 100_000)
    # Strictly increasing, all in the window.
    assert all(a < b for a, b in itertools.pairwise(got))
    assert all(after < f <= until for f in got)
    # fires_between agrees with iterating next_fire.
    walked: list[int] = []
    t = after
    while True:
        nxt = c.next_fire(t)
        assert nxt is not None and nxt > t
        if nxt > until:
            break
        walked.append(nxt)
        t = nxt
    assert walked == got
    assert c.count_between(after, until, 100_000) == len(got)
    # And an independent scan of instants decides the same fires.
    expected, skipped = reference_fires(
        SECONDS[sec], MINUTES[minute], HOURS[hour], zone, after // 1000, until // 1000, gap, fold
    )
    assert got == expected
    assert c.skipped_between(after, until, 100_000) == skipped
