"""wheel's one error hierarchy.

Every failure wheel reports is a ``WheelError``. Third-party errors (sqlite3,
psycopg, lmdb, grpc, etcd3) are wrapped where they are caught, and
``wheel.rpc.status`` maps these classes to gRPC status codes at the edge.
"""

from __future__ import annotations


class WheelError(Exception):
    """Root of every error wheel raises on purpose."""


class InvalidArgument(WheelError):
    """A request or spec is malformed. ``field`` names the offending field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.reason = message


class LimitExceeded(InvalidArgument):
    """A value is over a configured limit; the message states the limit."""


class ResourceExhausted(WheelError):
    """The server is over a capacity limit (backfill size, queue depth...)."""


class Unauthenticated(WheelError):
    """A call without a valid credential (missing, malformed, unknown,
    expired or revoked token)."""


class PermissionDenied(WheelError):
    """A valid credential without the right to this call (a scope it lacks,
    a worker id or pool it is not bound to)."""


class NotFound(WheelError):
    """An id that does not exist (job, run, shard)."""


class AlreadyExists(WheelError):
    """An idempotency key reused with a different request body."""


class EffectDone(AlreadyExists):
    """A fenced effect whose idempotency key is already done (``wheel.effects``):
    the effect happened once; this attempt has nothing left to do."""


class FailedPrecondition(WheelError):
    """The operation is not legal in the object's current state."""


class StaleFence(WheelError):
    """A write carried a fence older than the newest attempt's."""


class NotOwner(WheelError):
    """This node does not (or no longer) own the shard."""


class StoreError(WheelError):
    """The record of truth failed; the operation may be retried."""


class StoreUnavailable(StoreError):
    """The store cannot be reached right now (connection lost, locked)."""


class CheckpointError(WheelError):
    """The local checkpoint is unusable; the node rebuilds from the store."""


class CoordinationError(WheelError):
    """Shard ownership could not be established or was lost."""
