"""The record of truth: one ``Store`` protocol, two backends (SQLite, PostgreSQL).

The store holds job definitions, schedule state (``next_run_at``) and every
execution. The shard owner keeps its fast state in memory and in the LMDB
checkpoint, but whenever they disagree the store wins.

Rules every backend keeps (the contract suite in ``tests/store`` checks them):

1. ``claim_fires`` is ONE transaction for a whole batch. Per claim it inserts an
   execution ``ON CONFLICT (job_id, scheduled_for, attempt) DO NOTHING`` and,
   only when that insert won and the claim asks to advance the schedule, moves
   ``next_run_at`` from ``expected_next_run_at`` to ``new_next_run_at`` with a
   compare-and-swap: a stale owner never moves a schedule backwards (seed R4).
2. ``complete_runs`` applies a terminal state only when the run is not terminal
   yet, its fence equals the one given, and no execution of the same fire
   ``(job_id, scheduled_for)`` carries a newer fence. Otherwise the completion
   is reported as superseded and nothing changes.
3. Lease renewals never reach the store (seed R2).
4. Backend errors are wrapped in ``wheel.errors.StoreError`` subclasses.

All times are integer milliseconds since the Unix epoch; ids are 64-bit ints.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Protocol

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
    WriteBatch,
)
from wheel.errors import WheelError

__all__ = [
    "SHARD_COUNT",
    "TERMINAL_RUN_STATES",
    "BatchOutcome",
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
    "WriteBatch",
    "idempotency_key",
    "shard_of",
]


class Store(Protocol):
    """The record of truth. Blocking calls: the node runs them off the event loop."""

    def migrate(self) -> None:
        """Apply pending schema migrations; safe to run twice and concurrently."""

    def close(self) -> None: ...

    # -- jobs -----------------------------------------------------------------

    def submit_job(self, new: NewJob) -> tuple[JobRecord, bool]:
        """Insert a job; returns (job, created). Same (tenant, key) and same body
        returns the existing job with created=False; a different body raises
        ``AlreadyExists``."""

    def submit_jobs(self, news: Sequence[NewJob]) -> list[tuple[JobRecord, bool] | WheelError]:
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
        """Cancel / pause / resume: sets state and next_run_at. Raises ``NotFound``."""

    # -- executions -----------------------------------------------------------

    def claim_fires(self, claims: Sequence[FireClaim]) -> list[ClaimOutcome]:
        """One transaction for the whole batch; outcomes in the order of claims."""

    def write_batch(self, batch: WriteBatch) -> BatchOutcome:
        """One dispatch-loop iteration's writes, in this order: completions,
        missed fires, schedule advances, claims, starts (a retry's claim must
        follow its failed attempt's completion; an advance must precede the
        claim that expects it). SQLite does it in one transaction."""

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
    ) -> tuple[list[JobRecord], int]:
        """Jobs of these shards changed after ``watermark`` and the new watermark.
        Never skips a change whose transaction commits late. ``owner_moves=False``
        reports only jobs changed through the API (each as it is now, owner
        moves included), not the owner's own schedule moves (claim and advance
        CAS): a running owner needs only what others changed, while a
        restarting one needs both. An owner move after an API change never
        hides the API change."""

    # -- retention ------------------------------------------------------------

    def purge_history(self, finished_before_ms: int, batch: int = 10_000) -> int:
        """Delete terminal executions and missed records older than the cutoff, in
        bulk; returns how many rows went."""
