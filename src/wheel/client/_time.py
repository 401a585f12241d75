"""Times and durations as users give them, and as the wire carries them.

Users pass ``datetime`` values (aware; a naive one is read as UTC) or epoch
seconds, and ``timedelta`` values or seconds. The wire carries integer
milliseconds since the epoch and integer milliseconds. The conversions are
exact in integer arithmetic (no float round trip through ``timestamp()``),
and every value the client hands back is an aware UTC ``datetime``.
"""

from __future__ import annotations

import functools
from datetime import UTC, datetime, timedelta

from wheel.errors import InvalidArgument

# What the public signatures accept: a ``datetime`` or epoch seconds, and a
# ``timedelta`` or seconds. ``float`` admits ``int`` too.
When = datetime | float
Duration = timedelta | float

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)


def utc(ms: int) -> datetime:
    """The UTC time ``ms`` milliseconds after the epoch."""
    return EPOCH + timedelta(milliseconds=ms)


@functools.lru_cache(maxsize=256)
def span(ms: int) -> timedelta:
    """``ms`` milliseconds as a ``timedelta``; made once each, as a job's
    durations (timeouts, periods, backoffs) are few values repeated."""
    return timedelta(milliseconds=ms)


def utc_or_none(ms: int) -> datetime | None:
    """``utc(ms)``, or None for the wire's 0 ("not set")."""
    return utc(ms) if ms else None


def millis(value: timedelta) -> int:
    """Whole milliseconds of a duration, rounded to the nearest."""
    return round(value / _MS)


def as_duration(value: object, field: str) -> timedelta:
    """A ``timedelta`` from a ``timedelta`` or a number of seconds."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return timedelta(seconds=value)
    raise InvalidArgument(field, f"expected a timedelta or seconds, got {type(value).__name__}")


def duration(value: object, field: str, *, positive: bool) -> timedelta:
    """``as_duration``, refusing negative durations, and those under a
    millisecond too where ``positive`` (where the wire would read 0 as "use
    the default", so a zero must not get that far)."""
    out = as_duration(value, field)
    ms = millis(out)
    if ms < 0 or (positive and ms == 0):
        raise InvalidArgument(field, f"must be {'at least 1 ms' if positive else '>= 0'}")
    return out


def as_time(value: object, field: str) -> datetime:
    """An aware ``datetime`` from a ``datetime`` (naive means UTC) or epoch seconds."""
    if isinstance(value, datetime):
        return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return EPOCH + timedelta(seconds=value)
    raise InvalidArgument(
        field, f"expected a datetime or epoch seconds, got {type(value).__name__}"
    )


def time_ms(value: object, field: str) -> int:
    """Milliseconds since the epoch of a time (see ``as_time``), rounded down."""
    return (as_time(value, field) - EPOCH) // _MS
