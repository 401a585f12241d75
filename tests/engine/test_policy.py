"""Retry backoff and catch-up planning: the pure policy the shard owner follows."""

from __future__ import annotations

import subprocess
import sys
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wheel.engine.model import MissedReason
from wheel.engine.policy import (
    CatchUpPlan,
    CatchUpStream,
    backoff_ms,
    plan_catch_up,
    retry_delay_ms,
    should_retry,
    stable_hash64,
)
from wheel.engine.spec import CatchUp, CatchUpMode, Retry

R = MissedReason
LATEST, ALL, SKIP = CatchUpMode.RUN_LATEST_ONLY, CatchUpMode.RUN_ALL, CatchUpMode.SKIP

# -- stable_hash64 ------------------------------------------------------------------


def test_stable_hash64_is_pinned_across_processes_and_versions() -> None:
    # Pinned values: a change here changes every jitter ever persisted or replayed.
    here = [stable_hash64(), stable_hash64(0), stable_hash64(1, 2, 3), stable_hash64(-1)]
    code = (
        "from wheel.engine.policy import stable_hash64 as h;print([h(), h(0), h(1, 2, 3), h(-1)])"
    )
    other = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert other.strip() == str(here)
    assert all(0 <= v < 2**64 for v in here)


def test_stable_hash64_depends_on_order_count_and_every_value() -> None:
    assert stable_hash64(1, 2) != stable_hash64(2, 1)
    assert stable_hash64(0) != stable_hash64(0, 0)
    assert stable_hash64() != stable_hash64(0)
    values = {stable_hash64(7, t, 0) for t in range(10_000)}
    assert len(values) == 10_000


def test_stable_hash64_low_bits_are_balanced() -> None:
    # Sequential inputs (the common case: consecutive fire times) must not bias the jitter.
    ones = sum(stable_hash64(42, t) & 1 for t in range(20_000))
    assert 9_500 < ones < 10_500


# -- retries ----------------------------------------------------------------------------

RETRY = Retry(max_attempts=5, initial_backoff_ms=1_000, max_backoff_ms=60_000, multiplier=2.0)


@pytest.mark.parametrize(
    ("attempt", "backoff"),
    [(0, 1_000), (1, 2_000), (2, 4_000), (5, 32_000), (6, 60_000), (7, 60_000), (10**9, 60_000)],
)
def test_backoff_grows_exponentially_up_to_the_cap(attempt: int, backoff: int) -> None:
    assert backoff_ms(RETRY, failed_attempt=attempt) == backoff


@given(
    initial=st.integers(0, 10**7),
    extra=st.integers(0, 10**9),
    multiplier=st.floats(1.0, 100.0),
    attempt=st.integers(0, 10**12),
    job_id=st.integers(0, 2**63 - 1),
    fire=st.integers(0, 2**53),
)
@settings(deadline=None, max_examples=300)
def test_retry_delay_is_the_backoff_plus_at_most_a_quarter_for_any_attempt(
    initial: int, extra: int, multiplier: float, attempt: int, job_id: int, fire: int
) -> None:
    retry = Retry(initial_backoff_ms=initial, max_backoff_ms=initial + extra, multiplier=multiplier)
    backoff = backoff_ms(retry, failed_attempt=attempt)
    assert 0 <= backoff <= retry.max_backoff_ms  # max_backoff caps the backoff before jitter
    delay = retry_delay_ms(retry, failed_attempt=attempt, job_id=job_id, scheduled_for=fire)
    assert backoff <= delay <= 1.25 * backoff
    assert delay == retry_delay_ms(retry, failed_attempt=attempt, job_id=job_id, scheduled_for=fire)


def test_the_first_retry_of_a_one_second_backoff_comes_no_sooner_than_a_second() -> None:
    retry = Retry(max_attempts=3, initial_backoff_ms=1_000, max_backoff_ms=60_000, multiplier=2.0)
    first = [
        retry_delay_ms(retry, failed_attempt=0, job_id=job, scheduled_for=1_700_000_000_000)
        for job in range(2_000)
    ]
    assert min(first) >= 1_000 and max(first) <= 1_250
    second = [
        retry_delay_ms(retry, failed_attempt=1, job_id=job, scheduled_for=1_700_000_000_000)
        for job in range(2_000)
    ]
    assert min(second) >= 2_000 and max(second) <= 2_500


