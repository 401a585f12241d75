"""The shard owner's state: the records it keeps per job, run, worker and
shard, and the base every part of the owner shares (``_OwnerState``).

Eight parts own their state and are reached through their methods: the run
table (``runs``, ``_runtable``), the tenant limits (``tenants``,
``_tenants``), the shards held (``shard_map``, ``_shardmap``), the fires
to run again (``redos``, ``_redos``), the connected workers (``workers``,
``_fleet``), the claims on their way to the store (``claims``,
``_claims``), the work queued for workers (``dispatcher``, ``_dispatch``:
routing, claims formed and hand-out) and the jobs (``book``, ``_jobs`` on
``_packed``: jobs at rest and awake, arming, the fire path). The rest of
the logic is split by seam into traits that still share this state:
``_workers`` (the lease streams), ``_runs`` (run endings and what follows
them) and ``_shards`` (gaining and losing shards). What one trait calls in
another is declared here, so each seam shows what crosses it.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, NamedTuple

from mypy_extensions import trait

from wheel.engine.model import RunState, shard_of
from wheel.engine.owner._claims import Claims
from wheel.engine.owner._fleet import Fleet
from wheel.engine.owner._redos import Redos
from wheel.engine.owner._runtable import RunTable, _Run
from wheel.engine.owner._shardmap import ShardMap
from wheel.engine.owner._tenants import Tenants
from wheel.engine.owner._values import (
    Actions,
    OwnerConfig,
    OwnerStats,
    Route,
)
from wheel.engine.profiles import Profiles
from wheel.engine.schedule import CompiledSchedule
from wheel.engine.spec import JobSpec, OverlapPolicy
from wheel.engine.timerwheel import TimerWheel

if TYPE_CHECKING:
    from wheel.engine.owner._dispatch import Dispatcher
    from wheel.engine.owner._jobs import JobBook
    from wheel.engine.owner._values import RevokeReason

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
        # or a re-dispatch of it follows (``_Runs.on_completed``).
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


@trait
class _Parts:
    """What every part of the owner shares: its state (declared here, set by
    ``_OwnerState``) and what each part offers the others (declared here,
    defined by the part named), so each seam shows what crosses it. A trait
    (mypyc's word for a mixin base): the parts are compiled classes, and a
    compiled class has one base class and any number of traits."""

    # Slots, not an instance dict (the pure-Python build): past 30 attributes
    # an instance dict stops sharing its keys and every ``self.x`` on the
    # dispatch path becomes a dict lookup (measured: 4% more instructions per
    # dispatch).
    __slots__ = (
        "book",
        "claims",
        "config",
        "dispatcher",
        "jobs",
        "profiles",
        "redos",
        "runs",
        "shard_map",
        "stats",
        "tenants",
        "wheel",
        "workers",
    )

    # The state, set by ``_OwnerState.__init__`` (see there).
    config: OwnerConfig
    wheel: TimerWheel
    jobs: dict[int, _Job]
    profiles: Profiles
    runs: RunTable
    workers: Fleet
    stats: OwnerStats
    shard_map: ShardMap
    claims: Claims
    redos: Redos
    tenants: Tenants
    dispatcher: Dispatcher
    book: JobBook

    # What one part calls in another, defined by the part named.
    # _runs
    def end_run(
        self,
        run: _Run,
        state: RunState,
        error: str | None,
        acts: Actions,
        now_ms: int,
        *,
        reply_to: str | None = None,
        started_at_ms: int | None = None,
    ) -> None:
        raise NotImplementedError

    def revoke(self, run: _Run, reason: RevokeReason, acts: Actions) -> None:
        raise NotImplementedError

    def _lose(
        self, run: _Run, why: str, now_ms: int, acts: Actions, *, reply_to: str | None = None
    ) -> None:
        raise NotImplementedError

    def _take_back(self, run: _Run, now_ms: int) -> None:
        raise NotImplementedError


class _OwnerState(_Parts):
    """The state every part of the owner shares (the base class of ``Owner``;
    the parts are its traits)."""

    __slots__ = ()

    def __init__(
        self,
        *,
        epochs: dict[int, int] | None = None,
        now_ms: int,
        config: OwnerConfig | None = None,
    ) -> None:
        """An owner of the shards in ``epochs`` (shard -> epoch), empty until
        ``add_shards`` gives it jobs and runs; more shards come and go with
        ``add_shards`` and ``remove_shards``."""
        self.config = config or OwnerConfig()
        self.wheel = TimerWheel(now_ms)
        # The runs held, their phases and leases (``_runtable``).
        self.runs = RunTable(self.wheel)
        # The connected workers, their credit and the runs they hold (``_fleet``).
        self.workers = Fleet()
        self.stats = OwnerStats()
        # The shards held: epochs, fence counters, tables of jobs (``_shardmap``).
        self.shard_map = ShardMap(epochs)
        # Claims sent to the store and not answered yet (``_claims``).
        self.claims = Claims()
        # Retries waiting out their backoff, lost runs' fires waiting for
        # the reaper (``_redos``).
        self.redos = Redos(
            self.wheel, self.config.reaper_rate_per_s, self.config.reaper_burst, now_ms
        )
        # Tenant limits: each limited tenant's fire bucket and the runs its
        # workers hold (``_tenants``).
        self.tenants = Tenants()
