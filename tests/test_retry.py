"""The one backoff every retry of wheel's own calls waits by (``wheel._retry``)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from wheel._retry import Backoff, Jitter


def test_waits_double_from_initial_up_to_max() -> None:
    delays = Backoff(initial=0.1, max=1.0).delays()
    assert [round(delays.wait(), 3) for _ in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]


def test_a_success_starts_the_waits_over() -> None:
    delays = Backoff(initial=0.05, max=2.0, multiplier=3.0).delays()
    assert [delays.wait() for _ in range(3)] == pytest.approx([0.05, 0.15, 0.45])
    delays.reset()
    assert delays.wait() == pytest.approx(0.05)


@given(retry=st.integers(0, 200), seed=st.integers(0, 2**32))
def test_jitter_draws_under_the_ceiling(retry: int, seed: int) -> None:
    ceiling = Backoff(initial=0.25, max=5.0).ceiling(retry)
    rng = random.Random(seed)
    equal = Backoff(initial=0.25, max=5.0, jitter=Jitter.EQUAL).delay(retry, rng)
    full = Backoff(initial=0.25, max=5.0, jitter=Jitter.FULL).delay(retry, rng)
    assert ceiling / 2 <= equal <= ceiling
    assert 0 <= full <= ceiling <= 5.0


def test_no_wait_ends_past_the_deadline_from_the_first_failure() -> None:
    now = [100.0]
    delays = Backoff(initial=1.0, max=4.0, deadline=5.0).delays(clock=lambda: now[0])
    assert delays.next() == 1.0  # ends at 101
    now[0] = 101.0
    assert delays.next() == 2.0  # ends at 103
    now[0] = 103.0
    assert delays.failing_for == 3.0
    assert delays.next() is None  # 4 s would end at 107, past 105
    delays.reset()
    assert delays.failing_for == 0.0
    assert delays.next() == 1.0


def test_a_negative_wait_or_a_shrinking_multiplier_is_refused() -> None:
    with pytest.raises(ValueError, match="negative"):
        Backoff(initial=-1.0, max=1.0)
    with pytest.raises(ValueError, match="multiplier"):
        Backoff(initial=0.1, max=1.0, multiplier=0.5)
