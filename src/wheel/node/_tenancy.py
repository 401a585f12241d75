"""Tenant quotas and tokens on a node. Quotas are read from the store,
enforced at the edge (max jobs, submits a second) and handed to the owner
(fires a second, runs in flight: ``wheel.engine.owner._tenants``); tokens
are read and written through here by the rpc layer (its authenticator and
AdminService), which touches the store only through the node.

Every node reads the quotas at start, every ``QUOTA_REFRESH_S`` after, and at
once after a change made through it: a change made through another member
applies here within that interval. Rates are counted per node (a tenant
submitting through three nodes may submit three times its rate; its fires
are counted by the owner of each shard), and max jobs is checked against the
store's count plus the submits this node has on their way, so concurrent
submits through several nodes may overshoot it by what they have on the way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence

from wheel.engine.driver import Driver
from wheel.engine.fairness import TokenBucket
from wheel.engine.owner import TenantLimit
from wheel.errors import ResourceExhausted, StoreError
from wheel.node._changes import InThread
from wheel.node._values import Clock
from wheel.store.base import Store, TenantQuota, TokenRecord

log = logging.getLogger("wheel.node")

QUOTA_REFRESH_S = 5.0


class Tenancy:
    """The tenant quotas and tokens of a node."""

    def __init__(
        self,
        store: Store,
        clock: Clock,
        *,
        in_thread: InThread,
        driver: Callable[[], Driver | None],
        wake: Callable[[], None],
    ) -> None:
        self._store = store
        self._clock = clock
        self._in_thread = in_thread
        # The node's driver once it started (quotas are handed to the owner).
        self._driver = driver
        self._wake = wake
        self.quotas: dict[str, TenantQuota] = {}
        self._submit_buckets: dict[str, TokenBucket] = {}
        # Submits admitted by max_jobs and not yet stored, by tenant.
        self._jobs_on_the_way: dict[str, int] = {}
        self._quota_task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._quota_task = asyncio.create_task(self._watch_quotas(), name="wheel-quotas")

    async def stop(self) -> None:
        if self._quota_task is not None:
            self._quota_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._quota_task

    async def _watch_quotas(self) -> None:
        while True:
            try:
                await self.refresh_quotas()
            except StoreError as exc:
                log.warning("reading tenant quotas failed: %s", exc)
            except Exception:  # a bug here must not stop the refresh for good
                log.exception("reading tenant quotas failed")
            await asyncio.sleep(QUOTA_REFRESH_S)

    async def refresh_quotas(self) -> None:
        """Read every tenant's quota from the store and apply it."""
        self.apply_quotas(await self._in_thread(self._store.list_tenant_quotas))

    def apply_quotas(self, quotas: Sequence[TenantQuota]) -> None:
        now = self._clock.now_ms()
        self.quotas = {q.tenant: q for q in quotas}
        buckets: dict[str, TokenBucket] = {}
        for q in quotas:
            if q.submits_per_s is None:
                continue
            rate, burst = q.submits_per_s, max(1.0, q.submits_per_s)
            bucket = self._submit_buckets.get(q.tenant)
            if bucket is None:
                bucket = TokenBucket(rate, burst, now)
            else:
                bucket.set_rate(rate, now, burst=burst)
            buckets[q.tenant] = bucket
        self._submit_buckets = buckets
        driver = self._driver()
        if driver is not None:
            limits = {
                q.tenant: TenantLimit(fires_per_s=q.fires_per_s, max_in_flight=q.max_in_flight)
                for q in quotas
            }
            if limits or driver.tenant_limits():
                driver.set_tenant_limits(limits, now)
                self._wake()

    async def set_tenant_quota(self, quota: TenantQuota) -> TenantQuota:
        stored = await self._in_thread(self._store.set_tenant_quota, quota)
        await self.refresh_quotas()
        return stored

    async def list_tenant_quotas(self) -> list[TenantQuota]:
        """Every tenant with limits set, as the store has them now."""
        return await self._in_thread(self._store.list_tenant_quotas)

    # -- tokens -------------------------------------------------------------------

    async def create_token(self, record: TokenRecord) -> None:
        """Store a minted token (``AlreadyExists`` for a token id in use)."""
        await self._in_thread(self._store.create_token, record)

    async def get_token(self, token_id: str) -> TokenRecord:
        """A token's record as the store has it now (``NotFound``)."""
        return await self._in_thread(self._store.get_token, token_id)

    async def list_tokens(self) -> list[TokenRecord]:
        """Every token, revoked and expired ones included."""
        return await self._in_thread(self._store.list_tokens)

    async def revoke_token(self, token_id: str) -> TokenRecord:
        """Revoke a token as of now by the node's clock (again: keeps the
        first time; ``NotFound``)."""
        return await self._in_thread(self._store.revoke_token, token_id, self._clock.now_ms())

    async def admit_submits(self, tenants: Sequence[str]) -> list[ResourceExhausted | None]:
        """For each submit (by its tenant, in order): None when it may go on,
        or the quota it is over. An admitted submit holds a place against
        ``max_jobs`` until ``submits_done`` gives it back."""
        out: list[ResourceExhausted | None] = []
        room: dict[str, int | None] = {}
        now = self._clock.now_ms()
        for tenant in tenants:
            quota = self.quotas.get(tenant)
            if quota is None:
                out.append(None)
                continue
            if tenant not in room:
                room[tenant] = await self._job_room(quota)
            bucket = self._submit_buckets.get(tenant)
            left = room[tenant]
            if left is not None and left <= 0:
                out.append(
                    ResourceExhausted(
                        f"max_jobs: tenant {tenant!r} is at its limit of {quota.max_jobs}"
                        " active or paused jobs"
                    )
                )
            elif bucket is not None and bucket.take(1, now) == 0:
                out.append(
                    ResourceExhausted(
                        f"submits_per_s: tenant {tenant!r} is over its limit of"
                        f" {quota.submits_per_s:g} submits a second"
                    )
                )
            else:
                if left is not None:
                    room[tenant] = left - 1
                    self._jobs_on_the_way[tenant] = self._jobs_on_the_way.get(tenant, 0) + 1
                out.append(None)
        return out

    def submits_done(self, tenants: Sequence[str]) -> None:
        """Give back the places ``admit_submits`` held for these submits."""
        for tenant in tenants:
            n = self._jobs_on_the_way.get(tenant, 0) - 1
            if n > 0:
                self._jobs_on_the_way[tenant] = n
            else:
                self._jobs_on_the_way.pop(tenant, None)

    async def _job_room(self, quota: TenantQuota) -> int | None:
        if quota.max_jobs is None:
            return None
        held = await self._in_thread(self._store.count_jobs, quota.tenant)
        return quota.max_jobs - held - self._jobs_on_the_way.get(quota.tenant, 0)
