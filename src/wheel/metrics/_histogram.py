"""A histogram of integer millisecond samples that arrive in batches.

The dispatch loop hands out thousands of runs a second and each has a lag
sample. ``prometheus_client.Histogram.observe`` takes a lock and walks the
buckets per sample; here a batch is only appended to a list (one ``extend``
per loop pass), and samples are sorted into buckets later, many at a time:
lags in whole milliseconds repeat, so ``Counter`` collapses a batch to a few
distinct values, and only those are placed with ``bisect``. Folding happens
when the histogram is read (a scrape, the lag objective's check) or when the
pending list grows long, which bounds its memory.

Not thread-safe: one thread adds and reads (the node's event loop).
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Iterable, Sequence

# Pending samples past which ``add`` folds at once.
FOLD_AT = 65_536


class BatchedHistogram:
    """Cumulative bucket counts of millisecond samples, bucket bounds in
    milliseconds (a sample equal to a bound is counted in that bucket, as
    Prometheus' ``le`` says)."""

    __slots__ = ("_bounds", "_counts", "_peak_ms", "_pending", "_sum_ms", "bounds_ms")

    def __init__(self, bounds_ms: Sequence[float]) -> None:
        bounds = sorted(float(b) for b in bounds_ms)
        if not bounds or len(set(bounds)) != len(bounds):
            raise ValueError("bucket bounds must be distinct and at least one")
        self.bounds_ms: tuple[float, ...] = tuple(bounds)
        self._bounds = list(bounds)
        # One count per bound, and the last for samples above every bound.
        self._counts = [0] * (len(bounds) + 1)
        self._sum_ms = 0
        # The largest sample since ``take_peak`` last read it.
        self._peak_ms = 0
        self._pending: list[int] = []

    def add(self, samples: Iterable[int]) -> None:
        """Take a batch of samples; cheap: they are counted later."""
        pending = self._pending
        pending.extend(samples)
        if len(pending) >= FOLD_AT:
            self.fold()

    def fold(self) -> None:
        """Count the pending samples into their buckets."""
        pending = self._pending
        if not pending:
            return
        bounds, counts = self._bounds, self._counts
        total = 0
        peak = self._peak_ms
        for value, n in Counter(pending).items():
            counts[bisect_left(bounds, value)] += n
            total += value * n
            if value > peak:
                peak = value
        self._sum_ms += total
        self._peak_ms = peak
        pending.clear()

    def buckets(self) -> list[int]:
        """Cumulative counts: one per bound (samples at or below it), then
        the count of all samples."""
        self.fold()
        out: list[int] = []
        running = 0
        for n in self._counts:
            running += n
            out.append(running)
        return out

    @property
    def count(self) -> int:
        self.fold()
        return sum(self._counts)

    @property
    def sum_ms(self) -> int:
        self.fold()
        return self._sum_ms

    def take_peak(self) -> int:
        """The largest sample since the last call (0: none), and start again."""
        self.fold()
        peak, self._peak_ms = self._peak_ms, 0
        return peak

    def at_or_below(self, bound_ms: float) -> int:
        """Samples at or below ``bound_ms``, which must be one of the bounds."""
        return self.buckets()[self._bounds.index(float(bound_ms))]
