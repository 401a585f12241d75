"""The audit trail's writer: a server interceptor that records each
administrative change the API made, once its call has answered OK.

Which calls are administrative, and what of each is recorded, is the table
``AUDITED``: for each method a function of the request and the response
giving the change's tenant, what it acted on, its job (if a job's) and its
details. The details are chosen field by field, never copied whole: a
secret's value, a token's secret and a job's payload are never among them.
Who made the change is the call's token (with auth on), where it came from
the peer address gRPC gives. Submits are not audited (a job's creation is
in its own row, and imports make millions); the other job changes are.

The entry is written before the answer goes back, so a caller that saw OK
saw its change recorded; if the store refuses the entry, the change stands
(it was made already), and the node logs the entry at ERROR instead.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Awaitable, Callable
from typing import Any

import grpc  # type: ignore[import-untyped, unused-ignore]

from wheel.auth import Authenticator, Principal
from wheel.errors import WheelError
from wheel.node import Node
from wheel.rpc.v1 import admin_service_pb2 as admin
from wheel.rpc.v1 import job_service_pb2 as js
from wheel.rpc.v1 import jobs_pb2
from wheel.store.base import AuditEntry

__all__ = ["AUDITED", "AuditInterceptor", "Change"]

# What a call changed: its tenant ("" where the request does not say:
# the caller's is used), what it acted on, its job id or None, its details.
Change = tuple[str, str, int | None, dict[str, Any]]
Describe = Callable[[Any, Any], Change]

_JOBS = "/wheel.rpc.v1.JobService/"
_ADMIN = "/wheel.rpc.v1.AdminService/"


def _job_state(request: js.JobRef, job: jobs_pb2.Job) -> Change:
    state = jobs_pb2.JobState.Name(job.state).removeprefix("JOB_STATE_").lower()
    return job.spec.tenant, f"job {request.job_id}", request.job_id, {"state": state}


def _trigger(request: js.JobRef, resp: js.TriggerJobResponse) -> Change:
    details = {"scheduled_for_ms": resp.scheduled_for_ms, "idempotency_key": resp.idempotency_key}
    return "", f"job {request.job_id}", request.job_id, details


def _backfill(request: js.BackfillJobRequest, resp: js.BackfillJobResponse) -> Change:
    details = {
        "from_ms": request.from_ms,
        "to_ms": request.to_ms,
        "scheduled": resp.scheduled,
        "skipped_existing": resp.skipped_existing,
    }
    return "", f"job {request.job_id}", request.job_id, details


def _update(request: js.UpdateJobRequest, resp: js.UpdateJobResponse) -> Change:
    details: dict[str, Any] = {
        "fields": sorted(request.fields),
        "version": resp.update.version,
        "updated": resp.updated,
        "payload_changed": resp.update.payload_changed,
    }
    return resp.job.spec.tenant, f"job {request.job_id}", request.job_id, details


def _redrive(request: js.RedriveDeadLettersRequest, resp: js.RedriveDeadLettersResponse) -> Change:
    details: dict[str, Any] = {"runs": [r.run_id for r in resp.runs][:100]}
    if request.run_id:
        details["run_id"] = request.run_id
    return "", f"job {request.job_id}", request.job_id, details


def _create_token(_: admin.CreateTokenRequest, resp: admin.CreateTokenResponse) -> Change:
    info = resp.info
    details: dict[str, Any] = {"scopes": list(info.scopes), "label": info.label}
    if info.expires_at_ms:
        details["expires_at_ms"] = info.expires_at_ms
    if info.worker_id:
        details["worker_id"] = info.worker_id
    if info.pools:
        details["pools"] = list(info.pools)
    return info.tenant, f"token {info.token_id}", None, details


def _revoke_token(request: admin.RevokeTokenRequest, resp: admin.TokenInfo) -> Change:
    return resp.tenant, f"token {request.token_id}", None, {"revoked_at_ms": resp.revoked_at_ms}


def _quota(request: admin.TenantQuota, _: admin.TenantQuota) -> Change:
    details = {
        name: getattr(request, name) if request.HasField(name) else None
        for name in ("max_jobs", "submits_per_s", "fires_per_s", "max_in_flight")
    }
    return request.tenant, f"tenant {request.tenant}", None, details


def _set_secret(request: Any, resp: admin.SetSecretResponse) -> Change:
    # Never request.value nor resp.value: the version and how it was made.
    details: dict[str, Any] = {"version": resp.info.version, "generated": request.generate}
    if isinstance(request, admin.RotateSecretRequest):
        details["overlap_ms"] = request.overlap_ms
    return resp.info.tenant, f"secret {resp.info.name}", None, details


def _delete_secret(request: admin.DeleteSecretRequest, resp: admin.DeleteSecretResponse) -> Change:
    return request.tenant, f"secret {request.name}", None, {"versions_deleted": resp.deleted}


def _set_calendar(request: admin.SetCalendarRequest, resp: admin.Calendar) -> Change:
    details: dict[str, Any] = {
        "version": resp.version,
        "dates": len(resp.dates),
        "ranges": len(resp.ranges),
        "weekdays": list(resp.weekdays),
    }
    return resp.tenant, f"calendar {resp.name}", None, details


def _delete_calendar(request: admin.DeleteCalendarRequest, resp: Any) -> Change:
    return request.tenant, f"calendar {request.name}", None, {"deleted": bool(resp.deleted)}


def _set_limit(request: admin.SetLimitRequest, resp: admin.LimitInfo) -> Change:
    details = {
        "max_concurrent": resp.max_concurrent,
        "rate": resp.rate,
        "rate_period_ms": resp.rate_period_ms,
        "burst": resp.burst,
    }
    return resp.tenant, f"limit {resp.key}", None, details


def _delete_limit(request: admin.DeleteLimitRequest, resp: admin.DeleteLimitResponse) -> Change:
    return request.tenant, f"limit {request.key}", None, {"deleted": resp.deleted}


AUDITED: dict[str, Describe] = {
    _JOBS + "CancelJob": _job_state,
    _JOBS + "PauseJob": _job_state,
    _JOBS + "ResumeJob": _job_state,
    _JOBS + "TriggerJob": _trigger,
    _JOBS + "BackfillJob": _backfill,
    _JOBS + "UpdateJob": _update,
    _JOBS + "RedriveDeadLetters": _redrive,
    _ADMIN + "CreateToken": _create_token,
    _ADMIN + "RevokeToken": _revoke_token,
    _ADMIN + "SetTenantQuota": _quota,
    _ADMIN + "SetSecret": _set_secret,
    _ADMIN + "RotateSecret": _set_secret,
    _ADMIN + "DeleteSecret": _delete_secret,
    _ADMIN + "SetCalendar": _set_calendar,
    _ADMIN + "DeleteCalendar": _delete_calendar,
    _ADMIN + "SetLimit": _set_limit,
    _ADMIN + "DeleteLimit": _delete_limit,
}


class AuditInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Records the calls of ``AUDITED`` that answer OK (see the module)."""

    def __init__(self, node: Node, auth: Authenticator | None) -> None:
        self.node = node
        self.auth = auth

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        details: grpc.HandlerCallDetails,
    ) -> Any:
        handler = await continuation(details)
        describe = AUDITED.get(details.method)
        if handler is None or describe is None or handler.unary_unary is None:
            return handler
        inner = handler.unary_unary
        action = details.method.rsplit("/", 1)[-1]

        async def audited(request: Any, context: grpc.aio.ServicerContext) -> Any:
            response = await inner(request, context)
            if context.code() in (None, grpc.StatusCode.OK):
                await self._record(action, describe, request, response, context)
            return response

        return grpc.unary_unary_rpc_method_handler(
            audited, handler.request_deserializer, handler.response_serializer
        )

    async def _record(
        self,
        action: str,
        describe: Describe,
        request: Any,
        response: Any,
        context: grpc.aio.ServicerContext,
    ) -> None:
        principal: Principal | None = None
        if self.auth is not None:
            principal = await self.auth.authenticate(context.invocation_metadata())
        tenant, target, job_id, details = describe(request, response)
        if not tenant and job_id is not None:
            with contextlib.suppress(WheelError):  # gone since: the caller's then
                tenant = (await self.node.get_job(job_id)).spec.tenant
        if not tenant:
            tenant = principal.tenant if principal is not None else ""
        entry = AuditEntry(
            at_ms=self.node.now_ms(),
            actor="" if principal is None else f"token {principal.token_id}",
            tenant=tenant,
            address=context.peer() or "",
            action=action,
            target=target,
            job_id=job_id,
            details=json.dumps(details, sort_keys=True, separators=(",", ":")),
        )
        await self.node.record_audit([entry])
