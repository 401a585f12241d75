"""Calendar changes reach the jobs that skip them.

The owner holds each calendar once (``JobBook.calendars``); a job's compiled
schedule reads the days when it is compiled (a wake, a load). A change to a
calendar therefore finds the jobs whose profile names it -- a scan of the
held shards' profile column, no per-job index kept for a rare event -- wakes
them, compiles them again and re-arms each whose next fire moved
(``JobBook.rearm_for_calendar``). They go back to rest once settled.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from wheel.engine.calendars import Calendar
from wheel.engine.owner._jobs import JobBook
from wheel.engine.owner._values import Actions

__all__ = ["put_calendar", "put_calendars"]


def put_calendar(
    book: JobBook,
    tenant: str,
    name: str,
    calendar: Calendar | None,
    now_ms: int,
    acts: Actions,
) -> int:
    """A calendar as it is now (None: deleted); how many jobs were re-armed."""
    if not book.calendars.put(tenant, name, calendar):
        return 0
    return _rearm(book, {(tenant, name)}, now_ms, acts)


def put_calendars(
    book: JobBook, calendars: Mapping[tuple[str, str], Calendar], now_ms: int, acts: Actions
) -> int:
    """Every calendar as the store has them now; how many jobs were re-armed."""
    changed = book.calendars.replace_all(calendars)
    if not changed:
        return 0
    return _rearm(book, set(changed), now_ms, acts)


def _rearm(book: JobBook, changed: Collection[tuple[str, str]], now_ms: int, acts: Actions) -> int:
    profiles = [
        i
        for i, p in enumerate(book.profiles.items)
        if any((p.template.tenant, n) in changed for n in p.template.skip_calendars)
    ]
    if not profiles:
        return 0
    moved = 0
    for held in list(book.shard_map.values()):
        for job_id in held.table.ids_of_profiles(profiles):
            job = book.job(job_id)
            if job is not None and book.rearm_for_calendar(job, now_ms, acts):
                moved += 1
    return moved