@given(
    initial=st.integers(1, 10**6),
    extra=st.integers(0, 10**8),
    multiplier=st.floats(1.0, 100.0),
)
@settings(deadline=None, max_examples=100)
def test_backoff_never_shrinks_as_attempts_grow(
    initial: int, extra: int, multiplier: float
) -> None:
    retry = Retry(initial_backoff_ms=initial, max_backoff_ms=initial + extra, multiplier=multiplier)
    backoffs = [backoff_ms(retry, failed_attempt=n) for n in range(200)]
    assert backoffs == sorted(backoffs)
    assert backoffs[0] == initial
    if multiplier >= 1.1:
        assert backoffs[-1] == retry.max_backoff_ms


def test_retry_delay_is_spread_over_a_quarter_of_the_backoff_on_top_of_it() -> None:
    delays = [
        retry_delay_ms(RETRY, failed_attempt=3, job_id=job, scheduled_for=1_700_000_000_000)
        for job in range(4_000)
    ]
    assert 8_000 <= min(delays) < 8_000 + 2_000 * 0.05
    assert 8_000 + 2_000 * 0.95 < max(delays) <= 10_000
    assert 8_900 < sum(delays) / len(delays) < 9_100  # uniform on [8000, 10000]: mean 9000
    assert len(set(delays)) > 1_500


def test_retry_delay_differs_between_attempts_and_fires_of_the_same_job() -> None:
    by_attempt = {
        retry_delay_ms(RETRY, failed_attempt=9, job_id=1, scheduled_for=0) for _ in range(3)
    }
    assert len(by_attempt) == 1  # deterministic
    per_fire = {
        retry_delay_ms(RETRY, failed_attempt=9, job_id=1, scheduled_for=t * 60_000)
        for t in range(50)
    }
    assert len(per_fire) > 40
    per_attempt = {
        retry_delay_ms(RETRY, failed_attempt=a, job_id=1, scheduled_for=0) for a in range(8, 60)
    }
    assert len(per_attempt) > 40


def test_retry_delay_is_zero_when_there_is_no_backoff() -> None:
    retry = Retry(initial_backoff_ms=0, max_backoff_ms=0)
    assert retry_delay_ms(retry, failed_attempt=3, job_id=1, scheduled_for=2) == 0


def test_retry_delay_handles_huge_attempt_numbers_without_overflow() -> None:
    retry = Retry(initial_backoff_ms=1, max_backoff_ms=10**9, multiplier=100.0)
    for attempt in (10**3, 10**6, 2**63, 10**30):
        assert backoff_ms(retry, failed_attempt=attempt) == 10**9
        delay = retry_delay_ms(retry, failed_attempt=attempt, job_id=1, scheduled_for=1)
        assert 10**9 <= delay <= 1.25 * 10**9


def test_a_multiplier_of_one_keeps_a_constant_backoff() -> None:
    retry = Retry(initial_backoff_ms=500, max_backoff_ms=10_000, multiplier=1.0)
    assert {backoff_ms(retry, failed_attempt=n) for n in range(100)} == {500}


@pytest.mark.parametrize(
    ("max_attempts", "failed_attempt", "retry"),
    [
        (1, 0, False),
        (5, 0, True),
        (5, 3, True),
        (5, 4, False),
        (5, 5, False),
    ],
)
def test_should_retry_until_max_attempts_then_dead_letter(
    max_attempts: int, failed_attempt: int, retry: bool
) -> None:
    assert should_retry(Retry(max_attempts=max_attempts), failed_attempt=failed_attempt) is retry


# -- plan_catch_up: the table ----------------------------------------------------------

NOW = 1_000_000
FIRES = [NOW - 50_000, NOW - 40_000, NOW - 30_000, NOW - 20_000, NOW - 10_000]
A, B, C, D, E = FIRES


