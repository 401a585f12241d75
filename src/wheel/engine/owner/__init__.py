"""The shard owner: wheel's scheduling logic as a pure state machine.

The owner is fed events -- the clock advanced, a job was submitted or changed,
a worker said hello / acked / heartbeated / completed / went away, the store
answered a claim or a completion -- and appends what must happen to an
``Actions`` accumulator: store writes, assignments and revokes for workers,
results for completions. It never reads a clock, never sleeps, never does I/O;
``now_ms`` is always an argument. The node (``wheel.node``) executes actions
in this order per loop iteration: completions, missed fires, schedule
advances, claims, starts; then it feeds the store's answers back in
(``wheel.engine.driver`` is that loop, without the I/O).

Shards come and go (``add_shards``, ``remove_shards``): everything the owner
keeps is filed under its shard, and a shard is taken on or handed over whole.
``Owner`` composes parts that own their state, each held as a field and
called through its methods:

- ``runs`` (``_runtable``): the runs' phases, the transition table, grace
  leases and lease timers;
- ``book`` (``_jobs`` on ``_packed``): the jobs, at rest as packed rows or
  awake as objects, their FIRE timers and the fire path (catch-up, overlap,
  the schedule moved on in the store);
- ``dispatcher`` (``_dispatch``): the work queued by route, claims formed
  within the workers' credit and the overdue budget, runs handed out;
- ``ends`` (``_runs``): run endings and what follows the store's answer
  (retries, re-dispatch through the reaper), lease and timeout timers;
- ``streams`` (``_workers``): the workers' messages on their lease streams;
- ``shard_moves`` (``_shards``): shards gained and lost, each whole;
- ``shard_map`` (``_shardmap``): the shards held, their epochs, fence
  counters and tables of jobs; ``workers`` (``_fleet``): the connected
  workers, their credit and the runs they hold; ``claims`` (``_claims``):
  claims on their way to the store; ``keywaits`` (``_keywaits``, held by
  the dispatcher): claims waiting for a permit of their concurrency key;
  ``redos`` (``_redos``): retries waiting
  out their backoff and lost runs' fires waiting for the reaper;
  ``tenants`` (``_tenants``): the tenant limits.

Where two parts call each other the seam is explicit: the book queues the
fires it admits with the dispatcher and asks the run endings (a small
``RunEnds`` protocol) to end a cancelled job's runs; the dispatcher, the
run endings and the rest reach the jobs through the book.

Invariants (each has a test in tests/engine/test_owner.py):

1. No silent drop. Every fire that comes due ends in exactly one of: a claim
   (an execution row), a missed record with its reason, or a buffered entry
   that later ends in one of those.
2. Never early. A run is handed out no earlier than its fire's (jittered)
   due time. A fire is claimed once a FIRE timer for that time expired, or
   one set ``claim_ahead_ms`` before it when no jitter moves it, its instant
   is a burst's (``claim_ahead_min`` fires armed there: ``_Shelf._ahead``)
   and nothing of its job is going on (``_Shelf.fires_now``); such a run waits in the
   dispatcher's ``held`` until its time. The wheel never fires a timer
   before its deadline.
3. Schedules only move forward, in order. Per job, claims that advance the
   schedule are emitted in fire order, and each carries the owner's belief of
   the store's ``next_run_at`` as the compare-and-swap's expected value
   (``_Job.store_next``), so a stale owner never moves a schedule backwards.
4. One holder per run. A run is held by at most one worker; an ack, renewal
   or completion is accepted only from that worker with that fence. The store
   re-checks every completion's fence: the owner's check is a filter, the
   store's is the authority.
5. Fences strictly increase per shard: ``(epoch << 32) | counter``.
6. Per-job serialization. A job has at most ``overlap.max_concurrent`` runs
   in flight (1 unless the policy is ``allow``); a newer attempt of the same
   fire is only created after the older one was made terminal (lost, failed,
   timed out) in the store. Runs claimed ahead (``claim_now``: triggers and
   backfills) count as in flight from their claim, and are handed out only
   while fewer than that many runs of the job are held by workers.
7. A run leaves the owner only through a terminal state sent to the store.

Run lifecycle: see ``wheel.engine.owner._runtable`` (the phases, their
transition table, and how grace leases wait in one FIFO instead of the
wheel). A READY run has no lease and no timeout running: it waits for a
worker of its route, and its timeout starts when one gets it.

Routing: a job's route is (pool, handler). A run goes only to a worker that
serves the pool and registered the handler (a worker that registered no
handler names takes any). Work whose route no connected worker serves waits
unclaimed -- no grace lease, no attempt used -- and is reported by
``unserved`` (an alert once it has waited ``unserved_alert_ms``).

Timer ids pack a kind into the low two bits: ``(n << 2) | kind`` where n is a
job id (FIRE), a run id (LEASE, TIMEOUT) or a retry sequence number (RETRY).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from wheel.engine.calendars import Calendar
from wheel.engine.jobtable import Columns
from wheel.engine.model import JobState
from wheel.engine.owner._calendars import put_calendar, put_calendars
from wheel.engine.owner._claims import Claims
from wheel.engine.owner._dispatch import Dispatcher
from wheel.engine.owner._fleet import Fleet
from wheel.engine.owner._jobs import FireHold, JobBook
from wheel.engine.owner._redos import Redo, Redos
from wheel.engine.owner._runs import RunEndings
from wheel.engine.owner._runtable import RunTable
from wheel.engine.owner._shardmap import ShardMap
from wheel.engine.owner._shards import ShardMoves
from wheel.engine.owner._state import Due
from wheel.engine.owner._tenants import Tenants
from wheel.engine.owner._values import (
    COUNTER_BITS,
    COUNTER_MASK,
    FIRE,
    LEASE,
    RETRY,
    TIMEOUT,
    Actions,
    Alert,
    Assignment,
    CompletionResult,
    Outcome,
    OwnerConfig,
    OwnerStats,
    PackedJob,
    Phase,
    ProtocolViolation,
    Report,
    Revoke,
    RevokeReason,
    Route,
    RunNote,
    RunRef,
    ShardContents,
    TenantLimit,
    Unserved,
    WorkerView,
)
from wheel.engine.owner._workers import WorkerStreams
from wheel.engine.profiles import Profile
from wheel.engine.records import ClaimOutcome, CompletionOutcome, JobRecord, RowChanges
from wheel.engine.timerwheel import TimerWheel

__all__ = [
    "COUNTER_BITS",
    "COUNTER_MASK",
    "FIRE",
    "LEASE",
    "RETRY",
    "TIMEOUT",
    "Actions",
    "Alert",
    "Assignment",
    "CompletionResult",
    "Due",
    "FireHold",
    "Outcome",
    "Owner",
    "OwnerConfig",
    "OwnerStats",
    "PackedJob",
    "Phase",
    "ProtocolViolation",
    "Redo",
    "Report",
    "Revoke",
    "RevokeReason",
    "Route",
    "RunNote",
    "RunRef",
    "ShardContents",
    "TenantLimit",
    "Unserved",
    "WorkerView",
]


class Owner:
    """Owns a set of shards: their jobs' pending fires, in-flight runs and
    leases. It composes the parts below and calls each through its methods;
    its own methods are what the driver, the node and the tests call."""

    __slots__ = (
        "book",
        "claims",
        "config",
        "dispatcher",
        "ends",
        "jobs",
        "profiles",
        "redos",
        "runs",
        "shard_map",
        "shard_moves",
        "stats",
        "streams",
        "tenants",
        "wheel",
        "workers",
    )

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
        config = self.config = config or OwnerConfig()
        wheel = self.wheel = TimerWheel(now_ms)
        self.stats = OwnerStats()
        # The runs held, their phases and leases (``_runtable``).
        self.runs = RunTable(wheel)
        # The connected workers, their credit and the runs they hold (``_fleet``).
        self.workers = Fleet()
        # The shards held: epochs, fence counters, tables of jobs (``_shardmap``).
        self.shard_map = ShardMap(epochs)
        # Claims sent to the store and not answered yet (``_claims``).
        self.claims = Claims()
        # Retries waiting out their backoff, lost runs' fires waiting for
        # the reaper (``_redos``).
        self.redos = Redos(wheel, config.reaper_rate_per_s, config.reaper_burst, now_ms)
        # Tenant limits: each limited tenant's fire bucket and the runs its
        # workers hold (``_tenants``).
        self.tenants = Tenants()
        # The jobs, at rest and awake, and the fire path (``_jobs``, ``_packed``).
        book = self.book = JobBook(
            config=config,
            wheel=wheel,
            shard_map=self.shard_map,
            runs=self.runs,
            claims=self.claims,
            redos=self.redos,
            stats=self.stats,
            now_ms=now_ms,
        )
        # The book's awake jobs and profiles, read where the owner is at hand.
        self.jobs = book.jobs
        self.profiles = book.profiles
        # The work queued for workers and its hand-out (``_dispatch``).
        self.dispatcher = Dispatcher(
            book,
            config=config,
            wheel=wheel,
            runs=self.runs,
            workers=self.workers,
            tenants=self.tenants,
            claims=self.claims,
            shard_map=self.shard_map,
            redos=self.redos,
            stats=self.stats,
            now_ms=now_ms,
        )
        # Run endings and what follows them (``_runs``).
        self.ends = RunEndings(
            book=book,
            config=config,
            dispatcher=self.dispatcher,
            redos=self.redos,
            runs=self.runs,
            stats=self.stats,
            tenants=self.tenants,
            workers=self.workers,
        )
        # The book's two-way seams: the fires it admits are queued with the
        # dispatcher, and a cancel ends the job's runs.
        book.dispatcher = self.dispatcher
        book.ends = self.ends
        # The workers' messages (``_workers``) and shards gained and lost
        # (``_shards``).
        self.streams = WorkerStreams(
            book=book,
            claims=self.claims,
            config=config,
            dispatcher=self.dispatcher,
            ends=self.ends,
            runs=self.runs,
            stats=self.stats,
            workers=self.workers,
        )
        self.shard_moves = ShardMoves(
            book=book,
            claims=self.claims,
            config=config,
            dispatcher=self.dispatcher,
            ends=self.ends,
            redos=self.redos,
            runs=self.runs,
            shard_map=self.shard_map,
            tenants=self.tenants,
            wheel=wheel,
            workers=self.workers,
        )

    def advance(self, now_ms: int, acts: Actions, *, release_held: bool = True) -> None:
        """Fire every timer due at ``now_ms``, then hand out what workers can
        take. ``release_held``: runs claimed ahead whose time has come go out
        too (the node's loop leaves them to its tick's round, so that a tick's
        runs reach a worker in one message, not one a round)."""
        book, ends = self.book, self.ends
        # 1. Claims made with no Actions at hand (a backfill) go out now.
        if book.later.claims:
            acts.claims.extend(book.later.claims)
            book.later.claims.clear()
        # 2. Grace leases due become wheel timers (the run table); jobs at
        #    rest coming due get their FIRE timers (the book).
        self.runs.expire_grace(now_ms)
        if now_ms + self.config.arm_ahead_ms >= book.next_unarmed:
            book.arm_ahead(now_ms)
        # 3. The wheel's due timers, by kind: a job's fire (the book), a
        #    run's lease or timeout (the run endings), a retry's backoff (``redos``).
        fired = 0  # added to the stats once: a local costs less per fire
        for tid in self.wheel.advance(now_ms):
            kind, n = tid & 3, tid >> 2
            if kind == FIRE:
                job = book.jobs.get(n) or book.wake_to_fire(n, now_ms)
                if (
                    job is not None
                    and not job.paused
                    and job.next_fire is not None
                    and book.fires_now(job, now_ms)
                ):
                    fired += 1
                    book.on_fire(job, now_ms, acts)
            elif kind == LEASE:
                ends.on_lease_timer(n, now_ms, acts)
            elif kind == TIMEOUT:
                ends.on_timeout(n, now_ms, acts)
            else:
                ends.on_retry(n, now_ms)
        if fired:
            self.stats.fires += fired
        # 4. Lost runs' fires the reaper may send again, then everything
        #    queued that workers have credit for (the dispatcher).
        ends.run_reaper(now_ms, acts)
        self.dispatcher.dispatch(now_ms, acts, release_held=release_held)
        # 5. Jobs whose work is over go back to rest as rows (the book).
        if book.settling:
            book.settle(now_ms)

    # -- timers and the loop's wake-ups ---------------------------------------------

    def next_timer(self) -> int | None:
        """The earliest deadline of a timer: the wheel's, or a grace lease's."""
        deadline = self.wheel.next_deadline()
        grace = self.runs.next_grace()
        if grace is not None and (deadline is None or grace < deadline):
            return grace
        return deadline

    def pending_timers(self) -> int:
        """Timers pending: the wheel's, grace leases of runs not ended, and
        the FIRE timers of jobs at rest not armed in the wheel yet."""
        return len(self.wheel) + self.runs.graced + self.book.unarmed_fires()

    def next_deadline(self) -> int | None:
        """When the node should call ``advance`` next (None: only on events):
        the wheel's next timer, the next job at rest to arm, or sooner when
        the dispatcher's budgeted or waiting work is due (``next_wake``)."""
        waits = (self.next_timer(), self.book.next_arming(), self.dispatcher.next_wake())
        return min((w for w in waits if w is not None), default=None)

    # -- dispatch (``Dispatcher``) ------------------------------------------------

    def has_dispatchable_work(self) -> bool:
        """Whether ``advance(now)`` would hand out or claim something right away."""
        return self.dispatcher.has_dispatchable_work()

    def on_claimed(self, outcomes: Sequence[ClaimOutcome], now_ms: int, acts: Actions) -> None:
        """The store's answer to a claim batch."""
        self.dispatcher.on_claimed(outcomes, now_ms, acts)

    def permit_freed(self, tenant: str, key: str) -> bool:
        """A permit of the key came back in the store: its claims waiting
        here go out at once (``KeyWaits.freed``); whether any wait."""
        return self.dispatcher.keywaits.freed(tenant, key)

    def handing_off(self, claims: bool) -> bool:
        """A permit of a concurrency key is being handed to claims waiting
        here; ``claims``: claims wait for a store batch
        (``Dispatcher.handing_off``)."""
        return self.dispatcher.handing_off(claims)

    def batch_taken(self) -> None:
        """The claims made so far went into one store batch."""
        self.dispatcher.batch_taken()

    def unserved(self) -> list[Unserved]:
        """Work waiting because no connected worker serves its route."""
        return self.dispatcher.unserved()

    def limit_waiting(self) -> dict[tuple[str, str], int]:
        """Claims waiting for a permit of their concurrency key, by (tenant,
        key) (``_keywaits``)."""
        return self.dispatcher.keywaits.waiting()

    def backlog(self) -> tuple[int, int]:
        """Queued work: (fresh fires and claimed runs waiting, overdue fires)."""
        return self.dispatcher.backlog()

    # -- jobs (``JobBook``) ------------------------------------------------------

    def has_job(self, job_id: int) -> bool:
        return self.book.has_job(job_id)

    def job_count(self) -> int:
        return self.book.job_count()

    def awake_count(self) -> int:
        return self.book.awake_count()

    def job_ids(self) -> list[int]:
        return self.book.job_ids()

    def unarmed_fires(self) -> int:
        """Jobs at rest with a fire due after the stretch armed in the wheel."""
        return self.book.unarmed_fires()

    def packed_bytes(self) -> int:
        """What the tables of jobs at rest take (their arrays' memory)."""
        return self.book.packed_bytes()

    def profile(self, profile_id: int) -> Profile | None:
        return self.book.profile(profile_id)

    def image_of(self, job_id: int) -> PackedJob | None:
        """A job as it rests (None: the job is gone): what a checkpoint keeps."""
        return self.book.image_of(job_id)

    def take_dirty(self) -> set[int]:
        return self.book.take_dirty()

    def snapshot_columns(self, shard: int) -> Columns | None:
        return self.book.snapshot_columns(shard)

    def next_arming(self) -> int | None:
        """When the book has timers to arm next (None: no job at rest comes due)."""
        return self.book.next_arming()

    def add_rest(self, packed: Mapping[int, Columns], profiles: Sequence[Profile]) -> int:
        return self.book.add_rest(packed, profiles)

    def upsert_job(self, record: JobRecord, now_ms: int, acts: Actions) -> None:
        """A job as the store has it now (submitted, changed, or reloaded). Store wins."""
        self.book.upsert_job(record, now_ms, acts)

    def upsert(
        self,
        job_id: int,
        state: JobState,
        next_run_at: int | None,
        prof: int,
        param: int,
        has_payload: bool,
        now_ms: int,
        acts: Actions,
    ) -> None:
        self.book.upsert(job_id, state, next_run_at, prof, param, has_payload, now_ms, acts)

    def hold_fires(self, job_id: int) -> FireHold | None:
        return self.book.hold_fires(job_id)

    def release_fires(self, job_id: int, hold: FireHold, now_ms: int) -> None:
        self.book.release_fires(job_id, hold, now_ms)

    def respecify(self, record: JobRecord, now_ms: int, acts: Actions) -> None:
        self.book.respecify(record, now_ms, acts)

    def cancel_job(self, job_id: int, acts: Actions, now_ms: int | None = None) -> None:
        self.book.cancel_job(job_id, acts, now_ms)

    def record_paused_fires(
        self, job_id: int, paused_from_ms: int, resumed_at_ms: int, acts: Actions
    ) -> None:
        """Fires that came due while a job was paused become missed records."""
        self.book.record_paused_fires(job_id, paused_from_ms, resumed_at_ms, acts)

    def claim_now(
        self,
        job_id: int,
        fires: Sequence[int],
        now_ms: int,
        acts: Actions,
        *,
        overdue: bool = False,
        attempts: Sequence[int] | None = None,
    ) -> None:
        self.book.claim_now(job_id, fires, now_ms, acts, overdue=overdue, attempts=attempts)

    def trigger(self, job_id: int, now_ms: int, acts: Actions) -> int:
        return self.book.trigger(job_id, now_ms, acts)

    def backfill(
        self, job_id: int, fires: Sequence[int], now_ms: int, acts: Actions | None = None
    ) -> None:
        self.book.backfill(job_id, fires, now_ms, acts)

    def redrive(
        self, job_id: int, fires: Sequence[tuple[int, int]], now_ms: int, acts: Actions
    ) -> None:
        self.book.redrive(job_id, fires, now_ms, acts)

    def next_fires(self, job_id: int, count: int) -> list[int]:
        return self.book.next_fires(job_id, count)

    # -- runs ending (``RunEndings``) ---------------------------------------------

    def on_completed(
        self, outcomes: Sequence[CompletionOutcome], now_ms: int, acts: Actions
    ) -> None:
        """The store's answer to a completion batch: follow-ups for applied ones."""
        self.ends.on_completed(outcomes, now_ms, acts)

    @property
    def reaper_paused(self) -> bool:
        return self.ends.reaper_paused

    # -- workers' messages (``WorkerStreams``) -------------------------------------

    def worker_hello(
        self,
        worker_id: str,
        capacity: int,
        pools: Sequence[str],
        now_ms: int,
        acts: Actions,
        *,
        handlers: Sequence[str] = (),
    ) -> None:
        self.streams.worker_hello(worker_id, capacity, pools, now_ms, acts, handlers=handlers)

    def worker_capacity(self, worker_id: str) -> int | None:
        return self.streams.worker_capacity(worker_id)

    def worker_drain(self, worker_id: str) -> None:
        self.streams.worker_drain(worker_id)

    def worker_credit(
        self, worker_id: str, add: int, now_ms: int, acts: Actions, *, seq: int = 0
    ) -> None:
        self.streams.worker_credit(worker_id, add, now_ms, acts, seq=seq)

    def worker_disconnect(self, worker_id: str) -> None:
        self.streams.worker_disconnect(worker_id)

    def worker_views(self) -> list[WorkerView]:
        return self.streams.worker_views()

    def worker_ack(
        self, worker_id: str, refs: Sequence[tuple[int, int]], now_ms: int, acts: Actions
    ) -> None:
        self.streams.worker_ack(worker_id, refs, now_ms, acts)

    def worker_heartbeat(
        self, worker_id: str, refs: Sequence[tuple[int, int]], now_ms: int, acts: Actions
    ) -> None:
        """One stream-level heartbeat renews every run the worker holds."""
        self.streams.worker_heartbeat(worker_id, refs, now_ms, acts)

    def worker_complete(
        self,
        worker_id: str,
        completions: Sequence[tuple[int, int, Outcome, str]],
        now_ms: int,
        acts: Actions,
        *,
        ran_ms: Mapping[int, int] | None = None,
        results: Mapping[int, str] | None = None,
        retry_after_ms: Mapping[int, int] | None = None,
    ) -> None:
        """``ran_ms``, ``results`` and ``retry_after_ms``: by run id, see
        ``WorkerStreams.worker_complete``."""
        self.streams.worker_complete(
            worker_id,
            completions,
            now_ms,
            acts,
            ran_ms=ran_ms,
            results=results,
            retry_after_ms=retry_after_ms,
        )

    # -- shards gained and lost (``ShardMoves``) -----------------------------------

    def owns(self, job_id: int) -> bool:
        return self.shard_moves.owns(job_id)

    def shards(self) -> Mapping[int, int]:
        return self.shard_moves.shards()

    def add_shards(
        self, epochs: Mapping[int, int], contents: ShardContents, now_ms: int, acts: Actions
    ) -> None:
        self.shard_moves.add_shards(epochs, contents, now_ms, acts)

    def apply_rows(
        self, changes: RowChanges, now_ms: int, acts: Actions, ours: set[int] | None = None
    ) -> None:
        self.shard_moves.apply_rows(changes, now_ms, acts, ours)

    def remove_shards(self, shards: Collection[int]) -> list[RunRef]:
        return self.shard_moves.remove_shards(shards)

    # -- tenant limits (``Tenants``) ----------------------------------------------

    def set_tenant_limits(self, limits: Mapping[str, TenantLimit], now_ms: int) -> None:
        """Replace every tenant's limits (a tenant not named has none); the
        runs held by workers are counted afresh."""
        counted = self.tenants.set_limits(limits, now_ms)
        if counted:
            for run in self.runs.values():
                if run.held_out:
                    job = self.book.jobs.get(run.job_id) or self.book.job(run.job_id)
                    if job is not None and job.spec.tenant in counted:
                        self.tenants.hold(run.run_id, job.spec.tenant)

    def set_calendar(
        self, tenant: str, name: str, calendar: Calendar | None, now_ms: int, acts: Actions
    ) -> int:
        """A calendar as it is now (None: deleted): the jobs skipping it are
        compiled again and re-armed where their next fire moved (how many)."""
        return put_calendar(self.book, tenant, name, calendar, now_ms, acts)

    def set_calendars(
        self, calendars: Mapping[tuple[str, str], Calendar], now_ms: int, acts: Actions
    ) -> int:
        """Every calendar as the store has them (a load, a refresh)."""
        return put_calendars(self.book, calendars, now_ms, acts)

    def calendar_count(self) -> int:
        return len(self.book.calendars)

    def tenant_limits(self) -> dict[str, TenantLimit]:
        return dict(self.tenants.limits)

    def tenant_in_flight(self, tenant: str) -> int:
        """Runs of ``tenant`` held by workers (counted for limited tenants only)."""
        return self.tenants.in_flight(tenant)
