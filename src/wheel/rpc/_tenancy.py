"""AdminService's token and tenant-quota calls (scope ``admin``; the
interceptor checks it)."""

from __future__ import annotations

import math

import grpc

from wheel.auth import OPERATOR, mint
from wheel.errors import FailedPrecondition, InvalidArgument
from wheel.node import Node
from wheel.rpc._common import _call
from wheel.rpc._guard import Guard
from wheel.rpc.v1 import admin_service_pb2 as pb
from wheel.store.base import TenantQuota, TokenRecord

__all__ = ["TenancyAdmin", "quota_of", "quota_to_proto", "token_info"]

MAX_TENANT = 100


def token_info(t: TokenRecord) -> pb.TokenInfo:
    return pb.TokenInfo(
        token_id=t.token_id,
        tenant=t.tenant,
        scopes=list(t.scopes),
        worker_id=t.worker_id or "",
        pools=list(t.pools),
        label=t.label,
        created_at_ms=t.created_at_ms,
        expires_at_ms=t.expires_at_ms or 0,
        revoked_at_ms=t.revoked_at_ms or 0,
    )


def quota_to_proto(q: TenantQuota) -> pb.TenantQuota:
    out = pb.TenantQuota(tenant=q.tenant, updated_at_ms=q.updated_at_ms)
    if q.max_jobs is not None:
        out.max_jobs = q.max_jobs
    if q.submits_per_s is not None:
        out.submits_per_s = q.submits_per_s
    if q.fires_per_s is not None:
        out.fires_per_s = q.fires_per_s
    if q.max_in_flight is not None:
        out.max_in_flight = q.max_in_flight
    return out


def _rate(msg: pb.TenantQuota, field: str) -> float | None:
    if not msg.HasField(field):
        return None
    value = float(getattr(msg, field))
    if not (math.isfinite(value) and value > 0):
        raise InvalidArgument(field, f"{value} is not a positive number a second")
    return value


def quota_of(msg: pb.TenantQuota, now_ms: int) -> TenantQuota:
    """The quota a SetTenantQuota asks for (``InvalidArgument`` names the field)."""
    tenant = msg.tenant
    if not tenant or len(tenant) > MAX_TENANT or tenant == OPERATOR:
        raise InvalidArgument("tenant", f"must be a tenant name of 1 to {MAX_TENANT} characters")
    max_jobs = msg.max_jobs if msg.HasField("max_jobs") else None
    if max_jobs is not None and max_jobs < 0:
        raise InvalidArgument("max_jobs", f"{max_jobs} is negative")
    max_in_flight = msg.max_in_flight if msg.HasField("max_in_flight") else None
    if max_in_flight is not None and max_in_flight < 1:
        raise InvalidArgument("max_in_flight", f"{max_in_flight} is below 1")
    return TenantQuota(
        tenant=tenant,
        max_jobs=max_jobs,
        submits_per_s=_rate(msg, "submits_per_s"),
        fires_per_s=_rate(msg, "fires_per_s"),
        max_in_flight=max_in_flight,
        updated_at_ms=now_ms,
    )


class TenancyAdmin:
    """Mixed into ``AdminServicer``."""

    node: Node
    guard: Guard

    def _auth_on(self) -> None:
        if self.guard.auth is None:
            raise FailedPrecondition(
                "auth: this node runs without --auth, where tokens are not checked;"
                " start it with --auth (and --init-admin-token FILE) first"
            )

    async def CreateToken(
        self, request: pb.CreateTokenRequest, context: grpc.aio.ServicerContext
    ) -> pb.CreateTokenResponse:
        async def work() -> pb.CreateTokenResponse:
            self._auth_on()
            minted = mint(
                tenant=request.tenant,
                scopes=list(request.scopes),
                now_ms=self.node.now_ms(),
                ttl_ms=request.ttl_ms,
                worker_id=request.worker_id,
                pools=list(request.pools),
                label=request.label,
            )
            await self.node.create_token(minted.record)
            return pb.CreateTokenResponse(token=minted.token, info=token_info(minted.record))

        return await _call(context, work())

    async def ListTokens(
        self, request: pb.ListTokensRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListTokensResponse:
        async def work() -> pb.ListTokensResponse:
            self._auth_on()
            tokens = await self.node.list_tokens()
            return pb.ListTokensResponse(tokens=[token_info(t) for t in tokens])

        return await _call(context, work())

    async def RevokeToken(
        self, request: pb.RevokeTokenRequest, context: grpc.aio.ServicerContext
    ) -> pb.TokenInfo:
        async def work() -> pb.TokenInfo:
            self._auth_on()
            if not request.token_id:
                raise InvalidArgument("token_id", "is required")
            record = await self.node.revoke_token(request.token_id)
            if self.guard.auth is not None:
                self.guard.auth.forget(record.token_id)
            return token_info(record)

        return await _call(context, work())

    async def SetTenantQuota(
        self, request: pb.TenantQuota, context: grpc.aio.ServicerContext
    ) -> pb.TenantQuota:
        async def work() -> pb.TenantQuota:
            quota = quota_of(request, self.node.now_ms())
            return quota_to_proto(await self.node.set_tenant_quota(quota))

        return await _call(context, work())

    async def ListTenantQuotas(
        self, request: pb.ListTenantQuotasRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListTenantQuotasResponse:
        async def work() -> pb.ListTenantQuotasResponse:
            quotas = await self.node.list_tenant_quotas()
            return pb.ListTenantQuotasResponse(quotas=[quota_to_proto(q) for q in quotas])

        return await _call(context, work())
