"""The owner and calendars: a fire on a skipped day is recorded missed
(calendar), never run; a skipped day costs one record; a calendar change
re-arms the jobs that skip it, without a resubmit."""

from __future__ import annotations

from tests.engine.sim import HOUR, MIN, SEC
from tests.engine.test_owner import Node, spec
from wheel.engine.calendars import parse_calendar
from wheel.engine.model import MissedReason
from wheel.engine.spec import CatchUp, CatchUpMode, Cron, Interval

DAY = 24 * HOUR
FRI = 1_799_971_200_000  # 2027-01-15 00:00 UTC, a Friday
FRIDAY = parse_calendar(["2027-01-15"], [], [])
WEEKEND = parse_calendar([], [], ["sat", "sun"])


def _node(now: int = FRI + 8 * HOUR) -> Node:
    n = Node(now=now)
    n.hello(capacity=100)
    return n


def _run_until(n: Node, end: int, every: int = 10 * MIN) -> None:
    while n.now < end:
        acts = n.step(min(end, n.now + every))
        for a in acts.assignments.get("w1", []):
            n.complete(a)


def _fires(n: Node, job_id: int) -> list[int]:
    return sorted({f for f, _, _ in n.execs(job_id)})


def test_a_job_skipping_today_runs_nothing_today_and_records_the_day_once() -> None:
    n = _node()
    n.owner.set_calendar("default", "hol", FRIDAY, n.now, n.acts)
    j = n.submit(spec(schedule=Interval(period_ms=MIN), skip_calendars=("hol",)))
    _run_until(n, FRI + DAY - MIN)
    assert _fires(n, j) == []
    assert n.missed(j) == {FRI + 8 * HOUR: MissedReason.CALENDAR}
    _run_until(n, FRI + DAY + 3 * MIN, every=MIN)
    assert _fires(n, j) == [FRI + DAY, FRI + DAY + MIN, FRI + DAY + 2 * MIN, FRI + DAY + 3 * MIN]


def test_a_fire_every_second_through_a_weekend_records_two_missed_fires() -> None:
    n = _node(FRI + DAY - 2 * SEC)
    n.owner.set_calendar("default", "wk", WEEKEND, n.now, n.acts)
    j = n.submit(spec(schedule=Interval(period_ms=SEC), skip_calendars=("wk",)))
    _run_until(n, FRI + DAY - SEC, every=SEC)
    # Saturday's first fire is armed next: it stands for the day, and the
    # schedule jumps to Sunday's, then to Monday.
    _run_until(n, FRI + 3 * DAY + SEC, every=HOUR)
    calendar = {f for f, r in n.missed(j).items() if r is MissedReason.CALENDAR}
    assert calendar == {FRI + DAY, FRI + 2 * DAY}
    fires = _fires(n, j)
    assert fires[0] == FRI + DAY - 2 * SEC
    assert all(not FRI + DAY <= f < FRI + 3 * DAY for f in fires)
    assert FRI + 3 * DAY in fires


def test_deleting_the_calendar_makes_the_job_fire_again_from_now() -> None:
    n = _node()
    n.owner.set_calendar("default", "hol", FRIDAY, n.now, n.acts)
    j = n.submit(spec(schedule=Interval(period_ms=MIN), skip_calendars=("hol",)))
    _run_until(n, FRI + 10 * HOUR)
    assert _fires(n, j) == []
    moved = n.owner.set_calendar("default", "hol", None, n.now, n.acts)
    assert moved == 1
    _run_until(n, FRI + 10 * HOUR + 3 * MIN, every=MIN)
    assert _fires(n, j) == [FRI + 10 * HOUR + k * MIN for k in (1, 2, 3)]
    # Nothing run was recorded missed too.
    assert set(n.missed(j)) == {FRI + 8 * HOUR}


