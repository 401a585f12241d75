"""The record of truth: one ``Store`` protocol, two backends (SQLite, PostgreSQL).

The store holds job definitions, schedule state (``next_run_at``) and every
execution. The shard owner keeps its fast state in memory and in the LMDB
checkpoint, but whenever they disagree the store wins.

Rules every backend keeps (the contract suite in ``tests/store`` checks them,
against an in-memory reference model of this protocol too):

1. ``claim_fires`` is ONE transaction for a whole batch. Per claim it inserts an
   execution ``ON CONFLICT (job_id, scheduled_for, attempt) DO NOTHING`` and,
   only when that insert won and the claim asks to advance the schedule, moves
   ``next_run_at`` from ``expected_next_run_at`` to ``new_next_run_at`` with a
   compare-and-swap: a stale owner never moves a schedule backwards (seed R4).
2. ``complete_runs`` applies a terminal state only when the run is not terminal
   yet, its fence equals the one given, and no execution of the same fire
   ``(job_id, scheduled_for)`` carries a newer fence. Otherwise the completion
   is reported as superseded and nothing changes.
3. A write made again reports the first one's work as its own (see
   ``write_batch``): fences are unique per assignment, so a claim that finds
   its fire attempt held with its own fence, or a start or completion that
   finds its run already in exactly the state it asks for, is the caller's
   own earlier write.
4. Every change of a job is stamped with a change marker, an integer that
   names the write: one for all the jobs one write changes, a larger one for
   a later write (PostgreSQL: the writing transaction's id; SQLite: a change
   number). ``changes_since`` hands changes out in marker order.
5. Lease renewals never reach the store (seed R2).
6. Backend errors are wrapped in ``wheel.errors.StoreError`` subclasses.

All times are integer milliseconds since the Unix epoch; ids are 64-bit ints.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import NamedTuple, Protocol

from wheel.engine.model import (
    SHARD_COUNT,
    TERMINAL_RUN_STATES,
    JobState,
    MissedReason,
    RunState,
    idempotency_key,
    shard_of,
)
from wheel.engine.records import (
    BatchOutcome,
    ClaimOutcome,
    Completion,
    CompletionOutcome,
    ExecutionRecord,
    FireClaim,
    JobRecord,
    MissedFire,
    NewJob,
    RunStart,
    ScheduleAdvance,
    ShardLoad,
    UnparsedJob,
    WriteBatch,
)
from wheel.errors import WheelError

__all__ = [
    "SHARD_COUNT",
    "TERMINAL_RUN_STATES",
    "BatchOutcome",
    "Changes",
    "ClaimOutcome",
    "Completion",
    "CompletionOutcome",
    "ExecutionRecord",
    "FireClaim",
    "JobRecord",
    "JobState",
    "MissedFire",
    "MissedReason",
    "NewJob",
    "RunStart",
    "RunState",
    "ScheduleAdvance",
    "ShardLoad",
    "Submitted",
    "UnparsedJob",
    "WriteBatch",
    "idempotency_key",
    "shard_of",
    "write_in_order",
]


class Submitted(NamedTuple):
    """A submit's answer: the job as stored, and whether this call created it
    (False: the same key and body were submitted before)."""

    job: JobRecord
    created: bool


class Changes(NamedTuple):
    """A page of the change feed: the jobs as they are now, and the watermark
    to read on from."""

    jobs: list[JobRecord]
    watermark: int


class Store(Protocol):
    """The record of truth. Blocking calls: the node runs them off the event loop."""

    def migrate(self) -> None:
        """Apply pending schema migrations; safe to run twice and concurrently."""

    def close(self) -> None: ...

    def ping(self) -> None:
        """One trivial round trip, not retried (a health probe): raises
        ``StoreUnavailable`` when the store cannot answer now."""

    # -- jobs -----------------------------------------------------------------

    def submit_job(self, new: NewJob) -> Submitted:
        """Insert a job. Same (tenant, key) and same body returns the existing
        job with ``created=False``; a different body raises ``AlreadyExists``.
        A created job's ``change`` is this write's change marker."""

    def submit_jobs(self, news: Sequence[NewJob]) -> list[Submitted | WheelError]:
        """``submit_job`` for many in ONE transaction (group commit of concurrent
        submits); a key conflict is returned in that submit's place."""

    def get_job(self, job_id: int) -> JobRecord:
        """Raises ``NotFound``."""

    def list_jobs(
        self,
        *,
        tenant: str | None = None,
        state: JobState | None = None,
        after_job_id: int = 0,
        limit: int = 100,
    ) -> list[JobRecord]:
        """Jobs ordered by job_id, strictly after ``after_job_id`` (stable paging)."""

    def set_job_state(
        self, job_id: int, state: JobState, *, next_run_at: int | None, now_ms: int
    ) -> JobRecord:
        """Cancel / pause / resume: sets state and next_run_at; the job comes
        back with this write's change marker. Raises ``NotFound``."""

    # -- executions -----------------------------------------------------------

    def claim_fires(self, claims: Sequence[FireClaim]) -> list[ClaimOutcome]:
        """One transaction for the whole batch; outcomes in the order of claims."""

    def write_batch(self, batch: WriteBatch) -> BatchOutcome:
        """One dispatch-loop iteration's writes; answers in the batch's order.

        Order. The kinds are applied as if one after another: completions,
        missed fires, schedule advances, claims, starts. Missed fires go before
        the advances that move past them (a failure in between leaves a fire
        recorded, never skipped in silence), and an advance before the claim
        whose compare-and-swap expects it.

        Transactions. SQLite writes the whole batch in ONE transaction (one
        fsync): all of it or none; so does the reference model, in memory.
        PostgreSQL writes each kind in a transaction of its own: missed
        fires, advances, claims and starts one after another on the calling
        thread, and the completions at the same time on a second connection;
        it returns once all have committed. A failure there may leave some
        kinds committed and others not.

        Why the completions may commit beside the rest: they only end runs
        that are in flight already, while the other kinds insert new runs,
        record missed fires, move schedules and start runs the same batch does
        not complete (the caller leaves such starts out). The one pair that
        would depend on the order is a completion and a claim of another
        attempt of the same fire, and the owner never forms it: it claims a
        new attempt only once the store has answered that the older one
        ended, so that completion was in an earlier batch, and batches are
        written one after another. So every answer is what one transaction in
        the order above would have given, and the owner, which feeds the
        answers back in the batch's order, cannot tell the difference; a
        failure part-way is covered by writing the batch again (below). Put
        in one batch anyway, either may commit first on PostgreSQL, and when
        the claim does, the fence check reports the completion superseded.

        Retries and errors. PostgreSQL retries each kind's transaction on a
        lost connection, with backoff; when the connection died during COMMIT
        (outcome unknown) it retries every kind but the schedule advances,
        which raise ``StoreUnavailable`` instead (an advance that applied would
        then read as not applied). SQLite waits up to its busy timeout for
        the write lock and does not retry. Whatever fails comes out as a
        ``StoreError``, and the caller writes the whole batch again.

        A batch written again reports the first write's work as its own, on
        every store: a claim whose fire attempt is held with its own fence is
        won, with that run's id (``advanced`` when the job's schedule stands at
        the claim's new next fire, so of several claims of one job only the
        last reads as moved); a completion or a start whose run is already in
        exactly that state with that fence is applied; a missed fire is not
        recorded twice; an advance that applied before does not apply again
        (advances have no answer in ``BatchOutcome``). The same (run, fence)
        twice in one batch is applied once, and the repeat reported not
        applied."""

    def advance_schedules(self, advances: Sequence[ScheduleAdvance]) -> list[bool]:
        """CAS ``next_run_at`` from expected to new where it still equals expected;
        one transaction; True where applied. Never completes or reactivates a job."""

    def mark_running(self, starts: Sequence[RunStart]) -> list[bool]:
        """dispatched -> running where the fence matches; one transaction."""

    def complete_runs(self, completions: Sequence[Completion]) -> list[CompletionOutcome]:
        """Fenced terminal transitions; one transaction; outcomes in order."""

    def record_missed(self, missed: Sequence[MissedFire]) -> None:
        """Missed fires with reasons; a repeat of the same (job, fire) is ignored."""

    def get_run(self, run_id: int) -> ExecutionRecord:
        """Raises ``NotFound``."""

    def list_runs(
        self, job_id: int, *, before_run_id: int | None = None, limit: int = 100
    ) -> list[ExecutionRecord]:
        """Newest first."""

    def list_missed(
        self, job_id: int, *, before_scheduled_for: int | None = None, limit: int = 100
    ) -> list[MissedFire]:
        """Newest first."""

    def fires_exist(self, job_id: int, scheduled_for: Sequence[int]) -> set[int]:
        """Which of these fire times already have an execution (any attempt) or a
        missed record: backfill skips them."""

    # -- ownership ------------------------------------------------------------

    def acquire_epochs(self, shards: Collection[int], owner: str) -> dict[int, int]:
        """Bump and return each shard's ownership epoch (strictly increasing):
        how a single node takes every shard at start."""

    def fence_shards(self, epochs: Mapping[int, int], owner: str) -> dict[int, int]:
        """Raise each shard's epoch to the one given (a cluster's coordinator
        issues them, strictly increasing per shard), never lowering it. From
        its commit on, the store refuses the shard's claims, completions and
        schedule moves from an older epoch (seed C4), so a node that lost the
        shard writes nothing more. Returns each shard's epoch after: one
        higher than given means a newer owner fenced it first."""

    def shard_epochs(self, shards: Collection[int]) -> dict[int, int]:
        """The epoch each shard has in the store (absent: never owned)."""

    def load_shards(self, shards: Collection[int], *, unparsed: bool = False) -> ShardLoad:
        """Active/paused jobs and in-flight executions of these shards. With
        ``unparsed``, paused jobs and active ones with a next fire come as
        rows in ``ShardLoad.unparsed`` (a restart arms them without parsing
        their specs); the rest are parsed into ``jobs`` as without it."""

    def inflight_runs(self, shards: Collection[int]) -> list[ExecutionRecord]:
        """Dispatched or running executions of these shards (``load_shards``
        without the jobs: a restart from a checkpoint needs only these)."""

    def retry_candidates(self, shards: Collection[int]) -> list[ExecutionRecord]:
        """Latest attempts of fires in these shards that ended failed, lost or
        timed out with no newer attempt (job not cancelled): a retry or
        re-dispatch the previous owner had pending when it stopped."""

    def changes_since(
        self,
        watermark: int,
        shards: Collection[int],
        limit: int = 10_000,
        *,
        owner_moves: bool = True,
        exclude: Collection[int] = (),
    ) -> Changes:
        """Jobs of these shards changed after ``watermark``, each as it is now,
        in the order of their change markers, and the new watermark. Never
        skips a change whose transaction commits late. A page holds at most
        ``limit`` jobs, unless one write changed more: it is never split.

        ``owner_moves=False`` reports only jobs changed through the API (each
        as it is now, owner moves included), not the owner's own schedule
        moves (claim and advance CAS): a running owner needs only what others
        changed, while a restarting one needs both. An owner move after an API
        change never hides the API change.

        ``exclude``: change markers of writes the caller made itself (the
        ``change`` of the jobs its submits and state changes returned). A job
        whose last change, of the kinds asked for, carries one of them is left
        out: the caller has it already, and a node need not read and parse
        back every job it stored. A marker below a returned watermark is never
        reported again, so the caller may forget those."""

    # -- retention ------------------------------------------------------------

    def purge_history(self, finished_before_ms: int, batch: int = 10_000) -> int:
        """Delete terminal executions and missed records older than the cutoff, in
        bulk; returns how many rows went."""

    def purge_steps(self, finished_before_ms: int, batch: int = 1_000) -> Iterator[int]:
        """``purge_history`` one short transaction at a time: each step deletes
        what is past the cutoff among at most ``batch`` rows, commits, and
        yields how many went; the caller paces the steps (the node's
        retention sleeps between them). Rows in flight or newer than the
        cutoff are never touched; a generator dropped half-way leaves every
        step it ran committed and the rest for the next pass."""


def write_in_order(store: Store, batch: WriteBatch) -> BatchOutcome:
    """``batch`` through the one-kind calls, in ``write_batch``'s order: what a
    store that writes a batch in one transaction runs inside it."""
    completed = store.complete_runs(batch.completions)
    store.record_missed(batch.missed)
    store.advance_schedules(batch.advances)
    claimed = store.claim_fires(batch.claims)
    store.mark_running(batch.starts)
    return BatchOutcome(completions=completed, claims=claimed)
