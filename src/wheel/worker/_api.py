"""What handlers and their authors see: the run context, the two failures a
handler raises on purpose, and the worker's counters (handler references are
resolved in ``wheel.worker._loading``)."""

from __future__ import annotations

import contextvars
import json
import logging
import time
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from typing import Any

Handler = Callable[["RunContext"], Any]

# The run whose handler is executing in this context (its task, its thread,
# or the inline step), for ``RunLogFilter``.
current_run: contextvars.ContextVar[RunContext | None] = contextvars.ContextVar(
    "wheel_current_run", default=None
)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunContext:
    """What a handler gets: one attempt of one fire.

    A handler's return value is dropped: only how it ended (returned,
    raised ``Retryable``/``Permanent``/anything else, timed out) is
    reported to the node.
    """

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
    # When the fire was due, in milliseconds since the Unix epoch (UTC).
    scheduled_for_ms: int
    # The job's timeout_s in milliseconds (0: no timeout).
    timeout_ms: int
    # When the run times out, on the monotonic clock: compare with
    # time.monotonic() (or asyncio's loop.time()), never with time.time().
    # inf: no timeout. ``remaining`` is the same as seconds from now.
    deadline: float

    @property
    def remaining(self) -> float:
        """Seconds left before the run times out (inf: no timeout)."""
        return self.deadline - time.monotonic()

    @property
    def scheduled_for(self) -> datetime:
        """When the fire was due, as an aware UTC datetime."""
        return datetime.fromtimestamp(self.scheduled_for_ms / 1000, UTC)

    def json(self) -> Any:
        """The payload parsed as JSON. A payload that is not JSON raises
        ``Permanent`` (another attempt would not change it: the fire is
        dead-lettered unless the handler catches it)."""
        try:
            return json.loads(self.payload)
        except (ValueError, UnicodeDecodeError) as exc:
            head = self.payload[:40]
            more = "..." if len(self.payload) > 40 else ""
            raise Permanent(
                f"the payload of run {self.run_id} is not JSON ({exc}): {head!r}{more}"
            ) from exc

    @property
    def log(self) -> logging.LoggerAdapter[logging.Logger]:
        """A logger whose records carry this run's ``job_id``, ``run_id`` and
        ``attempt`` (logger ``wheel.handler.<handler name>``)."""
        return logging.LoggerAdapter(
            logging.getLogger(f"wheel.handler.{self.handler}"), _log_ids(self)
        )


def _log_ids(ctx: RunContext) -> dict[str, Any]:
    return {"job_id": ctx.job_id, "run_id": ctx.run_id, "attempt": ctx.attempt}


class RunLogFilter(logging.Filter):
    """Adds the ``job_id``, ``run_id`` and ``attempt`` of the run whose
    handler logs a record (any logger, any thread the worker runs handlers
    in) to that record, unless it carries them already. Never drops one.
    ``Worker.run()`` puts it on the root logger's handlers present when it
    starts; put it on handlers made later yourself."""

    def filter(self, record: logging.LogRecord) -> bool:
        ctx = current_run.get()
        if ctx is not None:
            attrs: MutableMapping[str, Any] = record.__dict__
            for key, value in _log_ids(ctx).items():
                attrs.setdefault(key, value)
        return True


def install_log_filter() -> None:
    """``RunLogFilter`` on each handler of the root logger that lacks one."""
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, RunLogFilter) for f in handler.filters):
            handler.addFilter(RunLogFilter())


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
