"""Fair, bounded dispatch of overdue work (seed C5/R5).

After an outage one tenant may hold 1.2 million overdue fires. Three pieces
keep that from hurting anyone else:

- ``split_capacity``: fresh fires take dispatch capacity first; overdue fires
  only get what is left, and never more than the overdue budget allows.
- ``TokenBucket``: the overdue budget, refilled at a fraction (default 20%) of
  dispatch capacity, so a backlog can never starve newly due work.
- ``FairQueue``: deficit round robin across tenants, so a tenant with a huge
  backlog gets its share of that budget and no more. Fresh fires wait in one
  too: when workers are short, each tenant with work gets its turn, and a
  tenant held back by its own quota (``pop``'s ``allow``) keeps its items
  queued, in order, for a later pop: delayed, never dropped.

All pure: time is an argument in integer milliseconds.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["DEFAULT_OVERDUE_SHARE", "DispatchSplit", "FairQueue", "TokenBucket", "split_capacity"]

# The fraction of dispatch capacity overdue work may use (seed R5).
DEFAULT_OVERDUE_SHARE = 0.2

T = TypeVar("T")

# Tokens are kept in integer nano-tokens, and the refill carries its remainder,
# so the bucket never drifts: over any span of T ms it adds exactly
# floor(T * rate) tokens, however the span is cut into calls. The only error
# is rounding the rate itself to a nano-token per second.
_UNIT = 1_000_000_000


class TokenBucket:
    """A token bucket on a caller-supplied clock; starts full.

    A clock that steps backwards is clamped: no refill until it passes the
    latest time already seen, and no tokens are ever taken back.
    """

    __slots__ = ("_burst", "_carry", "_last_ms", "_rate", "_units")

    def __init__(self, rate_per_s: float, burst: float, now_ms: int) -> None:
        self._rate = 0  # nano-tokens per second
        self._burst = 0  # nano-tokens
        self._set(rate_per_s, burst)
        self._units = self._burst
        self._carry = 0  # refill remainder, in nano-tokens * ms / s
        self._last_ms = now_ms

    @staticmethod
    def _check(rate_per_s: float, burst: float) -> None:
        if not rate_per_s >= 0:
            raise ValueError(f"rate_per_s must be >= 0, got {rate_per_s}")
        if not burst >= 0:
            raise ValueError(f"burst must be >= 0, got {burst}")

    def _set(self, rate_per_s: float, burst: float) -> None:
        self._check(rate_per_s, burst)
        self._rate = round(rate_per_s * _UNIT)
        self._burst = round(burst * _UNIT)

    def _refill(self, now_ms: int) -> None:
        elapsed = now_ms - self._last_ms
        if elapsed <= 0:
            return
        self._last_ms = now_ms
        if self._units >= self._burst:
            self._carry = 0
            return
        added, self._carry = divmod(elapsed * self._rate + self._carry, 1000)
        self._units += added
        if self._units >= self._burst:
            self._units = self._burst
            self._carry = 0

    @property
    def rate_per_s(self) -> float:
        return self._rate / _UNIT

    @property
    def burst(self) -> float:
        return self._burst / _UNIT

    def set_rate(self, rate_per_s: float, now_ms: int, *, burst: float | None = None) -> None:
        """Change the refill rate (and optionally the burst) from ``now_ms`` on:
        the budget follows dispatch capacity as workers come and go."""
        self._refill(now_ms)
        self._set(rate_per_s, self.burst if burst is None else burst)
        self._units = min(self._units, self._burst)

    def take(self, n: int, now_ms: int) -> int:
        """Take up to ``n`` whole tokens available now; returns how many were granted."""
        self._refill(now_ms)
        granted = max(0, min(n, self._units // _UNIT))
        self._units -= granted * _UNIT
        return granted

    def available(self, now_ms: int) -> int:
        """Whole tokens available at ``now_ms``."""
        self._refill(now_ms)
        return self._units // _UNIT

    def next_available_ms(self, now_ms: int) -> int | None:
        """The earliest time at which at least one token is available (``now_ms``
        if one is now); None if none ever will be (rate 0, or burst below 1)."""
        self._refill(now_ms)
        if self._units >= _UNIT:
            return now_ms
        if self._rate == 0 or self._burst < _UNIT:
            return None
        # Smallest d with (d * rate + carry) // 1000 >= need.
        need = (_UNIT - self._units) * 1000 - self._carry
        return self._last_ms + -(-need // self._rate)


class FairQueue(Generic[T]):
    """Deficit round robin across tenants (seed R5: a per-tenant share).

    Each tenant with pending items has a FIFO; on its turn a tenant may take
    ``weight`` items, then the turn passes on. With weight 1 this is strict
    round robin: over any run of pops, two tenants that both have items
    pending get counts within one of each other, however deep either backlog.

    ``push`` is O(1); ``pop(n)`` is O(n + tenants touched), independent of how
    many items wait. A tenant that drains leaves the rotation and rejoins at
    the back when it pushes again.
    """

    __slots__ = ("_active", "_deficit", "_len", "_queues", "_weights")

    def __init__(self) -> None:
        self._queues: dict[str, deque[T]] = {}
        self._weights: dict[str, int] = {}
        self._deficit: dict[str, int] = {}
        # Tenants with pending items in turn order; the head holds the current turn.
        self._active: deque[str] = deque()
        self._len = 0

    def _queue_for(self, tenant: str, weight: int) -> deque[T]:
        if weight < 1:
            raise ValueError(f"weight must be >= 1, got {weight}")
        self._weights[tenant] = weight
        q = self._queues.get(tenant)
        if q is None:
            q = self._queues[tenant] = deque()
            self._deficit[tenant] = 0
            self._active.append(tenant)
        return q

    def push(self, tenant: str, item: T, weight: int = 1) -> None:
        """Append ``item`` to ``tenant``'s FIFO; ``weight`` becomes the tenant's share."""
        q = self._queues.get(tenant)
        if q is None or self._weights[tenant] != weight:
            q = self._queue_for(tenant, weight)
        q.append(item)
        self._len += 1

    def push_front(self, tenant: str, item: T, weight: int = 1) -> None:
        """Put ``item`` first in ``tenant``'s FIFO (work that must go next,
        such as a trigger's run); the tenant's turn order is unchanged."""
        q = self._queues.get(tenant)
        if q is None or self._weights[tenant] != weight:
            q = self._queue_for(tenant, weight)
        q.appendleft(item)
        self._len += 1

    def extend(self, tenant: str, items: Iterable[T], weight: int = 1) -> None:
        """``push`` for many items of one tenant at once."""
        q = self._queue_for(tenant, weight)
        before = len(q)
        q.extend(items)
        self._len += len(q) - before
        if not q:  # nothing was added to a new tenant: undo its registration
            self._active.remove(tenant)
            self._drop(tenant)

    def _drop(self, tenant: str) -> None:
        del self._queues[tenant]
        del self._deficit[tenant]
        del self._weights[tenant]

    def pop(self, n: int, allow: dict[str, int] | None = None) -> list[T]:
        """Up to ``n`` items, interleaved across tenants by their weights.

        ``allow`` (tenant -> items it may take now) holds back the tenants it
        names: one at 0 is passed over, its items left queued in order, and
        each item taken counts down its entry. Tenants it does not name take
        as their weight says."""
        out: list[T] = []
        active = self._active
        if allow is None and len(active) == 1:
            # One tenant: its FIFO, without a turn per item.
            tenant = active[0]
            q = self._queues[tenant]
            for _ in range(min(n, len(q))):
                out.append(q.popleft())
            if not q:
                active.popleft()
                self._drop(tenant)
            self._len -= len(out)
            return out
        passed = 0  # tenants passed over in a row: all of them ends the pop
        while len(out) < n and active and passed < len(active):
            tenant = active[0]
            room = None if allow is None else allow.get(tenant)
            if room is not None and room <= 0:
                active.rotate(-1)
                passed += 1
                continue
            passed = 0
            q = self._queues[tenant]
            deficit = self._deficit[tenant]
            if deficit <= 0:  # a new turn
                deficit = self._weights[tenant]
            take = min(deficit, len(q), n - len(out))
            if room is not None:
                take = min(take, room)
                allow[tenant] = room - take  # type: ignore[index]
            for _ in range(take):
                out.append(q.popleft())
            deficit -= take
            if not q:
                active.popleft()
                self._drop(tenant)
                continue
            self._deficit[tenant] = deficit
            if deficit == 0 or (room is not None and room == take):
                active.rotate(-1)
            # else: n ran out mid-turn; the tenant keeps the rest of its turn.
        self._len -= len(out)
        return out

    def __len__(self) -> int:
        return self._len

    def __bool__(self) -> bool:
        # Said, not left to __len__: compiled code tests an Optional of a
        # compiled class without __bool__ for None only (mypyc 2.4).
        return len(self) > 0

    def tenant_len(self, tenant: str) -> int:
        q = self._queues.get(tenant)
        return 0 if q is None else len(q)

    def tenants(self) -> list[str]:
        """Tenants with pending items, in turn order."""
        return list(self._active)

    def heads(self) -> list[T]:
        """Each tenant's first item, in turn order."""
        return [self._queues[t][0] for t in self._active]

    def discard(self, predicate: Callable[[T], bool], tenant: str | None = None) -> int:
        """Remove every item matching ``predicate`` (e.g. fires of a cancelled
        job); returns how many went. O(items scanned): pass ``tenant`` to scan
        only that tenant's queue."""
        names = list(self._active) if tenant is None else [tenant]
        removed = 0
        for name in names:
            q = self._queues.get(name)
            if q is None:
                continue
            kept = deque(item for item in q if not predicate(item))
            gone = len(q) - len(kept)
            if gone == 0:
                continue
            removed += gone
            if kept:
                self._queues[name] = kept
            else:
                self._drop(name)
        if removed:
            self._len -= removed
            if any(name not in self._queues for name in self._active):
                self._active = deque(t for t in self._active if t in self._queues)
        return removed


@dataclass(frozen=True, slots=True, kw_only=True)
class DispatchSplit:
    """How many fresh and overdue fires to dispatch in this round."""

    fresh: int
    overdue: int


def split_capacity(
    *, capacity: int, fresh_waiting: int, overdue_waiting: int, overdue_tokens: int
) -> DispatchSplit:
    """Divide dispatch capacity: fresh fires first, up to all of it; overdue fires
    get what is left, bounded by the overdue budget's tokens. The caller then
    takes ``overdue`` tokens from its bucket and pops that many from its
    ``FairQueue``."""
    capacity = max(0, capacity)
    fresh = min(max(0, fresh_waiting), capacity)
    overdue = max(0, min(overdue_waiting, overdue_tokens, capacity - fresh))
    return DispatchSplit(fresh=fresh, overdue=overdue)
