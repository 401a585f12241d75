"""The record of truth: the ``Store`` protocol, two backends (SQLite, PostgreSQL).

``Store`` is made of roles, each a protocol of its own that a caller
needing only it can take: ``JobStore`` (jobs through the API),
``TenancyStore`` (tokens and quotas), ``SecretStore`` (the signing secrets
of HTTP targets), ``AuditStore`` (the audit trail), ``CalendarStore`` (days
jobs skip), ``TraceStore`` (jobs' trace contexts), ``LimitStore``
(concurrency keys and rate limits), ``DispatchStore`` (the owner's claims,
completions and batches), ``OwnershipStore`` (epochs, fences, shard loads
and the change feed), ``HistoryStore`` (runs, missed fires, retention) and
``OverviewStore`` (the console's aggregates over jobs and runs).

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
7. An owner's batch carries the epochs it holds its shards under, and the
   store refuses, in the write's own transaction, every write of a shard
   from an epoch older than the shard's (seed C4; see ``write_batch``).
8. A claim of a job with a concurrency key takes a permit of its limit in
   the claim's own transaction, or is answered ``waiting`` with nothing
   written; every transition of a keyed run out of dispatched/running gives
   its permit back in its own transaction, unless its worker gave it back
   earlier (``release_returned``: its handler returned). A limit's
   ``in_flight`` is the count of its runs in flight in the store that still
   carry its key (``wheel.store._limits``).

All times are integer milliseconds since the Unix epoch; ids are 64-bit ints.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
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
    JobChange,
    JobRecord,
    JobRow,
    MissedFire,
    NewJob,
    PackedRows,
    RowChanges,
    RunStart,
    ScheduleAdvance,
    ShardLoad,
    SpecUpdate,
    Updated,
    WriteBatch,
)
from wheel.errors import WheelError
from wheel.store._roles import (
    AuditEntry,
    AuditStore,
    CalendarRecord,
    CalendarStore,
    FeedPage,
    FeedRun,
    FireMark,
    LimitRecord,
    LimitStore,
    OutcomeCount,
    OverviewStore,
    RunStats,
    TraceStore,
)

__all__ = [
    "SHARD_COUNT",
    "TERMINAL_RUN_STATES",
    "AuditEntry",
    "AuditStore",
    "BatchOutcome",
    "CalendarRecord",
    "CalendarStore",
    "Changes",
    "ClaimOutcome",
    "Completion",
    "CompletionOutcome",
    "DispatchStore",
    "ExecutionRecord",
    "FeedPage",
    "FeedRun",
    "FireClaim",
    "FireMark",
    "HistoryStore",
    "JobChange",
    "JobRecord",
    "JobRow",
    "JobState",
    "JobStore",
    "KindWrites",
    "LimitRecord",
    "LimitStore",
    "MissedFire",
    "MissedReason",
    "NewJob",
    "OutcomeCount",
    "OverviewStore",
    "OwnershipStore",
    "PackedRows",
    "RowChanges",
    "RunStart",
    "RunState",
    "RunStats",
    "ScheduleAdvance",
    "Seal",
    "SecretRecord",
    "SecretStore",
    "ShardLoad",
    "SpecUpdate",
    "Store",
    "Submitted",
    "TenancyStore",
    "TenantQuota",
    "TokenRecord",
    "TraceStore",
    "Updated",
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


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenRecord:
    """A bearer token as the store keeps it: never the secret, only its hash
    (``wheel.auth``). ``tenant`` is ``*`` for operators; a worker token names
    the worker id and pools it may connect as. Times are epoch ms; None: no
    expiry, not revoked."""

    token_id: str
    secret_hash: str
    tenant: str
    scopes: tuple[str, ...]
    worker_id: str | None = None
    pools: tuple[str, ...] = ()
    label: str = ""
    created_at_ms: int
    expires_at_ms: int | None = None
    revoked_at_ms: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class TenantQuota:
    """A tenant's limits (None: no limit): jobs it may hold (active or
    paused), submits and fires a second, and runs in flight at once."""

    tenant: str
    max_jobs: int | None = None
    submits_per_s: float | None = None
    fires_per_s: float | None = None
    max_in_flight: int | None = None
    updated_at_ms: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class SecretRecord:
    """One version of a signing secret as the store keeps it: its key sealed
    with the nodes' secrets key (``key_id`` names that key, never holds it),
    bound to its tenant, name and version. ``retires_at_ms``: None while it
    is the newest version; else when it stops signing (a rotation's
    overlap). Times are epoch ms."""

    tenant: str
    name: str
    version: int
    key_id: str
    ciphertext: bytes
    created_at_ms: int
    retires_at_ms: int | None = None

    def signing(self, now_ms: int) -> bool:
        return self.retires_at_ms is None or self.retires_at_ms > now_ms


# Seals a secret's new key for the version the store gives it (the version
# is part of what the seal binds): the key id and the ciphertext.
Seal = Callable[[int], tuple[str, bytes]]


class Changes(NamedTuple):
    """A page of the change feed: the jobs as they are now, and the watermark
    to read on from."""

    jobs: list[JobRecord]
    watermark: int


class JobStore(Protocol):
    """Jobs as the API reads and writes them: submits, reads, state changes
    and spec updates, each in one transaction."""

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
        name_prefix: str = "",
        after_name: str | None = None,
    ) -> list[JobRecord]:
        """Jobs ordered by job_id, strictly after ``after_job_id`` (stable paging).
        With ``name_prefix``: only the jobs whose name starts with it
        (case-sensitive), ordered by (name, job_id), strictly after
        (``after_name``, ``after_job_id``) when ``after_name`` is given; an
        index range, never a scan of every job."""

    def set_job_state(
        self, job_id: int, state: JobState, *, next_run_at: int | None, now_ms: int
    ) -> JobRecord:
        """Cancel / pause / resume: sets state and next_run_at; the job comes
        back with this write's change marker. Raises ``NotFound``."""

    def update_job(self, update: SpecUpdate, *, if_version: int | None = None) -> Updated:
        """Replace a job's spec and next fire (its state as it is), in ONE
        transaction that also records the change in the job's history
        (version 1, 2, ...) and stamps the job with this write's change
        marker. With a key: the same key and body again returns the job as it
        is now and the change that key made (``applied=False``); another body
        raises ``AlreadyExists``. Raises ``NotFound``, and
        ``FailedPrecondition`` for a cancelled job, or when ``if_version`` is
        given and the job's newest update is another version (0: none)."""

    def list_job_updates(
        self, job_id: int, *, before_version: int | None = None, limit: int = 100
    ) -> list[JobChange]:
        """A job's recorded updates, newest first."""

    def list_dead_letters(
        self,
        *,
        job_id: int | None = None,
        tenant: str | None = None,
        before_run_id: int | None = None,
        limit: int = 100,
    ) -> list[ExecutionRecord]:
        """Dead-lettered runs with no later attempt of their fire (not
        redriven yet), newest first: of one job, or of every job (of
        ``tenant``), through an index of dead letters (no scan of the
        executions)."""


