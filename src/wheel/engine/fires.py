"""When a job's schedule fires, computed from its spec or its stored record
alone, without an owner: a submitted job's first fire (``first_fire``), the
last fire its ``max_fires`` leaves it (``with_last_fire``), the upcoming
fires a read shows (``next_fires_of``) and a schedule's preview
(``preview_fires``, ``preview``). The driver's job API and the shell's
reads both use them.
"""

from __future__ import annotations

import functools
from dataclasses import replace

from wheel.engine.calendars import CalendarDays
from wheel.engine.model import JobState
from wheel.engine.records import JobRecord
from wheel.engine.schedule import compile_schedule, compile_spec, with_calendars
from wheel.engine.spec import Cron, Interval, IntervalMode, JobSpec

__all__ = [
    "bounds",
    "first_fire",
    "next_fires_of",
    "preview",
    "preview_fires",
    "with_last_fire",
]


def first_fire(job_id: int, spec: JobSpec, now_ms: int) -> int | None:
    """The first fire a job submitted at ``now_ms`` owes (the first one at or
    after it: fires before the submit are not owed). Validates the schedule
    (cron syntax, time zone) on the way. A bounded schedule's first fire is
    its first one at or after ``active_from_ms`` too, and none past
    ``active_until_ms``."""
    if spec.active_from_ms or spec.active_until_ms:
        return compile_spec(spec, job_id=job_id).next_fire(now_ms - 1)
    s = spec.schedule
    if isinstance(s, Cron):
        # The nominal fire depends on the schedule and the time alone: the
        # jobs of a bulk submit share a few crons and one instant.
        return _first_cron_fire(s, now_ms)
    if isinstance(s, Interval) and s.mode is IntervalMode.FIXED_RATE and s.period_ms > 0:
        # Arithmetic (as _FixedRateSchedule.next_fire), without compiling.
        if now_ms - 1 < s.start_at_ms:
            return s.start_at_ms
        return s.start_at_ms + ((now_ms - 1 - s.start_at_ms) // s.period_ms + 1) * s.period_ms
    compiled = compile_schedule(s, jitter_ms=spec.jitter_ms, job_id=job_id)
    return compiled.next_fire(now_ms - 1)


def with_last_fire(spec: JobSpec, owed_from_ms: int) -> JobSpec:
    """``spec`` with the last fire its ``max_fires`` leaves it
    (``JobSpec.last_fire_ms``): its ``max_fires``-th fire at or after
    ``owed_from_ms`` (the job's submit: fires before it are not owed) within
    its active range (the range's last where it ends first); 0 where there
    is no ``max_fires``. Every fire of the schedule in between counts, run or
    recorded missed, so the job has exactly ``max_fires`` fire records. A
    fixed-rate interval starting at or after ``owed_from_ms`` needs none:
    its start and period say its last fire, and its jobs share a profile
    (``JobSpec.ends_at_ms``)."""
    last = 0
    s = spec.schedule
    grid = (
        isinstance(s, Interval)
        and s.mode is IntervalMode.FIXED_RATE
        and s.start_at_ms >= owed_from_ms
    )
    if spec.max_fires and not grid:
        compiled = compile_schedule(
            spec.schedule,
            active_from_ms=spec.active_from_ms,
            active_until_ms=spec.active_until_ms,
        )
        fires = compiled.fires_between(owed_from_ms - 1, _NEVER_MS, spec.max_fires)
        # Fewer where the range ends first: its last (none: before any).
        last = fires[-1] if fires else max(1, owed_from_ms - 1)
    return spec if spec.last_fire_ms == last else replace(spec, last_fire_ms=last)


# Far enough ahead that no schedule's fire is after it.
_NEVER_MS = 2**53


@functools.lru_cache(maxsize=1024)
def _first_cron_fire(schedule: Cron, now_ms: int) -> int | None:
    return compile_schedule(schedule).next_fire(now_ms - 1)


def next_fires_of(record: JobRecord, count: int, days: CalendarDays | None = None) -> list[int]:
    """The next ``count`` fires of a job as its schedule computes them from
    the store's ``next_run_at`` (the owner's memory is elsewhere), none on
    ``days`` (those of the calendars it skips)."""
    fire = record.next_run_at
    if fire is None or record.state is not JobState.ACTIVE:
        return []
    compiled = compile_spec(record.spec, job_id=record.job_id, jitter=False)
    return with_calendars(compiled, record.spec.schedule, days).upcoming(fire, count)


def preview_fires(spec: JobSpec, after_ms: int, count: int) -> list[int]:
    """The next ``count`` nominal fires of ``spec``'s schedule strictly after
    ``after_ms``, as the owner computes them (its time zone, DST gap and fold
    policies): what PreviewSchedule shows."""
    return preview(spec, after_ms, count)[0]


def preview(
    spec: JobSpec, after_ms: int, count: int, days: CalendarDays | None = None
) -> tuple[list[int], list[int]]:
    """``preview_fires`` skipping ``days`` (the job's calendars' days), and
    the first fire of each skipped day on the way (recorded missed, reason
    calendar, by the owner); a bounded schedule's fires end at its bounds."""
    compiled = with_calendars(compile_spec(spec, jitter=False), spec.schedule, days)
    if spec.max_fires:
        count = min(count, spec.max_fires)
    out: list[int] = []
    skipped: list[int] = []
    at = after_ms
    while len(out) < count and len(skipped) < 10 * count:
        nxt = compiled.next_fire(at)
        if nxt is None:
            break
        (skipped if compiled.skips(nxt) else out).append(nxt)
        at = nxt
    return out, skipped


def bounds(spec: JobSpec) -> tuple[int, int, int]:
    """What bounds a schedule's fires: its active range and ``max_fires``."""
    return (spec.active_from_ms, spec.active_until_ms, spec.max_fires)