@pytest.mark.parametrize(
    ("catch_up", "run", "missed", "alerted"),
    [
        pytest.param(CatchUp(), [E], [(f, R.COLLAPSED) for f in FIRES[:-1]], False, id="default"),
        pytest.param(
            CatchUp(mode=LATEST, window_ms=30_000),
            [E],
            [(A, R.OUTSIDE_WINDOW), (B, R.OUTSIDE_WINDOW), (C, R.COLLAPSED), (D, R.COLLAPSED)],
            False,
            id="latest-window",
        ),
        pytest.param(
            CatchUp(mode=LATEST, window_ms=5_000),
            [],
            [(f, R.OUTSIDE_WINDOW) for f in FIRES],
            False,
            id="latest-all-outside-window",
        ),
        pytest.param(CatchUp(mode=ALL), FIRES, [], False, id="all-under-cap"),
        pytest.param(CatchUp(mode=ALL, max_count=5), FIRES, [], False, id="all-at-cap"),
        pytest.param(
            CatchUp(mode=ALL, max_count=4),
            [E],
            [(f, R.OVER_CAP) for f in FIRES[:-1]],
            True,
            id="all-over-cap",
        ),
        pytest.param(
            CatchUp(mode=ALL, window_ms=20_000),
            [D, E],
            [(A, R.OUTSIDE_WINDOW), (B, R.OUTSIDE_WINDOW), (C, R.OUTSIDE_WINDOW)],
            False,
            id="all-window",
        ),
        pytest.param(
            CatchUp(mode=ALL, window_ms=40_000, max_count=2),
            [E],
            [(A, R.OUTSIDE_WINDOW), (B, R.OVER_CAP), (C, R.OVER_CAP), (D, R.OVER_CAP)],
            True,
            id="all-window-then-cap",
        ),
        pytest.param(
            CatchUp(mode=ALL, window_ms=0, max_count=1),
            [],
            [(f, R.OUTSIDE_WINDOW) for f in FIRES],
            False,
            id="all-zero-window",
        ),
        pytest.param(CatchUp(mode=SKIP), [], [(f, R.SKIPPED) for f in FIRES], False, id="skip"),
        pytest.param(
            CatchUp(mode=SKIP, window_ms=30_000),
            [],
            [(f, R.SKIPPED) for f in FIRES],
            False,
            id="skip-ignores-window",
        ),
    ],
)
def test_plan_catch_up_table(
    catch_up: CatchUp, run: list[int], missed: list[tuple[int, MissedReason]], alerted: bool
) -> None:
    plan = plan_catch_up(catch_up, FIRES, NOW)
    assert plan.run == run
    assert plan.missed == missed
    assert (plan.alert is not None) is alerted


def test_window_boundary_is_inclusive() -> None:
    # now - fire == window is still inside; one millisecond more is outside.
    plan = plan_catch_up(CatchUp(mode=ALL, window_ms=1_000), [NOW - 1_001, NOW - 1_000], NOW)
    assert plan.run == [NOW - 1_000]
    assert plan.missed == [(NOW - 1_001, R.OUTSIDE_WINDOW)]


def test_over_cap_alert_says_how_many_and_the_cap() -> None:
    fires = list(range(0, 1_000, 10))
    plan = plan_catch_up(CatchUp(mode=ALL, max_count=7), fires, 5_000)
    assert plan.alert is not None
    assert "100" in plan.alert and "max_count=7" in plan.alert and "99" in plan.alert


def test_empty_backlog_plans_nothing() -> None:
    for mode in CatchUpMode:
        assert plan_catch_up(CatchUp(mode=mode), [], NOW) == CatchUpPlan(run=[], missed=[])


@pytest.mark.parametrize("fires", [[3, 2], [1, 1], [1, 5, 4]])
def test_unordered_or_duplicate_fires_are_refused(fires: list[int]) -> None:
    with pytest.raises(ValueError, match="ascending"):
        plan_catch_up(CatchUp(), fires, NOW)
    with pytest.raises(ValueError, match="ascending"):
        CatchUpStream(CatchUp(), NOW).feed(fires)