class TenancyStore(Protocol):
    """Tenants and their tokens (``wheel.auth``): tokens, quotas, and the
    count a max-jobs quota is checked against."""

    def count_jobs(self, tenant: str) -> int:
        """How many active or paused jobs ``tenant`` holds (its max-jobs quota)."""

    def create_token(self, token: TokenRecord) -> None:
        """Store a new token; an existing ``token_id`` raises ``AlreadyExists``."""

    def get_token(self, token_id: str) -> TokenRecord:
        """Raises ``NotFound``."""

    def list_tokens(self) -> list[TokenRecord]:
        """Every token, revoked and expired ones included, by creation time."""

    def revoke_token(self, token_id: str, now_ms: int) -> TokenRecord:
        """Mark a token revoked at ``now_ms`` (again: keeps the first time);
        raises ``NotFound``."""

    def set_tenant_quota(self, quota: TenantQuota) -> TenantQuota:
        """Replace the tenant's limits with ``quota``'s."""

    def list_tenant_quotas(self) -> list[TenantQuota]:
        """Every tenant with limits set, by name."""


class SecretStore(Protocol):
    """The signing secrets of HTTP targets, by tenant, name and version. The
    store never sees a key in the clear: ``seal`` (run inside the write's
    transaction, so it must be quick) turns the version the store picks
    into what it keeps. A version past its ``retires_at_ms`` no longer signs
    and is deleted when a call comes across it."""

    def set_secret(self, tenant: str, name: str, seal: Seal, now_ms: int) -> SecretRecord:
        """Create the secret (version 1), or replace every version of it with
        one new version (the highest so far plus one, so a version number is
        never reused while a node may cache the one before)."""

    def rotate_secret(
        self, tenant: str, name: str, seal: Seal, now_ms: int, overlap_ms: int
    ) -> SecretRecord:
        """Add a new version (the highest plus one); the versions before it
        sign until ``now_ms + overlap_ms`` (or their own retirement if that
        comes sooner). ``NotFound`` when the secret does not exist."""

    def list_secrets(self, now_ms: int, tenant: str | None = None) -> list[SecretRecord]:
        """Every version still signing at ``now_ms``, of ``tenant`` (None:
        of every tenant), by tenant, name and version."""

    def delete_secret(self, tenant: str, name: str) -> int:
        """Delete every version of the secret; how many versions it removed
        (0: there was no such secret)."""


