"""The server interceptor: every call but health and reflection needs a
valid bearer token (UNAUTHENTICATED otherwise) holding the scope its method
needs (PERMISSION_DENIED otherwise). What the caller may touch once in (its
tenant's jobs, its worker id and pools) is checked by the handlers."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from wheel.auth._authority import Authenticator
from wheel.auth._tokens import ADMIN, JOBS_READ, JOBS_WRITE, WORKER
from wheel.errors import PermissionDenied, StoreUnavailable, Unauthenticated, WheelError

# Open to anyone: load balancers probe health, and the schema reflection
# hands out is the public proto.
PUBLIC_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")
# Any valid credential: workers and clients route by the membership.
ANY_SCOPE = ""

_JOBS = "/wheel.rpc.v1.JobService/"
_ADMIN = "/wheel.rpc.v1.AdminService/"
SCOPE_OF: dict[str, str] = {
    **{
        _JOBS + m: JOBS_WRITE
        for m in (
            "SubmitJob",
            "SubmitJobs",
            "CancelJob",
            "PauseJob",
            "ResumeJob",
            "TriggerJob",
            "BackfillJob",
            "UpdateJob",
            "RedriveDeadLetters",
        )
    },
    **{
        _JOBS + m: JOBS_READ
        for m in (
            "GetJob",
            "ListJobs",
            "ListRuns",
            "GetRun",
            "ListJobUpdates",
            "PreviewSchedule",
            "ListDeadLetters",
            "GetRunOverview",
            "ListRecentRuns",
            "GetJobHistory",
        )
    },
    # A tenant's credential manages its own tenant's signing secrets.
    **{_ADMIN + m: JOBS_WRITE for m in ("SetSecret", "RotateSecret", "DeleteSecret")},
    _ADMIN + "ListSecrets": JOBS_READ,
    # And its own tenant's calendars.
    **{_ADMIN + m: JOBS_WRITE for m in ("SetCalendar", "DeleteCalendar")},
    **{_ADMIN + m: JOBS_READ for m in ("GetCalendar", "ListCalendars")},
    # ... and its concurrency keys' limits.
    **{_ADMIN + m: JOBS_WRITE for m in ("SetLimit", "DeleteLimit")},
    _ADMIN + "ListLimits": JOBS_READ,
    "/wheel.rpc.v1.WorkerService/Connect": WORKER,
    _ADMIN + "GetMembership": ANY_SCOPE,
    # Calls between members carry the credential of the call that caused them.
    "/wheel.rpc.v1.NodeService/JobsChanged": JOBS_WRITE,
}


def scope_of(method: str) -> str:
    """The scope ``method`` needs; a method not listed needs ``admin`` (every
    AdminService call but GetMembership, and any method added later)."""
    return SCOPE_OF.get(method, ADMIN)


def _status(exc: WheelError) -> grpc.StatusCode:
    if isinstance(exc, PermissionDenied):
        return grpc.StatusCode.PERMISSION_DENIED
    if isinstance(exc, StoreUnavailable):
        return grpc.StatusCode.UNAVAILABLE
    if isinstance(exc, Unauthenticated):
        return grpc.StatusCode.UNAUTHENTICATED
    return grpc.StatusCode.UNAVAILABLE  # the store failed to answer: try again


def _refusal(handler: Any, code: grpc.StatusCode, message: str) -> Any:
    """A handler of ``handler``'s kind that only answers ``code``."""

    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(code, message)

    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(
            unary, handler.request_deserializer, handler.response_serializer
        )
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(
            unary, handler.request_deserializer, handler.response_serializer
        )
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(
            unary, handler.request_deserializer, handler.response_serializer
        )
    return grpc.unary_unary_rpc_method_handler(
        unary, handler.request_deserializer, handler.response_serializer
    )


class AuthInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Authenticates every call but the public ones before its handler runs."""

    def __init__(self, auth: Authenticator) -> None:
        self.auth = auth

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        details: grpc.HandlerCallDetails,
    ) -> Any:
        method = details.method
        if method.startswith(PUBLIC_PREFIXES):
            return await continuation(details)
        try:
            principal = await self.auth.authenticate(details.invocation_metadata)
            need = scope_of(method)
            if need and need not in principal.scopes:
                raise PermissionDenied(f"authorization: this call needs scope {need!r}")
        except WheelError as exc:
            handler = await continuation(details)
            if handler is None:
                return None
            return _refusal(handler, _status(exc), str(exc))
        return await continuation(details)