def test_plan_catch_up_accepts_a_lazy_range_of_fires() -> None:
    # A one-second job down for a day: the owner may pass a range, not a list.
    day = 86_400_000
    plan = plan_catch_up(CatchUp(mode=LATEST, window_ms=10_000), range(0, day, 1_000), day)
    assert plan.run == [day - 1_000]
    assert len(plan.missed) == 86_399
    assert sum(1 for _, r in plan.missed if r is R.COLLAPSED) == 9  # 10 in window, 1 runs


# -- plan_catch_up: properties ------------------------------------------------------

catch_ups = st.builds(
    CatchUp,
    mode=st.sampled_from(CatchUpMode),
    window_ms=st.none() | st.integers(0, 2_000),
    max_count=st.integers(1, 20),
)
backlogs = st.lists(st.integers(0, 2_000), max_size=60, unique=True).map(sorted)


@given(catch_up=catch_ups, fires=backlogs, lag=st.integers(0, 500))
@settings(deadline=None, max_examples=400)
def test_plan_catch_up_properties(catch_up: CatchUp, fires: list[int], lag: int) -> None:
    now = (fires[-1] if fires else 0) + lag
    plan = plan_catch_up(catch_up, fires, now)
    missed = [f for f, _ in plan.missed]
    reasons = dict(plan.missed)

    # Every fire exactly once, both lists ascending.
    assert sorted(plan.run + missed) == fires
    assert plan.run == sorted(plan.run) and missed == sorted(missed)

    def in_window(f: int) -> bool:
        return catch_up.window_ms is None or now - f <= catch_up.window_ms

    inside = [f for f in fires if in_window(f)]
    assert all(in_window(f) for f in plan.run)
    if catch_up.mode is SKIP:
        assert plan.run == [] and set(reasons.values()) <= {R.SKIPPED}
        assert plan.alert is None
        return
    assert all(reasons[f] is R.OUTSIDE_WINDOW for f in fires if not in_window(f))
    if catch_up.mode is LATEST:
        assert plan.run == inside[-1:]
        assert all(reasons[f] is R.COLLAPSED for f in inside[:-1])
        assert plan.alert is None
    else:
        assert len(plan.run) <= catch_up.max_count
        if len(inside) <= catch_up.max_count:
            assert plan.run == inside and plan.alert is None
        else:
            assert plan.run == inside[-1:] and plan.alert is not None
            assert all(reasons[f] is R.OVER_CAP for f in inside[:-1])


@given(
    catch_up=catch_ups,
    fires=backlogs,
    lag=st.integers(0, 500),
    cuts=st.lists(st.integers(0, 60), max_size=6),
)
@settings(deadline=None, max_examples=300)
def test_streamed_plan_equals_the_whole_plan_for_any_chunking(
    catch_up: CatchUp, fires: list[int], lag: int, cuts: list[int]
) -> None:
    now = (fires[-1] if fires else 0) + lag
    stream = CatchUpStream(catch_up, now)
    missed: list[tuple[int, MissedReason]] = []
    bounds = [0, *sorted(min(c, len(fires)) for c in cuts), len(fires)]
    for lo, hi in pairwise(bounds):
        part = stream.feed(iter(fires[lo:hi]))
        assert part.run == [] and part.alert is None
        missed += part.missed
    end = stream.finish()
    assert end.missed == []
    assert CatchUpPlan(run=end.run, missed=missed, alert=end.alert) == plan_catch_up(
        catch_up, fires, now
    )


def test_stream_holds_at_most_max_count_plus_one_fires_of_a_day_long_backlog() -> None:
    # 86,400 one-second fires fed in chunks: missed fires come out as they are
    # decided, only the run_all buffer is held back.
    day = 86_400_000
    stream = CatchUpStream(CatchUp(mode=ALL, max_count=100), day)
    released = 0
    for start in range(0, day, 3_600_000):
        part = stream.feed(range(start, start + 3_600_000, 1_000))
        released += len(part.missed)
        assert all(r is R.OVER_CAP for _, r in part.missed)
        assert len(stream._held) <= 101
    end = stream.finish()
    assert end.run == [day - 1_000]
    assert released == 86_399
    assert end.alert is not None