class KindWrites(Protocol):
    """The owner's writes one kind at a time, each in one transaction, or
    all inside the one transaction of a batch (``write_in_order``)."""

    def claim_fires(self, claims: Sequence[FireClaim]) -> list[ClaimOutcome]:
        """One transaction for the whole batch; outcomes in the order of
        claims. A won claim that asks for its job's payload has it in its
        outcome (read in the same transaction)."""

    def advance_schedules(self, advances: Sequence[ScheduleAdvance]) -> list[bool]:
        """CAS ``next_run_at`` from expected to new where it still equals expected;
        one transaction; True where applied. Never completes or reactivates a job."""

    def mark_running(self, starts: Sequence[RunStart]) -> list[bool]:
        """dispatched -> running where the fence matches; one transaction."""

    def complete_runs(self, completions: Sequence[Completion]) -> list[CompletionOutcome]:
        """Fenced terminal transitions; one transaction; outcomes in order."""

    def record_missed(self, missed: Sequence[MissedFire]) -> None:
        """Missed fires with reasons; a repeat of the same (job, fire) is ignored."""


class DispatchStore(KindWrites, Protocol):
    """The owner's writes: what one iteration of its dispatch loop claims,
    completes, records and moves, as a batch or one kind at a time."""

    def write_batch(self, batch: WriteBatch) -> BatchOutcome:
        """One dispatch-loop iteration's writes; answers in the batch's order.

        Order. The kinds are applied as if one after another: completions,
        missed fires, schedule advances, claims, starts (``write_in_order``).
        Missed fires go before the advances that move past them (a failure
        in between leaves a fire recorded, never skipped in silence), and an
        advance before the claim whose compare-and-swap expects it.

        Transactions are the backend's (each says how in its own
        ``write_batch``): SQLite and the reference model write the whole
        batch in ONE transaction, all of it or none; PostgreSQL writes each
        kind in a transaction of its own and may leave some committed and
        others not when it fails. Either way every answer is what one
        transaction in the order above would have given.

        Epochs (seed C4). With ``batch.epochs`` (shard -> the epoch the
        writer holds it under; None: not checked), every transaction the
        batch commits reads first the stored epochs of the writer's shards,
        locked against ``fence_shards`` until it ends, and refuses each
        shard whose stored epoch is newer than the writer's, and each shard
        missing from ``batch.epochs`` that a write is about. A refused shard
        gets nothing of the batch: its claims come back unwon (no run id,
        not advanced), its completions unapplied, and its missed fires,
        schedule advances and starts are not written. The other shards'
        writes go on as they would without the check. ``BatchOutcome.fenced``
        names the refused shards: every shard of ``batch.epochs`` a check
        found newer, whether the batch writes about it or not, and the
        missing shards it writes about (on PostgreSQL, a missing shard whose
        only writes are completions or starts that would not have applied
        anyway may go unnamed). A shard with no stored epoch was never
        fenced and is current: every owner fences a shard before it writes
        to it. A write refused after an earlier write of it committed (a
        batch written again) reports refused all the same: the shard is the
        newer owner's now, and it goes by what the store holds. No write
        checks an old epoch and commits after the fence (each backend's
        ``write_batch`` says how its lock keeps that rule).

        The common case costs one small statement per transaction: each
        write's shard is worked out only when a shard is refused or the
        writer does not hold every shard (``wheel.store._fence``).

        Errors. Whatever fails comes out as a ``StoreError``, and the caller
        writes the whole batch again.

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


class OwnershipStore(Protocol):
    """Shards and who owns them: epochs and fences, the clock and change
    mark an owner anchors to, a shard's load, and the change feed that
    keeps a running owner current."""

    def clock_ms(self) -> int:
        """The store's wall clock now (PostgreSQL: the server's; SQLite: the
        host's, which is the node's). Nodes anchor their own clock to it, so
        a cluster fires by one clock whatever its hosts' clocks say."""

    def change_mark(self) -> int:
        """The store's change mark: a number its commits only ever raise
        (SQLite: the change counter every schedule move and API change
        bumps), reported again with each batch (``BatchOutcome.change_mark``).
        A mark the checkpoint logged that is above the store's now means the
        store lost commits the checkpoint saw (a power loss with commits not
        fsynced, a database restored from a backup): the checkpoint is then
        ahead of the record of truth and is not used. 0: the store keeps no
        such mark (PostgreSQL: its commits are flushed before they return)."""

    def acquire_epochs(self, shards: Collection[int], owner: str) -> dict[int, int]:
        """Bump and return each shard's ownership epoch (strictly increasing):
        how a single node takes every shard at start."""

    def fence_shards(self, epochs: Mapping[int, int], owner: str) -> dict[int, int]:
        """Raise each shard's epoch to the one given (a cluster's coordinator
        issues them, strictly increasing per shard), never lowering it. From
        its commit on, ``write_batch`` refuses every write of the shard from
        an older epoch, in that write's own transaction (seed C4), so a node
        that lost the shard writes nothing more. It waits for the batch
        transactions that checked the shard's epoch before it: a load of the
        shard after it returns sees every write an older owner's batches
        ever make there. Returns each shard's epoch after: a higher one than
        given means a newer owner fenced it first."""

    def release_unsent(self, shards: Collection[int], sent: Collection[int]) -> int:
        """A planned hand-over of ``shards``, after their owner stopped
        serving them and before it releases them: mark the runs it claimed
        and never sent to a worker (every in-flight run of its epoch not in
        ``sent``, claims of batches that committed after it forgot them
        included) so that the next owner sends them at once instead of
        waiting out a grace lease for a worker that never had them. Nothing
        is marked once a newer owner fenced a shard. Returns how many."""

    def take_unsent(self, run_ids: Collection[int]) -> set[int]:
        """A new owner, after its fence, takes the runs of ``run_ids`` still
        marked unsent (``release_unsent``): the mark is cleared and their ids
        returned; it sends those at once. A run whose mark another owner took
        already is not returned: whether that one sent it is unknown, so it
        waits for its worker under a grace lease like any run adopted."""

    def shard_epochs(self, shards: Collection[int]) -> dict[int, int]:
        """The epoch each shard has in the store (absent: never owned)."""

    def load_shards(
        self,
        shards: Collection[int],
        *,
        packed: bool = False,
        due_by: int | None = None,
        later_than: int | None = None,
    ) -> ShardLoad:
        """Active/paused jobs and in-flight executions (with their jobs'
        payloads) of these shards. With ``packed``, paused jobs and active
        ones with a next fire come as columns in ``ShardLoad.packed``, with
        their profiles' bodies (an owner takes them on without parsing a
        spec); the rest are parsed into ``jobs`` as without it.

        A load in two parts, due first (``packed`` only): ``due_by`` gives
        only the columns of active jobs due by then (the rest parsed, the
        runs in flight, as above); ``later_than`` only the columns of the
        others (paused, or due after it), and no runs."""

    def inflight_runs(self, shards: Collection[int]) -> list[ExecutionRecord]:
        """Dispatched or running executions of these shards, with their jobs'
        payloads (``load_shards`` without the jobs: a restart from a
        checkpoint needs only these)."""

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

    def changed_rows(
        self,
        watermark: int,
        shards: Collection[int],
        limit: int = 10_000,
        *,
        owner_moves: bool = True,
        exclude: Collection[int] = (),
    ) -> RowChanges:
        """``changes_since`` with each job as a ``JobRow`` (no spec to parse:
        what a running owner reads), jobs stored before profiles parsed, and
        the bodies of the profiles the rows name."""

    def job_rows(self, job_ids: Collection[int]) -> RowChanges:
        """These jobs as ``JobRow`` values (those that exist), as
        ``changed_rows`` gives them: one read for many jobs."""


