"""Which node a call goes to, and when a failed call is tried on another.

A client holds a channel to each address it was given (any node serves every
call). A call goes to the address that answered last. On UNAVAILABLE (the
node is down or starting, cannot reach its store, or answers NOT_OWNER for a
shard it just lost) the call goes to the next address, each address once a
round with a backoff between rounds, until the call's own timeout; the last
failure is what the caller sees.

Only what is safe to repeat is repeated. Every call is idempotent by design
(a submit carries an idempotency key, generated when the caller gave none, so
a retried submit finds the job its first attempt made) except a trigger: a
trigger goes to another address only when it provably never left. So before a
trigger, and before the first call to an address (or the first after it
failed), the client asks the node's standard health service: an address that
does not answer that within ``CONNECT_TIMEOUT_S`` has not been sent the call,
and one that drops packets cannot eat a call's whole timeout either.

``Tries`` is the decision, without I/O; the clients carry it out.
"""

from __future__ import annotations

from enum import Enum

import grpc  # type: ignore[import-untyped, unused-ignore]
from grpc_health.v1 import health_pb2  # type: ignore[import-untyped, unused-ignore]

from wheel._retry import Backoff
from wheel.tracing import current_traceparent

# The backoff between two rounds over every address: doubling, capped.
RETRY_INITIAL_S = 0.05
RETRY_MAX_S = 1.0
ROUND_BACKOFF = Backoff(initial=RETRY_INITIAL_S, max=RETRY_MAX_S)
# At most this long for a connection to one address before trying the next
# (an address that drops packets would otherwise take the whole timeout).
CONNECT_TIMEOUT_S = 2.0
# A node that comes back is found within a second or so, not gRPC's default
# of up to two minutes between connection attempts.
CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1_000),
    # Answers to a bulk submit or a page of jobs can pass gRPC's default 4 MiB.
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
]

# The question that proves a connection: any answer to it will do.
PROBE = health_pb2.HealthCheckRequest()


class Resend(Enum):
    """When a call that failed with UNAVAILABLE may go to another address."""

    # Idempotent: whenever it failed with UNAVAILABLE.
    ALWAYS = "always"
    # Not idempotent (a trigger): only when it never left.
    UNSENT = "unsent"


class Tries:
    """The addresses one call tries, in turn from ``first``, and the waits
    between them; ``next`` after each failure."""

    __slots__ = ("_count", "_deadline", "_round", "_tried", "index")

    def __init__(self, count: int, first: int, timeout: float, now: float) -> None:
        self._count = count
        self._deadline = now + timeout
        self._round = 0
        self._tried = 0
        self.index = first

    def remaining(self, now: float) -> float:
        """What is left of the call's timeout (never quite zero: gRPC takes
        a deadline in the past as none at all)."""
        return max(self._deadline - now, 0.001)

    def next(self, now: float) -> float | None:
        """Move to the next address; the seconds to wait before trying it, or
        None when the call's time is up."""
        self.index = (self.index + 1) % self._count
        self._tried += 1
        delay = 0.0
        if self._tried >= self._count:  # a round over every address failed
            self._tried = 0
            delay = ROUND_BACKOFF.delay(self._round)
            self._round += 1
        if now + delay >= self._deadline:
            return None
        return delay


def connected(exc: grpc.RpcError) -> bool:
    """Whether a probe that failed with ``exc`` reached the node all the same
    (it answered, say UNIMPLEMENTED) rather than not at all."""
    code = getattr(exc, "code", None)
    return not callable(code) or code() not in (
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
    )


def traced(metadata: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """A call's metadata with the current span's ``traceparent`` (W3C), when
    the application traces (``wheel.tracing``): the node's span of the call
    is then its child."""
    parent = current_traceparent()
    return (*metadata, ("traceparent", parent)) if parent else metadata
