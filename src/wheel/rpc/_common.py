"""What every servicer shares: request limits, the one mapping from wheel's
errors to gRPC status codes, and small request checks."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any, TypeVar

import grpc

from wheel.engine.spec import no_nul
from wheel.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    LimitExceeded,
    NotFound,
    NotOwner,
    PermissionDenied,
    ResourceExhausted,
    StaleFence,
    StoreUnavailable,
    Unauthenticated,
    WheelError,
)

log = logging.getLogger("wheel.rpc")

T = TypeVar("T")

MAX_PAGE = 1000
MAX_NEXT_FIRES = 100
MAX_CAPACITY = 100_000
MAX_WORKER_ID = 200
MAX_HANDLERS = 10_000
MAX_IDEMPOTENCY_KEY = 200
# A request's size at most: room for a bulk submit of 10,000 jobs with
# payloads of a few kilobytes each (the client splits bigger ones).
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
MAX_SUBMIT_MANY = 10_000
# Runs one Returned message may name (each is a look-up in the store).
MAX_RETURNED_RUNS = 10_000
# Server messages queued for one worker stream before it is judged not reading.
MAX_PENDING_MESSAGES = 10_000

_STATUS: list[tuple[type[WheelError], grpc.StatusCode]] = [
    (LimitExceeded, grpc.StatusCode.INVALID_ARGUMENT),
    (InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
    (NotFound, grpc.StatusCode.NOT_FOUND),
    (AlreadyExists, grpc.StatusCode.ALREADY_EXISTS),
    (ResourceExhausted, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (FailedPrecondition, grpc.StatusCode.FAILED_PRECONDITION),
    (StaleFence, grpc.StatusCode.FAILED_PRECONDITION),
    (Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
    (PermissionDenied, grpc.StatusCode.PERMISSION_DENIED),
    (NotOwner, grpc.StatusCode.UNAVAILABLE),
    (StoreUnavailable, grpc.StatusCode.UNAVAILABLE),
]


def status_of(exc: WheelError) -> grpc.StatusCode:
    """The one mapping from wheel's errors to gRPC status codes."""
    for cls, code in _STATUS:
        if isinstance(exc, cls):
            return code
    return grpc.StatusCode.INTERNAL


async def _call(context: grpc.aio.ServicerContext, work: Awaitable[T]) -> T:
    try:
        return await work
    except WheelError as exc:
        await context.abort(status_of(exc), str(exc))
        raise AssertionError("unreachable") from exc


def _ignore_outcome(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()  # marks it retrieved


def _page_size(value: int, field: str = "page_size") -> int:
    if value < 0:
        raise InvalidArgument(field, f"{value} is negative")
    if value > MAX_PAGE:
        raise LimitExceeded(field, f"{value} is over the limit of {MAX_PAGE}")
    return value or 100


def _idempotency_key(value: str) -> str:
    if len(value) > MAX_IDEMPOTENCY_KEY:
        raise LimitExceeded("idempotency_key", f"longer than {MAX_IDEMPOTENCY_KEY} characters")
    no_nul("idempotency_key", value)
    return value


def _job_id(value: int) -> int:
    if value <= 0:
        raise InvalidArgument("job_id", "must be a positive job id")
    return value
