"""Calendars: named sets of days a job does not fire on.

A calendar belongs to a tenant and holds explicit dates, inclusive ranges of
dates and weekdays. A job names the calendars it skips
(``JobSpec.skip_calendars``); a fire whose *local date* in the job's time
zone (the cron's ``time_zone``; UTC for intervals and one-shots) is a day of
one of them is not run but recorded missed with reason ``calendar``
(``wheel.engine.schedule.with_calendars`` compiles that into the job's
schedule).

Days are proleptic Gregorian ordinals (``date.toordinal()``), so a lookup is
a set membership, a bisect over the ranges and a weekday test; no clock is
read here.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date
from typing import Any

from wheel.errors import InvalidArgument, LimitExceeded

__all__ = [
    "WEEKDAYS",
    "Calendar",
    "CalendarBook",
    "CalendarDays",
    "parse_calendar",
]

# Weekday names as the API spells them, Monday first (date.weekday() order).
WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")

_FULL_NAMES = dict(
    zip(
        ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"),
        WEEKDAYS,
        strict=True,
    )
)

MAX_DATES = 10_000
MAX_RANGES = 1_000


@dataclass(frozen=True, slots=True, kw_only=True)
class Calendar:
    """A calendar's days as its owner wrote them, normalised: dates sorted
    and unique, ranges sorted, weekdays in week order."""

    dates: tuple[str, ...] = ()
    ranges: tuple[tuple[str, str], ...] = ()
    weekdays: tuple[str, ...] = ()

    def to_json(self) -> str:
        return json.dumps(
            {
                "dates": list(self.dates),
                "ranges": [{"from": a, "to": b} for a, b in self.ranges],
                "weekdays": list(self.weekdays),
            },
            sort_keys=True,
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str) -> Calendar:
        d: dict[str, Any] = json.loads(text)
        return cls(
            dates=tuple(d.get("dates", ())),
            ranges=tuple((r["from"], r["to"]) for r in d.get("ranges", ())),
            weekdays=tuple(d.get("weekdays", ())),
        )

    def days(self) -> CalendarDays:
        return CalendarDays.of([self])


class CalendarDays:
    """The days of one or more calendars, for lookups by day ordinal."""

    __slots__ = ("_dates", "_range_ends", "_range_starts", "_weekdays")

    def __init__(
        self,
        dates: Iterable[int] = (),
        ranges: Iterable[tuple[int, int]] = (),
        weekdays: Iterable[int] = (),
    ) -> None:
        self._dates = frozenset(dates)
        merged = _merge(sorted(ranges))
        self._range_starts = [a for a, _ in merged]
        self._range_ends = [b for _, b in merged]
        self._weekdays = frozenset(weekdays)

    @classmethod
    def of(cls, calendars: Iterable[Calendar]) -> CalendarDays:
        dates: list[int] = []
        ranges: list[tuple[int, int]] = []
        weekdays: list[int] = []
        for c in calendars:
            dates.extend(date.fromisoformat(d).toordinal() for d in c.dates)
            ranges.extend(
                (date.fromisoformat(a).toordinal(), date.fromisoformat(b).toordinal())
                for a, b in c.ranges
            )
            weekdays.extend(WEEKDAYS.index(w) for w in c.weekdays)
        return cls(dates, ranges, weekdays)

    def holds(self, day: int) -> bool:
        """Whether the day (a ``date.toordinal()``) is one of the calendar's."""
        if day in self._dates or (day - 1) % 7 in self._weekdays:
            return True
        i = bisect.bisect_right(self._range_starts, day) - 1
        return i >= 0 and day <= self._range_ends[i]

    def empty(self) -> bool:
        return not (self._dates or self._range_starts or self._weekdays)

    def every_day(self) -> bool:
        """Whether no day is left to fire on (all seven weekdays)."""
        return len(self._weekdays) == 7

    def __repr__(self) -> str:
        return (
            f"CalendarDays(dates={len(self._dates)}, ranges={len(self._range_starts)}, "
            f"weekdays={sorted(self._weekdays)})"
        )


