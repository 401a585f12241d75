"""Claims on their way to the store: a part of the owner.

A claim is sent in a store batch and answered with the next batch's
outcome (``Owner.on_claimed``): until then it waits here, by its fire
attempt ``(job, fire, attempt)``, with the worker it was meant for (its
credit reserved) and how its run is to be handed out. What the answer means
for the job and the run is the owner's business.

Invariants (tests in tests/engine/test_claims.py):

1. A fire attempt has at most one claim on its way; an answer takes it out
   once (a second answer, or one for a claim dropped, finds nothing).
2. A claim whose worker went away is kept, meant for no worker: its run
   waits for another when it is won.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Collection
from dataclasses import dataclass


@dataclass(slots=True, init=False)
class _Pending:
    """A claim on its way to the store (its __init__ spelled out: see
    wheel.engine.records.FireClaim)."""

    job_id: int
    scheduled_for: int
    attempt: int
    fence: int
    worker_id: str | None
    # ``claim_now``: the won run waits on its job, handed out as overdue work.
    ahead: bool
    overdue: bool
    # Its run's hand-out counts as dispatch lag (``_Run.timed``).
    timed: bool
    # When it first waited for a permit of its concurrency key (-1: never).
    waited_since: int

    def __init__(
        self,
        job_id: int,
        scheduled_for: int,
        attempt: int,
        fence: int,
        worker_id: str | None,
        ahead: bool = False,
        overdue: bool = False,
        timed: bool = True,
    ) -> None:
        self.job_id = job_id
        self.scheduled_for = scheduled_for
        self.attempt = attempt
        self.fence = fence
        self.worker_id = worker_id
        self.ahead = ahead
        self.overdue = overdue
        self.timed = timed
        self.waited_since = -1


class Claims:
    """The claims sent and not answered yet."""

    __slots__ = ("_pending",)

    def __init__(self) -> None:
        self._pending: dict[tuple[int, int, int], _Pending] = {}

    def __len__(self) -> int:
        return len(self._pending)

    def __bool__(self) -> bool:
        return bool(self._pending)

    def values(self) -> Collection[_Pending]:
        return self._pending.values()

    def keys(self) -> list[tuple[int, int, int]]:
        """The fire attempts claimed: (job, fire, attempt)."""
        return list(self._pending)

    def sent(self, pend: _Pending) -> None:
        """A claim went into a store batch (invariant 1)."""
        self._pending[(pend.job_id, pend.scheduled_for, pend.attempt)] = pend

    def answered(self, job_id: int, fire: int, attempt: int) -> _Pending | None:
        """The store answered the claim of this fire attempt: taken out
        (None: not on its way from here)."""
        return self._pending.pop((job_id, fire, attempt), None)

    def orphan(self, worker_id: str) -> None:
        """The worker went away: its claims are meant for none (invariant 2)."""
        for pend in self._pending.values():
            if pend.worker_id == worker_id:
                pend.worker_id = None

    def drop(self, gone: Callable[[int], bool]) -> list[_Pending]:
        """Drop the claims of the jobs ``gone`` names (a hand-over): returned."""
        dropped = []
        for key, pend in list(self._pending.items()):
            if gone(pend.job_id):
                del self._pending[key]
                dropped.append(pend)
        return dropped


class Held:
    """Runs claimed ahead of their fire's due time (``claim_ahead_ms``),
    answered and waiting READY, with no lease, until that time: by due
    time, each with the worker whose credit its claim reserved and keeps
    reserved ("" for none). The dispatcher deals them at their time."""

    __slots__ = ("_heap",)

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, str]] = []

    def __bool__(self) -> bool:
        return bool(self._heap)

    def next_due(self) -> int | None:
        return self._heap[0][0] if self._heap else None

    def hold(self, due: int, run_id: int, worker_id: str) -> None:
        heapq.heappush(self._heap, (due, run_id, worker_id))

    def take_due(self, now_ms: int) -> list[tuple[int, str]]:
        """(run id, reserved worker) of the runs due by ``now_ms``, taken out."""
        heap = self._heap
        out: list[tuple[int, str]] = []
        while heap and heap[0][0] <= now_ms:
            _, run_id, worker_id = heapq.heappop(heap)
            out.append((run_id, worker_id))
        return out

    def orphan(self, worker_id: str) -> None:
        """The worker went away: the runs held for it are meant for none
        (its reservations went with it; a worker of that id connecting
        again starts with none)."""
        if any(w == worker_id for _, _, w in self._heap):
            self._heap = [(t, r, "" if w == worker_id else w) for t, r, w in self._heap]
            heapq.heapify(self._heap)