class HistoryStore(Protocol):
    """What ran and what was missed: runs and missed fires as the API reads
    them, and their retention."""

    def get_run(self, run_id: int) -> ExecutionRecord:
        """Raises ``NotFound``."""

    def list_runs(
        self, job_id: int, *, before_run_id: int | None = None, limit: int = 100
    ) -> list[ExecutionRecord]:
        """Newest first: by fire time, then attempt (a retry right after
        its first attempt, a backfilled old fire at its fire time, not at
        its claim). ``before_run_id``: the runs after that one of the job
        in this order (the page below it). A cursor whose run is gone
        (retention deleted it meanwhile) goes on with the runs claimed
        before it."""

    def runs_of_fires(self, job_id: int, scheduled_for: Sequence[int]) -> list[ExecutionRecord]:
        """Every attempt of these fires of the job, by fire time then attempt."""

    def list_missed(
        self, job_id: int, *, before_scheduled_for: int | None = None, limit: int = 100
    ) -> list[MissedFire]:
        """Newest first."""

    def fires_exist(self, job_id: int, scheduled_for: Sequence[int]) -> set[int]:
        """Which of these fire times already have an execution (any attempt) or a
        missed record: backfill skips them."""

    def purge_history(self, finished_before_ms: int, batch: int = 10_000) -> int:
        """Delete terminal executions and missed records older than the cutoff, in
        bulk; returns how many rows went."""

    def purge_steps(self, finished_before_ms: int, batch: int = 1_000) -> Iterator[int]:
        """``purge_history`` one short transaction at a time: each step deletes
        what is past the cutoff among ``batch`` rows (with those ending in the
        same millisecond as the last of them), commits, and yields how many
        went, the steps as many as what expired needs, however many rows are
        kept; the caller paces the steps (the node's
        retention sleeps between them). Rows in flight or newer than the
        cutoff are never touched; a generator dropped half-way leaves every
        step it ran committed and the rest for the next pass."""


