"""How wheel waits before trying again, written once: a ``Backoff`` policy
and the ``Delays`` it hands out.

Every place that retries an I/O (the node's store writes and shard gains,
the outbox relay, the etcd coordinator, the PostgreSQL store, a worker's
streams and strays, the client's calls, ``wheelctl import``) holds a
``Backoff`` and asks it how long to wait; the loop stays at the place, which
knows what a failure and a success are. A worked example: ``Backoff(
initial=0.1, max=1.0)`` waits 0.1, 0.2, 0.4, 0.8, 1.0, 1.0 ... seconds;
with ``jitter=Jitter.EQUAL`` each wait is drawn from its upper half
(0.05-0.1, 0.1-0.2, ...), with ``Jitter.FULL`` from all of it (0-0.1, ...).

This is the waiting between tries of wheel's own calls. A job's retries
(``wheel.engine.policy``) are a promise to the user, kept in the engine.
"""

from __future__ import annotations

import enum
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Backoff", "Delays", "Jitter"]


class Jitter(enum.Enum):
    """How a wait is drawn under its ceiling (the exponential's value)."""

    # The ceiling itself: one caller alone, or a wait a test pins.
    NONE = "none"
    # Half the ceiling plus a random part of the other half: callers that
    # failed together spread out, and none retries at once.
    EQUAL = "equal"
    # Anywhere from zero to the ceiling: the widest spread, for many callers
    # that hit one server at the same moment.
    FULL = "full"


@dataclass(frozen=True, slots=True, kw_only=True)
class Backoff:
    """Waits that grow from ``initial`` by ``multiplier`` up to ``max``
    seconds, drawn by ``jitter``; with ``deadline``, no wait that would end
    more than that many seconds after the first failure (``Delays.next``
    then says None: give up)."""

    initial: float
    max: float
    multiplier: float = 2.0
    jitter: Jitter = Jitter.NONE
    deadline: float | None = None

    def __post_init__(self) -> None:
        if self.initial < 0 or self.max < 0:
            raise ValueError(f"backoff: a negative wait ({self.initial}, {self.max})")
        if self.multiplier < 1:
            raise ValueError(f"backoff: multiplier {self.multiplier} is below 1")

    def ceiling(self, retry: int) -> float:
        """The longest wait before try ``retry + 2`` (``retry`` 0: the first retry)."""
        # The cap first: a long outage must not overflow the power.
        if retry > 64:
            return self.max
        return min(self.max, self.initial * self.multiplier**retry)

    def delay(self, retry: int, rng: random.Random | None = None) -> float:
        """The wait before the retry numbered ``retry`` (from 0)."""
        ceiling = self.ceiling(retry)
        if self.jitter is Jitter.NONE:
            return ceiling
        uniform = (rng or _RANDOM).uniform
        if self.jitter is Jitter.EQUAL:
            return ceiling / 2 + uniform(0, ceiling / 2)
        return uniform(0, ceiling)

    def delays(
        self, *, rng: random.Random | None = None, clock: Callable[[], float] = time.monotonic
    ) -> Delays:
        """A fresh run of waits: ``next`` after each failure, ``reset`` after a success."""
        return Delays(self, rng=rng, clock=clock)


_RANDOM = random.Random()


class Delays:
    """A ``Backoff`` in use by one loop: how many waits in a row it gave and
    since when, so that a success starts it over."""

    __slots__ = ("_clock", "_rng", "_since", "policy", "retries")

    def __init__(
        self,
        policy: Backoff,
        *,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = policy
        self.retries = 0
        self._rng = rng
        self._clock = clock
        self._since: float | None = None

    def next(self) -> float | None:
        """The wait after a failure, or None when it would end past the
        policy's deadline (counted from the first failure since a reset)."""
        policy = self.policy
        delay = policy.delay(self.retries, self._rng)
        self.retries += 1
        if policy.deadline is None:
            return delay
        now = self._clock()
        if self._since is None:
            self._since = now
        if now + delay > self._since + policy.deadline:
            return None
        return delay

    def wait(self) -> float:
        """The wait after a failure, for a policy without a deadline."""
        delay = self.next()
        if delay is None:
            raise RuntimeError("Delays.wait on a backoff with a deadline: use next")
        return delay

    @property
    def failing_for(self) -> float:
        """Seconds since the first failure counted by the deadline (0: none yet)."""
        return 0.0 if self._since is None else self._clock() - self._since

    def reset(self) -> None:
        """A success: the next failure waits ``initial`` again."""
        self.retries = 0
        self._since = None
