"""Retry and catch-up policy: pure decisions the shard owner asks for.

Nothing here reads a clock or draws real randomness. Time is an argument, and
every "random" choice (retry jitter) is a deterministic hash of the fire it
belongs to, so a replayed WAL or a second owner reaches the same decision.

Catch-up rules (``plan_catch_up``), for the fires of one job that came due
while nobody dispatched them, all at or before ``now_ms``:

1. Every input fire appears exactly once: either in ``run`` or in ``missed``
   with a reason. Nothing is dropped silently.
2. ``skip``: nothing runs; every fire is missed as ``SKIPPED`` (the window is
   irrelevant when nothing would run anyway).
3. Otherwise the window goes first: a fire with ``now_ms - fire > window_ms``
   is missed as ``OUTSIDE_WINDOW`` (``window_ms`` None means no limit).
4. ``run_latest_only``: of the fires inside the window only the latest runs;
   the others are missed as ``COLLAPSED``.
5. ``run_all``: every fire inside the window runs, unless there are more than
   ``max_count`` of them; then only the latest runs, the others are missed as
   ``OVER_CAP`` and the plan carries an alert (seed R5: run_all is bounded).

For backlogs too large to hold (a one-second job down for a day is 86,400
fires), ``CatchUpStream`` applies the same rules in one pass over fires fed in
chunks, holding at most ``max_count + 1`` of them.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import pairwise

from wheel.engine.model import MissedReason
from wheel.engine.spec import CatchUp, CatchUpMode, Retry

__all__ = [
    "CatchUpPlan",
    "CatchUpStream",
    "backoff_ms",
    "plan_catch_up",
    "retry_delay_ms",
    "should_retry",
    "stable_hash64",
]

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _mix64(z: int) -> int:
    # splitmix64's finalizer (Steele, Lea, Flood 2014): a bijection on 64 bits
    # whose every output bit depends on every input bit.
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def stable_hash64(*values: int) -> int:
    """A 64-bit hash of the integers, identical in every process and version.

    Python's ``hash()`` is salted per process for strings and not a contract
    for ints; jitter must be reproducible across owners and restarts. Each
    value is taken modulo 2**64 and chained through splitmix64, so order and
    count of the values both matter.
    """
    h = _GOLDEN
    for v in values:
        h = _mix64(((h ^ (v & _MASK64)) + _GOLDEN) & _MASK64)
    return _mix64(h ^ len(values))


# -- retries -------------------------------------------------------------------------


def backoff_ms(retry: Retry, *, failed_attempt: int) -> int:
    """The backoff after attempt ``failed_attempt`` failed (0-based here: 0 is
    the first attempt, the one users call 1), before jitter:
    ``min(max_backoff, initial * multiplier**failed_attempt)``. ``max_backoff``
    caps the backoff, not the jittered delay.

    Non-decreasing in ``failed_attempt`` and safe for any attempt number: the
    exponent is never evaluated past the point where the cap is reached.
    """
    n = max(0, failed_attempt)
    base = max(0, retry.initial_backoff_ms)
    cap = max(0, retry.max_backoff_ms)
    mult = retry.multiplier
    if base == 0 or base >= cap or not mult > 1.0:
        return min(base, cap)
    # initial * mult**n >= cap  <=>  n >= log_mult(cap / initial).
    if n >= math.log(cap / base) / math.log(mult):
        return cap
    return min(cap, int(base * mult**n))


def retry_delay_ms(retry: Retry, *, failed_attempt: int, job_id: int, scheduled_for: int) -> int:
    """Delay before retrying a fire whose attempt ``failed_attempt`` failed.

    The backoff plus up to a quarter of it: ``backoff * (1 + u/4)``, with
    ``u`` in ``[0, 1)`` drawn from a hash of the fire and the attempt. Never
    less than the backoff (``initial_backoff 1s`` retries no sooner than a
    second later), so a herd of retries spreads over a quarter of the
    backoff, and a replay computes the same delay.
    """
    backoff = backoff_ms(retry, failed_attempt=failed_attempt)
    # The modulo bias is (backoff / 4) / 2**64: invisible for millisecond delays.
    return backoff + stable_hash64(job_id, scheduled_for, failed_attempt) % (backoff // 4 + 1)


def should_retry(retry: Retry, *, failed_attempt: int) -> bool:
    """Whether another attempt follows a failed ``failed_attempt`` (0-based);
    False means dead-letter."""
    return failed_attempt + 1 < retry.max_attempts


# -- catch-up -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class CatchUpPlan:
    """What to do with a job's overdue fires: which run now, which are missed."""

    # Nominal fire times to run now, ascending.
    run: list[int]
    # Every overdue fire not run, with its reason, ascending.
    missed: list[tuple[int, MissedReason]]
    # Set when run_all collapsed a backlog larger than max_count.
    alert: str | None = None


