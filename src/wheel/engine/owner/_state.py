"""The records the shard owner keeps per job (``_Job``) and the small
helpers its parts share about them. The parts themselves are in their own
modules (see ``wheel.engine.owner``).
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple, Protocol

from wheel.engine.model import shard_of
from wheel.engine.owner._values import Route
from wheel.engine.schedule import CompiledSchedule
from wheel.engine.spec import JobSpec, OverlapPolicy

# A fire a job is to claim: (scheduled_for, attempt, whether its claim moves
# the schedule). Plain tuples, unpacked where read: one is made per fire.
Due = tuple[int, int, bool]


def _moves(due: Due) -> bool:
    """Its claim moves the schedule (a fire's first attempt, not a retry)."""
    return due[2]


def _retry(due: Due) -> bool:
    """A later attempt of a fire that already ran."""
    return due[1] > 0


class Ahead(NamedTuple):
    """A run claimed ahead of any worker (a trigger, a backfill)."""

    run_id: int
    overdue: bool


class _Job:
    __slots__ = (
        "advancing",
        "buffered",
        "cancelled",
        "compiled",
        "due",
        "ending",
        "has_payload",
        "inflight",
        "job_id",
        "limit",
        "moved_past",
        "next_fire",
        "param",
        "paused",
        "profile",
        "queued",
        "ready",
        "route",
        "running",
        "shard",
        "skipped",
        "spec",
        "store_next",
    )

    def __init__(
        self,
        job_id: int,
        spec: JobSpec,
        compiled: CompiledSchedule,
        profile: int,
        param: int,
        has_payload: bool,
    ) -> None:
        self.job_id = job_id
        self.shard = shard_of(job_id)
        # The profile's template (wheel.engine.profiles): shared by every job
        # of the profile, with no name, no payload and the schedule's own
        # instant zeroed (``param`` holds it; ``compiled`` has it).
        self.spec = spec
        self.profile = profile
        self.param = param
        # The claim that dispatches it reads its payload from the store.
        self.has_payload = has_payload
        self.compiled = compiled
        self.limit = _limit(spec)
        self.route: Route = (spec.pool, spec.handler)
        self.paused = False
        # Cancelled: nothing of it runs any more (``paused`` is set too).
        self.cancelled = False
        # What the store's next_run_at is (or will be once our pending writes land).
        self.store_next: int | None = None
        # The latest fire this owner's own writes moved the store's
        # next_run_at past (a claim that advances the schedule, a schedule
        # advance; -1: none). The store never moves it back to such a fire:
        # a row saying so was read before those writes landed
        # (``JobBook.upsert``).
        self.moved_past = -1
        # The next nominal fire armed in the wheel (None: nothing armed).
        self.next_fire: int | None = None
        # Fires ready to claim.
        self.due: deque[Due] = deque()
        # Fires held back by buffer_one / buffer_all while a run is going.
        self.buffered: deque[int] = deque()
        # Fires skipped by the overlap policy whose missed record waits for the
        # store write that moves next_run_at past them (``JobBook.flush_skipped``).
        self.skipped: list[int] = []
        # Runs of this job whose terminal state is on its way to the store.
        # A fire that comes due while only such runs are in the way is held
        # (in ``buffered``) until the store answers, not skipped as overlap:
        # the run has ended, but the owner cannot know yet whether a retry
        # or a re-dispatch of it follows (``RunEndings.on_completed``).
        self.ending = 0
        # Runs of this job in flight (claiming .. ending) + pending retries.
        self.inflight = 0
        # Claims that move next_run_at, sent to the store and not answered yet.
        self.advancing = 0
        # Runs claimed ahead of any worker (``claim_now``: triggers and
        # backfills), in fire order, waiting to be handed out.
        self.ready: deque[Ahead] = deque()
        # Runs handed out (or restored) whose terminal state the store has
        # not applied yet: what per-job serialization bounds.
        self.running = 0
        self.queued = False


def _limit(spec: JobSpec) -> int:
    """How many runs of a job may be in flight at once (per-job serialization)."""
    overlap = spec.overlap
    return overlap.max_concurrent if overlap.policy is OverlapPolicy.ALLOW else 1


def _fence_mismatch(given: int, current: int) -> str:
    """Why a message about a run with the wrong fence is refused: an older
    fence is stale (a newer attempt superseded it); a newer one was never
    issued for this run, so it simply does not match."""
    if given < current:
        return f"stale fence {given}: the run's fence is now {current}"
    return f"fence {given} does not match the run's fence {current}"


class Queues(Protocol):
    """What the job book asks of the dispatcher (``_dispatch.Dispatcher``):
    queue a job's due work, take it out, queue its next piece."""

    def enqueue(self, job: _Job, now_ms: int, *, overdue: bool, front: bool = False) -> None: ...

    def unqueue(self, job: _Job) -> None: ...

    def requeue_job(self, job: _Job, now_ms: int) -> None: ...
