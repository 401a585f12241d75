"""Tenant limits on dispatch: fires a second and runs in flight per tenant.

``Tenants`` is a part of the owner: it keeps each limited tenant's fire
bucket and the runs its workers hold, and answers the dispatcher's
questions (how much may each tenant take now, is it over its in-flight
limit, when does a tenant held back get its next token). It knows nothing
of jobs or runs beyond the run ids and tenants it is told of; what is on its
way to the store (``claiming``) the dispatcher counts and passes in.

A tenant over either limit is passed over by the dispatch queues (``FairQueue.pop``'s
``allow``): its fires stay queued in order and go out once it is back under
(a token of its bucket, or a run of its ending), never dropped. The other
tenants' work goes on meanwhile, sharing the workers' credit turn by turn.

Rules:

1. A tenant's allowance for one dispatch is the smaller of its bucket's whole
   tokens (``fires_per_s``, a second of burst) and ``max_in_flight`` less the
   runs it has in flight: claims on their way to the store (those a dispatch
   made, not a trigger's or a backfill's, which count once handed out) and
   runs handed to a worker and not ended.
2. Every item a dispatch takes for a tenant costs one token of its bucket.
3. Runs held are counted only for tenants with an in-flight limit, by run id,
   so that a run leaving the owner by any path (ended, handed back, its shard
   handed over) is uncounted once and only once; a change of limits counts
   them afresh. Runs an owner adopts (gaining a shard, a restart) count from
   the start.
4. Every way a run reaches a worker keeps the in-flight limit: a claimed run
   waiting for a worker (its worker went away, it was handed back, a
   trigger's or a backfill's) is handed out only while its tenant is under
   it, as is a fire run again after a lost lease or a failure (through the
   dispatch queues, rule 1). Such a waiting run was paid for when claimed:
   it takes no token of the fire rate.
"""

from __future__ import annotations

from collections.abc import Mapping

from wheel.engine.fairness import TokenBucket
from wheel.engine.owner._values import TenantLimit
from wheel.engine.priority import RankedQueue

# An allowance without a limit.
_UNLIMITED = 1 << 62


class Tenants:
    """Each limited tenant's limits, fire bucket and runs held by workers."""

    __slots__ = ("_blocked", "_buckets", "_by_run", "_held", "limits")

    def __init__(self) -> None:
        # Only tenants with a limit; empty: no tenant is limited (the
        # dispatch path asks nothing more).
        self.limits: dict[str, TenantLimit] = {}
        self._buckets: dict[str, TokenBucket] = {}
        # Runs held by workers, counted for tenants with an in-flight limit:
        # the tenant of each run (rule 3), and how many each tenant holds.
        self._by_run: dict[int, str] = {}
        self._held: dict[str, int] = {}
        # The tenants the last dispatch left without allowance.
        self._blocked: set[str] = set()

    def set_limits(self, limits: Mapping[str, TenantLimit], now_ms: int) -> set[str]:
        """Replace every tenant's limits (a tenant not named has none). The
        runs held are forgotten: returns the tenants whose runs must be
        counted afresh (``hold``), those with an in-flight limit."""
        kept = {
            t: lim
            for t, lim in limits.items()
            if lim.fires_per_s is not None or lim.max_in_flight is not None
        }
        buckets: dict[str, TokenBucket] = {}
        for tenant, lim in kept.items():
            if lim.fires_per_s is None:
                continue
            rate = max(0.0, lim.fires_per_s)
            burst = max(1.0, rate)
            bucket = self._buckets.get(tenant)
            if bucket is None:
                bucket = TokenBucket(rate, burst, now_ms)
            else:
                bucket.set_rate(rate, now_ms, burst=burst)
            buckets[tenant] = bucket
        self.limits = kept
        self._buckets = buckets
        self._blocked = set()
        self._by_run.clear()
        self._held.clear()
        return {t for t, lim in kept.items() if lim.max_in_flight is not None}

    def in_flight(self, tenant: str) -> int:
        """Runs of ``tenant`` held by workers (counted for limited tenants only)."""
        return self._held.get(tenant, 0)

    def holds_runs(self) -> bool:
        """Some run is counted (an ``unhold`` may have something to do)."""
        return bool(self._by_run)

    def hold(self, run_id: int, tenant: str) -> None:
        """A worker holds the run: counted once however often it is told."""
        if run_id not in self._by_run:
            self._by_run[run_id] = tenant
            self._held[tenant] = self._held.get(tenant, 0) + 1

    def hold_if_limited(self, run_id: int, tenant: str) -> None:
        lim = self.limits.get(tenant)
        if lim is not None and lim.max_in_flight is not None:
            self.hold(run_id, tenant)

    def unhold(self, run_id: int) -> None:
        """The run left its worker (by any path): uncounted, once."""
        tenant = self._by_run.pop(run_id, None)
        if tenant is not None:
            self._held[tenant] -= 1

    def counts_claims(self) -> bool:
        """Some tenant has an in-flight limit: claims on their way count."""
        return any(lim.max_in_flight is not None for lim in self.limits.values())

    def over_in_flight(self, tenant: str, claiming: Mapping[str, int]) -> bool:
        """The tenant has as many runs in flight as its limit allows (rule 4):
        a claimed run waiting for a worker stays waiting."""
        lim = self.limits.get(tenant)
        if lim is None or lim.max_in_flight is None:
            return False
        busy = self._held.get(tenant, 0) + claiming.get(tenant, 0)
        return busy >= lim.max_in_flight

    def allowance(self, now_ms: int, claiming: Mapping[str, int]) -> dict[str, int]:
        """Items each limited tenant may take in this dispatch (rule 1)."""
        allow: dict[str, int] = {}
        for tenant, lim in self.limits.items():
            room = _UNLIMITED
            bucket = self._buckets.get(tenant)
            if bucket is not None:
                room = bucket.available(now_ms)
            if lim.max_in_flight is not None:
                busy = self._held.get(tenant, 0) + claiming.get(tenant, 0)
                room = min(room, max(0, lim.max_in_flight - busy))
            allow[tenant] = room
        return allow

    def took(self, before: Mapping[str, int], allow: Mapping[str, int], now_ms: int) -> None:
        """Charge each tenant's bucket for what it took (rule 2), and note the
        tenants left without allowance."""
        blocked: set[str] = set()
        for tenant, left in allow.items():
            took = before[tenant] - left
            bucket = self._buckets.get(tenant)
            if bucket is not None and took > 0:
                bucket.take(took, now_ms)
            if left <= 0:
                blocked.add(tenant)
        self._blocked = blocked

    def any_blocked(self) -> bool:
        return bool(self._blocked)

    def has_unblocked(self, q: RankedQueue[int]) -> bool:
        """Some tenant queued in ``q`` was not held back by the last dispatch."""
        blocked = self._blocked
        return not blocked or any(t not in blocked for t in q.tenants())

    def wake(self, now_ms: int) -> int | None:
        """When a tenant held back by its fire rate gets its next token (one
        held back by its in-flight limit waits for a run to end: an event)."""
        wake: int | None = None
        for tenant in self._blocked:
            bucket = self._buckets.get(tenant)
            if bucket is not None and bucket.available(now_ms) == 0:
                at = bucket.next_available_ms(now_ms)
                if at is not None and (wake is None or at < wake):
                    wake = at
        return wake
