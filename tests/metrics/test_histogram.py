"""``BatchedHistogram`` counts what a per-sample histogram would: every
sample in the first bucket whose bound is at or above it, whenever and in
whatever batches the samples came."""

from __future__ import annotations

from bisect import bisect_left

import pytest
from hypothesis import given
from hypothesis import strategies as st

from wheel.metrics import BatchedHistogram
from wheel.metrics import _histogram as module

BOUNDS = (1, 2.5, 5, 10, 100, 1_000)


def naive(bounds: tuple[float, ...], samples: list[int]) -> list[int]:
    """Cumulative counts the slow way: one sample at a time, ``le`` bounds."""
    counts = [0] * (len(bounds) + 1)
    for s in samples:
        counts[bisect_left(bounds, s)] += 1
    out, running = [], 0
    for n in counts:
        running += n
        out.append(running)
    return out


def test_a_sample_equal_to_a_bound_counts_in_that_bucket() -> None:
    hist = BatchedHistogram(BOUNDS)
    hist.add([1, 2, 3, 1_000, 1_001])
    assert hist.buckets() == [1, 2, 3, 3, 3, 4, 5]
    assert hist.at_or_below(1_000) == 4
    assert hist.count == 5
    assert hist.sum_ms == 1 + 2 + 3 + 1_000 + 1_001


@given(st.lists(st.lists(st.integers(-5, 5_000), max_size=50), max_size=20))
def test_batches_count_as_the_samples_one_by_one(batches: list[list[int]]) -> None:
    hist = BatchedHistogram(BOUNDS)
    for batch in batches:
        hist.add(batch)
    every = [s for batch in batches for s in batch]
    assert hist.buckets() == naive(BOUNDS, every)
    assert hist.sum_ms == sum(every)


def test_reading_between_batches_keeps_earlier_counts() -> None:
    hist = BatchedHistogram(BOUNDS)
    hist.add([3, 3, 3])
    assert hist.count == 3
    hist.add([50])
    assert hist.buckets() == naive(BOUNDS, [3, 3, 3, 50])


def test_a_long_pending_list_is_folded_as_it_grows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(module, "FOLD_AT", 10)
    hist = BatchedHistogram(BOUNDS)
    hist.add(range(12))
    assert hist._pending == []  # counted already, not kept
    assert hist.count == 12


def test_bounds_must_be_distinct() -> None:
    with pytest.raises(ValueError):
        BatchedHistogram((1, 1, 2))
    with pytest.raises(ValueError):
        BatchedHistogram(())