def _over_cap_alert(catch_up: CatchUp, in_window: int) -> str:
    return (
        f"run_all catch-up: {in_window} overdue fires exceed max_count={catch_up.max_count}; "
        f"ran the latest only and recorded {in_window - 1} as missed ({MissedReason.OVER_CAP})"
    )


def _check_ascending(fires: Sequence[int]) -> None:
    for a, b in pairwise(fires):
        if b <= a:
            raise ValueError(f"overdue fires must be strictly ascending, got {a} then {b}")


def plan_catch_up(catch_up: CatchUp, overdue: Sequence[int], now_ms: int) -> CatchUpPlan:
    """Decide which of a job's overdue fires (strictly ascending, all due at or
    before ``now_ms``) run now and which are missed, by the rules in the module
    docstring. Raises ``ValueError`` if the fires are not strictly ascending."""
    _check_ascending(overdue)
    if not overdue:
        return CatchUpPlan(run=[], missed=[])
    if catch_up.mode is CatchUpMode.SKIP:
        return CatchUpPlan(run=[], missed=[(f, MissedReason.SKIPPED) for f in overdue])

    # Fires strictly before now - window are outside it; being ascending they form a prefix.
    start = 0 if catch_up.window_ms is None else bisect_left(overdue, now_ms - catch_up.window_ms)
    missed = [(f, MissedReason.OUTSIDE_WINDOW) for f in overdue[:start]]
    in_window = len(overdue) - start
    if in_window == 0:
        return CatchUpPlan(run=[], missed=missed)

    if catch_up.mode is CatchUpMode.RUN_ALL and in_window <= max(1, catch_up.max_count):
        return CatchUpPlan(run=list(overdue[start:]), missed=missed)

    alert = None
    reason = MissedReason.COLLAPSED
    if catch_up.mode is CatchUpMode.RUN_ALL:
        reason = MissedReason.OVER_CAP
        alert = _over_cap_alert(catch_up, in_window)
    missed.extend((f, reason) for f in overdue[start:-1])
    return CatchUpPlan(run=[overdue[-1]], missed=missed, alert=alert)


class CatchUpStream:
    """``plan_catch_up`` for backlogs too large to materialize, in one pass.

    Feed the job's overdue fires in ascending chunks (any chunking); each
    ``feed`` returns the fires already known to be missed, and ``finish``
    returns the rest: the fires to run, the last missed ones and the alert.
    The concatenation of every returned plan equals ``plan_catch_up`` over all
    the fires. Memory is bounded by ``max_count + 1`` fires (run_all must see
    one past the cap before it knows whether to collapse); the other modes
    hold one.
    """

    __slots__ = ("_catch_up", "_held", "_in_window", "_last", "_threshold")

    def __init__(self, catch_up: CatchUp, now_ms: int) -> None:
        self._catch_up = catch_up
        self._threshold = None if catch_up.window_ms is None else now_ms - catch_up.window_ms
        self._held: list[int] = []  # in-window fires whose fate is not known yet
        self._in_window = 0
        self._last: int | None = None

    def feed(self, fires: Iterable[int]) -> CatchUpPlan:
        """Classify the next chunk; returns only the fires decided so far (all missed)."""
        missed: list[tuple[int, MissedReason]] = []
        mode = self._catch_up.mode
        cap = max(1, self._catch_up.max_count)
        held = self._held
        for f in fires:
            if self._last is not None and f <= self._last:
                raise ValueError(
                    f"overdue fires must be strictly ascending, got {self._last} then {f}"
                )
            self._last = f
            if mode is CatchUpMode.SKIP:
                missed.append((f, MissedReason.SKIPPED))
                continue
            if self._threshold is not None and f < self._threshold:
                missed.append((f, MissedReason.OUTSIDE_WINDOW))
                continue
            self._in_window += 1
            if mode is CatchUpMode.RUN_ALL and self._in_window <= cap:
                held.append(f)
                continue
            # From here on only the latest in-window fire can run: release the rest.
            reason = (
                MissedReason.OVER_CAP if mode is CatchUpMode.RUN_ALL else MissedReason.COLLAPSED
            )
            missed.extend((h, reason) for h in held)
            held.clear()
            held.append(f)
        return CatchUpPlan(run=[], missed=missed)

    def finish(self) -> CatchUpPlan:
        """The fires to run now (ascending), and the alert if run_all collapsed."""
        run = list(self._held)
        self._held.clear()
        c = self._catch_up
        alert = None
        if c.mode is CatchUpMode.RUN_ALL and self._in_window > max(1, c.max_count):
            alert = _over_cap_alert(c, self._in_window)
        return CatchUpPlan(run=run, missed=[], alert=alert)
