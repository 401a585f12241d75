"""A node's dispatch lag minute by minute over the last hour (``LagRing``).

The lag histogram (``BatchedHistogram``) only grows. Every few seconds the
node hands the ring its cumulative bucket counts and the largest sample since
the last look; the ring keeps the difference per wall-clock minute, sixty
minutes of it, so an hour of lag costs sixty rows of bucket counts whatever
the dispatch rate. A minute's p50 and p99 are read off its buckets: the
bound of the bucket the rank falls in (never above the minute's max), which
is as exact as the histogram Prometheus scrapes.

Pure: time is an argument.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

MINUTE_MS = 60_000
MINUTES_KEPT = 60


@dataclass(frozen=True, slots=True, kw_only=True)
class LagMinute:
    """One minute of dispatch lag: runs handed out and their lag (ms)."""

    minute_ms: int
    count: int
    p50_ms: float
    p99_ms: float
    max_ms: float


class _Minute:
    __slots__ = ("counts", "max_ms", "minute_ms")

    def __init__(self, minute_ms: int, width: int) -> None:
        self.minute_ms = minute_ms
        self.counts = [0] * width
        self.max_ms = 0


class LagRing:
    """Per-minute lag summaries of the last ``MINUTES_KEPT`` minutes."""

    def __init__(self, bounds_ms: Sequence[float]) -> None:
        self.bounds_ms = tuple(bounds_ms)
        self._minutes: deque[_Minute] = deque(maxlen=MINUTES_KEPT)
        # The cumulative counts seen last (one per bound, then the total).
        self._seen: list[int] | None = None

    def observe(self, now_ms: int, cumulative: Sequence[int], peak_ms: int) -> None:
        """Count what the histogram gained since the last call into the
        minute of ``now_ms``; ``peak_ms``: the largest sample meanwhile."""
        width = len(self.bounds_ms) + 1
        if len(cumulative) != width:
            raise ValueError(f"{len(cumulative)} counts for {width} buckets")
        seen, self._seen = self._seen, list(cumulative)
        minute = self._minute(now_ms - now_ms % MINUTE_MS)
        if seen is None:
            return  # the first look: what came before has no minute
        previous_below = previous_seen = 0
        for i, total in enumerate(cumulative):
            # Per-bucket gains from the cumulative counts.
            gained = (total - previous_below) - (seen[i] - previous_seen)
            previous_below, previous_seen = total, seen[i]
            minute.counts[i] += max(0, gained)
        if sum(minute.counts):
            minute.max_ms = max(minute.max_ms, peak_ms)

    def _minute(self, minute_ms: int) -> _Minute:
        minutes = self._minutes
        if minutes and minutes[-1].minute_ms >= minute_ms:
            return minutes[-1]  # this minute, or a wall clock stepped back
        minutes.append(_Minute(minute_ms, len(self.bounds_ms) + 1))
        return minutes[-1]

    def history(self, now_ms: int) -> list[LagMinute]:
        """The minutes of the last hour up to ``now_ms``, oldest first,
        quiet ones included (count 0)."""
        last = now_ms - now_ms % MINUTE_MS
        first = last - (MINUTES_KEPT - 1) * MINUTE_MS
        kept = {m.minute_ms: m for m in self._minutes if first <= m.minute_ms <= last}
        out = []
        for start in range(first, last + 1, MINUTE_MS):
            m = kept.get(start)
            if m is None:
                out.append(LagMinute(minute_ms=start, count=0, p50_ms=0, p99_ms=0, max_ms=0))
                continue
            out.append(
                LagMinute(
                    minute_ms=start,
                    count=sum(m.counts),
                    p50_ms=self._quantile(m, 0.5),
                    p99_ms=self._quantile(m, 0.99),
                    max_ms=float(m.max_ms),
                )
            )
        return out

    def _quantile(self, m: _Minute, q: float) -> float:
        total = sum(m.counts)
        if not total:
            return 0.0
        rank = max(1, math.ceil(q * total))
        running = 0
        for i, n in enumerate(m.counts):
            running += n
            if running >= rank:
                bound = self.bounds_ms[i] if i < len(self.bounds_ms) else math.inf
                return float(min(bound, m.max_ms))
        return float(m.max_ms)