class Store(
    JobStore,
    TenancyStore,
    SecretStore,
    AuditStore,
    CalendarStore,
    TraceStore,
    LimitStore,
    OverviewStore,
    DispatchStore,
    OwnershipStore,
    HistoryStore,
    Protocol,
):
    """The record of truth: every role in one. Blocking calls: the node runs
    them off the event loop. A caller that needs one role takes that
    protocol instead."""

    def migrate(self) -> None:
        """Apply pending schema migrations; safe to run twice and concurrently."""

    def close(self) -> None: ...

    def ping(self) -> None:
        """One trivial round trip, not retried (a health probe): raises
        ``StoreUnavailable`` when the store cannot answer now."""

    def refresh_statistics(self) -> list[tuple[str, int]]:
        """Bring the planner's statistics of the tables the dispatch path
        reads up to date where they lag far behind the rows (as after a bulk
        load, on a server whose autovacuum has not come round or is off):
        ``(table, rows changed since the last analysis)`` of each table
        analyzed, none when every one was fresh enough. A table another
        session is analyzing or vacuuming is left for the next call."""


def write_in_order(tx: KindWrites, batch: WriteBatch) -> BatchOutcome:
    """``batch`` through the one-kind writes of ``tx``, in ``write_batch``'s
    order: what a store that writes a batch in one transaction runs inside
    it, with ``tx`` writing in that transaction."""
    completed = tx.complete_runs(batch.completions)
    tx.record_missed(batch.missed)
    tx.advance_schedules(batch.advances)
    claimed = tx.claim_fires(batch.claims)
    tx.mark_running(batch.starts)
    return BatchOutcome(completions=completed, claims=claimed)
