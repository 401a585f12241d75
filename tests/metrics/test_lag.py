"""The per-minute lag ring: what a minute counts, and the hour it keeps."""

from __future__ import annotations

from wheel.metrics import BatchedHistogram, LagRing
from wheel.metrics._lag import MINUTE_MS

BOUNDS = (1, 5, 10, 50, 100, 500)
T0 = 1_000 * MINUTE_MS  # a minute's start


def ring_over(hist: BatchedHistogram) -> LagRing:
    ring = LagRing(hist.bounds_ms)
    ring.observe(T0, hist.buckets(), hist.take_peak())
    return ring


def test_a_minute_counts_what_the_histogram_gained_in_it_with_its_percentiles_and_max() -> None:
    hist = BatchedHistogram(BOUNDS)
    hist.add([400] * 10)  # before the ring's first look: in no minute
    ring = ring_over(hist)
    hist.add([3] * 98 + [42, 77])
    ring.observe(T0 + 20_000, hist.buckets(), hist.take_peak())
    hist.add([2])
    ring.observe(T0 + 50_000, hist.buckets(), hist.take_peak())
    minute = ring.history(T0 + 59_000)[-1]
    assert (minute.minute_ms, minute.count) == (T0, 101)
    # p50 in the (1, 5] bucket; p99 (rank 100 of 101: the 42) in (10, 50].
    assert (minute.p50_ms, minute.p99_ms, minute.max_ms) == (5.0, 50.0, 77.0)


def test_the_next_minute_starts_from_zero_and_quiet_minutes_are_rows_of_zero() -> None:
    hist = BatchedHistogram(BOUNDS)
    ring = ring_over(hist)
    hist.add([7, 8])
    ring.observe(T0 + 1_000, hist.buckets(), hist.take_peak())
    hist.add([600])
    ring.observe(T0 + 3 * MINUTE_MS + 1, hist.buckets(), hist.take_peak())
    history = ring.history(T0 + 3 * MINUTE_MS + 2)
    assert len(history) == 60
    assert [m.minute_ms for m in history[-4:]] == [T0 + i * MINUTE_MS for i in range(4)]
    assert [m.count for m in history[-4:]] == [2, 0, 0, 1]
    # A bucket's bound is never said above the minute's max (7 and 8 in (5, 10]).
    assert (history[-4].p50_ms, history[-4].max_ms) == (8.0, 8.0)
    assert (history[-1].p99_ms, history[-1].max_ms) == (600.0, 600.0)  # above every bound


def test_only_the_last_hour_is_kept() -> None:
    hist = BatchedHistogram(BOUNDS)
    ring = ring_over(hist)
    for minute in range(90):
        hist.add([minute + 1])
        ring.observe(T0 + minute * MINUTE_MS, hist.buckets(), hist.take_peak())
    history = ring.history(T0 + 89 * MINUTE_MS)
    assert [m.max_ms for m in history] == [float(m + 1) for m in range(30, 90)]
    assert all(m.count == 1 for m in history)


def test_the_histogram_peak_is_the_largest_sample_since_it_was_last_taken() -> None:
    hist = BatchedHistogram(BOUNDS)
    assert hist.take_peak() == 0
    hist.add([3, 900, 4])
    assert hist.count == 3  # a fold on the way keeps the peak
    hist.add([5])
    assert (hist.take_peak(), hist.take_peak()) == (900, 0)
