"""The shard owner: wheel's scheduling logic as a pure state machine.

The owner is fed events -- the clock advanced, a job was submitted or changed,
a worker said hello / acked / heartbeated / completed / went away, the store
answered a claim or a completion -- and appends what must happen to an
``Effects`` accumulator: store writes, assignments and revokes for workers,
results for completions. It never reads a clock, never sleeps, never does I/O;
``now_ms`` is always an argument. The node (``wheel.node``) executes effects
in this order per loop iteration: completions, missed fires, schedule
advances, claims, starts; then it feeds the store's answers back in.

Invariants (each has a test in tests/engine/test_owner.py):

1. No silent drop. Every fire that comes due ends in exactly one of: a claim
   (an execution row), a missed record with its reason, or a buffered entry
   that later ends in one of those.
2. Never early. A fire is claimed only after a FIRE timer for its (jittered)
   due time expired; the wheel never fires a timer before its deadline.
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

Run lifecycle (``_RUN_TRANSITIONS`` is the table; ``_move`` enforces it):

    CLAIMING --claim won--> DISPATCHED (grace lease) --ack--> RUNNING (full lease)
    CLAIMING --worker gone, or claimed ahead--> READY --assigned--> DISPATCHED
    DISPATCHED/RUNNING --handed back, never started--> READY
    DISPATCHED/RUNNING --complete / lease expired / timeout / cancel--> ENDING
    ENDING --store applied--> (gone)

A READY run has no lease and no timeout running: it waits for a worker of its
route, and its timeout starts when one gets it.

Routing: a job's route is (pool, handler). A run goes only to a worker that
serves the pool and registered the handler (a worker that registered no
handler names takes any). Work whose route no connected worker serves waits
unclaimed -- no grace lease, no attempt used -- and is reported by
``unserved`` (an alert once it has waited ``unserved_alert_ms``).

Timer ids pack a kind into the low two bits: ``(n << 2) | kind`` where n is a
job id (FIRE), a run id (LEASE, TIMEOUT) or a retry sequence number (RETRY).

A run's first grace lease is not a wheel timer of its own. Runs handed out
in one tick share a grace deadline, and those deadlines only grow, so they
wait in one FIFO (``_grace``), a list of run ids per deadline. Most runs end
within their grace lease and never touch the wheel: no LEASE or TIMEOUT to
add, none to cancel. A run still in flight at its grace deadline is checked
then and, if its lease was renewed, gets its own LEASE and TIMEOUT timers
(``_arm_run``). A run whose timeout falls within the grace lease gets them at
once, so no deadline is ever checked late.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum

from wheel.engine.fairness import FairQueue, TokenBucket, split_capacity
from wheel.engine.model import (
    SHARD_COUNT,
    JobState,
    MissedReason,
    RunState,
    idempotency_key,
    shard_of,
)
from wheel.engine.policy import CatchUpStream, retry_delay_ms, should_retry
from wheel.engine.records import (
    ClaimOutcome,
    Completion,
    CompletionOutcome,
    ExecutionRecord,
    FireClaim,
    JobRecord,
    MissedFire,
    RunStart,
    ScheduleAdvance,
)
from wheel.engine.schedule import CompiledSchedule, compile_schedule
from wheel.engine.spec import JobSpec, OverlapPolicy, SideEffect
from wheel.engine.timerwheel import TimerWheel

log = logging.getLogger("wheel.owner")

FIRE, LEASE, TIMEOUT, RETRY = 0, 1, 2, 3
# Where a run may go: (pool, handler).
Route = tuple[str, str]
COUNTER_BITS = 32
COUNTER_MASK = (1 << COUNTER_BITS) - 1


class Phase(IntEnum):
    CLAIMING = 0
    READY = 1
    DISPATCHED = 2
    RUNNING = 3
    ENDING = 4


_RUN_TRANSITIONS: frozenset[tuple[Phase, Phase]] = frozenset(
    {
        (Phase.CLAIMING, Phase.DISPATCHED),
        (Phase.CLAIMING, Phase.READY),
        (Phase.READY, Phase.DISPATCHED),
        (Phase.DISPATCHED, Phase.RUNNING),
        (Phase.DISPATCHED, Phase.ENDING),
        (Phase.RUNNING, Phase.ENDING),
        (Phase.READY, Phase.ENDING),
        # Handed back by a worker that never started it.
        (Phase.DISPATCHED, Phase.READY),
        (Phase.RUNNING, Phase.READY),
    }
)


class Outcome(IntEnum):
    """What a worker reports about a run (mirrors the wire enum)."""

    SUCCEEDED = 1
    FAILED = 2
    RETRYABLE = 3
    # Not started: the run goes to another worker with the same attempt and
    # fence (no attempt is used; nothing ran that a fence must shut out).
    HANDED_BACK = 4
    # Started, then given up (the worker is stopping): its effect is
    # unknown, as after a lost lease.
    ABANDONED = 5


class RevokeReason(IntEnum):
    SUPERSEDED = 1
    TIMED_OUT = 2
    CANCELLED = 3
    LEASE_EXPIRED = 4


@dataclass(frozen=True, slots=True, kw_only=True)
class OwnerConfig:
    grace_lease_ms: int = 5_000
    lease_ms: int = 60_000
    # A fire dispatched this much later than due counts as catch-up work.
    overdue_after_ms: int = 2_000
    # Dispatch capacity; overdue work gets ``overdue_fraction`` of it.
    dispatch_rate_per_s: float = 100_000.0
    overdue_fraction: float = 0.2
    # Overdue tokens that may pile up while the loop is busy elsewhere (a slow
    # store pass): one second of the budget, so the loop delivers its rate
    # whatever its wake-up rhythm (``next_deadline`` wakes it for tokens too).
    overdue_burst_s: float = 1.0
    # Re-dispatch of expired leases, rate limited (seed C6/R6); one second of
    # burst, as for overdue work.
    reaper_rate_per_s: float = 500.0
    reaper_burst: int = 500
    # Above this fleet utilisation the reaper stops and alerts (seed R6).
    busy_threshold: float = 0.85
    max_claim_batch: int = 10_000
    # Upper bound on missed records listed for one catch-up or pause.
    max_missed_listed: int = 100_000
    # Work that waits this long for a worker of its route raises an alert
    # ("no worker for handler H"); workers reconnecting after a restart of
    # the node or a redeploy of the fleet stay below it.
    unserved_alert_ms: int = 10_000

    @property
    def heartbeat_interval_ms(self) -> int:
        return self.lease_ms // 3


# Not frozen: one is built per dispatch (see wheel.engine.records.FireClaim).
@dataclass(slots=True, kw_only=True)
class Assignment:
    run_id: int
    job_id: int
    handler: str
    tenant: str
    scheduled_for: int
    attempt: int
    fence: int
    payload: bytes
    lease_ms: int
    timeout_ms: int

    @property
    def idempotency_key(self) -> str:
        return idempotency_key(self.job_id, self.scheduled_for)


@dataclass(frozen=True, slots=True, kw_only=True)
class Revoke:
    run_id: int
    fence: int
    reason: RevokeReason


@dataclass(slots=True, kw_only=True)
class CompletionResult:
    run_id: int
    accepted: bool
    reason: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class ProtocolViolation:
    code: str  # gRPC status code name
    message: str
    run_id: int = 0


@dataclass(slots=True)
class Effects:
    """What the node must do, in this order: store writes, then messages."""

    completions: list[Completion] = field(default_factory=list)
    missed: list[MissedFire] = field(default_factory=list)
    advances: list[ScheduleAdvance] = field(default_factory=list)
    claims: list[FireClaim] = field(default_factory=list)
    starts: list[RunStart] = field(default_factory=list)
    assignments: dict[str, list[Assignment]] = field(default_factory=dict)
    revokes: dict[str, list[Revoke]] = field(default_factory=dict)
    results: dict[str, list[CompletionResult]] = field(default_factory=dict)
    rejected_renewals: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    violations: dict[str, list[ProtocolViolation]] = field(default_factory=dict)
    # Jobs whose store row disagrees with the owner: the node re-reads them.
    resync: set[int] = field(default_factory=set)
    alerts: list[str] = field(default_factory=list)
    # Dispatch lag samples (ms) of runs handed out.
    lags: list[int] = field(default_factory=list)

    def store_work(self) -> bool:
        return bool(self.completions or self.missed or self.advances or self.claims or self.starts)

    def take_store_work(self) -> Effects:
        """Move the store writes into a new Effects, leaving messages here."""
        out = Effects(
            completions=self.completions,
            missed=self.missed,
            advances=self.advances,
            claims=self.claims,
            starts=self.starts,
        )
        self.completions, self.missed, self.advances, self.claims, self.starts = [], [], [], [], []
        return out


class _Job:
    __slots__ = (
        "advancing",
        "buffered",
        "cancelled",
        "compiled",
        "due",
        "inflight",
        "job_id",
        "limit",
        "next_fire",
        "paused",
        "queued",
        "ready",
        "route",
        "running",
        "shard",
        "skipped",
        "spec",
        "spec_json",
        "store_next",
    )

    def __init__(
        self, job_id: int, spec: JobSpec, compiled: CompiledSchedule, spec_json: bytes
    ) -> None:
        self.job_id = job_id
        self.shard = shard_of(job_id)
        self.spec = spec
        self.spec_json = spec_json
        self.compiled = compiled
        self.limit = _limit(spec)
        self.route: Route = (spec.pool, spec.handler)
        self.paused = False
        # Cancelled: nothing of it runs any more (``paused`` is set too).
        self.cancelled = False
        # What the store's next_run_at is (or will be once our pending writes land).
        self.store_next: int | None = None
        # The next nominal fire armed in the wheel (None: nothing armed).
        self.next_fire: int | None = None
        # Fires ready to claim: (scheduled_for, attempt, advances_schedule).
        self.due: deque[tuple[int, int, bool]] = deque()
        # Fires held back by buffer_one / buffer_all while a run is going.
        self.buffered: deque[int] = deque()
        # Fires skipped by the overlap policy whose missed record waits for the
        # store write that moves next_run_at past them (``_flush_skipped``).
        self.skipped: list[int] = []
        # Runs of this job in flight (claiming .. ending) + pending retries.
        self.inflight = 0
        # Claims that move next_run_at, sent to the store and not answered yet.
        self.advancing = 0
        # Runs claimed ahead of any worker (``claim_now``: triggers and
        # backfills), in fire order, waiting to be handed out.
        self.ready: deque[tuple[int, bool]] = deque()  # (run_id, overdue)
        # Runs handed out (or restored) whose terminal state the store has
        # not applied yet: what per-job serialization bounds.
        self.running = 0
        self.queued = False


class _Run:
    __slots__ = (
        "armed",
        "attempt",
        "fence",
        "held_out",
        "job_id",
        "lease_deadline",
        "phase",
        "refused",
        "run_id",
        "scheduled_for",
        "timeout_deadline",
        "worker_id",
    )

    def __init__(
        self, run_id: int, job_id: int, scheduled_for: int, attempt: int, fence: int
    ) -> None:
        self.run_id = run_id
        self.job_id = job_id
        self.scheduled_for = scheduled_for
        self.attempt = attempt
        self.fence = fence
        self.phase = Phase.CLAIMING
        self.worker_id: str | None = None
        self.lease_deadline = 0
        self.timeout_deadline = 0
        # Handed to a worker (or restored): counted in its job's ``running``.
        self.held_out = False
        # Its LEASE and TIMEOUT deadlines are wheel timers (else its grace
        # lease waits in the owner's ``_grace`` FIFO, or it has no lease yet).
        self.armed = False
        # Workers (by incarnation) that handed it back: it does not go back
        # to them until they say hello again.
        self.refused: set[int] | None = None


class _Worker:
    __slots__ = (
        "capacity",
        "draining",
        "handlers",
        "held",
        "incarnation",
        "pools",
        "reserved",
        "silent",
        "worker_id",
    )

    def __init__(
        self,
        worker_id: str,
        capacity: int,
        pools: frozenset[str],
        handlers: frozenset[str],
        incarnation: int,
    ) -> None:
        self.worker_id = worker_id
        self.capacity = capacity
        self.pools = pools
        # Handler names it runs; empty: any.
        self.handlers = handlers
        # Which hello this is: refusals of an earlier one do not count.
        self.incarnation = incarnation
        self.held: set[int] = set()
        self.reserved = 0
        self.draining = False
        # Let a lease it held expire (stopped, partitioned, not acking): no new
        # work until it sends something again.
        self.silent = False

    @property
    def free(self) -> int:
        if self.draining or self.silent:
            return 0
        return self.capacity - len(self.held) - self.reserved

    def serves(self, route: Route) -> bool:
        return route[0] in self.pools and (not self.handlers or route[1] in self.handlers)


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerView:
    """A connected worker as status reports it."""

    worker_id: str
    capacity: int
    held: int
    pools: tuple[str, ...]
    handlers: tuple[str, ...]
    draining: bool
    silent: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class Unserved:
    """Work that waits because no connected worker serves its route."""

    pool: str
    handler: str
    waiting: int
    since_ms: int


@dataclass(slots=True)
class _Pending:
    """A claim on its way to the store."""

    job_id: int
    scheduled_for: int
    attempt: int
    fence: int
    worker_id: str | None
    # ``claim_now``: the won run waits on its job, handed out as overdue work.
    ahead: bool = False
    overdue: bool = False


@dataclass(slots=True)
class OwnerStats:
    dispatched: int = 0
    completed: int = 0
    missed: int = 0
    dead_lettered: int = 0
    lost_leases: int = 0
    timed_out: int = 0
    superseded_completions: int = 0


@dataclass(slots=True)
class JobImage:
    """A job as the checkpoint keeps it: its spec as stored, whether it is
    paused, the earliest fire not yet claimed and when that fire is due."""

    spec_json: bytes
    paused: bool
    store_next: int | None
    due_at: int | None


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


def _move(run: _Run, to: Phase) -> None:
    if (run.phase, to) not in _RUN_TRANSITIONS:
        raise AssertionError(f"illegal run transition {run.phase.name} -> {to.name}")
    run.phase = to


class Owner:
    """Owns a set of shards: their jobs' pending fires, in-flight runs and leases."""

    def __init__(
        self, *, epochs: dict[int, int], now_ms: int, config: OwnerConfig | None = None
    ) -> None:
        self.config = config or OwnerConfig()
        self.wheel = TimerWheel(now_ms)
        self.jobs: dict[int, _Job] = {}
        # Jobs restored from a checkpoint, kept as their image until first
        # touched: a restart arms a million timers without parsing a million
        # specs (see ``load_images``).
        self._dormant: dict[int, object] = {}
        self._decode_image: Callable[[object], JobImage] | None = None
        # Jobs whose image changed since ``take_dirty`` (the node logs them),
        # and those of them that arrived or whose spec changed: the log needs
        # their spec again, the others' moves go without it.
        self.dirty: set[int] = set()
        self.new_specs: set[int] = set()
        self.runs: dict[int, _Run] = {}
        self.workers: dict[str, _Worker] = {}
        self.stats = OwnerStats()
        self._epochs = dict(epochs)
        self._counters = dict.fromkeys(epochs, 0)
        self._pending: dict[tuple[int, int, int], _Pending] = {}
        self._ending: dict[int, tuple[_Run, RunState, str | None]] = {}
        # Queued work by route: jobs with a fresh fire, jobs with overdue
        # work (fair across tenants), and claimed runs that wait for a worker
        # (theirs went away, or it handed them back).
        self._fresh: dict[Route, deque[int]] = {}
        self._overdue: dict[Route, FairQueue[int]] = {}
        self._ready: dict[Route, deque[int]] = {}
        # Routes with work and no connected worker serving them: since when,
        # and whether the alert went out.
        self._unserved: dict[Route, int] = {}
        self._unserved_alerted: set[Route] = set()
        self._incarnations = 0
        # Grace leases in hand-out order: (deadline, run ids), deadlines
        # increasing (see the module docstring).
        self._grace: deque[tuple[int, list[int]]] = deque()
        self._graced = 0  # runs in there that have not ended
        self._retries: dict[int, tuple[int, int, int]] = {}  # seq -> (job, fire, attempt)
        self._retry_seq = 0
        self._reaper: deque[tuple[int, int, int]] = deque()
        self._reaper_bucket = TokenBucket(
            self.config.reaper_rate_per_s, self.config.reaper_burst, now_ms
        )
        rate = self.config.dispatch_rate_per_s * self.config.overdue_fraction
        self._next_worker = 0
        self._overdue_bucket = TokenBucket(
            rate, max(1.0, rate * self.config.overdue_burst_s), now_ms
        )
        self._reaper_paused = False
        # Claims made without an Effects at hand, sent with the next advance.
        self._later = Effects()

    # -- ownership ------------------------------------------------------------

    def owns(self, job_id: int) -> bool:
        return shard_of(job_id) in self._epochs

    def shards(self) -> dict[int, int]:
        return dict(self._epochs)

    def _job(self, job_id: int) -> _Job | None:
        """The job, woken from its checkpoint image if it is dormant. The
        dispatch path writes ``self.jobs.get(j) or self._job(j)``: a job it
        touches is nearly always awake, and the call costs more than the get."""
        job = self.jobs.get(job_id)
        if job is None and job_id in self._dormant:
            job = self._wake(job_id)
        return job

    def _job_or_raise(self, job_id: int) -> _Job:
        job = self._job(job_id)
        if job is None:
            raise KeyError(job_id)
        return job

    def _dormant_image(self, raw: object) -> JobImage:
        assert self._decode_image is not None
        return self._decode_image(raw)

    def _wake(self, job_id: int) -> _Job | None:
        raw = self._dormant.pop(job_id)
        try:
            image = self._dormant_image(raw)
            spec = JobSpec.from_json(image.spec_json.decode())
            compiled = self._compile(job_id, spec)
        except Exception:
            # One bad row (an expression this version rejects) must not stop
            # the owner, nor every other job of the shard from running.
            log.exception("job %s could not be loaded; skipped", job_id)
            self.wheel.cancel((job_id << 2) | FIRE)
            return None
        job = _Job(job_id, spec, compiled, image.spec_json)
        job.paused = image.paused
        job.store_next = image.store_next
        # The FIRE timer was armed at image.due_at by load_images. An image
        # made from a store row knows only the fire's nominal time: the job's
        # jitter (never earlier) moves the timer now.
        job.next_fire = None if image.paused else image.store_next
        if job.next_fire is not None:
            due = compiled.jittered(job.next_fire)
            if due != image.due_at:
                self.wheel.add((job_id << 2) | FIRE, due)
        self.jobs[job_id] = job
        return job

    def _wake_to_fire(self, job_id: int, now_ms: int) -> _Job | None:
        """A dormant job whose FIRE timer went off, if its fire is due: one
        armed at the nominal time of a jittered fire is due later (``_wake``
        armed it again for then)."""
        job = self._job(job_id)
        if job is None or job.next_fire is None or job.compiled.jittered(job.next_fire) > now_ms:
            return None
        return job

    def has_job(self, job_id: int) -> bool:
        return job_id in self.jobs or job_id in self._dormant

    def job_count(self) -> int:
        return len(self.jobs) + len(self._dormant)

    # -- checkpoint images ------------------------------------------------------

    def dormant_record(self, job_id: int) -> object | None:
        """A dormant job's image as ``load_images`` was given it (None: the
        job is awake or gone)."""
        return self._dormant.get(job_id)

    def image_of(self, job_id: int) -> JobImage | None:
        """What a checkpoint keeps of a job (None: the job is gone)."""
        dormant = self._dormant.get(job_id)
        if dormant is not None:
            return self._dormant_image(dormant)
        job = self.jobs.get(job_id)
        if job is None:
            return None
        due_at = None
        if job.store_next is not None and not job.paused:
            due_at = job.compiled.jittered(job.store_next)
        return JobImage(
            spec_json=job.spec_json, paused=job.paused, store_next=job.store_next, due_at=due_at
        )

    def take_dirty(self) -> set[int]:
        dirty, self.dirty = self.dirty, set()
        return dirty

    def take_new_specs(self, dirty: set[int] | None = None) -> set[int]:
        """Of ``dirty`` (the jobs about to be logged), those whose spec the
        checkpoint has not seen: they are logged as full images, the others as
        moves. The rest stay marked until they are logged (None: take all,
        when a snapshot of everything follows or nothing is logged)."""
        if dirty is None:
            new, self.new_specs = self.new_specs, set()
            return new
        new = self.new_specs & dirty
        self.new_specs -= new
        return new

    def job_ids(self) -> list[int]:
        return [*self.jobs, *self._dormant]

    def load_images(
        self,
        images: Mapping[int, tuple[int | None, object]],
        decode: Callable[[object], JobImage],
    ) -> None:
        """Restore jobs from a checkpoint, or from the store's rows made into
        images: ``images`` maps a job id to (when its earliest unclaimed fire
        is due, or its nominal time if it may be jittered later; its image in
        the checkpoint's own encoding). Each is armed now and decoded by
        ``decode`` only when the job is first touched: a restart arms a
        million jobs without parsing a million specs."""
        self._decode_image = decode
        owns_all = len(self._epochs) == SHARD_COUNT
        ids: list[int] = []
        deadlines: list[int] = []
        dormant = self._dormant
        for job_id, (due_at, raw) in images.items():
            if not owns_all and not self.owns(job_id):
                continue
            dormant[job_id] = raw
            if due_at is not None:
                ids.append((job_id << 2) | FIRE)
                deadlines.append(due_at)
        self.wheel.add_many(ids, deadlines)

    def _next_fence(self, shard: int) -> int:
        counter = self._counters[shard] + 1
        if counter > COUNTER_MASK:
            raise OverflowError(f"fence counter of shard {shard} exhausted; bump the epoch")
        self._counters[shard] = counter
        return (self._epochs[shard] << COUNTER_BITS) | counter

    # -- jobs -------------------------------------------------------------------

    def upsert_job(self, record: JobRecord, now_ms: int, fx: Effects) -> None:
        """A job as the store has it now (submitted, changed, or reloaded). Store wins."""
        job = self._job(record.job_id)
        if record.state in (JobState.CANCELLED, JobState.COMPLETED):
            if job is not None:
                self._drop_job(
                    job, cancelled=record.state is JobState.CANCELLED, now_ms=now_ms, fx=fx
                )
            return
        self.dirty.add(record.job_id)
        if job is None:
            job = _Job(
                record.job_id,
                record.spec,
                self._compile(record.job_id, record.spec),
                record.spec.to_json().encode(),
            )
            self.jobs[record.job_id] = job
            self.new_specs.add(record.job_id)
        elif job.spec != record.spec:
            job.spec = record.spec
            job.limit = _limit(record.spec)
            job.route = (record.spec.pool, record.spec.handler)
            job.spec_json = record.spec.to_json().encode()
            job.compiled = self._compile(record.job_id, record.spec)
            self.new_specs.add(record.job_id)
        if record.state is JobState.PAUSED:
            if not job.paused:
                job.paused = True
                self._clear_pending_fires(job, MissedReason.PAUSED, now_ms, fx)
            job.store_next = record.next_run_at
            return
        job.paused = False
        if record.next_run_at != job.store_next or (
            job.next_fire is None and not job.due and record.next_run_at is not None
        ):
            # The store moved the schedule (a resume, another node, a reload):
            # forget fires derived from the old value and re-arm from the store.
            # Buffered ones too: those before the store's value are not ours
            # any more, the others come due again from it. Kept, a buffered
            # fire behind the new value was claimed with the new value as its
            # CAS and moved the schedule nowhere, or backwards.
            job.due = deque(d for d in job.due if not d[2])
            job.buffered.clear()
            # Skipped fires the store moved past are recorded; the others come
            # due again from the store's value and are decided again.
            self._flush_skipped(job, record.next_run_at, now_ms, fx)
            job.skipped.clear()
            job.store_next = record.next_run_at
            # A first fire or a resume from now: gap wall times between now
            # and that fire are passed over already.
            self._record_gap_skips(job, now_ms, record.next_run_at, now_ms, fx)
            self._arm(job, record.next_run_at)
        if (
            job.compiled.completion_driven
            and record.next_run_at is None
            and job.next_fire is None
            and job.inflight <= 0
            and not job.due
        ):
            # fixed_delay with nothing running and nothing armed (resumed past
            # its start, where ``next_fire`` has no answer): count the delay
            # from now, or the job would never fire again.
            self._arm(job, job.compiled.next_after_completion(now_ms))
        if job.due:
            self._enqueue(job, now_ms, overdue=False)

    def _compile(self, job_id: int, spec: JobSpec) -> CompiledSchedule:
        return compile_schedule(spec.schedule, jitter_ms=spec.jitter_ms, job_id=job_id)

    def _arm(self, job: _Job, fire: int | None) -> None:
        job.next_fire = fire
        tid = (job.job_id << 2) | FIRE
        if fire is None:
            self.wheel.cancel(tid)
        else:
            self.wheel.add(tid, job.compiled.jittered(fire))

    def cancel_job(self, job_id: int, fx: Effects, now_ms: int | None = None) -> None:
        job = self._job(job_id)
        if job is not None:
            now = self.wheel.now if now_ms is None else now_ms
            self._drop_job(job, cancelled=True, now_ms=now, fx=fx)

    def _drop_job(self, job: _Job, *, cancelled: bool, now_ms: int, fx: Effects) -> None:
        if cancelled:
            # Fires queued, buffered or already past due that no run will
            # serve: recorded, never dropped silently (invariant 1).
            self._clear_pending_fires(job, MissedReason.CANCELLED, now_ms, fx)
        self.wheel.cancel((job.job_id << 2) | FIRE)
        job.next_fire = None
        self._flush_skipped(job, None, now_ms, fx)
        job.buffered.clear()
        if cancelled:
            # Retries of fires that ran end with the job: their last attempt
            # is in the store.
            job.due.clear()
            job.paused = job.cancelled = True
        else:
            # Completed (a one-shot is, once its fire is claimed): the schedule
            # is over, but that fire's retries and re-dispatches must still run.
            job.due = deque(d for d in job.due if not d[2])
        if cancelled:
            for run in list(self.runs.values()):
                if run.job_id == job.job_id and run.phase in (
                    Phase.READY,
                    Phase.DISPATCHED,
                    Phase.RUNNING,
                ):
                    self._end_run(run, RunState.CANCELLED, "job cancelled", fx, now_ms)
                    if run.worker_id is not None:
                        self._revoke(run, RevokeReason.CANCELLED, fx)
        if job.inflight <= 0 and not job.due:
            del self.jobs[job.job_id]
            self.dirty.add(job.job_id)

    def _clear_pending_fires(
        self, job: _Job, reason: MissedReason, now_ms: int, fx: Effects
    ) -> None:
        """Drop armed/due/buffered fires, each recorded as missed with ``reason``."""
        self.wheel.cancel((job.job_id << 2) | FIRE)
        fires = [d[0] for d in job.due if d[1] == 0] + list(job.buffered)
        # The armed fire may already be past its nominal time (its jitter, or
        # the loop not having woken yet): ``record_paused_fires`` on resume only
        # covers fires after the pause, so it is recorded here.
        armed = first_armed = job.next_fire
        while armed is not None and armed <= now_ms and len(fires) < self.config.max_missed_listed:
            fires.append(armed)
            armed = job.compiled.next_fire(armed)
        if first_armed is not None and first_armed <= now_ms:
            self._record_gap_skips(job, first_armed, now_ms + 1, now_ms, fx)
        # Retries of fires already run keep their place; new fires are dropped.
        job.due = deque(d for d in job.due if d[1] > 0)
        job.buffered.clear()
        job.next_fire = None
        self._record_missed(job, fires, reason, now_ms, fx)
        self._flush_skipped(job, None, now_ms, fx)

    def record_paused_fires(
        self, job_id: int, paused_from_ms: int, resumed_at_ms: int, fx: Effects
    ) -> None:
        """Fires that came due while a job was paused become missed records."""
        job = self._job(job_id)
        if job is None:
            return
        fires = job.compiled.fires_between(
            paused_from_ms, resumed_at_ms, self.config.max_missed_listed
        )
        self._record_missed(job, fires, MissedReason.PAUSED, resumed_at_ms, fx)
        self._record_gap_skips(job, paused_from_ms, resumed_at_ms + 1, resumed_at_ms, fx)

    def _record_missed(
        self, job: _Job, fires: Iterable[int], reason: MissedReason, now_ms: int, fx: Effects
    ) -> None:
        for f in fires:
            fx.missed.append(
                MissedFire(job_id=job.job_id, scheduled_for=f, reason=reason, recorded_at_ms=now_ms)
            )
            self.stats.missed += 1

    def claim_now(
        self,
        job_id: int,
        fires: Sequence[int],
        now_ms: int,
        fx: Effects,
        *,
        overdue: bool = False,
    ) -> None:
        """Claim out-of-band fires (a trigger, a backfill) at once, whatever the
        workers' credit, so that they are in the store before the API answers:
        acknowledged, they survive a crash (a restart restores the runs). Won
        runs wait on their job (READY) and are handed out like its fires:
        first in line, or with ``overdue`` as catch-up work inside the overdue
        budget, fair across tenants; never more at once than the job's
        overlap limit allows. The schedule is left alone (advance=False)."""
        job = self._job_or_raise(job_id)
        for fire in fires:
            job.inflight += 1
            fence = self._next_fence(job.shard)
            fx.claims.append(
                FireClaim(
                    job_id=job_id,
                    scheduled_for=fire,
                    attempt=0,
                    fence=fence,
                    dispatched_at_ms=now_ms,
                    advance=False,
                )
            )
            self._pending[(job_id, fire, 0)] = _Pending(
                job_id, fire, 0, fence, None, ahead=True, overdue=overdue
            )

    def trigger(self, job_id: int, now_ms: int, fx: Effects) -> int:
        """An out-of-band fire at ``now_ms``, claimed at once (``claim_now``);
        returns its scheduled_for."""
        self.claim_now(job_id, (now_ms,), now_ms, fx)
        return now_ms

    def backfill(
        self, job_id: int, fires: Sequence[int], now_ms: int, fx: Effects | None = None
    ) -> None:
        """Past fires to run as catch-up work, claimed at once (``claim_now``)
        and handed out inside the overdue budget, fair across tenants.
        Without ``fx`` the claims go out with the next ``advance`` (not yet
        durable when this returns)."""
        if fx is None:
            fx = self._later
        self.claim_now(job_id, fires, now_ms, fx, overdue=True)

    # -- the clock ------------------------------------------------------------

    def next_timer(self) -> int | None:
        """The earliest deadline of a timer: the wheel's, or a grace lease's."""
        deadline = self.wheel.next_deadline()
        if self._grace and (deadline is None or self._grace[0][0] < deadline):
            return self._grace[0][0]
        return deadline

    def pending_timers(self) -> int:
        """Timers pending: the wheel's, and grace leases of runs not ended."""
        return len(self.wheel) + self._graced

    def next_deadline(self) -> int | None:
        """When the node should call ``advance`` next (None: only on events):
        the wheel's next timer, or sooner when budgeted work (overdue fires,
        expired leases to re-dispatch) waits only for the next token of its
        bucket -- waking just every ``max_idle`` would deliver a fraction of
        the configured rate -- or when waiting work is due an alert."""
        deadline = self.next_timer()
        waits: list[int | None] = [deadline]
        if self._unserved:
            limit = self.config.unserved_alert_ms
            waits.extend(
                since + limit
                for route, since in self._unserved.items()
                if route not in self._unserved_alerted
            )
        if self._reaper or any(len(q) for q in self._overdue.values()):
            now = self.wheel.now
            if any(len(q) and self._has_server(route) for route, q in self._overdue.items()):
                waits.append(self._overdue_bucket.next_available_ms(now))
            if self._reaper and self._any_free() and not self._fleet_busy():
                waits.append(self._reaper_bucket.next_available_ms(now))
        return min((w for w in waits if w is not None), default=None)

    def has_dispatchable_work(self) -> bool:
        """Whether ``advance(now)`` would hand out or claim something right
        away: a waiting run or a queued fresh fire with a worker of its route
        that has credit, or overdue fires / expired leases with tokens too.
        The node asks after feeding the store's answers back, so a buffered
        fire released by a completion or a claim lost to a gone worker goes
        out at once instead of at the next wake. O(routes x workers)."""
        if not self.workers or not self._any_free():
            return False
        now = self.wheel.now
        for route, q in self._ready.items():
            if q and any(self._placeable(run_id, route) for run_id in q):
                return True
        if len(self._pending) >= self.config.max_claim_batch:
            return False
        if any(q and self._has_server(route) for route, q in self._fresh.items()):
            return True
        if self._overdue_bucket.available(now) > 0 and any(
            len(q) and self._has_server(route) for route, q in self._overdue.items()
        ):
            return True
        return bool(
            self._reaper and not self._fleet_busy() and self._reaper_bucket.available(now) > 0
        )

    def _fleet_busy(self) -> bool:
        """Above the reaper's busy threshold (or no capacity at all)."""
        capacity = sum(w.capacity for w in self.workers.values())
        busy = sum(len(w.held) for w in self.workers.values())
        return capacity == 0 or busy / capacity > self.config.busy_threshold

    def _any_free(self) -> bool:
        return any(w.free > 0 for w in self.workers.values())

    def _has_server(self, route: Route) -> bool:
        """Some worker with credit serves ``route``."""
        return any(w.free > 0 and w.serves(route) for w in self.workers.values())

    def _placeable(self, run_id: int, route: Route) -> bool:
        """A waiting run could go out now: a worker of its route that did not
        hand it back has credit, and its job is below its limit."""
        run = self.runs.get(run_id)
        if run is None or run.phase is not Phase.READY:
            return True  # dropped from the queue on the next pass
        job = self.jobs.get(run.job_id) or self._job(run.job_id)
        if job is not None and job.running >= job.limit:
            return False
        return self._server_for(run, route) is not None

    def _server_for(self, run: _Run, route: Route) -> _Worker | None:
        refused = run.refused
        for w in self.workers.values():
            if w.free > 0 and w.serves(route) and (not refused or w.incarnation not in refused):
                return w
        return None

    def advance(self, now_ms: int, fx: Effects) -> None:
        """Fire every timer due at ``now_ms``, then hand out what workers can take."""
        if self._later.claims:
            fx.claims.extend(self._later.claims)
            self._later.claims.clear()
        grace = self._grace
        while grace and grace[0][0] <= now_ms:
            self._grace_expired(grace.popleft()[1])
        for tid in self.wheel.advance(now_ms):
            kind, n = tid & 3, tid >> 2
            if kind == FIRE:
                job = self.jobs.get(n) or self._wake_to_fire(n, now_ms)
                if job is not None and not job.paused and job.next_fire is not None:
                    self._on_fire(job, now_ms, fx)
            elif kind == LEASE:
                self._on_lease_timer(n, now_ms, fx)
            elif kind == TIMEOUT:
                self._on_timeout(n, now_ms, fx)
            else:
                self._on_retry(n, now_ms)
        self._run_reaper(now_ms, fx)
        self._dispatch(now_ms, fx)

    def _on_fire(self, job: _Job, now_ms: int, fx: Effects) -> None:
        fire = job.next_fire
        assert fire is not None
        compiled = job.compiled
        if compiled.completion_driven and job.inflight > 0:
            # fixed_delay: the next fire is computed when the run completes.
            job.next_fire = None
            return
        nxt = None if compiled.completion_driven else compiled.next_fire(fire)
        # Late relative to when the fire was due: its jittered time, not its
        # nominal one (a jitter is a delay the job asked for, not lateness).
        overdue = now_ms - compiled.jittered(fire) > self.config.overdue_after_ms
        if overdue:
            # The owner was down or behind: one or more fires are late. The
            # job's catch-up policy decides which run; the rest become missed.
            # However long the backlog, it is planned as ONE catch-up (in
            # chunks of fires listed at a time): run_latest_only runs one fire,
            # not one per chunk. The last fire is held back until it is known
            # to be late: one whose nominal time passed but whose jittered
            # time has not stays armed, or it would run early.
            stream = CatchUpStream(job.spec.catch_up, now_ms)
            chunk = self.config.max_missed_listed
            held, count = fire, 1
            if nxt is not None and nxt <= now_ms:
                while True:
                    more = compiled.fires_between(held, now_ms, chunk)
                    if not more:
                        break
                    self._note_missed(job, stream.feed([held, *more[:-1]]).missed, now_ms, fx)
                    held, count = more[-1], count + len(more)
                    if len(more) < chunk:
                        break
                if count > 1 and compiled.jittered(held) > now_ms:
                    nxt = held
                else:
                    self._note_missed(job, stream.feed([held]).missed, now_ms, fx)
                    nxt = compiled.next_fire(held)
            else:
                self._note_missed(job, stream.feed([held]).missed, now_ms, fx)
            plan = stream.finish()
            if plan.alert:
                fx.alerts.append(f"job {job.job_id}: {plan.alert}")
            if compiled.completion_driven and not plan.run:
                # fixed_delay whose fire was not run: no completion will arm
                # the next one, so count from now or the schedule stops.
                nxt = compiled.next_after_completion(now_ms)
            self._record_gap_skips(job, fire, nxt, now_ms, fx)
            self._arm(job, nxt)
            # Planned catch-up runs one after another: the overlap gate
            # applies to the batch as a whole, not between its fires.
            if plan.run:
                self._admit(job, plan.run[0], now_ms, overdue=True, fx=fx)
                if job.buffered and job.buffered[-1] == plan.run[0]:
                    # The batch waits behind the running run as a whole, in
                    # fire order: queued ahead of its first fire, the rest
                    # would be claimed first and the first one's claim would
                    # move the schedule backwards (invariant 3).
                    job.buffered.extend(plan.run[1:])
                else:
                    job.due.extend((f, 0, True) for f in plan.run[1:])
        else:
            self._record_gap_skips(job, fire, nxt, now_ms, fx)
            self._arm(job, nxt)
            self._admit(job, fire, now_ms, overdue=False, fx=fx)
        self._sync_schedule(job, now_ms, fx)

    def _record_gap_skips(
        self,
        job: _Job,
        after: int,
        until: int | None,
        now_ms: int,
        fx: Effects,
    ) -> None:
        """Record the wall times a ``DstGap.SKIP`` cron policy passed over in
        ``(after, until)`` as missed (dst_gap), once the schedule moves past
        them. Several skipped wall times of one gap share its transition
        instant: one record per instant, and none where a real fire is due at
        that instant too (a fire is never both run and missed). Recorded
        again after a restart from an older next_run_at, it is deduplicated
        by the store like every missed record."""
        if until is None or until <= after + 1:
            return
        skips = job.compiled.skipped_between(after, until - 1, self.config.max_missed_listed)
        if skips:
            compiled = job.compiled
            instants = sorted(
                {s.at_ms for s in skips if compiled.next_fire(s.at_ms - 1) != s.at_ms}
            )
            self._record_missed(job, instants, MissedReason.DST_GAP, now_ms, fx)

    def _note_missed(
        self,
        job: _Job,
        missed: Sequence[tuple[int, MissedReason]],
        now_ms: int,
        fx: Effects,
    ) -> None:
        for f, reason in missed:
            fx.missed.append(
                MissedFire(job_id=job.job_id, scheduled_for=f, reason=reason, recorded_at_ms=now_ms)
            )
        self.stats.missed += len(missed)

    def _admit(self, job: _Job, fire: int, now_ms: int, *, overdue: bool, fx: Effects) -> None:
        """Apply the overlap policy to a fire that came due."""
        overlap = job.spec.overlap
        if job.inflight + len(job.due) < job.limit:
            job.due.append((fire, 0, True))
            self._enqueue(job, now_ms, overdue=overdue)
            return
        room = {OverlapPolicy.BUFFER_ONE: 1, OverlapPolicy.BUFFER_ALL: overlap.max_buffered}
        if len(job.buffered) < room.get(overlap.policy, 0):
            job.buffered.append(fire)
            return
        # Recorded missed once next_run_at moves past it (``_sync_schedule``
        # right after, or the claim of the fire that holds it back).
        job.skipped.append(fire)

    def _sync_schedule(self, job: _Job, now_ms: int, fx: Effects) -> None:
        """Move the store's next_run_at past fires that will never be claimed
        (missed, skipped by overlap) when no claim of ours will move it."""
        due = job.due
        if (due and (due[0][2] or any(d[2] for d in due))) or job.buffered:
            return
        if job.advancing:
            # The node writes a pass's advances before its claims: an advance
            # chained after a claim still on its way would find the store's
            # next_run_at not moved yet, fail, and leave the owner believing
            # it had moved. It is sent once the claim is answered.
            return
        target = job.next_fire
        if target is None and job.compiled.completion_driven and job.inflight > 0:
            return  # fixed_delay: the run's completion sets the next fire
        if job.store_next != target and job.store_next is not None:
            if target is None and not job.compiled.completion_driven:
                # A one-shot whose only fire was skipped: a claim-less advance
                # must not complete the job; leave it for the catch-up record.
                return
            fx.advances.append(
                ScheduleAdvance(
                    job_id=job.job_id,
                    expected_next_run_at=job.store_next,
                    new_next_run_at=target,
                )
            )
            job.store_next = target
            self.dirty.add(job.job_id)
        self._flush_skipped(job, job.store_next, now_ms, fx)

    def _flush_skipped(self, job: _Job, upto: int | None, now_ms: int, fx: Effects) -> None:
        """Record overlap-skipped fires before ``upto`` (all of them if None) as
        missed, in the same store pass as the write that moves next_run_at to
        ``upto`` (missed records are written first).

        Recorded while an older buffered or queued fire still held next_run_at
        back, a restart from the store would arm that older fire, catch up
        through the skipped one and run it: a fire both run and missed.
        """
        if not job.skipped:
            return
        if upto is None:
            gone, job.skipped = job.skipped, []
        else:
            gone = [f for f in job.skipped if f < upto]
            if not gone:
                return
            job.skipped = [f for f in job.skipped if f >= upto]
        self._record_missed(job, gone, MissedReason.OVERLAP, now_ms, fx)

    def _enqueue(self, job: _Job, now_ms: int, *, overdue: bool, front: bool = False) -> None:
        if job.queued or not (job.due or job.ready):
            return
        job.queued = True
        route = job.route
        if overdue:
            q = self._overdue.get(route)
            if q is None:
                q = self._overdue[route] = FairQueue()
            q.push(job.spec.tenant, job.job_id)
        elif front:
            self._fresh.setdefault(route, deque()).appendleft(job.job_id)
        else:
            self._fresh.setdefault(route, deque()).append(job.job_id)

    # -- dispatch ---------------------------------------------------------------

    def _dispatch(self, now_ms: int, fx: Effects) -> None:
        starved: list[Route] = []  # routes with work and no worker with credit
        if self._ready:
            starved.extend(self._assign_ready(now_ms, fx))
        budget = self.config.max_claim_batch - len(self._pending)
        workers_all = self.workers.values()
        # In the order routes first had work (a set's order would change
        # with the hash seed, and a simulation must replay exactly).
        routes = list(self._fresh)
        routes.extend(r for r in self._overdue if r not in self._fresh)
        for route in routes:
            fresh = self._fresh.get(route)
            over = self._overdue.get(route)
            if not fresh and not over:
                self._fresh.pop(route, None)
                self._overdue.pop(route, None)
                continue
            pool, handler = route
            workers = [
                w
                for w in workers_all
                if pool in w.pools and (not w.handlers or handler in w.handlers) and w.free > 0
            ]
            if not workers:
                starved.append(route)
                continue
            capacity = min(budget, sum(w.free for w in workers))
            if capacity <= 0:
                continue
            split = split_capacity(
                capacity=capacity,
                fresh_waiting=len(fresh) if fresh else 0,
                overdue_waiting=len(over) if over else 0,
                overdue_tokens=self._overdue_bucket.available(now_ms) if over else 0,
            )
            picked: list[tuple[int, bool]] = []
            if fresh:
                picked.extend((fresh.popleft(), False) for _ in range(split.fresh))
            if over and split.overdue:
                n = self._overdue_bucket.take(split.overdue, now_ms)
                picked.extend((j, True) for j in over.pop(n))
            budget -= len(picked)
            self._claim(picked, workers, now_ms, fx)
        if starved or self._unserved:
            self._note_unserved(starved, now_ms, fx)

    def _note_unserved(self, starved: list[Route], now_ms: int, fx: Effects) -> None:
        """Of the routes whose work found no worker with credit, those no
        connected worker serves at all: their work waits (unclaimed, or
        claimed without a lease), reported by ``unserved`` and, once it has
        waited ``unserved_alert_ms``, by an alert."""
        workers = self.workers.values()
        was = self._unserved
        self._unserved = {
            route: was.get(route, now_ms)
            for route in starved
            if not any(w.serves(route) for w in workers)
        }
        self._unserved_alerted &= self._unserved.keys()
        limit = self.config.unserved_alert_ms
        for route, since in self._unserved.items():
            if now_ms - since >= limit and route not in self._unserved_alerted:
                self._unserved_alerted.add(route)
                pool, handler = route
                fx.alerts.append(
                    f"no worker for handler {handler!r} in pool {pool!r}: "
                    f"{self._waiting_on(route)} runs wait for one"
                )

    def _waiting_on(self, route: Route) -> int:
        """Fires and claimed runs queued for ``route``."""
        n = 0
        for queues in (self._fresh, self._overdue, self._ready):
            q = queues.get(route)
            if q is not None:
                n += len(q)
        return n

    def unserved(self) -> list[Unserved]:
        """Work waiting because no connected worker serves its route."""
        return [
            Unserved(
                pool=pool,
                handler=handler,
                waiting=self._waiting_on((pool, handler)),
                since_ms=since,
            )
            for (pool, handler), since in sorted(self._unserved.items())
        ]

    def worker_views(self) -> list[WorkerView]:
        return [
            WorkerView(
                worker_id=w.worker_id,
                capacity=w.capacity,
                held=len(w.held),
                pools=tuple(sorted(w.pools)),
                handlers=tuple(sorted(w.handlers)),
                draining=w.draining,
                silent=w.silent,
            )
            for w in sorted(self.workers.values(), key=lambda w: w.worker_id)
        ]

    def _claim(
        self, picked: list[tuple[int, bool]], workers: list[_Worker], now_ms: int, fx: Effects
    ) -> None:
        # Start where the last batch stopped: one fire a tick must not always
        # land on the same worker.
        wi = self._next_worker
        for job_id, overdue in picked:
            job = self.jobs.get(job_id) or self._job(job_id)
            if job is None:
                continue
            job.queued = False
            if job.ready:
                # Runs claimed ahead go first, one per turn, while the job is
                # below its limit of runs held by workers.
                if job.running >= job.limit:
                    continue  # re-enqueued when a run of the job finishes
                run_id, _ = job.ready.popleft()
                run = self.runs.get(run_id)
                if run is not None and run.phase is Phase.READY:
                    while workers[wi % len(workers)].free <= 0:
                        wi += 1
                    self._hand_out(run, workers[wi % len(workers)], now_ms, fx)
                    wi += 1
                self._requeue_job(job, now_ms)
                continue
            if not job.due or job.paused or job.inflight >= job.limit:
                continue  # re-enqueued when a run of the job finishes
            fire, attempt, advance = job.due.popleft()
            job.inflight += 1
            while workers[wi % len(workers)].free <= 0:
                wi += 1
            worker = workers[wi % len(workers)]
            wi += 1
            worker.reserved += 1
            fence = self._next_fence(job.shard)
            expected = new = None
            if advance:
                expected = job.store_next
                # The oldest fire not claimed yet: queued, then buffered behind
                # this run, then armed. Moving the store past a buffered fire
                # would lose it to a restart (the store is all a new owner has).
                due = job.due
                later = job.buffered[0] if job.buffered else job.next_fire
                if not due:  # the common cases, without a scan
                    new = later
                elif due[0][2]:
                    new = due[0][0]
                else:
                    new = next((d[0] for d in due if d[2]), later)
                if new is None and job.compiled.completion_driven:
                    # fixed_delay: provisional next fire, corrected on completion.
                    new = job.compiled.next_after_completion(fire)
                job.store_next = new
                job.advancing += 1
                self.dirty.add(job_id)
                self._flush_skipped(job, new, now_ms, fx)
            fx.claims.append(
                FireClaim(
                    job_id=job_id,
                    scheduled_for=fire,
                    attempt=attempt,
                    fence=fence,
                    dispatched_at_ms=now_ms,
                    advance=advance,
                    expected_next_run_at=expected,
                    new_next_run_at=new,
                )
            )
            self._pending[(job_id, fire, attempt)] = _Pending(
                job_id, fire, attempt, fence, worker.worker_id
            )
            if job.due and job.inflight < job.limit:
                self._enqueue(job, now_ms, overdue=overdue)
        self._next_worker = wi % len(workers)

    def on_claimed(self, outcomes: Sequence[ClaimOutcome], now_ms: int, fx: Effects) -> None:
        """The store's answer to a claim batch."""
        for out in outcomes:
            c = out.claim
            pend = self._pending.pop((c.job_id, c.scheduled_for, c.attempt), None)
            if pend is None:
                continue
            worker = self.workers.get(pend.worker_id) if pend.worker_id else None
            if worker is not None:
                worker.reserved -= 1
            job = self.jobs.get(c.job_id) or self._job(c.job_id)
            if c.advance and job is not None:
                job.advancing -= 1
            if c.advance and not out.advanced:
                fx.resync.add(c.job_id)
            elif c.advance and job is not None and job.advancing == 0 and not job.paused:
                # Fires passed over while the claim was on its way.
                self._sync_schedule(job, now_ms, fx)
            if out.run_id is None:
                # Someone else holds this fire (another owner, or an earlier
                # life of this one): it is not ours to run.
                if job is not None:
                    self._run_finished(job, now_ms, fx)
                continue
            run = _Run(out.run_id, c.job_id, c.scheduled_for, c.attempt, c.fence)
            self.runs[run.run_id] = run
            if pend.ahead and job is not None:
                # Its timeout starts when a worker gets it (``_hand_out``).
                _move(run, Phase.READY)
                job.ready.append((run.run_id, pend.overdue))
                self._requeue_job(job, now_ms)
                continue
            if worker is not None and worker.free >= 0 and not worker.draining:
                self._hand_out(run, worker, now_ms, fx)
            else:
                # Its worker went away: it waits for another of its route,
                # with no lease and no timeout running until one gets it.
                _move(run, Phase.READY)
                self._wait_ready(run, job)

    def _wait_ready(self, run: _Run, job: _Job | None) -> None:
        route = job.route if job is not None else ("default", "")
        self._ready.setdefault(route, deque()).append(run.run_id)

    def _assign_ready(self, now_ms: int, fx: Effects) -> list[Route]:
        """Hand out claimed runs that wait for a worker, in order per route,
        each to a worker of its route that did not hand it back, while its
        job is below its limit; the others keep their place. Returns the
        routes with runs left and no worker with credit."""
        starved: list[Route] = []
        for route, q in list(self._ready.items()):
            kept: list[int] = []
            while q:
                run = self.runs.get(q[0])
                if run is None or run.phase is not Phase.READY:
                    q.popleft()
                    continue
                if not any(w.free > 0 and w.serves(route) for w in self.workers.values()):
                    starved.append(route)
                    break
                q.popleft()
                job = self.jobs.get(run.job_id) or self._job(run.job_id)
                worker = self._server_for(run, route)
                if worker is None or (job is not None and job.running >= job.limit):
                    kept.append(run.run_id)
                    continue
                self._hand_out(run, worker, now_ms, fx)
            if kept:
                q.extendleft(reversed(kept))
            if not q:
                del self._ready[route]
        return starved

    def _requeue_job(self, job: _Job, now_ms: int) -> None:
        """Queue the job for its next piece of work: a run claimed ahead (a
        trigger first in line, a backfill as overdue work), else a due fire."""
        if job.ready:
            overdue = job.ready[0][1]
            self._enqueue(job, now_ms, overdue=overdue, front=not overdue)
        elif job.due and not job.paused:
            self._enqueue(
                job, now_ms, overdue=now_ms - job.due[0][0] > self.config.overdue_after_ms
            )

    def _hand_out(self, run: _Run, worker: _Worker, now_ms: int, fx: Effects) -> None:
        job = self.jobs.get(run.job_id) or self._job(run.job_id)
        if job is None:  # pragma: no cover - a run keeps its job alive
            return
        _move(run, Phase.DISPATCHED)
        run.held_out = True
        job.running += 1
        if run.timeout_deadline == 0:
            run.timeout_deadline = now_ms + job.spec.timeout_ms
        run.worker_id = worker.worker_id
        worker.held.add(run.run_id)
        deadline = run.lease_deadline = now_ms + self.config.grace_lease_ms
        grace = self._grace
        last = grace[-1][0] if grace else None
        # Own timers when it has them already, when its timeout comes first,
        # or when an earlier now than the last hand-out would unsort the FIFO.
        if run.armed or run.timeout_deadline <= deadline or (last is not None and last > deadline):
            self._arm_run(run)
        else:
            if last == deadline:
                grace[-1][1].append(run.run_id)
            else:
                grace.append((deadline, [run.run_id]))
            self._graced += 1
        spec = job.spec
        fx.assignments.setdefault(worker.worker_id, []).append(
            Assignment(
                run_id=run.run_id,
                job_id=run.job_id,
                handler=spec.handler,
                tenant=spec.tenant,
                scheduled_for=run.scheduled_for,
                attempt=run.attempt,
                fence=run.fence,
                payload=spec.payload,
                lease_ms=self.config.grace_lease_ms,
                timeout_ms=max(0, run.timeout_deadline - now_ms),
            )
        )
        if run.attempt == 0:  # a retry's wait is its backoff, not dispatch lag
            fx.lags.append(now_ms - run.scheduled_for)
        self.stats.dispatched += 1

    # -- workers ----------------------------------------------------------------

    def worker_hello(
        self,
        worker_id: str,
        capacity: int,
        pools: Sequence[str],
        now_ms: int,
        fx: Effects,
        *,
        handlers: Sequence[str] = (),
    ) -> None:
        """A worker's stream opened: it serves ``pools`` and runs ``handlers``
        (none named: any). A hello again (a reconnect) keeps the runs it holds
        and forgets the runs it handed back."""
        old = self.workers.get(worker_id)
        self._incarnations += 1
        w = _Worker(
            worker_id,
            capacity,
            frozenset(pools or ("default",)),
            frozenset(handlers),
            self._incarnations,
        )
        if old is not None:
            w.held = old.held
            w.reserved = old.reserved
        self.workers[worker_id] = w
        self._dispatch(now_ms, fx)

    def worker_capacity(self, worker_id: str) -> int | None:
        w = self.workers.get(worker_id)
        return None if w is None else w.capacity

    def worker_drain(self, worker_id: str) -> None:
        w = self.workers.get(worker_id)
        if w is not None:
            w.draining = True

    def _heard_from(self, worker_id: str) -> None:
        w = self.workers.get(worker_id)
        if w is not None:
            w.silent = False

    def worker_credit(self, worker_id: str, add: int, now_ms: int, fx: Effects) -> None:
        w = self.workers.get(worker_id)
        if w is not None:
            w.silent = False
            w.capacity = max(0, w.capacity + add)
            self._dispatch(now_ms, fx)

    def worker_disconnect(self, worker_id: str) -> None:
        """The stream is gone. Its runs keep their leases: the worker may come
        back and renew them; otherwise they expire and are re-dispatched."""
        w = self.workers.pop(worker_id, None)
        if w is None:
            return
        for pend in self._pending.values():
            if pend.worker_id == worker_id:
                pend.worker_id = None

    def _held_run(
        self, worker_id: str, run_id: int, fence: int, fx: Effects, what: str
    ) -> _Run | None:
        run = self.runs.get(run_id)
        if run is not None and run.worker_id is None and run.fence == fence:
            # Restored after a restart and not adopted yet: the worker that
            # still holds it takes it back, as with a heartbeat.
            run.worker_id = worker_id
            worker = self.workers.get(worker_id)
            if worker is not None:
                worker.held.add(run_id)
        if run is None or run.phase is Phase.ENDING:
            reason = "run not held by this node (unknown or finished)"
        elif run.fence != fence:
            reason = _fence_mismatch(fence, run.fence)
        elif run.worker_id != worker_id:
            reason = "run is held by another worker"
        else:
            return run
        fx.violations.setdefault(worker_id, []).append(
            ProtocolViolation(
                code="FAILED_PRECONDITION", message=f"{what}: {reason}", run_id=run_id
            )
        )
        return None

    def worker_ack(
        self, worker_id: str, refs: Sequence[tuple[int, int]], now_ms: int, fx: Effects
    ) -> None:
        self._heard_from(worker_id)
        for run_id, fence in refs:
            run = self._held_run(worker_id, run_id, fence, fx, "ack")
            if run is None:
                continue
            if run.phase is Phase.DISPATCHED:
                _move(run, Phase.RUNNING)
                fx.starts.append(
                    RunStart(run_id=run_id, fence=fence, worker_id=worker_id, started_at_ms=now_ms)
                )
            run.lease_deadline = now_ms + self.config.lease_ms

    def worker_heartbeat(
        self, worker_id: str, refs: Sequence[tuple[int, int]], now_ms: int, fx: Effects
    ) -> None:
        """One stream-level heartbeat renews every run the worker holds."""
        self._heard_from(worker_id)
        worker = self.workers.get(worker_id)
        rejected: list[tuple[int, int]] = []
        deadline = now_ms + self.config.lease_ms
        for run_id, fence in refs:
            run = self.runs.get(run_id)
            ok = run is not None and run.fence == fence and run.phase is not Phase.ENDING
            if ok and run is not None and run.worker_id != worker_id:
                # A run restored from the store after a restart has no holder
                # yet: the worker that still runs it adopts it with its fence.
                ok = run.worker_id is None and run.phase in (Phase.DISPATCHED, Phase.RUNNING)
                if ok and worker is not None:
                    run.worker_id = worker_id
                    worker.held.add(run_id)
            if ok and run is not None and worker is not None and run_id not in worker.held:
                worker.held.add(run_id)  # a reconnect: the stream is new, the lease is not
            if ok and run is not None:
                run.lease_deadline = deadline
            else:
                rejected.append((run_id, fence))
        if rejected:
            fx.rejected_renewals.setdefault(worker_id, []).extend(rejected)

    def worker_complete(
        self,
        worker_id: str,
        completions: Sequence[tuple[int, int, Outcome, str]],
        now_ms: int,
        fx: Effects,
    ) -> None:
        self._heard_from(worker_id)
        for run_id, fence, outcome, error in completions:
            run = self.runs.get(run_id)
            if run is None or run.phase is Phase.ENDING:
                # Not ours in memory (finished, superseded, or from before a
                # restart). The store is the authority: it applies the
                # completion only if the fence is still the newest.
                fx.results.setdefault(worker_id, []).append(
                    CompletionResult(run_id=run_id, accepted=False, reason="run not held")
                )
                self.stats.superseded_completions += 1
                continue
            if run.fence == fence and run.worker_id is None:
                # A run restored after a restart, completed by the worker that
                # still ran it before its first heartbeat on the new stream
                # (the SDK re-sends completions first): adopt it, as a
                # heartbeat would. Rejecting it let the lease expire and re-ran
                # a fire that had succeeded.
                run.worker_id = worker_id
            if run.fence != fence or run.worker_id != worker_id:
                fx.results.setdefault(worker_id, []).append(
                    CompletionResult(
                        run_id=run_id,
                        accepted=False,
                        reason=_fence_mismatch(fence, run.fence)
                        if run.fence != fence
                        else "run is held by another worker",
                    )
                )
                self.stats.superseded_completions += 1
                continue
            if outcome is Outcome.SUCCEEDED:
                self._end_run(run, RunState.SUCCEEDED, None, fx, now_ms, reply_to=worker_id)
            elif outcome is Outcome.HANDED_BACK:
                self._take_back(run, now_ms)
                fx.results.setdefault(worker_id, []).append(
                    CompletionResult(run_id=run_id, accepted=True)
                )
            elif outcome is Outcome.ABANDONED:
                self._lose(
                    run, "abandoned by its worker while running", now_ms, fx, reply_to=worker_id
                )
            elif (
                outcome is Outcome.RETRYABLE
                and (job := self._job(run.job_id)) is not None
                and should_retry(job.spec.retry, failed_attempt=run.attempt)
            ):
                self._end_run(
                    run, RunState.FAILED, error or "failed", fx, now_ms, reply_to=worker_id
                )
            else:
                self._end_run(
                    run, RunState.DEAD_LETTERED, error or "failed", fx, now_ms, reply_to=worker_id
                )

    # -- run endings --------------------------------------------------------------

    def _end_run(
        self,
        run: _Run,
        state: RunState,
        error: str | None,
        fx: Effects,
        now_ms: int,
        *,
        reply_to: str | None = None,
    ) -> None:
        """Send a terminal state to the store; follow-ups wait for its answer."""
        _move(run, Phase.ENDING)
        if run.worker_id is not None:
            w = self.workers.get(run.worker_id)
            if w is not None:
                w.held.discard(run.run_id)
        if run.armed:
            self.wheel.cancel((run.run_id << 2) | LEASE)
            self.wheel.cancel((run.run_id << 2) | TIMEOUT)
        elif run.lease_deadline:
            self._graced -= 1  # its entry in ``_grace`` is skipped when due
        fx.completions.append(
            Completion(
                run_id=run.run_id,
                fence=run.fence,
                state=state,
                finished_at_ms=now_ms,
                error=error,
                worker_id=run.worker_id,
            )
        )
        self._ending[run.run_id] = (run, state, reply_to)

    def _take_back(self, run: _Run, now_ms: int) -> None:
        """A worker gives back a run it never started: it goes to another
        worker of its route with the same attempt and fence (nothing ran that
        a newer fence must shut out), and waits with no lease and no timeout
        running until one takes it. The worker is not given it again."""
        worker = self.workers.get(run.worker_id) if run.worker_id is not None else None
        if worker is not None:
            worker.held.discard(run.run_id)
            if run.refused is None:
                run.refused = set()
            run.refused.add(worker.incarnation)
        if run.armed:
            self.wheel.cancel((run.run_id << 2) | LEASE)
            self.wheel.cancel((run.run_id << 2) | TIMEOUT)
            run.armed = False
        elif run.lease_deadline:
            self._graced -= 1  # its entry in ``_grace`` is skipped when due
        run.worker_id = None
        run.lease_deadline = run.timeout_deadline = 0
        _move(run, Phase.READY)
        job = self.jobs.get(run.job_id) or self._job(run.job_id)
        if job is not None and run.held_out:
            job.running -= 1
        run.held_out = False
        self._wait_ready(run, job)

    def on_completed(self, outcomes: Sequence[CompletionOutcome], now_ms: int, fx: Effects) -> None:
        """The store's answer to a completion batch: follow-ups for applied ones."""
        for out in outcomes:
            entry = self._ending.pop(out.run_id, None)
            if entry is None:
                continue
            run, state, reply_to = entry
            self.runs.pop(run.run_id, None)
            if reply_to is not None:
                fx.results.setdefault(reply_to, []).append(
                    CompletionResult(
                        run_id=run.run_id,
                        accepted=out.applied,
                        reason="" if out.applied else "superseded: a newer attempt exists",
                    )
                )
            job = self.jobs.get(run.job_id) or self._job(run.job_id)
            if job is None:
                continue
            if run.held_out:
                job.running -= 1
                if job.ready:
                    self._requeue_job(job, now_ms)  # a run claimed ahead may go now
            if not out.applied:
                self.stats.superseded_completions += 1
                self._run_finished(job, now_ms, fx)
                continue
            if state is RunState.SUCCEEDED:
                self.stats.completed += 1
            elif state is RunState.DEAD_LETTERED:
                self.stats.dead_lettered += 1
                fx.alerts.append(f"job {job.job_id} fire {run.scheduled_for}: dead-lettered")
            if state in (RunState.FAILED, RunState.TIMED_OUT) and should_retry(
                job.spec.retry, failed_attempt=run.attempt
            ):
                self._schedule_retry(job, run, now_ms)
                continue
            if state is RunState.LOST:
                self._reaper.append((job.job_id, run.scheduled_for, run.attempt + 1))
                continue
            self._run_finished(job, now_ms, fx)

    def _run_finished(self, job: _Job, now_ms: int, fx: Effects) -> None:
        job.inflight -= 1
        if job.compiled.completion_driven and not job.paused and job.next_fire is None:
            nxt = job.compiled.next_after_completion(now_ms)
            if job.inflight == 0 and nxt is not None:
                self._arm(job, nxt)
                self._sync_schedule(job, now_ms, fx)
        if job.buffered and not job.paused and job.inflight + len(job.due) < job.limit:
            job.due.append((job.buffered.popleft(), 0, True))
        self._requeue_job(job, now_ms)
        if (
            job.inflight <= 0
            and job.next_fire is None
            and not job.due
            and (job.paused or not job.compiled.completion_driven)
        ):
            self.wheel.cancel((job.job_id << 2) | FIRE)
            del self.jobs[job.job_id]
            self.dirty.add(job.job_id)

    def _schedule_retry(self, job: _Job, run: _Run, now_ms: int) -> None:
        delay = retry_delay_ms(
            job.spec.retry,
            failed_attempt=run.attempt,
            job_id=job.job_id,
            scheduled_for=run.scheduled_for,
        )
        self._retry_seq += 1
        self._retries[self._retry_seq] = (job.job_id, run.scheduled_for, run.attempt + 1)
        self.wheel.add((self._retry_seq << 2) | RETRY, now_ms + delay)

    def _on_retry(self, seq: int, now_ms: int) -> None:
        entry = self._retries.pop(seq, None)
        if entry is None:
            return
        self._requeue(*entry, now_ms=now_ms)

    def _requeue(self, job_id: int, fire: int, attempt: int, *, now_ms: int) -> None:
        """A retry or a re-dispatch of a fire that already ran: first in line."""
        job = self._job(job_id)
        if job is None:
            return
        job.inflight -= 1
        job.due.appendleft((fire, attempt, False))
        self._enqueue(job, now_ms, overdue=False)

    def _arm_run(self, run: _Run) -> None:
        """Give the run its own wheel timers: TIMEOUT, and LEASE once handed out."""
        run.armed = True
        if run.lease_deadline:
            self.wheel.add((run.run_id << 2) | LEASE, run.lease_deadline)
        self.wheel.add((run.run_id << 2) | TIMEOUT, run.timeout_deadline)

    def _grace_expired(self, run_ids: list[int]) -> None:
        """Grace leases handed out together are due: runs that ended are
        gone; the rest get their own timers, which fire at once if due."""
        runs = self.runs
        for run_id in run_ids:
            run = runs.get(run_id)
            if run is None or run.armed or run.phase not in (Phase.DISPATCHED, Phase.RUNNING):
                continue
            self._graced -= 1
            self._arm_run(run)

    def _on_lease_timer(self, run_id: int, now_ms: int, fx: Effects) -> None:
        run = self.runs.get(run_id)
        if run is None or run.phase not in (Phase.DISPATCHED, Phase.RUNNING):
            return
        if run.lease_deadline > now_ms:
            # Renewed since the timer was set: renewals only move the deadline.
            self.wheel.add((run_id << 2) | LEASE, run.lease_deadline)
            return
        self.stats.lost_leases += 1
        if run.worker_id is not None:
            holder = self.workers.get(run.worker_id)
            if holder is not None:
                # Its stream is up but it did not renew: do not hand the
                # re-dispatch (or anything else) straight back to it.
                holder.silent = True
            self._revoke(run, RevokeReason.LEASE_EXPIRED, fx)
        self._lose(run, "lease expired", now_ms, fx)

    def _lose(
        self, run: _Run, why: str, now_ms: int, fx: Effects, *, reply_to: str | None = None
    ) -> None:
        """A run that may have had its effect ended without an outcome (its
        lease lapsed, its worker gave up on it): an at_most_once run becomes
        unknown; another is re-dispatched as a new attempt while attempts
        remain, else dead-lettered."""
        job = self._job(run.job_id)
        if job is not None and job.spec.side_effect is SideEffect.AT_MOST_ONCE:
            fx.alerts.append(
                f"job {run.job_id} fire {run.scheduled_for}: at_most_once run {why}; "
                "outcome unknown, not re-dispatched"
            )
            self._end_run(run, RunState.UNKNOWN, why, fx, now_ms, reply_to=reply_to)
        elif job is not None and should_retry(job.spec.retry, failed_attempt=run.attempt):
            self._end_run(run, RunState.LOST, why, fx, now_ms, reply_to=reply_to)
        else:
            self._end_run(
                run,
                RunState.DEAD_LETTERED,
                f"{why} on the last attempt",
                fx,
                now_ms,
                reply_to=reply_to,
            )

    def _on_timeout(self, run_id: int, now_ms: int, fx: Effects) -> None:
        run = self.runs.get(run_id)
        if run is None or run.phase not in (Phase.DISPATCHED, Phase.RUNNING, Phase.READY):
            return
        self.stats.timed_out += 1
        if run.worker_id is not None:
            self._revoke(run, RevokeReason.TIMED_OUT, fx)
        job = self._job(run.job_id)
        # An at_most_once run that was handed out may have had its effect: a
        # timeout is no proof it did not, so it is never re-dispatched.
        last = (
            job is None
            or job.spec.side_effect is SideEffect.AT_MOST_ONCE
            or not should_retry(job.spec.retry, failed_attempt=run.attempt)
        )
        self._end_run(
            run,
            RunState.DEAD_LETTERED if last else RunState.TIMED_OUT,
            "timed out",
            fx,
            now_ms,
        )

    def _revoke(self, run: _Run, reason: RevokeReason, fx: Effects) -> None:
        if run.worker_id is not None and run.worker_id in self.workers:
            fx.revokes.setdefault(run.worker_id, []).append(
                Revoke(run_id=run.run_id, fence=run.fence, reason=reason)
            )

    def _run_reaper(self, now_ms: int, fx: Effects) -> None:
        """Re-dispatch fires whose lease expired, rate limited, and not at all
        while the fleet is nearly saturated (seed R6: a spiral is worse)."""
        if not self._reaper:
            return
        if self._fleet_busy():
            if not self._reaper_paused:
                capacity = sum(w.capacity for w in self.workers.values())
                busy = sum(len(w.held) for w in self.workers.values())
                self._reaper_paused = True
                fx.alerts.append(
                    f"reaper paused: fleet {busy}/{capacity} busy; "
                    f"{len(self._reaper)} expired leases wait for capacity"
                )
            return
        self._reaper_paused = False
        n = self._reaper_bucket.take(len(self._reaper), now_ms)
        for _ in range(n):
            self._requeue(*self._reaper.popleft(), now_ms=now_ms)

    @property
    def reaper_paused(self) -> bool:
        return self._reaper_paused

    # -- recovery -----------------------------------------------------------------

    def adopt_finished_jobs(self, records: Sequence[JobRecord]) -> None:
        """Jobs whose schedule is over but that still have runs in flight or
        retries owed (see ``restore_inflight`` and ``restore_retries``).

        A completed one-shot schedules nothing more, but its fire's runs,
        retries and re-dispatches go on exactly as they would have without the
        restart: the job is not paused, or a re-dispatch of its lost run would
        wait for a resume that cannot come (a silent drop). A cancelled job
        is kept only to end its runs as the cancel would have."""
        for record in records:
            if record.job_id in self.jobs or record.job_id in self._dormant:
                continue
            job = _Job(
                record.job_id,
                record.spec,
                self._compile(record.job_id, record.spec),
                record.spec.to_json().encode(),
            )
            if record.state is JobState.CANCELLED:
                job.paused = job.cancelled = True
            self.jobs[record.job_id] = job
            # Not in the checkpoint: its first record there must be whole.
            self.new_specs.add(record.job_id)

    def restore_inflight(
        self, executions: Sequence[ExecutionRecord], now_ms: int, fx: Effects
    ) -> None:
        """Runs the store says are in flight, after a restart or takeover. A
        running run gets a full lease from now and one never acked the grace
        lease (seed R1): their workers reconnect and renew (adopt) them; runs
        nobody renews expire and are re-dispatched. A run of a cancelled job
        is cancelled, as the cancel would have done had the node lived."""
        for ex in executions:
            if ex.run_id in self.runs:
                continue
            run = _Run(ex.run_id, ex.job_id, ex.scheduled_for, ex.attempt, ex.fence)
            if ex.state is RunState.RUNNING:
                run.phase = Phase.RUNNING
                run.lease_deadline = now_ms + self.config.lease_ms
            else:
                run.phase = Phase.DISPATCHED
                run.lease_deadline = now_ms + self.config.grace_lease_ms
            run.worker_id = None
            run.held_out = True
            run.armed = True
            self.wheel.add((run.run_id << 2) | LEASE, run.lease_deadline)
            job = self._job(ex.job_id)
            if job is not None:
                job.inflight += 1
                job.running += 1
                run.timeout_deadline = ex.dispatched_at_ms + job.spec.timeout_ms
                self.wheel.add((run.run_id << 2) | TIMEOUT, max(now_ms, run.timeout_deadline))
            self.runs[run.run_id] = run
            shard = shard_of(ex.job_id)
            if shard in self._counters and ex.fence >> COUNTER_BITS == self._epochs[shard]:
                self._counters[shard] = max(self._counters[shard], ex.fence & COUNTER_MASK)
            if job is not None and job.cancelled:
                self._end_run(run, RunState.CANCELLED, "job cancelled", fx, now_ms)

    def restore_retries(self, executions: Sequence[ExecutionRecord], now_ms: int) -> None:
        """Latest attempts that ended failed, lost or timed out with no newer
        attempt: their retry (or re-dispatch) was pending when the previous
        owner stopped. Without this a restart would silently drop them."""
        for ex in executions:
            job = self._job(ex.job_id)
            if job is None or job.cancelled:
                continue
            if ex.state is RunState.LOST:
                job.inflight += 1
                self._reaper.append((job.job_id, ex.scheduled_for, ex.attempt + 1))
            elif should_retry(job.spec.retry, failed_attempt=ex.attempt):
                job.inflight += 1
                self._retry_seq += 1
                self._retries[self._retry_seq] = (job.job_id, ex.scheduled_for, ex.attempt + 1)
                self.wheel.add((self._retry_seq << 2) | RETRY, now_ms)

    # -- introspection --------------------------------------------------------------

    def backlog(self) -> tuple[int, int]:
        fresh = sum(len(q) for q in self._fresh.values())
        overdue = sum(len(q) for q in self._overdue.values())
        return fresh + sum(len(q) for q in self._ready.values()), overdue

    def next_fires(self, job_id: int, count: int) -> list[int]:
        job = self._job(job_id)
        if job is None or job.next_fire is None:
            return []
        out = [job.next_fire]
        while len(out) < count:
            nxt = job.compiled.next_fire(out[-1])
            if nxt is None:
                break
            out.append(nxt)
        return out
