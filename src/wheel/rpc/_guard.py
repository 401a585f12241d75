"""What the handlers ask of a call's credential (``wheel.auth``): the
tenant it acts for, whether a job is its to see, which pools it may use.

Without ``--auth`` there is no credential: every answer is yes and the
request's tenant stands, exactly as before auth existed. With it, a tenant's
credential decides the tenant of everything it does:

- a submit is stored under the credential's tenant whatever ``spec.tenant``
  says (the job returned shows it), and ListJobs lists only that tenant's
  jobs whatever its ``tenant`` field says; an operator (tenant ``*``) names
  tenants in requests as before;
- another tenant's job answers NOT_FOUND with the same message as a job that
  does not exist, so ids do not tell whether they are taken;
- a pool named ``TENANT/...`` belongs to that tenant: only its jobs may use
  it (PERMISSION_DENIED on ``spec.pool`` otherwise).
"""

from __future__ import annotations

import grpc

from wheel.auth import Authenticator, Principal, tenant_pool
from wheel.engine.records import JobRecord
from wheel.errors import NotFound, PermissionDenied
from wheel.rpc.v1 import job_service_pb2


class Guard:
    def __init__(self, auth: Authenticator | None) -> None:
        self.auth = auth

    async def principal(self, context: grpc.aio.ServicerContext) -> Principal | None:
        """The caller (None without ``--auth``); the interceptor has let only
        valid credentials through, so this is a cache hit."""
        if self.auth is None:
            return None
        return await self.auth.authenticate(context.invocation_metadata())

    @staticmethod
    def own_submit(
        principal: Principal | None, request: job_service_pb2.SubmitJobRequest
    ) -> job_service_pb2.SubmitJobRequest:
        """The submit as the caller may make it: under its own tenant, into a
        pool its tenant may use."""
        if principal is None:
            return request
        if not principal.operator and request.spec.tenant != principal.tenant:
            mine = job_service_pb2.SubmitJobRequest()
            mine.CopyFrom(request)
            mine.spec.tenant = principal.tenant
            request = mine
        tenant = request.spec.tenant or "default"
        owner = tenant_pool(request.spec.pool)
        if owner is not None and owner != tenant:
            raise PermissionDenied(
                f"spec.pool: pool {request.spec.pool!r} belongs to tenant {owner!r}"
            )
        return request

    @staticmethod
    def list_tenant(principal: Principal | None, requested: str) -> str | None:
        """The tenant whose jobs a ListJobs lists (None: every tenant)."""
        if principal is None or principal.operator:
            return requested or None
        return principal.tenant

    @staticmethod
    def check_job(principal: Principal | None, record: JobRecord) -> JobRecord:
        """``record`` if the caller may see it, else NOT_FOUND as for a job
        that does not exist."""
        if principal is not None and not principal.sees(record.spec.tenant):
            raise NotFound(f"job {record.job_id} does not exist")
        return record
