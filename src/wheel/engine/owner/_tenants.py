"""Tenant limits on dispatch: fires a second and runs in flight per tenant.

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

from mypy_extensions import trait

from wheel.engine.fairness import FairQueue, TokenBucket
from wheel.engine.owner._state import _Parts
from wheel.engine.owner._values import TenantLimit

# An allowance without a limit.
_UNLIMITED = 1 << 62


@trait
class _Tenants(_Parts):
    __slots__ = ()

    def set_tenant_limits(self, limits: Mapping[str, TenantLimit], now_ms: int) -> None:
        """Replace every tenant's limits (a tenant not named has none)."""
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
            bucket = self._tenant_buckets.get(tenant)
            if bucket is None:
                bucket = TokenBucket(rate, burst, now_ms)
            else:
                bucket.set_rate(rate, now_ms, burst=burst)
            buckets[tenant] = bucket
        self._tenant_limits = kept
        self._tenant_buckets = buckets
        self._tenant_blocked = set()
        self._held_tenant.clear()
        self._tenant_held.clear()
        counted = {t for t, lim in kept.items() if lim.max_in_flight is not None}
        if counted:
            for run in self.runs.values():
                if run.held_out:
                    job = self.jobs.get(run.job_id) or self._job(run.job_id)
                    if job is not None and job.spec.tenant in counted:
                        self._hold(run.run_id, job.spec.tenant)

    def tenant_limits(self) -> dict[str, TenantLimit]:
        return dict(self._tenant_limits)

    def tenant_in_flight(self, tenant: str) -> int:
        """Runs of ``tenant`` held by workers (counted for limited tenants only)."""
        return self._tenant_held.get(tenant, 0)

    def _hold(self, run_id: int, tenant: str) -> None:
        if run_id not in self._held_tenant:
            self._held_tenant[run_id] = tenant
            self._tenant_held[tenant] = self._tenant_held.get(tenant, 0) + 1

    def _hold_if_limited(self, run_id: int, tenant: str) -> None:
        lim = self._tenant_limits.get(tenant)
        if lim is not None and lim.max_in_flight is not None:
            self._hold(run_id, tenant)

    def _unhold(self, run_id: int) -> None:
        tenant = self._held_tenant.pop(run_id, None)
        if tenant is not None:
            self._tenant_held[tenant] -= 1

    def _claiming(self) -> dict[str, int]:
        """Claims on their way to the store by tenant (those a dispatch made:
        a trigger's or a backfill's count once handed out), for tenants with
        an in-flight limit."""
        claiming: dict[str, int] = {}
        limits = self._tenant_limits
        if self._pending and any(lim.max_in_flight is not None for lim in limits.values()):
            for pend in self._pending.values():
                if pend.ahead:
                    continue
                job = self.jobs.get(pend.job_id)
                if job is not None:
                    tenant = job.spec.tenant
                    claiming[tenant] = claiming.get(tenant, 0) + 1
        return claiming

    def _over_in_flight(self, tenant: str, claiming: Mapping[str, int]) -> bool:
        """The tenant has as many runs in flight as its limit allows (rule 4):
        a claimed run waiting for a worker stays waiting."""
        lim = self._tenant_limits.get(tenant)
        if lim is None or lim.max_in_flight is None:
            return False
        busy = self._tenant_held.get(tenant, 0) + claiming.get(tenant, 0)
        return busy >= lim.max_in_flight

    def _tenant_allowance(self, now_ms: int) -> dict[str, int] | None:
        """Items each limited tenant may take in this dispatch (rule 1)."""
        limits = self._tenant_limits
        if not limits:
            return None
        claiming = self._claiming()
        allow: dict[str, int] = {}
        for tenant, lim in limits.items():
            room = _UNLIMITED
            bucket = self._tenant_buckets.get(tenant)
            if bucket is not None:
                room = bucket.available(now_ms)
            if lim.max_in_flight is not None:
                busy = self._tenant_held.get(tenant, 0) + claiming.get(tenant, 0)
                room = min(room, max(0, lim.max_in_flight - busy))
            allow[tenant] = room
        return allow

    def _tenants_took(
        self, before: Mapping[str, int], allow: Mapping[str, int], now_ms: int
    ) -> None:
        """Charge each tenant's bucket for what it took (rule 2), and note the
        tenants left without allowance."""
        blocked: set[str] = set()
        for tenant, left in allow.items():
            took = before[tenant] - left
            bucket = self._tenant_buckets.get(tenant)
            if bucket is not None and took > 0:
                bucket.take(took, now_ms)
            if left <= 0:
                blocked.add(tenant)
        self._tenant_blocked = blocked

    def _has_unblocked(self, q: FairQueue[int]) -> bool:
        """Some tenant queued in ``q`` was not held back by the last dispatch."""
        blocked = self._tenant_blocked
        return not blocked or any(t not in blocked for t in q.tenants())

    def _tenant_wake(self, now_ms: int) -> int | None:
        """When a tenant held back by its fire rate gets its next token (one
        held back by its in-flight limit waits for a run to end: an event)."""
        wake: int | None = None
        for tenant in self._tenant_blocked:
            bucket = self._tenant_buckets.get(tenant)
            if bucket is not None and bucket.available(now_ms) == 0:
                at = bucket.next_available_ms(now_ms)
                if at is not None and (wake is None or at < wake):
                    wake = at
        return wake
