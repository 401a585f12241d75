"""Schedule semantics: when a job's fires are, as integer UTC epoch milliseconds.

``compile_schedule`` validates a ``Once``, ``Cron`` or ``Interval`` once and
returns a small immutable ``CompiledSchedule`` the shard owner keeps per job.
Everything here is pure: no clock is read, time is always an argument.

A fire's *nominal* time is its identity (``scheduled_for``; the idempotency key
derives from it). Jitter only delays when a fire is dispatched
(``jittered``), never what it is called.

Cron expressions
----------------
Five fields ``minute hour day-of-month month day-of-week``, or six with a
**seconds field first** (``*/10 * * * * *`` fires every ten seconds), as in
Quartz and most schedulers; croniter's own default puts seconds last, so we
pass ``second_at_beginning=True``. Aliases (``@hourly``, ``@daily`` ...), ``L``,
``W`` and ``#`` work as croniter defines them; a year field and croniter's
hashed (``H``) and random (``R``) fields are rejected, because a schedule must
be the same in every process.

Time zones and DST
------------------
croniter enumerates *wall times* in the job's IANA zone as plain calendar
arithmetic (naive datetimes, no zone), and this module maps each wall time to
instants itself, under the schedule's explicit policy (croniter's own zone
handling hard-codes one behaviour: it fires both occurrences of a repeated
wall time):

* A wall time that exists once maps to its one instant.
* A wall time in a **gap** (spring forward, e.g. 02:30 on 2026-03-08 in
  America/New_York) does not exist. ``DstGap.FIRE_AT_TRANSITION`` fires at the
  transition instant, the first valid instant after the gap (03:00 EDT =
  07:00Z); every gap wall time of one gap collapses into that ONE fire, which is
  also the fire of the wall time at the end of the gap if that matches
  (``*/15``: 02:00..02:45 and 03:00 are one fire at 07:00Z). ``DstGap.SKIP``
  does not fire them; ``skipped_between`` reports each skipped wall time as a
  ``SkippedFire`` whose ``at_ms`` is that transition instant, so the owner
  can record a missed fire with reason ``dst_gap`` when it passes there.
* A wall time in a **fold** (fall back, 01:00..01:59 on 2026-11-01 in
  America/New_York) happens twice. ``DstFold.FIRST`` fires only the first
  occurrence (01:00 EDT = 05:00Z); ``DstFold.BOTH`` fires both (also 01:00 EST
  = 06:00Z).

Fires are strictly increasing and never repeat an instant.
"""

from __future__ import annotations

import functools
import heapq
from collections.abc import Generator
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadCronError, CroniterBadDateError, CroniterError, croniter

from wheel.engine.calendars import CalendarDays
from wheel.engine.cronwall import (
    RANDOM_OR_HASHED,
    borrow_croniter,
    offset_at,
    return_croniter,
    transition,
    wall_iso,
    wall_offsets,
)
from wheel.engine.spec import (
    Cron,
    DstFold,
    DstGap,
    Interval,
    IntervalMode,
    JobSpec,
    Once,
    Schedule,
)
from wheel.errors import InvalidArgument

__all__ = [
    "CompiledSchedule",
    "SkippedFire",
    "compile_schedule",
    "compile_spec",
    "with_calendars",
]

_MASK64 = (1 << 64) - 1
_EPOCH = datetime(1970, 1, 1)
# Instants (seconds) the cron arithmetic is asked about are clamped to this
# range: 1900-01-01 up to a year before datetime's end, where nothing fires.
_MIN_S = -2_208_988_800
_MAX_S = 253_402_300_799 - 366 * 86_400
# How far ahead a fold can hide: a wall time earlier than the one at `after`
# may still be due after it, in the second occurrence of a fold that starts
# within this long (real folds are at most two hours).
_FOLD_LOOKAHEAD_S = 3 * 3600
# A cron that produced no fire for this long of wall time has none left (for
# instance an expression that only matches inside DST gaps under SKIP). The
# longest real wait is a leap day: eight years around 2100.
_GIVE_UP_S = 30 * 366 * 86_400

_FIRE = 0
_SKIP = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class SkippedFire:
    """A cron wall time that did not exist (DST gap) under ``DstGap.SKIP``.

    ``at_ms`` is the transition instant (the first valid instant after the gap),
    where ``fire_at_transition`` would have fired; several wall times of one gap
    share it, and a real fire may be due at the same instant. ``wall_time`` is
    the nonexistent local time, ISO 8601 without offset.
    """

    at_ms: int
    wall_time: str


