"""Work that waits for a worker, in priority order with aging.

A route's queue (``RankedQueue``) holds one ``FairQueue`` per priority level
(0 first, 9 last), each fair across tenants as before. A pop takes from the
level whose oldest entry has the best *effective* priority:

    effective = max(0, priority - waited // aging_ms)

where ``waited`` is how long the entry has been in the queue. Ties go to the
level whose oldest entry was queued first, so work of equal rank leaves in
the order it came. Worked example, aging 10 s: a priority-9 run queued at
t=0 ranks 9 until t=10 s, 8 until 20 s, ... and 0 from t=90 s; from then on
only work queued before it can go ahead of it, whatever its priority. That
is the starvation bound: a run waits at most ``9 x aging_ms`` plus what a
plain FIFO queue would have made it wait for the work queued before it.

``aging_ms`` of 0 turns aging off (strict priority: a steady stream of
priority-0 work then holds priority-9 work back for as long as it lasts).

The common case costs what a ``FairQueue`` does: while one level holds all
the waiting work (all jobs at the default 5, or no contention), a pop goes
straight to that level's ``FairQueue`` without comparing levels. With
several levels waiting a pop is O(levels x tenants) an item.

All pure: time is an argument in integer milliseconds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from wheel.engine.fairness import FairQueue

__all__ = ["LEVELS", "RankedQueue", "effective_priority"]

# Priorities 0..9.
LEVELS = 10

T = TypeVar("T")


def effective_priority(priority: int, waited_ms: int, aging_ms: int) -> int:
    """The rank of work of ``priority`` that has waited ``waited_ms``: one
    level better for every ``aging_ms`` waited, never better than 0."""
    if aging_ms <= 0 or waited_ms <= 0:
        return priority
    return max(0, priority - waited_ms // aging_ms)


class RankedQueue(Generic[T]):
    """Items by priority level, fair across tenants within a level, with
    aging (see the module's doc). Each item keeps the time it was queued."""

    __slots__ = ("_aging_ms", "_len", "_levels")

    def __init__(self, aging_ms: int) -> None:
        self._aging_ms = aging_ms
        self._levels: list[FairQueue[tuple[int, T]] | None] = [None] * LEVELS
        self._len = 0

    @property
    def aging_ms(self) -> int:
        return self._aging_ms

    def _level(self, priority: int) -> FairQueue[tuple[int, T]]:
        q = self._levels[priority]
        if q is None:
            q = self._levels[priority] = FairQueue()
        return q

    def push(self, tenant: str, item: T, priority: int, now_ms: int) -> None:
        """Queue ``item`` last of its tenant at ``priority``, waiting from ``now_ms``."""
        self._level(priority).push(tenant, (now_ms, item))
        self._len += 1

    def push_front(self, tenant: str, item: T, priority: int, now_ms: int) -> None:
        """Queue ``item`` first of its tenant at ``priority`` (work that must
        go next at its level, such as a trigger's run)."""
        self._level(priority).push_front(tenant, (now_ms, item))
        self._len += 1

    def pop(
        self, n: int, now_ms: int, allow: dict[str, int] | None = None, below: int = LEVELS
    ) -> list[T]:
        """Up to ``n`` items, best effective priority first (``allow`` as for
        ``FairQueue.pop``: tenants held back keep their items, in order;
        ``below``: only items of a priority below it)."""
        if self._len == 0 or n <= 0:
            return []
        only: FairQueue[tuple[int, T]] | None = None
        several = False
        for q in self._levels[:below]:
            if q is not None and q:
                if only is not None:
                    several = True
                    break
                only = q
        if only is None:
            return []
        if not several:
            got = only.pop(n, allow)
            self._len -= len(got)
            return [item for _, item in got]
        out: list[T] = []
        passed: set[int] = set()  # levels whose every tenant is held back
        passed.update(range(below, LEVELS))
        while len(out) < n:
            level = self._best(now_ms, passed)
            if level < 0:
                break
            q = self._levels[level]
            assert q is not None
            got = q.pop(1, allow)
            if not got:
                passed.add(level)
                continue
            out.append(got[0][1])
        self._len -= len(out)
        return out

    def _best(self, now_ms: int, passed: set[int]) -> int:
        """The level to pop from next (-1: none): the best effective priority
        of its oldest entry, then the earliest queued."""
        best, best_rank, best_at = -1, LEVELS, 0
        for level, q in enumerate(self._levels):
            if q is None or not q or level in passed:
                continue
            oldest = min(stamp for stamp, _ in q.heads())
            rank = effective_priority(level, now_ms - oldest, self._aging_ms)
            if best < 0 or rank < best_rank or (rank == best_rank and oldest < best_at):
                best, best_rank, best_at = level, rank, oldest
        return best

    def __len__(self) -> int:
        return self._len

    def __bool__(self) -> bool:
        # Said, not left to __len__ (see FairQueue.__bool__).
        return self._len > 0

    def tenants(self) -> list[str]:
        """Tenants with queued items, each once."""
        seen: dict[str, None] = {}
        for q in self._levels:
            if q is not None:
                for tenant in q.tenants():
                    seen[tenant] = None
        return list(seen)

    def best_level(self) -> int:
        """The best priority with items queued (``LEVELS``: none)."""
        for level, q in enumerate(self._levels):
            if q is not None and q:
                return level
        return LEVELS

    def count_below(self, level: int) -> int:
        """How many items of a priority below ``level`` are queued."""
        return sum(len(q) for q in self._levels[:level] if q is not None)

    def levels(self) -> list[int]:
        """How many items wait at each priority level."""
        return [0 if q is None else len(q) for q in self._levels]

    def discard(self, predicate: Callable[[T], bool], tenant: str | None = None) -> int:
        """Remove every item matching ``predicate``, at any level; returns how
        many went (``tenant``: scan only its items)."""
        removed = 0
        for q in self._levels:
            if q is not None and q:
                removed += q.discard(lambda entry: predicate(entry[1]), tenant)
        self._len -= removed
        return removed