class CalendarBook:
    """The calendars an owner knows, by tenant and name, each held once, and
    the days of each set of names its jobs skip, made once per set and
    shared by every job of it."""

    __slots__ = ("_calendars", "_unions")

    def __init__(self) -> None:
        self._calendars: dict[tuple[str, str], Calendar] = {}
        self._unions: dict[tuple[str, tuple[str, ...]], CalendarDays | None] = {}

    def __len__(self) -> int:
        return len(self._calendars)

    def get(self, tenant: str, name: str) -> Calendar | None:
        return self._calendars.get((tenant, name))

    def put(self, tenant: str, name: str, calendar: Calendar | None) -> bool:
        """Take a calendar as it is now (None: deleted); whether that changed
        what the book held."""
        key = (tenant, name)
        if self._calendars.get(key) == calendar:
            return False
        if calendar is None:
            del self._calendars[key]
        else:
            self._calendars[key] = calendar
        self._unions = {
            k: v for k, v in self._unions.items() if not (k[0] == tenant and name in k[1])
        }
        return True

    def replace_all(self, calendars: Mapping[tuple[str, str], Calendar]) -> list[tuple[str, str]]:
        """Take every calendar as the store has them now; the ones that
        changed (added, changed or gone)."""
        changed = [k for k, c in calendars.items() if self._calendars.get(k) != c]
        changed += [k for k in self._calendars if k not in calendars]
        for tenant, name in changed:
            self.put(tenant, name, calendars.get((tenant, name)))
        return changed

    def days_for(self, tenant: str, names: tuple[str, ...]) -> CalendarDays | None:
        """The days a job of ``tenant`` skipping ``names`` does not fire on
        (None: none; a name the book does not know skips no day)."""
        key = (tenant, names)
        if key in self._unions:
            return self._unions[key]
        held = [c for c in (self._calendars.get((tenant, n)) for n in names) if c is not None]
        days = CalendarDays.of(held) if held else None
        self._unions[key] = days
        return days


def _merge(ranges: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in ranges:
        if out and a <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _date(field: str, text: str) -> date:
    if len(text) != 10:
        raise InvalidArgument(field, f"{text!r} is not a date as YYYY-MM-DD")
    try:
        return date.fromisoformat(text)
    except ValueError as e:
        raise InvalidArgument(field, f"{text!r} is not a date as YYYY-MM-DD") from e


def parse_calendar(
    dates: Sequence[str],
    ranges: Sequence[tuple[str, str]],
    weekdays: Sequence[str],
    *,
    prefix: str = "calendar",
) -> Calendar:
    """Validate a calendar's days; ``InvalidArgument`` names the field
    (``calendar.dates[2]``, ``calendar.ranges[0].to``, ``calendar.weekdays[1]``)."""
    if len(dates) > MAX_DATES:
        raise LimitExceeded(f"{prefix}.dates", f"{len(dates)} is over the limit of {MAX_DATES}")
    if len(ranges) > MAX_RANGES:
        raise LimitExceeded(f"{prefix}.ranges", f"{len(ranges)} is over the limit of {MAX_RANGES}")
    days = sorted({_date(f"{prefix}.dates[{i}]", d) for i, d in enumerate(dates)})
    spans: list[tuple[date, date]] = []
    for i, (a, b) in enumerate(ranges):
        start = _date(f"{prefix}.ranges[{i}].from", a)
        end = _date(f"{prefix}.ranges[{i}].to", b)
        if end < start:
            raise InvalidArgument(f"{prefix}.ranges[{i}].to", f"{b} is before {a}")
        spans.append((start, end))
    spans.sort()
    names: set[int] = set()
    for i, w in enumerate(weekdays):
        key = w.strip().lower()
        key = _FULL_NAMES.get(key, key)
        if key not in WEEKDAYS:
            raise InvalidArgument(
                f"{prefix}.weekdays[{i}]", f"{w!r} is not a weekday ({', '.join(WEEKDAYS)})"
            )
        names.add(WEEKDAYS.index(key))
    if not days and not spans and not names:
        raise InvalidArgument(prefix, "holds no day: give dates, ranges or weekdays")
    return Calendar(
        dates=tuple(d.isoformat() for d in days),
        ranges=tuple((a.isoformat(), b.isoformat()) for a, b in spans),
        weekdays=tuple(WEEKDAYS[n] for n in sorted(names)),
    )
