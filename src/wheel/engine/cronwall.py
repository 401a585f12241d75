"""Cron's helpers for ``wheel.engine.schedule``: croniter instances shared by
expression, and a zone's offsets at an instant and at a wall time (DST gaps
and folds, PEP 495)."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from croniter import croniter

__all__ = [
    "EPOCH",
    "RANDOM_OR_HASHED",
    "borrow_croniter",
    "offset_at",
    "return_croniter",
    "transition",
    "wall_iso",
    "wall_offsets",
]

EPOCH = datetime(1970, 1, 1)

# croniter instances are a few kilobytes and slow to parse (~60 us), so one per
# distinct expression is kept here, not one per job. An instance is taken out
# while in use and put back after, so two callers never share one at a time.
_CRONITERS: dict[str, Any] = {}
CRONITERS_MAX = 4096

RANDOM_OR_HASHED = re.compile(r"^[hr](\(\d+-\d+\))?(/\d+)?$", re.IGNORECASE)


def borrow_croniter(expr: str) -> Any:
    it = _CRONITERS.pop(expr, None)
    if it is None:
        it = croniter(expr, 0.0, ret_type=float, second_at_beginning=True)
    return it


def return_croniter(expr: str, it: Any) -> None:
    if len(_CRONITERS) >= CRONITERS_MAX:
        _CRONITERS.clear()
    _CRONITERS[expr] = it


def offset_at(zone: ZoneInfo, instant_s: int) -> int:
    """The zone's UTC offset in seconds at an instant."""
    off = datetime.fromtimestamp(instant_s, tz=zone).utcoffset()
    assert off is not None
    return off // timedelta(seconds=1)


def wall_offsets(zone: ZoneInfo, wall_s: int) -> tuple[int, int]:
    """Offsets (seconds) of a wall time read with fold=0 and fold=1 (PEP 495).

    Equal: the wall time exists once. fold=0 smaller: a gap (fold=0 takes the
    offset before the transition, fold=1 the one after). fold=0 larger: a fold,
    fold=0 being the first occurrence.
    """
    local = (EPOCH + timedelta(seconds=wall_s)).replace(tzinfo=zone)
    o0 = local.utcoffset()
    o1 = local.replace(fold=1).utcoffset()
    assert o0 is not None and o1 is not None
    second = timedelta(seconds=1)
    return o0 // second, o1 // second


def transition(zone: ZoneInfo, lo_s: int, hi_s: int) -> int:
    """The first instant in ``(lo_s, hi_s]`` with the offset in force at ``hi_s``
    (the offset at ``lo_s`` differs): where a DST gap ends."""
    target = offset_at(zone, hi_s)
    while hi_s - lo_s > 1:
        mid = (lo_s + hi_s) // 2
        if offset_at(zone, mid) == target:
            hi_s = mid
        else:
            lo_s = mid
    return hi_s


def wall_iso(wall_s: int) -> str:
    return (EPOCH + timedelta(seconds=wall_s)).isoformat()