def test_a_calendar_that_comes_to_hold_today_stops_the_fires_from_the_change() -> None:
    n = _node()
    j = n.submit(spec(schedule=Cron(expr="0 * * * *"), skip_calendars=("hol",)))
    _run_until(n, FRI + 10 * HOUR + MIN)
    assert _fires(n, j) == [FRI + 8 * HOUR, FRI + 9 * HOUR, FRI + 10 * HOUR]
    # Another tenant's calendar of that name changes nothing.
    assert n.owner.set_calendar("other", "hol", FRIDAY, n.now, n.acts) == 0
    n.owner.set_calendar("default", "hol", FRIDAY, n.now, n.acts)
    _run_until(n, FRI + DAY + MIN, every=HOUR)
    assert _fires(n, j) == [FRI + 8 * HOUR, FRI + 9 * HOUR, FRI + 10 * HOUR, FRI + DAY]
    assert n.missed(j) == {FRI + 11 * HOUR: MissedReason.CALENDAR}


def test_skipped_days_passed_while_down_are_recorded_by_the_catch_up() -> None:
    n = _node(FRI + 4 * DAY)
    n.owner.set_calendar("default", "wk", WEEKEND, n.now, n.acts)
    # Every hour, last moved to Friday 23:00; the owner was down since.
    j = n.submit(
        spec(
            schedule=Cron(expr="0 * * * *"),
            skip_calendars=("wk",),
            catch_up=CatchUp(mode=CatchUpMode.RUN_ALL, max_count=1000),
        ),
        next_run_at=FRI + 23 * HOUR,
    )
    _run_until(n, FRI + 4 * DAY + HOUR, every=MIN)
    calendar = {f for f, r in n.missed(j).items() if r is MissedReason.CALENDAR}
    assert calendar == {FRI + DAY, FRI + 2 * DAY}
    fires = _fires(n, j)
    assert fires[0] == FRI + 23 * HOUR
    assert all(not FRI + DAY <= f < FRI + 3 * DAY for f in fires)
    assert FRI + 3 * DAY in fires


def test_a_restart_keeps_skipping_once_the_calendars_are_back() -> None:
    n = _node()
    n.owner.set_calendar("default", "hol", FRIDAY, n.now, n.acts)
    j = n.submit(spec(schedule=Interval(period_ms=MIN), skip_calendars=("hol",)))
    _run_until(n, FRI + 9 * HOUR)
    n.restart()
    n.hello(capacity=100)
    n.owner.set_calendars({("default", "hol"): FRIDAY}, n.now, n.acts)
    _run_until(n, FRI + DAY + MIN, every=HOUR)
    assert _fires(n, j) == [FRI + DAY, FRI + DAY + MIN]
    assert n.missed(j) == {FRI + 8 * HOUR: MissedReason.CALENDAR}


def test_a_job_s_next_fires_leave_out_its_skipped_days() -> None:
    n = _node(FRI + 23 * HOUR)
    n.owner.set_calendar("default", "wk", WEEKEND, n.now, n.acts)
    j = n.submit(spec(schedule=Cron(expr="0 12 * * *"), skip_calendars=("wk",)))
    n.step()
    # Saturday's noon is armed (it stands for the day), but never shown.
    assert n.owner.next_fires(j, 3) == [FRI + 3 * DAY + 12 * HOUR, FRI + 4 * DAY + 12 * HOUR,
                                        FRI + 5 * DAY + 12 * HOUR]  # fmt: skip


def test_a_skipped_day_s_fire_due_at_a_pause_is_recorded_as_the_calendar_s() -> None:
    n = _node()
    n.owner.set_calendar("default", "hol", FRIDAY, n.now, n.acts)
    j = n.submit(spec(schedule=Interval(period_ms=MIN), skip_calendars=("hol",)), next_run_at=FRI)
    n.owner.cancel_job(j, n.acts, n.now)
    n.step()
    assert n.missed(j) == {FRI: MissedReason.CALENDAR}
