"""What handlers and their authors see: the run context, the two failures a
handler raises on purpose, the worker's counters, and handler references."""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from wheel.errors import InvalidArgument

Handler = Callable[["RunContext"], Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class RunContext:
    """What a handler gets: one attempt of one fire."""

    run_id: int
    job_id: int
    handler: str
    tenant: str
    payload: bytes
    # Stable across attempts of the same fire: use it to deduplicate side effects.
    idempotency_key: str
    fence: int
    # 1 for a fire's first attempt, 2 for its first retry, ...
    attempt: int
    scheduled_for_ms: int
    timeout_ms: int
    # time.monotonic() when the run times out (inf: no timeout).
    deadline: float

    @property
    def remaining(self) -> float:
        """Seconds left before the run times out."""
        return self.deadline - time.monotonic()


# The context of every run the worker receives is built by ``run_context``:
# the ``__init__`` a frozen dataclass gets sets each field through
# ``object.__setattr__`` (1.0 us for these eleven), where the fields' own slot
# descriptors, bound once here, set them in 0.4 us. Same fields, same order
# (checked at import), and the object is the same frozen RunContext.
_FIELDS = (
    "run_id",
    "job_id",
    "handler",
    "tenant",
    "payload",
    "idempotency_key",
    "fence",
    "attempt",
    "scheduled_for_ms",
    "timeout_ms",
    "deadline",
)
if tuple(f.name for f in fields(RunContext)) != _FIELDS:  # pragma: no cover - a field added
    raise ImportError("run_context must set every field of RunContext")
(
    _set_run_id,
    _set_job_id,
    _set_handler,
    _set_tenant,
    _set_payload,
    _set_idempotency_key,
    _set_fence,
    _set_attempt,
    _set_scheduled_for_ms,
    _set_timeout_ms,
    _set_deadline,
) = (vars(RunContext)[f].__set__ for f in _FIELDS)
_new = object.__new__


def run_context(
    run_id: int,
    job_id: int,
    handler: str,
    tenant: str,
    payload: bytes,
    idempotency_key: str,
    fence: int,
    attempt: int,
    scheduled_for_ms: int,
    timeout_ms: int,
    deadline: float,
) -> RunContext:
    """``RunContext(...)`` with these values, built the cheap way (above)."""
    ctx: RunContext = _new(RunContext)
    _set_run_id(ctx, run_id)
    _set_job_id(ctx, job_id)
    _set_handler(ctx, handler)
    _set_tenant(ctx, tenant)
    _set_payload(ctx, payload)
    _set_idempotency_key(ctx, idempotency_key)
    _set_fence(ctx, fence)
    _set_attempt(ctx, attempt)
    _set_scheduled_for_ms(ctx, scheduled_for_ms)
    _set_timeout_ms(ctx, timeout_ms)
    _set_deadline(ctx, deadline)
    return ctx


class Retryable(Exception):
    """Raised by a handler: this attempt failed, retry with backoff."""


class Permanent(Exception):
    """Raised by a handler: failed for good, no retry (dead-letter)."""


@dataclass(slots=True)
class WorkerStats:
    """Counters since the worker started."""

    received: int = 0
    succeeded: int = 0
    # Every failed outcome reported: retryable, permanent, timed out.
    failed: int = 0
    timed_out: int = 0
    # Aborted because the server revoked the run or refused to renew its lease.
    revoked: int = 0
    # Completions the server answered with accepted=False.
    rejected: int = 0
    # Given back unstarted (draining, no such handler): no attempt used.
    handed_back: int = 0
    # Started, then given up at the end of a drain.
    abandoned: int = 0
    reconnects: int = 0
    # Runs and completions re-homed to another node because their shard moved
    # (the run went on: a move is not a revoke).
    moved: int = 0


def load_handler(spec: str) -> tuple[str, Callable[[RunContext], Any]]:
    """Resolve ``"pkg.mod:func"`` or ``"name=pkg.mod:func"`` to (name, function).

    The name defaults to the function's ``__name__``; ``func`` may be dotted
    (``pkg.mod:Class.method``).
    """
    name, sep, ref = spec.partition("=")
    if not sep or ":" in name:
        name, ref = "", spec
    module_name, _, attr = ref.partition(":")
    if not module_name or not attr:
        raise InvalidArgument(
            "handler", f"{spec!r} is not 'module:function' or 'name=module:function'"
        )
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise InvalidArgument("handler", f"cannot import {module_name!r}: {exc}") from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise InvalidArgument("handler", f"{module_name!r} has no attribute {attr!r}") from None
    if not callable(obj):
        raise InvalidArgument("handler", f"{spec!r} is not callable")
    return name or getattr(obj, "__name__", attr.rsplit(".", 1)[-1]), obj