class CompiledSchedule:
    """A validated schedule: answers when fires are, given a time.

    Immutable in value and a few slots in size; the cron variant keeps a
    one-entry memo of its last ``next_fire`` answer, so ``jittered(f)`` followed
    by ``next_fire(f)`` costs one cron computation.
    """

    __slots__ = ("_jitter_ms", "_job_id")

    #: True for fixed_delay intervals: after the first fire, the next one is
    #: ``next_after_completion(completed_at_ms)``, not ``next_fire``.
    completion_driven: bool = False

    def __init__(self, *, jitter_ms: int, job_id: int) -> None:
        self._jitter_ms = jitter_ms
        self._job_id = job_id

    @property
    def jitter_ms(self) -> int:
        return self._jitter_ms

    def next_fire(self, after_ms: int) -> int | None:
        """The first nominal fire strictly after ``after_ms``; None when none is left."""
        raise NotImplementedError

    def next_after_completion(self, completed_at_ms: int) -> int | None:
        """fixed_delay: the fire after a run completed; None: not completion-driven."""
        return None

    def fires_between(self, after_ms: int, until_ms: int, limit: int) -> list[int]:
        """Nominal fires in ``(after_ms, until_ms]``, ascending, at most ``limit``."""
        out: list[int] = []
        t = after_ms
        while len(out) < limit:
            nxt = self.next_fire(t)
            if nxt is None or nxt > until_ms:
                break
            out.append(nxt)
            t = nxt
        return out

    def count_between(self, after_ms: int, until_ms: int, cap: int) -> int:
        """How many nominal fires are in ``(after_ms, until_ms]``, counting at most ``cap``."""
        return len(self.fires_between(after_ms, until_ms, cap))

    def skipped_between(
        self, after_ms: int, until_ms: int, limit: int = 10_000
    ) -> list[SkippedFire]:
        """Cron wall times skipped by ``DstGap.SKIP`` whose ``at_ms`` is in
        ``(after_ms, until_ms]``, ascending, at most ``limit``; empty otherwise."""
        return []

    def skips(self, fire_ms: int) -> bool:
        """Whether the fire falls on a day of a calendar the job skips: it is
        recorded missed (reason ``calendar``), not run."""
        return False

    def after_skip(self, fire_ms: int) -> int | None:
        """The fire the schedule moves on to after a skipped one."""
        return self.next_fire(fire_ms)

    def upcoming(self, first: int | None, count: int) -> list[int]:
        """``first`` and the fires after it, at most ``count``, those on a
        skipped calendar day left out (what a job's next fires show)."""
        out: list[int] = []
        at = first
        for _ in range(count + _MAX_SKIPPED_DAYS):
            if at is None or len(out) >= count:
                break
            if not self.skips(at):
                out.append(at)
            at = self.next_fire(at)
        return out

    def jittered(self, fire_ms: int) -> int:
        """When the fire at nominal ``fire_ms`` is due: ``fire_ms`` plus a jitter in
        ``[0, jitter_ms]`` derived from ``(job_id, fire_ms)`` only (the same in every
        process), strictly before the next nominal fire. Where the next fire is
        closer than ``jitter_ms`` the jitter is drawn from the room there is, so it
        stays spread instead of piling up just before the next fire."""
        if self._jitter_ms <= 0:
            return fire_ms
        bound = self._jitter_ms + 1
        nxt = self._next_for_jitter(fire_ms)
        if nxt is not None:
            bound = max(1, min(bound, nxt - fire_ms))
        h = _mix64(_mix64(self._job_id & _MASK64) ^ (fire_ms & _MASK64))
        return fire_ms + h % bound

    def _next_for_jitter(self, fire_ms: int) -> int | None:
        return self.next_fire(fire_ms)


