"""Bounded schedules (``active_from_ms``, ``active_until_ms``, ``max_fires``):
the fires of a bounded schedule are those of the unbounded one filtered by
its range and cut at its N-th owed fire, and a job whose bound is reached
completes once the run of its last fire has ended."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.engine.sim import HOUR, MIN, SEC
from tests.engine.test_owner import Node, T, _assignment, spec
from tests.strategies import schedule_bounds
from wheel.engine.fires import preview_fires, with_last_fire
from wheel.engine.model import JobState, MissedReason
from wheel.engine.profiles import profile_of, split_spec
from wheel.engine.schedule import compile_schedule, compile_spec
from wheel.engine.spec import (
    Cron,
    Interval,
    IntervalMode,
    JobSpec,
    Once,
    Overlap,
    OverlapPolicy,
)
from wheel.errors import FailedPrecondition, InvalidArgument

DAY = 24 * HOUR

SCHEDULES = st.one_of(
    st.builds(
        Interval,
        period_ms=st.integers(MIN, 6 * HOUR),
        start_at_ms=st.integers(T - DAY, T + DAY),
    ),
    st.builds(
        Cron,
        expr=st.sampled_from(["*/7 * * * *", "0 */3 * * *", "30 2 * * *", "0 0 * * MON"]),
        time_zone=st.sampled_from(["UTC", "America/New_York", "Asia/Tokyo"]),
    ),
)


def reference(s: JobSpec, submitted: int, horizon: int) -> list[int]:
    """The model: the unbounded schedule's fires from the submit on, kept in
    the active range, cut at max_fires."""
    plain = compile_schedule(s.schedule)
    fires = plain.fires_between(submitted - 1, horizon, 10_000)
    kept = [
        f
        for f in fires
        if f >= s.active_from_ms and (not s.active_until_ms or f <= s.active_until_ms)
    ]
    return kept[: s.max_fires] if s.max_fires else kept


@settings(max_examples=150, deadline=None)
@given(schedule=SCHEDULES, data=st.data())
def test_a_bounded_schedule_fires_as_the_unbounded_one_filtered_and_cut(
    schedule: Interval | Cron, data: st.DataObject
) -> None:
    low, high, n = data.draw(schedule_bounds(T))
    submitted = T
    s = with_last_fire(
        spec(schedule=schedule, active_from_ms=low, active_until_ms=high, max_fires=n),
        submitted,
    )
    horizon = T + 5 * DAY
    compiled = compile_spec(s)
    got = compiled.fires_between(submitted - 1, horizon, 10_000)
    assert got == reference(s, submitted, horizon)
    # next_fire walks the same fires, and preview shows them.
    walked, at = [], submitted - 1
    while (nxt := compiled.next_fire(at)) is not None and nxt <= horizon:
        walked.append(nxt)
        at = nxt
    assert walked == got
    assert [f for f in preview_fires(s, submitted - 1, 20) if f <= horizon] == got[:20]
    assert compiled.count_between(submitted - 1, horizon, 10_000) == len(got)


def test_a_bound_keeps_each_fire_jittered_as_unbounded() -> None:
    shape = Interval(period_ms=MIN, start_at_ms=T)
    plain = compile_schedule(shape, jitter_ms=30 * SEC, job_id=7)
    bounded = compile_schedule(
        shape, jitter_ms=30 * SEC, job_id=7, active_from_ms=T + 5 * MIN, active_until_ms=T + HOUR
    )
    for f in plain.fires_between(T + 5 * MIN - 1, T + HOUR, 100):
        assert bounded.jittered(f) == plain.jittered(f)


def test_a_fixed_delay_schedule_starts_in_its_range_and_ends_at_its_until() -> None:
    shape = Interval(period_ms=MIN, mode=IntervalMode.FIXED_DELAY, start_at_ms=T)
    c = compile_schedule(shape, active_from_ms=T + HOUR, active_until_ms=T + 2 * HOUR)
    assert c.completion_driven
    assert c.next_fire(T - 1) == T + HOUR
    assert c.next_after_completion(T + HOUR + 10 * SEC) == T + HOUR + 70 * SEC
    assert c.next_after_completion(T + 2 * HOUR - 30 * SEC) is None


# -- the spec: JSON, profile, validation ---------------------------------------------


def test_an_unbounded_spec_keeps_its_json_and_profile() -> None:
    s = spec()
    assert "active_from_ms" not in s.to_json() and "max_fires" not in s.to_json()
    bounded = replace(s, active_from_ms=T, active_until_ms=T + DAY, max_fires=3)
    back = JobSpec.from_json(bounded.to_json())
    assert (back.active_from_ms, back.active_until_ms, back.max_fires) == (T, T + DAY, 3)
    assert JobSpec.from_json(s.to_json()) == s
    # Bounds are part of the profile: a bounded job does not share one with
    # an unbounded job of the same shape.
    assert profile_of(split_spec(s)[0]).profile_id != profile_of(split_spec(back)[0]).profile_id
    assert profile_of(split_spec(back)[0]).template.max_fires == 3


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"schedule": Once(at_ms=T), "max_fires": 2}, "spec.max_fires"),
        ({"schedule": Once(at_ms=T), "active_until_ms": T}, "spec.active_until_ms"),
        ({"schedule": Once(at_ms=T), "active_from_ms": T}, "spec.active_from_ms"),
        ({"max_fires": -1}, "spec.max_fires"),
        ({"max_fires": 100_001}, "spec.max_fires"),
        ({"active_from_ms": -5}, "spec.active_from_ms"),
        ({"active_from_ms": T, "active_until_ms": T}, "spec.active_until_ms"),
        (
            {
                "schedule": Interval(period_ms=MIN, mode=IntervalMode.FIXED_DELAY, start_at_ms=T),
                "max_fires": 3,
            },
            "spec.max_fires",
        ),
    ],
)
def test_bad_bounds_are_refused_naming_the_field(changes: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        spec(**changes).validate()
    assert e.value.field == field


# -- the owner ----------------------------------------------------------------------


def _run_fires(n: Node, job: int, until: int, step: int = MIN) -> list[int]:
    """Step the clock to ``until``, running and completing every fire of ``job``."""
    fires: list[int] = []
    t = n.now
    while t < until:
        t += step
        acts = n.step(t)
        for c in acts.claims:
            if c.job_id == job:
                fires.append(c.scheduled_for)
                n.complete(_assignment(n, c.fence))
    return fires


def test_max_fires_runs_exactly_n_fires_and_completes_the_job() -> None:
    n = Node()
    n.hello()
    j = n.submit(spec(max_fires=3))
    assert _run_fires(n, j, T + 10 * MIN) == [T + MIN, T + 2 * MIN, T + 3 * MIN]
    assert n.store.jobs[j].state is JobState.COMPLETED
    assert n.store.jobs[j].next_run_at is None
    assert j not in n.owner.jobs


def test_the_last_fire_claimed_makes_the_job_running_until_its_run_ends() -> None:
    n = Node()
    n.hello()
    j = n.submit(spec(active_until_ms=T + 2 * MIN))
    [c1] = n.step(T + MIN).claims
    n.complete(_assignment(n, c1.fence))
    [c2] = n.step(T + 2 * MIN).claims
    assert c2.new_next_run_at is None
    assert n.store.jobs[j].state is JobState.RUNNING
    acts = n.complete(_assignment(n, c2.fence))
    assert [x.job_state for x in acts.completions] == [JobState.COMPLETED]
    assert n.store.jobs[j].state is JobState.COMPLETED
    assert not n.step(T + DAY).claims


def test_no_fire_before_active_from() -> None:
    n = Node()
    n.hello()
    j = n.submit(spec(active_from_ms=T + 10 * MIN + 1, max_fires=2))
    assert n.store.jobs[j].next_run_at == T + 11 * MIN
    assert _run_fires(n, j, T + 20 * MIN) == [T + 11 * MIN, T + 12 * MIN]
    assert n.store.jobs[j].state is JobState.COMPLETED


def test_a_last_fire_recorded_missed_counts_and_completes_the_job() -> None:
    """A fire that came due while a run went on is owed and recorded missed
    (overlap): it is one of the N; once the run ends the job is complete."""
    n = Node()
    n.hello()
    j = n.submit(spec(max_fires=2, overlap=Overlap(policy=OverlapPolicy.SKIP)))
    [c1] = n.step(T + MIN).claims
    a = _assignment(n, c1.fence)
    n.step(T + 2 * MIN)  # the second and last fire comes due during the first run
    assert n.missed(j) == {T + 2 * MIN: MissedReason.OVERLAP}
    n.complete(a)
    assert n.store.jobs[j].state is JobState.COMPLETED
    assert not n.step(T + DAY).claims


def test_the_count_survives_a_restart_between_fires() -> None:
    n = Node()
    n.hello()
    j = n.submit(spec(max_fires=3))
    assert _run_fires(n, j, T + 2 * MIN) == [T + MIN, T + 2 * MIN]
    n.restart()
    n.hello()
    assert _run_fires(n, j, T + 10 * MIN) == [T + 3 * MIN]
    assert n.store.jobs[j].state is JobState.COMPLETED


def test_a_fixed_delay_job_completes_when_its_until_passes() -> None:
    n = Node()
    n.hello()
    shape = Interval(period_ms=MIN, mode=IntervalMode.FIXED_DELAY, start_at_ms=T + MIN)
    j = n.submit(spec(schedule=shape, active_until_ms=T + 3 * MIN + 30 * SEC))
    fires = _run_fires(n, j, T + 10 * MIN, step=SEC * 30)
    assert fires == [T + MIN + 30 * SEC * k for k in range(0, 5, 2)][:3]
    assert n.store.jobs[j].state is JobState.COMPLETED


def test_a_fixed_delay_job_whose_next_fire_after_a_long_run_is_past_its_until_completes() -> None:
    n = Node()
    n.hello()
    shape = Interval(period_ms=MIN, mode=IntervalMode.FIXED_DELAY, start_at_ms=T + MIN)
    j = n.submit(spec(schedule=shape, active_until_ms=T + 2 * MIN + 30 * SEC))
    [c] = n.step(T + MIN).claims
    assert c.new_next_run_at == T + 2 * MIN  # provisional: a period after the fire
    a = _assignment(n, c.fence)
    n.step(T + 2 * MIN)
    acts = n.complete(a)  # the next fire would be at T + 3 min, past the bound
    assert [x.ends for x in acts.advances] == [True]
    assert n.store.jobs[j].state is JobState.COMPLETED
    assert j not in n.owner.jobs and not n.step(T + DAY).claims


def test_a_paused_job_resumed_after_its_bound_is_completed() -> None:
    n = Node()
    j = n.submit(spec(active_until_ms=T + 5 * MIN))
    record = n.store.get_job(j)
    paused = n.store.set_job_state(j, JobState.PAUSED, next_run_at=None, now_ms=n.now)
    change = n.driver.state_change(paused, JobState.ACTIVE, T + HOUR)
    assert change.state is JobState.COMPLETED
    assert record.state is JobState.ACTIVE


def test_a_completed_job_may_not_take_new_bounds() -> None:
    n = Node()
    n.hello()
    j = n.submit(spec(max_fires=1))
    _run_fires(n, j, T + 3 * MIN)
    record = n.store.get_job(j)
    assert record.state is JobState.COMPLETED
    with pytest.raises(FailedPrecondition, match="completed"):
        n.driver.update(record, replace(record.spec, max_fires=5), n.now)


def test_a_submit_with_no_fire_left_in_its_bounds_is_refused() -> None:
    n = Node()
    with pytest.raises(InvalidArgument) as e:
        n.driver.new_job(spec(active_until_ms=T - 1), None, T)
    assert e.value.field == "spec.active_until_ms"


def test_an_update_counts_max_fires_from_the_submit_over_the_new_schedule() -> None:
    n = Node(now=T + 30 * SEC)
    j = n.submit(spec(schedule=Cron(expr="*/5 * * * *"), max_fires=3))
    record = n.store.get_job(j)
    assert record.spec.last_fire_ms == T + 15 * MIN  # :05, :10, :15 (T is on the hour)
    update, _ = n.driver.update(
        record, replace(record.spec, schedule=Cron(expr="*/10 * * * *")), T + MIN
    )
    assert update.spec.last_fire_ms == T + 30 * MIN  # from the submit, as if always so
    same, _ = n.driver.update(record, replace(record.spec, last_fire_ms=0), T + MIN)
    assert same.spec.last_fire_ms == T + 15 * MIN


def test_a_fixed_rate_job_s_last_fire_comes_from_its_start_so_its_jobs_share_a_profile() -> None:
    n = Node()
    a = n.driver.new_job(spec(max_fires=10), None, T)
    b = n.driver.new_job(
        spec(schedule=Interval(period_ms=MIN, start_at_ms=T + 7 * MIN), max_fires=10), None, T
    )
    assert a.spec.last_fire_ms == b.spec.last_fire_ms == 0
    assert a.profile == b.profile
    assert a.spec.ends_at_ms() == T + 10 * MIN and b.spec.ends_at_ms() == T + 16 * MIN
    # A start in the past: fires before the submit are not owed, so the last
    # one is counted and kept.
    late = n.driver.new_job(
        spec(schedule=Interval(period_ms=MIN, start_at_ms=T - 30 * MIN), max_fires=2), None, T
    )
    assert late.spec.last_fire_ms == T + MIN


def test_a_restart_while_the_last_fire_runs_still_completes_the_job_when_it_ends() -> None:
    n = Node()
    n.hello()
    j = n.submit(spec(max_fires=2))
    assert _run_fires(n, j, T + MIN) == [T + MIN]
    [c] = n.step(T + 2 * MIN).claims
    assert n.store.jobs[j].state is JobState.RUNNING
    n.restart()
    n.hello()
    acts = n.step(T + 2 * MIN + 10 * SEC)  # the run, adopted, is given out again or kept
    mine = [a for a in acts.assignments.get("w1", []) if a.job_id == j]
    a = mine[0] if mine else _assignment(n, c.fence)
    n.complete(a)
    assert n.store.jobs[j].state is JobState.COMPLETED
    assert not n.step(T + DAY).claims


def test_a_job_completes_when_its_last_run_in_flight_ends_not_before() -> None:
    """With overlap allow, the last fire's run may end before an earlier
    one's: the job completes when the later of them ends."""
    n = Node()
    n.hello()
    j = n.submit(spec(max_fires=2, overlap=Overlap(policy=OverlapPolicy.ALLOW, max_concurrent=2)))
    [c1] = n.step(T + MIN).claims
    a1 = _assignment(n, c1.fence)
    [c2] = n.step(T + 2 * MIN).claims
    assert c2.new_next_run_at is None
    n.complete(_assignment(n, c2.fence))
    assert n.store.jobs[j].state is JobState.RUNNING
    n.complete(a1)
    assert n.store.jobs[j].state is JobState.COMPLETED
