"""The shard owner's values: what it is configured with, what it is fed and
what it returns (``Actions``), and the names of its timers, phases and
outcomes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import IntEnum
from typing import NamedTuple

from wheel.engine.jobtable import Columns, ShardJobs
from wheel.engine.model import AlertKind, MissedReason, RunState, idempotency_key
from wheel.engine.profiles import Profile
from wheel.engine.records import (
    Completion,
    ExecutionRecord,
    FireClaim,
    JobRecord,
    MissedFire,
    RowChanges,
    RunStart,
    ScheduleAdvance,
)

FIRE, LEASE, TIMEOUT, RETRY = 0, 1, 2, 3
# Where a run may go: (pool, handler).
Route = tuple[str, str]
# A run as a worker names it: (run id, fence).
RunRef = tuple[int, int]
# A worker's report of a run: (run id, fence, outcome, error text).
Report = tuple[int, int, "Outcome", str]
COUNTER_BITS = 32
COUNTER_MASK = (1 << COUNTER_BITS) - 1


class Phase(IntEnum):
    CLAIMING = 0
    READY = 1
    DISPATCHED = 2
    RUNNING = 3
    ENDING = 4


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
class TenantLimit:
    """What one tenant's fires may use (None: no limit): runs claimed a
    second, and runs in flight at once (claims on their way to the store and
    runs held by workers). Fires over either wait in their queue."""

    fires_per_s: float | None = None
    max_in_flight: int | None = None


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
    # A store batch's claimed runs go to one worker until it has had this
    # many (or has no credit left), then to the next; the next batch starts
    # at the worker after the last (``Owner.batch_taken``). Each message a worker
    # gets is a round of its stream each way, about half a millisecond of
    # CPU on each side when the stream was idle (benchmarks/transport.py, 50
    # rounds/s), the same for one run as for a hundred: a tick's forty fires
    # dealt one at a time over two workers paid two rounds for what one
    # carries. Over batches the load is even; a worker never gets more than
    # its credit. 1: one run a worker in turn. A tick's batch at a few
    # thousand fires/s is 60-200 runs: dealt 64 a worker, each batch still
    # went to both of two workers (measured at 2,000 fires/s with 70-run
    # batches: the workers' CPU a fire 17% lower with 256 than with 64).
    hand_out_chunk: int = 256
    # Upper bound on missed records listed for one catch-up or pause.
    max_missed_listed: int = 100_000
    # Work that waits this long for a worker of its route raises an alert
    # ("no worker for handler H"); workers reconnecting after a restart of
    # the node or a redeploy of the fleet stay below it.
    unserved_alert_ms: int = 10_000
    # Jobs at rest (packed rows, see wheel.engine.jobtable) get a FIRE timer
    # in the wheel once their fire is due within ``arm_ahead_ms``; the owner
    # looks for more every ``arm_step_ms`` while some come due.
    arm_ahead_ms: int = 60_000
    arm_step_ms: int = 5_000
    # A job whose work is done goes back to rest (a packed row, no object)
    # unless its next fire is due within this long: jobs that fire often stay
    # awake, the millions that fire daily cost a row each.
    keep_awake_ms: int = 60_000
    # Work waiting for a worker moves up one priority level for every this
    # long it has waited (wheel.engine.priority): a priority-9 run ranks with
    # priority 0 after 9 x this. 0: no aging (strict priority).
    priority_aging_ms: int = 10_000
    # Claims waiting for a permit of their concurrency key are sent again
    # this often while any wait (``_keywaits``), and at once when a run of
    # their key ends on this owner.
    limit_poll_ms: int = 20
    # A fire is claimed up to this long before its due time when nothing of
    # its job is going on (no run, no queued or buffered fire, no jitter on
    # this fire, no concurrency key), and handed out at its due time: the
    # store's commit leaves the path from due time to worker (a burst of
    # thousands due at one instant waited for its claim's commit). 0: fires
    # are claimed at their due time. A pause or an update that lands inside
    # the lead finds the fire claimed already, as a trigger's run: it goes
    # out; a cancel ends it (cancelled).
    claim_ahead_ms: int = 250
    # Only the fires of an instant at which at least this many fires were
    # armed (a burst) are claimed ahead; the others at their time. A burst's
    # claim is long to commit (2,000 one-shots: 50-150 ms), a few fires'
    # is short; and a node lost inside the lead leaves the runs it claimed
    # to their grace lease on the shard's next owner, so the lead is spent
    # where it pays. 1: every fire the lead allows. The first of a burst's
    # fires armed one at a time are claimed at its instant.
    claim_ahead_min: int = 64

    @property
    def heartbeat_interval_ms(self) -> int:
        return self.lease_ms // 3


# Not frozen, and its __init__ spelled out: one is built per dispatch (see
# wheel.engine.records.FireClaim).
@dataclass(slots=True, kw_only=True, init=False)
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

    def __init__(
        self,
        *,
        run_id: int,
        job_id: int,
        handler: str,
        tenant: str,
        scheduled_for: int,
        attempt: int,
        fence: int,
        payload: bytes,
        lease_ms: int,
        timeout_ms: int,
    ) -> None:
        self.run_id = run_id
        self.job_id = job_id
        self.handler = handler
        self.tenant = tenant
        self.scheduled_for = scheduled_for
        self.attempt = attempt
        self.fence = fence
        self.payload = payload
        self.lease_ms = lease_ms
        self.timeout_ms = timeout_ms

    @property
    def idempotency_key(self) -> str:
        return idempotency_key(self.job_id, self.scheduled_for)


@dataclass(frozen=True, slots=True, kw_only=True)
class Revoke:
    run_id: int
    fence: int
    reason: RevokeReason


@dataclass(slots=True, kw_only=True, init=False)
class CompletionResult:
    run_id: int
    accepted: bool
    reason: str

    def __init__(self, *, run_id: int, accepted: bool, reason: str = "") -> None:
        self.run_id = run_id
        self.accepted = accepted
        self.reason = reason


@dataclass(frozen=True, slots=True, kw_only=True)
class ProtocolViolation:
    code: str  # gRPC status code name
    message: str
    run_id: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Alert:
    """Something an operator must hear of: its kind, what happened in words,
    and the job and run it is about, if one."""

    kind: AlertKind
    message: str
    job_id: int | None = None
    run_id: int | None = None
    fence: int | None = None
    worker: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RunNote:
    """A rare run event worth a log line with its ids: a lease that lapsed,
    a run that timed out."""

    what: str
    job_id: int
    run_id: int
    fence: int
    worker: str | None


@dataclass(slots=True)
class Actions:
    """What the owner decided must happen, in this order: store writes, then
    messages to workers and operators (not to be confused with
    ``wheel.effects``, the handlers' effects made once).

    One accumulator per owner, and one owner of it: the ``Driver``
    (``wheel.engine.driver``) holds it and passes it to every ``Owner`` call,
    whose methods only append to it; the driver alone takes what it holds
    out, as batches for the store (``take_store_work``), messages for the
    shell to send (``take_messages``) and jobs to read again (``resync``).
    A shell never clears it: what it was given is its own."""

    completions: list[Completion] = field(default_factory=list)
    missed: list[MissedFire] = field(default_factory=list)
    advances: list[ScheduleAdvance] = field(default_factory=list)
    claims: list[FireClaim] = field(default_factory=list)
    starts: list[RunStart] = field(default_factory=list)
    assignments: dict[str, list[Assignment]] = field(default_factory=dict)
    revokes: dict[str, list[Revoke]] = field(default_factory=dict)
    results: dict[str, list[CompletionResult]] = field(default_factory=dict)
    rejected_renewals: dict[str, list[RunRef]] = field(default_factory=dict)
    violations: dict[str, list[ProtocolViolation]] = field(default_factory=dict)
    # Worker -> the highest Credit seq applied: answered after the assignments
    # made before it, so the worker knows they are all on their way.
    credited: dict[str, int] = field(default_factory=dict)
    # Jobs whose store row disagrees with the owner: the node re-reads them.
    resync: set[int] = field(default_factory=set)
    alerts: list[Alert] = field(default_factory=list)
    notes: list[RunNote] = field(default_factory=list)
    # Dispatch lag samples (ms) of runs handed out.
    lags: list[int] = field(default_factory=list)
    # How long (ms) each claim won after waiting for a permit of its
    # concurrency key had waited.
    limit_waits: list[int] = field(default_factory=list)

    def store_work(self) -> bool:
        return bool(self.completions or self.missed or self.advances or self.claims or self.starts)

    def take_store_work(self) -> Actions:
        """Move the store writes into a new Actions, leaving messages here."""
        out = Actions(
            completions=self.completions,
            missed=self.missed,
            advances=self.advances,
            claims=self.claims,
            starts=self.starts,
        )
        self.completions, self.missed, self.advances, self.claims, self.starts = [], [], [], [], []
        return out

    def take_messages(self) -> Actions:
        """Move the messages (to workers, alerts, notes, lag samples) into a
        new Actions, leaving the store writes and the re-reads here."""
        out = Actions(
            assignments=self.assignments,
            revokes=self.revokes,
            results=self.results,
            rejected_renewals=self.rejected_renewals,
            violations=self.violations,
            credited=self.credited,
            alerts=self.alerts,
            notes=self.notes,
            lags=self.lags,
            limit_waits=self.limit_waits,
        )
        self.assignments, self.revokes, self.results = {}, {}, {}
        self.rejected_renewals, self.violations, self.credited = {}, {}, {}
        self.alerts, self.notes, self.lags = [], [], []
        self.limit_waits = []
        return out


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
class OwnerStats:
    """Counters since the owner was made; they only grow (a node's metrics
    read them when scraped, so the dispatch path pays an increment each)."""

    # Fires of schedules that came due (each fire of a catch-up counts).
    fires: int = 0
    # Claims the store answered: won (a run), or lost (the fire attempt was
    # held already: another owner, or an earlier life of this one).
    claims_won: int = 0
    claims_lost: int = 0
    dispatched: int = 0
    # Runs the store applied as succeeded (the common ending, kept out of
    # ``ended`` so that it costs one increment).
    completed: int = 0
    missed: int = 0
    dead_lettered: int = 0
    lost_leases: int = 0
    timed_out: int = 0
    superseded_completions: int = 0
    # Fires run again as a new attempt: after a lost lease (through the
    # reaper), and after a failure (after its backoff).
    redispatched: int = 0
    retried: int = 0
    # Terminal states other than succeeded the store applied, by state;
    # missed fires by reason.
    ended: dict[RunState, int] = field(default_factory=dict)
    missed_by_reason: dict[MissedReason, int] = field(default_factory=dict)

    def ended_by_state(self) -> dict[RunState, int]:
        """Every terminal state the store applied, succeeded included."""
        out = dict(self.ended)
        if self.completed:
            out[RunState.SUCCEEDED] = self.completed
        return out

    def copy(self) -> OwnerStats:
        """A copy that later counts do not change."""
        out = replace(self)
        out.ended = dict(self.ended)
        out.missed_by_reason = dict(self.missed_by_reason)
        return out


class PackedJob(NamedTuple):
    """A job as it rests, and as a checkpoint keeps it: the nominal time of
    its earliest unclaimed fire (``NO_FIRE``: none), when that fire is due
    (``NEVER``: nothing to arm, e.g. paused), its schedule parameter, its
    profile (``wheel.engine.profiles``) and flags (``PAUSED``, ``PAYLOAD``)."""

    job_id: int
    nxt: int
    due: int
    param: int
    profile_id: int
    flags: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardContents:
    """What an owner takes on with shards it gains (``Owner.add_shards``),
    from its checkpoint or the store; the store wins where they differ.

    ``packed`` are the shards' jobs as packed rows (shard -> columns, see
    ``wheel.engine.jobtable``), their ``prof`` column indexing ``profiles``:
    taken on at once without an object per job. ``tables`` are shards' rows
    as tables built already (numbered the same way), which the owner makes
    its own in place: built where the contents were read, off the owner's
    loop and, for a planned move, ahead of the switch; a shard in both is
    taken from ``tables``. ``rows`` and ``jobs`` are applied on top: the
    changes since the packed rows were made.
    ``finished`` are jobs whose schedule is over (completed, cancelled) but
    that still have runs in ``inflight`` or retries owed in ``retries``
    (latest attempts that ended failed, lost or timed out with no newer
    attempt)."""

    packed: Mapping[int, Columns] = field(default_factory=dict)
    # Each taken once: the owner keeps it and changes it.
    tables: Mapping[int, ShardJobs] = field(default_factory=dict)
    profiles: Sequence[Profile] = ()
    # Changes applied on top of ``packed`` (the store wins): as rows, then as
    # records.
    rows: Sequence[RowChanges] = ()
    jobs: Sequence[JobRecord] = ()
    finished: Sequence[JobRecord] = ()
    inflight: Sequence[ExecutionRecord] = ()
    retries: Sequence[ExecutionRecord] = ()
