"""AdminService's signing-secret calls. A tenant's credential manages its
own tenant's secrets (scope ``jobs:write``; listing ``jobs:read``: the
interceptor checks the scope), an operator's any tenant's; without
``--auth`` the request's tenant stands ("default" when empty).

No answer carries a secret's value but the one a SetSecret or RotateSecret
with ``generate`` made, once; no error message carries one either (a bad
value is described by its length, never echoed)."""

from __future__ import annotations

import re

import grpc

from wheel import webhooks
from wheel.auth import OPERATOR, Principal
from wheel.engine.spec import no_nul
from wheel.errors import InvalidArgument, PermissionDenied
from wheel.node import Node
from wheel.rpc._common import _call
from wheel.rpc._guard import Guard
from wheel.rpc.v1 import admin_service_pb2 as pb
from wheel.store.base import SecretRecord

__all__ = ["MAX_OVERLAP_MS", "SecretsAdmin", "request_tenant", "secret_info", "tenant_of"]

NAME = re.compile(r"[A-Za-z0-9._-]{1,128}")
MAX_TENANT = 100
MAX_OVERLAP_MS = 366 * 24 * 3_600_000


def secret_info(r: SecretRecord) -> pb.SecretInfo:
    return pb.SecretInfo(
        tenant=r.tenant,
        name=r.name,
        version=r.version,
        created_at_ms=r.created_at_ms,
        retires_at_ms=r.retires_at_ms or 0,
        key_id=r.key_id,
    )


def _name(name: str) -> str:
    if not NAME.fullmatch(name):
        raise InvalidArgument("name", "must be 1 to 128 letters, digits, '.', '_' or '-'")
    return name


def request_tenant(principal: Principal | None, requested: str) -> str:
    """``tenant_of`` a request whose tenant field is ``tenant``."""
    return tenant_of(principal, requested, "tenant")


def tenant_of(principal: Principal | None, requested: str, field: str) -> str:
    """The tenant a call acts on: the request's for an operator (or without
    auth), the credential's own for a tenant (naming another is refused);
    ``field`` names the request's tenant in an error."""
    if principal is None or principal.operator:
        tenant = requested or "default"
        if len(tenant) > MAX_TENANT or tenant == OPERATOR:
            raise InvalidArgument(field, f"must be a tenant name of 1 to {MAX_TENANT} characters")
        no_nul(field, tenant)
        return tenant
    if requested and requested != principal.tenant:
        raise PermissionDenied(
            f"{field}: this credential acts for tenant {principal.tenant!r} only"
        )
    return principal.tenant


def _new_key(generate: bool, value: bytes) -> tuple[bytes, str]:
    """The key a set or rotation asks for, and the value to answer with (the
    generated secret; empty for a given one)."""
    if generate and value:
        raise InvalidArgument("value", "give a value or generate, not both")
    if generate:
        made = webhooks.new_secret()
        return webhooks.parse_secret(made), made
    if not value:
        raise InvalidArgument("value", "give a value (whsec_... or raw key bytes) or generate")
    try:
        return webhooks.parse_secret(value), ""
    except webhooks.SecretFormatError as exc:
        raise InvalidArgument("value", str(exc).removeprefix("value: ")) from None


class SecretsAdmin:
    """The signing secrets' calls, which ``AdminServicer`` hands on."""

    def __init__(self, node: Node, guard: Guard) -> None:
        self.node = node
        self.guard = guard

    async def SetSecret(
        self, request: pb.SetSecretRequest, context: grpc.aio.ServicerContext
    ) -> pb.SetSecretResponse:
        async def work() -> pb.SetSecretResponse:
            tenant = request_tenant(await self.guard.principal(context), request.tenant)
            name = _name(request.name)
            key, shown = _new_key(request.generate, request.value)
            record = await self.node.set_secret(tenant, name, key)
            return pb.SetSecretResponse(info=secret_info(record), value=shown)

        return await _call(context, work())

    async def RotateSecret(
        self, request: pb.RotateSecretRequest, context: grpc.aio.ServicerContext
    ) -> pb.SetSecretResponse:
        async def work() -> pb.SetSecretResponse:
            tenant = request_tenant(await self.guard.principal(context), request.tenant)
            name = _name(request.name)
            if not 0 <= request.overlap_ms <= MAX_OVERLAP_MS:
                raise InvalidArgument(
                    "overlap_ms", f"{request.overlap_ms} is outside [0, {MAX_OVERLAP_MS}]"
                )
            key, shown = _new_key(request.generate, request.value)
            record = await self.node.rotate_secret(tenant, name, key, request.overlap_ms)
            return pb.SetSecretResponse(info=secret_info(record), value=shown)

        return await _call(context, work())

    async def ListSecrets(
        self, request: pb.ListSecretsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListSecretsResponse:
        async def work() -> pb.ListSecretsResponse:
            tenant = Guard.list_tenant(await self.guard.principal(context), request.tenant)
            records = await self.node.list_secrets(tenant)
            return pb.ListSecretsResponse(secrets=[secret_info(r) for r in records])

        return await _call(context, work())

    async def DeleteSecret(
        self, request: pb.DeleteSecretRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteSecretResponse:
        async def work() -> pb.DeleteSecretResponse:
            tenant = request_tenant(await self.guard.principal(context), request.tenant)
            name = _name(request.name)
            return pb.DeleteSecretResponse(deleted=await self.node.delete_secret(tenant, name))

        return await _call(context, work())
