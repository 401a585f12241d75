"""Fires to run again as a new attempt, waiting their turn: retries waiting
out their backoff, and fires of lost runs waiting for the reaper.

A part of the owner. A retry waits for a RETRY timer of the owner's wheel,
``(seq << 2) | RETRY``; the owner hands its number back when the timer goes
off (``retry_due``). A lost run's fire waits in the reaper's queue and goes
out at the reaper's rate (``reap``), never while the fleet is nearly
saturated: the owner decides that (``paused``), since a spiral of
re-dispatches is worse than a wait (seed R6). What a redo does once due --
queued first in line on its job -- is the owner's business.

Invariants (tests in tests/engine/test_redos.py):

1. A redo is due once: a retry's timer finds nothing after its redo was
   taken or dropped; the reaper hands each out once, in the order lost.
2. The reaper hands out no more than its bucket's tokens: ``reaper_rate_per_s``
   with a burst of ``reaper_burst``.
3. What a cancel or a hand-over drops is counted back to its caller, so a
   job's ``inflight`` is kept exact.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import NamedTuple

from wheel.engine.fairness import TokenBucket
from wheel.engine.owner._values import RETRY
from wheel.engine.timerwheel import TimerWheel


class Redo(NamedTuple):
    """A fire to run again as a new attempt (a retry, or a re-dispatch after
    a lost lease)."""

    job_id: int
    fire: int
    attempt: int


class Redos:
    """Retries by their RETRY timer's number, and the reaper's queue."""

    __slots__ = ("_bucket", "_reaper", "_retries", "_seq", "_wheel", "paused")

    def __init__(self, wheel: TimerWheel, rate_per_s: float, burst: float, now_ms: int) -> None:
        self._wheel = wheel
        self._retries: dict[int, Redo] = {}  # by sequence number (RETRY timers)
        self._seq = 0
        self._reaper: deque[Redo] = deque()
        self._bucket = TokenBucket(rate_per_s, burst, now_ms)
        # Re-dispatch waits for the fleet to have room (the alert went out).
        self.paused = False

    # -- retries --------------------------------------------------------------------

    def retry_at(self, redo: Redo, at_ms: int) -> None:
        """Run ``redo`` once its backoff ends at ``at_ms``."""
        self._seq += 1
        self._retries[self._seq] = redo
        self._wheel.add((self._seq << 2) | RETRY, at_ms)

    def retry_due(self, seq: int) -> Redo | None:
        """A RETRY timer went off: its redo, if still waiting (invariant 1)."""
        return self._retries.pop(seq, None)

    # -- the reaper -----------------------------------------------------------------

    def reap_later(self, redo: Redo) -> None:
        """A lost run's fire, re-dispatched at the reaper's rate."""
        self._reaper.append(redo)

    def lost(self) -> int:
        """Fires of lost runs waiting for the reaper."""
        return len(self._reaper)

    def reap(self, now_ms: int) -> list[Redo]:
        """The lost runs' fires the reaper's tokens allow now, in the order
        they were lost (invariant 2)."""
        reaper = self._reaper
        return [reaper.popleft() for _ in range(self._bucket.take(len(reaper), now_ms))]

    def tokens(self, now_ms: int) -> int:
        return self._bucket.available(now_ms)

    def next_token_ms(self, now_ms: int) -> int | None:
        return self._bucket.next_available_ms(now_ms)

    # -- dropping -------------------------------------------------------------------

    def drop(self, gone: Callable[[int], bool]) -> int:
        """Drop the redos of the jobs ``gone`` names (by job id): a cancel, a
        hand-over. Returns how many (invariant 3)."""
        dropped = 0
        for seq, redo in list(self._retries.items()):
            if gone(redo.job_id):
                del self._retries[seq]  # its RETRY timer finds nothing
                dropped += 1
        if self._reaper:
            kept = deque(r for r in self._reaper if not gone(r.job_id))
            dropped += len(self._reaper) - len(kept)
            self._reaper = kept
        return dropped

    def waiting(self) -> list[Redo]:
        """Every redo waiting: retries, then the reaper's."""
        return [*self._retries.values(), *self._reaper]