def _mix64(x: int) -> int:
    """splitmix64's finaliser: a stable 64-bit hash (Python's hash() is salted)."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


# -- once ------------------------------------------------------------------------------


class _OnceSchedule(CompiledSchedule):
    __slots__ = ("_at_ms",)

    def __init__(self, at_ms: int, *, jitter_ms: int, job_id: int) -> None:
        super().__init__(jitter_ms=jitter_ms, job_id=job_id)
        self._at_ms = at_ms

    def next_fire(self, after_ms: int) -> int | None:
        return self._at_ms if self._at_ms > after_ms else None

    def __repr__(self) -> str:
        return f"CompiledSchedule(once at_ms={self._at_ms})"


# -- intervals -------------------------------------------------------------------------


class _FixedRateSchedule(CompiledSchedule):
    """Fires at ``start_at_ms + k * period_ms``, k >= 0: pure arithmetic, no drift."""

    __slots__ = ("_period_ms", "_start_ms")

    def __init__(self, start_ms: int, period_ms: int, *, jitter_ms: int, job_id: int) -> None:
        super().__init__(jitter_ms=jitter_ms, job_id=job_id)
        self._start_ms = start_ms
        self._period_ms = period_ms

    def next_fire(self, after_ms: int) -> int | None:
        if after_ms < self._start_ms:
            return self._start_ms
        k = (after_ms - self._start_ms) // self._period_ms + 1
        return self._start_ms + k * self._period_ms

    def fires_between(self, after_ms: int, until_ms: int, limit: int) -> list[int]:
        first = self.next_fire(after_ms)
        if first is None or first > until_ms or limit <= 0:
            return []
        stop = min(until_ms + 1, first + limit * self._period_ms)
        return list(range(first, stop, self._period_ms))

    def count_between(self, after_ms: int, until_ms: int, cap: int) -> int:
        first = self.next_fire(after_ms)
        if first is None or first > until_ms or cap <= 0:
            return 0
        return min(cap, (until_ms - first) // self._period_ms + 1)

    def _next_for_jitter(self, fire_ms: int) -> int | None:
        return fire_ms + self._period_ms

    def __repr__(self) -> str:
        return f"CompiledSchedule(fixed_rate start={self._start_ms} period={self._period_ms})"


class _FixedDelaySchedule(CompiledSchedule):
    """First fire at ``start_at_ms``; each later one ``period_ms`` after the previous
    run completed, so only the first is known in advance."""

    __slots__ = ("_period_ms", "_start_ms")
    completion_driven = True

    def __init__(self, start_ms: int, period_ms: int, *, jitter_ms: int, job_id: int) -> None:
        super().__init__(jitter_ms=jitter_ms, job_id=job_id)
        self._start_ms = start_ms
        self._period_ms = period_ms

    def next_fire(self, after_ms: int) -> int | None:
        return self._start_ms if self._start_ms > after_ms else None

    def next_after_completion(self, completed_at_ms: int) -> int | None:
        return completed_at_ms + self._period_ms

    def _next_for_jitter(self, fire_ms: int) -> int | None:
        # The next fire comes period_ms after a completion that is itself after
        # the jittered dispatch, so any jitter stays before it.
        return None

    def __repr__(self) -> str:
        return f"CompiledSchedule(fixed_delay start={self._start_ms} period={self._period_ms})"


# -- cron ------------------------------------------------------------------------------


class _CronSchedule(CompiledSchedule):
    __slots__ = ("_expr", "_fold_both", "_gap_skip", "_memo", "_zone")

    def __init__(
        self,
        expr: str,
        zone: ZoneInfo,
        gap: DstGap,
        fold: DstFold,
        *,
        jitter_ms: int,
        job_id: int,
    ) -> None:
        super().__init__(jitter_ms=jitter_ms, job_id=job_id)
        self._expr = expr
        self._zone = zone
        self._gap_skip = gap is DstGap.SKIP
        self._fold_both = fold is DstFold.BOTH
        self._memo: tuple[int, int | None] | None = None

    def __repr__(self) -> str:
        return (
            f"CompiledSchedule(cron {self._expr!r} in {self._zone.key}, "
            f"gap={'skip' if self._gap_skip else 'fire_at_transition'}, "
            f"fold={'both' if self._fold_both else 'first'})"
        )

    def _events(
        self, after_s: int, want_skips: bool = False
    ) -> Generator[tuple[int, int, int], None, None]:
        """``(instant_s, kind, wall_s)`` for every fire (kind _FIRE), and with
        ``want_skips`` every skipped gap wall time (kind _SKIP), with instant >
        after_s, ascending by instant.

        croniter walks wall times upwards; each maps to instants by the policy.
        The first-occurrence (or transition) instant of successive wall times
        never decreases, and a fold's second occurrence comes later than its
        first, so a small heap releases events in instant order: everything not
        above the latest first-occurrence instant is final.
        """
        zone = self._zone
        t = min(max(after_s, _MIN_S), _MAX_S)
        if after_s >= _MAX_S:
            return
        # Start low enough to see wall times earlier than wall(t) whose second
        # occurrence (a fold within the lookahead) is still after t.
        min_off = min(offset_at(zone, t), offset_at(zone, t + _FOLD_LOOKAHEAD_S))
        wall = t + min_off
        it = borrow_croniter(self._expr)
        heap: list[tuple[int, int, int]] = []
        last_fire = t
        progress_wall = wall
        gap_t = gap_start = gap_end = 0
        try:
            it.set_current(float(wall), force=True)
            while True:
                try:
                    w = int(it.get_next(float))
                except (CroniterBadDateError, OverflowError, ValueError):
                    break
                if w - progress_wall > _GIVE_UP_S:
                    break
                o0, o1 = wall_offsets(zone, w)
                if o0 == o1:
                    first = w - o0
                    heapq.heappush(heap, (first, _FIRE, w))
                elif o0 < o1:  # gap: w does not exist
                    # Wall times [T + o0, T + o1) are missing; one search per gap.
                    if not gap_start <= w < gap_end:
                        gap_t = transition(zone, w - o1, w - o0)
                        gap_start, gap_end = gap_t + o0, gap_t + o1
                    first = gap_t
                    if not self._gap_skip:
                        heapq.heappush(heap, (first, _FIRE, w))
                    elif want_skips:
                        heapq.heappush(heap, (first, _SKIP, w))
                    if not (self._gap_skip and want_skips):
                        # The rest of the gap adds nothing more: jump to its end.
                        it.set_current(float(gap_end - 1), force=True)
                else:  # fold: w happens twice
                    first = w - o0
                    heapq.heappush(heap, (first, _FIRE, w))
                    if self._fold_both:
                        heapq.heappush(heap, (w - o1, _FIRE, w))
                while heap and heap[0][0] <= first:
                    ev = heapq.heappop(heap)
                    if ev[0] <= t:
                        continue
                    if ev[1] == _FIRE:
                        if ev[0] <= last_fire:
                            continue
                        last_fire = ev[0]
                        progress_wall = w
                    yield ev
            while heap:
                ev = heapq.heappop(heap)
                if ev[0] <= t:
                    continue
                if ev[1] == _FIRE:
                    if ev[0] <= last_fire:
                        continue
                    last_fire = ev[0]
                yield ev
        finally:
            return_croniter(self._expr, it)

    def next_fire(self, after_ms: int) -> int | None:
        memo = self._memo
        if memo is not None and memo[0] == after_ms:
            return memo[1]
        result: int | None = None
        events = self._events(after_ms // 1000)
        try:
            for instant_s, kind, _ in events:
                if kind == _FIRE:
                    result = instant_s * 1000
                    break
        finally:
            events.close()
        self._memo = (after_ms, result)
        return result

    def fires_between(self, after_ms: int, until_ms: int, limit: int) -> list[int]:
        out: list[int] = []
        if limit <= 0 or until_ms <= after_ms:
            return out
        events = self._events(after_ms // 1000)
        try:
            for instant_s, kind, _ in events:
                at = instant_s * 1000
                if at > until_ms:
                    break
                if kind == _FIRE:
                    out.append(at)
                    if len(out) >= limit:
                        break
        finally:
            events.close()
        return out

    def skipped_between(
        self, after_ms: int, until_ms: int, limit: int = 10_000
    ) -> list[SkippedFire]:
        out: list[SkippedFire] = []
        if not self._gap_skip or limit <= 0 or until_ms <= after_ms:
            return out
        events = self._events(after_ms // 1000, want_skips=True)
        try:
            for instant_s, kind, wall_s in events:
                at = instant_s * 1000
                if at > until_ms:
                    break
                if kind == _SKIP:
                    out.append(SkippedFire(at_ms=at, wall_time=wall_iso(wall_s)))
                    if len(out) >= limit:
                        break
        finally:
            events.close()
        return out


# -- bounds ----------------------------------------------------------------------------


class _BoundedSchedule(CompiledSchedule):
    """A schedule cut to its active range: the fires of ``inner`` at or after
    ``from_ms`` and at or before ``until_ms`` (0: no bound), the same
    instants with the same jitter as unbounded. A job's ``max_fires`` cuts
    it too, as the last fire it leaves (``JobSpec.ends_at_ms``)."""

    __slots__ = ("_from_ms", "_inner", "_until_ms")

    def __init__(self, inner: CompiledSchedule, from_ms: int, until_ms: int) -> None:
        super().__init__(jitter_ms=inner.jitter_ms, job_id=inner._job_id)
        self._inner = inner
        self._from_ms = from_ms
        self._until_ms = until_ms

    def _after(self, after_ms: int) -> int:
        return max(after_ms, self._from_ms - 1)

    def _until(self, until_ms: int) -> int:
        return min(until_ms, self._until_ms) if self._until_ms else until_ms

    def _cut(self, fire: int | None) -> int | None:
        if fire is None or (self._until_ms and fire > self._until_ms):
            return None
        return fire

    def next_fire(self, after_ms: int) -> int | None:
        return self._cut(self._inner.next_fire(self._after(after_ms)))

    def next_after_completion(self, completed_at_ms: int) -> int | None:
        fire = self._inner.next_after_completion(completed_at_ms)
        return self._cut(None if fire is None else max(fire, self._from_ms))

    def fires_between(self, after_ms: int, until_ms: int, limit: int) -> list[int]:
        return self._inner.fires_between(self._after(after_ms), self._until(until_ms), limit)

    def count_between(self, after_ms: int, until_ms: int, cap: int) -> int:
        return self._inner.count_between(self._after(after_ms), self._until(until_ms), cap)

    def skipped_between(
        self, after_ms: int, until_ms: int, limit: int = 10_000
    ) -> list[SkippedFire]:
        return self._inner.skipped_between(self._after(after_ms), self._until(until_ms), limit)

    def jittered(self, fire_ms: int) -> int:
        # As unbounded: a bound never moves a fire that it keeps.
        return self._inner.jittered(fire_ms)

    def __repr__(self) -> str:
        return f"{self._inner!r}[{self._from_ms}, {self._until_ms or 'inf'}]"


class _BoundedDelaySchedule(_BoundedSchedule):
    """A bounded fixed_delay schedule (its next fire counts from a completion)."""

    __slots__ = ()
    completion_driven = True

    def next_fire(self, after_ms: int) -> int | None:
        # The first fire, at its start or at the start of the range.
        fire = self._inner.next_fire(after_ms)
        return self._cut(None if fire is None else max(fire, self._from_ms))


# -- compiling -------------------------------------------------------------------------


def _cron_expr(expr: Any) -> str:
    """Validate and normalise a cron expression; the result is what croniter parses."""
    if not isinstance(expr, str) or not expr.strip():
        raise InvalidArgument("spec.schedule.cron.expr", "must be a non-empty cron expression")
    return _valid_cron_expr(expr)


# Rebuilding an owner compiles every job's schedule; most share a handful of
# expressions, and parsing one costs a croniter construction and a search.
@functools.lru_cache(maxsize=4096)
def _valid_cron_expr(expr: str) -> str:
    field = "spec.schedule.cron.expr"
    parts = expr.split()
    norm = " ".join(parts)
    if not norm.startswith("@") and len(parts) not in (5, 6):
        raise InvalidArgument(
            field,
            f"{norm!r} has {len(parts)} fields; expected 5 (minute hour day-of-month month "
            "day-of-week) or 6 with seconds first (second minute hour day-of-month month "
            "day-of-week)",
        )
    for part in parts:
        for item in part.split(","):
            if RANDOM_OR_HASHED.match(item):
                raise InvalidArgument(
                    field,
                    f"{item!r}: hashed (H) and random (R) fields are not supported, a schedule "
                    "must be deterministic; use jitter_ms to spread fires",
                )
    try:
        it = croniter(norm, 0.0, ret_type=float, second_at_beginning=True)
    except CroniterBadCronError as e:
        raise InvalidArgument(field, f"{norm!r} is not a valid cron expression: {e}") from e
    except (CroniterError, ValueError, TypeError, KeyError, IndexError) as e:
        raise InvalidArgument(field, f"{norm!r} is not a valid cron expression: {e}") from e
    # An expression that matches no date at all (31 February) never fires.
    try:
        it.get_next(float, start_time=946_684_800.0)  # 2000-01-01
    except (CroniterBadDateError, OverflowError, ValueError) as e:
        raise InvalidArgument(field, f"{norm!r} never matches a date") from e
    return norm


def _zone(name: Any) -> ZoneInfo:
    field = "spec.schedule.cron.time_zone"
    if not isinstance(name, str) or not name or name == "localtime":
        raise InvalidArgument(field, f"{name!r} is not an IANA time zone name")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError) as e:
        raise InvalidArgument(field, f"unknown IANA time zone {name!r}") from e


def _int_field(field: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(field, f"must be an integer, got {type(value).__name__}")
    if value < low:
        raise InvalidArgument(field, f"{value} is below the minimum of {low}")
    return value


def compile_schedule(
    schedule: Schedule,
    *,
    jitter_ms: int = 0,
    job_id: int = 0,
    active_from_ms: int = 0,
    active_until_ms: int = 0,
) -> CompiledSchedule:
    """Validate a schedule and return its compiled form, cut to its active
    range ``[active_from_ms, active_until_ms]`` where one is given (0: no
    bound on that side).

    Raises ``InvalidArgument`` naming the field: ``spec.schedule.cron.expr``,
    ``spec.schedule.cron.time_zone``, ``spec.schedule.cron.dst_gap``,
    ``spec.schedule.cron.dst_fold``, ``spec.schedule.interval.period_ms``,
    ``spec.schedule.interval.start_at_ms``, ``spec.schedule.interval.mode``,
    ``spec.schedule.once.at_ms`` or ``spec.jitter_ms``. ``job_id`` seeds the
    per-fire jitter.
    """
    compiled = _compile(schedule, jitter_ms=jitter_ms, job_id=job_id)
    if not active_from_ms and not active_until_ms:
        return compiled
    if compiled.completion_driven:
        return _BoundedDelaySchedule(compiled, active_from_ms, active_until_ms)
    return _BoundedSchedule(compiled, active_from_ms, active_until_ms)


def compile_spec(spec: JobSpec, *, job_id: int = 0, jitter: bool = True) -> CompiledSchedule:
    """The compiled schedule of a job's spec, its bounds included
    (``jitter=False``: nominal fires only, as previews show them)."""
    return compile_schedule(
        spec.schedule,
        jitter_ms=spec.jitter_ms if jitter else 0,
        job_id=job_id,
        active_from_ms=spec.active_from_ms,
        active_until_ms=spec.ends_at_ms(),
    )


def _compile(schedule: Schedule, *, jitter_ms: int, job_id: int) -> CompiledSchedule:
    jitter = _int_field("spec.jitter_ms", jitter_ms, 0)
    if isinstance(schedule, Once):
        at = _int_field("spec.schedule.once.at_ms", schedule.at_ms, 0)
        return _OnceSchedule(at, jitter_ms=jitter, job_id=job_id)
    if isinstance(schedule, Interval):
        period = _int_field("spec.schedule.interval.period_ms", schedule.period_ms, 1)
        start = _int_field("spec.schedule.interval.start_at_ms", schedule.start_at_ms, 0)
        try:
            mode = IntervalMode(schedule.mode)
        except ValueError as e:
            raise InvalidArgument(
                "spec.schedule.interval.mode", f"{schedule.mode!r} is not fixed_rate or fixed_delay"
            ) from e
        if mode is IntervalMode.FIXED_DELAY:
            return _FixedDelaySchedule(start, period, jitter_ms=jitter, job_id=job_id)
        return _FixedRateSchedule(start, period, jitter_ms=jitter, job_id=job_id)
    if isinstance(schedule, Cron):
        expr = _cron_expr(schedule.expr)
        zone = _zone(schedule.time_zone)
        try:
            gap = DstGap(schedule.dst_gap)
        except ValueError as e:
            raise InvalidArgument(
                "spec.schedule.cron.dst_gap",
                f"{schedule.dst_gap!r} is not fire_at_transition or skip",
            ) from e
        try:
            fold = DstFold(schedule.dst_fold)
        except ValueError as e:
            raise InvalidArgument(
                "spec.schedule.cron.dst_fold", f"{schedule.dst_fold!r} is not first or both"
            ) from e
        return _CronSchedule(expr, zone, gap, fold, jitter_ms=jitter, job_id=job_id)
    raise InvalidArgument("spec.schedule", "one of once, cron or interval is required")


# -- calendars -------------------------------------------------------------------------

_UNIX_DAY = 719_163  # date(1970, 1, 1).toordinal()
_DAY_MS = 86_400_000
# A schedule whose fires all fall on skipped days for this many days in a row
# has none left (a calendar of every weekday, or a range of a decade).
_MAX_SKIPPED_DAYS = 3_700


class _CalendarSchedule(CompiledSchedule):
    """A schedule that does not fire on the days of its calendars (local
    dates in ``zone``).

    ``next_fire`` jumps over skipped days, but answers the *first* fire of
    each skipped day (the day's marker): the owner arms it like any fire,
    finds it ``skips``, records it missed (reason ``calendar``) and moves on
    past the day (``next_fire`` of a skipped fire that is not its day's
    first jumps to the next day). So a skipped day costs one timer and one
    missed record however often the job fires: a job firing every second
    through a skipped weekend records two, not 172,800. Whatever fire of a
    skipped day reaches the owner (a first fire computed without the
    calendar, a re-arm at noon) is recorded the same way.
    """

    __slots__ = ("_days", "_inner", "_zone")

    def __init__(self, inner: CompiledSchedule, days: CalendarDays, zone: ZoneInfo | None) -> None:
        super().__init__(jitter_ms=inner.jitter_ms, job_id=inner._job_id)
        self._inner = inner
        self._days = days
        self._zone = zone

    def __repr__(self) -> str:
        return f"{self._inner!r} skipping {self._days!r}"

    def day_of(self, at_ms: int) -> int:
        """The local date (an ordinal) of an instant."""
        if self._zone is None:
            return at_ms // _DAY_MS + _UNIX_DAY
        return datetime.fromtimestamp(at_ms // 1000, tz=self._zone).toordinal()

    def day_start(self, day: int) -> int:
        """The first instant (ms) of a local date: midnight, or where a DST
        gap at midnight ends (fold=0 reads a gap's wall time with the offset
        before it, which is that instant; and a repeated midnight's first
        occurrence)."""
        if self._zone is None:
            return (day - _UNIX_DAY) * _DAY_MS
        d = datetime.fromordinal(day).replace(tzinfo=self._zone)
        return int(d.timestamp()) * 1000

    def skips(self, fire_ms: int) -> bool:
        return self._days.holds(self.day_of(fire_ms))

    def next_fire(self, after_ms: int) -> int | None:
        inner = self._inner
        f = inner.next_fire(after_ms)
        for _ in range(_MAX_SKIPPED_DAYS):
            if f is None:
                return None
            day = self.day_of(f)
            if not self._days.holds(day):
                return f
            if inner.next_fire(self.day_start(day) - 1) == f:
                return f  # the skipped day's marker
            f = inner.next_fire(max(f, self.day_start(day + 1) - 1))
        return None

    def next_after_completion(self, completed_at_ms: int) -> int | None:
        return self._inner.next_after_completion(completed_at_ms)

    def after_skip(self, fire_ms: int) -> int | None:
        """The next fire after a skipped one; a fixed_delay schedule, which
        no completion moves on, counts its period from the end of the
        skipped day."""
        if not self.completion_driven:
            return self.next_fire(fire_ms)
        return self._inner.next_after_completion(self.day_start(self.day_of(fire_ms) + 1))

    def skipped_between(
        self, after_ms: int, until_ms: int, limit: int = 10_000
    ) -> list[SkippedFire]:
        return self._inner.skipped_between(after_ms, until_ms, limit)


class _CalendarDelaySchedule(_CalendarSchedule):
    """A fixed_delay schedule skipping its calendars' days."""

    __slots__ = ()
    completion_driven = True


def with_calendars(
    compiled: CompiledSchedule, schedule: Schedule, days: CalendarDays | None
) -> CompiledSchedule:
    """``compiled`` skipping the days of ``days`` (local dates in the cron's
    time zone; UTC for the others), or ``compiled`` itself when no day is
    skipped."""
    if days is None or days.empty():
        return compiled
    zone = _zone(schedule.time_zone) if isinstance(schedule, Cron) else None
    if zone is not None and zone.key == "UTC":
        zone = None
    if compiled.completion_driven:
        return _CalendarDelaySchedule(compiled, days, zone)
    return _CalendarSchedule(compiled, days, zone)
