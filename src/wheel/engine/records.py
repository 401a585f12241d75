"""Records that cross the engine/store boundary: pure frozen values.

The shard owner emits them as actions (claims, completions, missed fires) and
receives them back (jobs and executions loaded from the store). They live in
the engine so that the engine never imports the store; ``wheel.store.base``
re-exports them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from wheel.engine.model import JobState, MissedReason, RunState
from wheel.engine.profiles import Profile
from wheel.engine.spec import JobSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class NewJob:
    spec: JobSpec
    created_at_ms: int
    # The first fire (None: nothing to schedule, e.g. a one-shot in the past
    # that the caller already decided to reject).
    next_run_at: int | None
    # Per-tenant submission key; None = not idempotent.
    idempotency_key: str | None = None
    # What "the same request" means for that key: a digest of the request as
    # the client sent it (defaults filled in later, such as an interval's
    # start of now + period, must not make a retry look different). None: a
    # digest of the spec.
    body_hash: str | None = None
    # The spec's profile and schedule parameter (``wheel.engine.profiles``),
    # when the caller has them at hand (None: the store works them out).
    profile: Profile | None = None
    param: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class SpecUpdate:
    """What an update of a job's spec stores (``Store.update_job``): the new
    spec (its tenant the job's own), the next fire it re-arms from (None for
    a paused job: a resume computes it), and its profile. One write changes
    the row, the spec and the history, so an owner reads either all of it
    or none."""

    job_id: int
    spec: JobSpec
    next_run_at: int | None
    updated_at_ms: int
    # Per-job key; None = not idempotent. ``body_hash``: what "the same
    # request" means for it (a digest of the request as sent).
    idempotency_key: str | None = None
    body_hash: str = ""
    # Who asked (the caller's tenant and token when auth is on), for history.
    updated_by: str = ""
    profile: Profile | None = None
    param: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class JobChange:
    """One recorded update of a job's spec (the specs without payloads)."""

    job_id: int
    version: int
    updated_at_ms: int
    old_spec: JobSpec
    new_spec: JobSpec
    payload_changed: bool
    updated_by: str = ""
    idempotency_key: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class JobRecord:
    job_id: int
    shard: int
    spec: JobSpec
    state: JobState
    next_run_at: int | None
    created_at_ms: int
    updated_at_ms: int
    idempotency_key: str | None = None
    # The store's marker of the job's last change through the API (a submit,
    # a pause...): the write's transaction on PostgreSQL, its change number
    # on SQLite. A node keeps those of its own writes and leaves them out of
    # its change feed (``Store.changes_since(exclude=...)``).
    change: int = 0

    @property
    def tenant(self) -> str:
        return self.spec.tenant


# After JobRecord: a compiled NamedTuple naming a class defined after it
# crashes its module at import (mypyc 2.4).
class Updated(NamedTuple):
    """An update's answer: the job as stored after it, the change recorded,
    and whether this call made it (False: an earlier call with the same key
    and body did)."""

    job: JobRecord
    change: JobChange
    applied: bool


class JobRow(NamedTuple):
    """A job as an owner takes it from the store: everything it schedules by,
    with no spec to parse (``wheel.engine.profiles``): its profile by id, its
    schedule parameter and whether it has a payload. A tuple: a bulk submit
    in a cluster sends the owners tens of thousands a second."""

    job_id: int
    state: JobState
    next_run_at: int | None
    profile_id: int
    param: int
    has_payload: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class RowChanges:
    """Jobs as rows (``Store.changed_rows``, ``Store.job_rows``): ``rows``,
    and ``jobs`` for those stored before profiles (parsed from their spec);
    the bodies of the profiles the rows name, by id; and the watermark to
    read on from (0 where it does not apply)."""

    rows: list[JobRow]
    jobs: list[JobRecord]
    profiles: Mapping[int, str]
    watermark: int = 0


# The records built once per dispatch or more (claims, their outcomes, starts,
# completions) are not frozen: a frozen dataclass sets each field through
# object.__setattr__ and costs 2.5x to build. And they spell out __init__
# (``init=False``): the one ``dataclass`` writes is Python made at run time
# with ``exec``, which the compiled build cannot compile, so every record
# ran interpreted code to be built -- 300 ns for a FireClaim against 40 ns
# for this one compiled (600 against 26 for a frozen one). Each keeps the
# dataclass's other methods (eq, repr, ``replace``).
@dataclass(slots=True, kw_only=True, init=False)
class FireClaim:
    job_id: int
    scheduled_for: int
    attempt: int
    fence: int
    dispatched_at_ms: int
    # Schedule compare-and-swap: applied only when ``advance`` is true and the
    # insert won. ``new_next_run_at=None`` ends the schedule (a one-shot's
    # fire claimed: the job becomes ``running`` until the fire ends).
    advance: bool
    expected_next_run_at: int | None
    new_next_run_at: int | None
    # Read the job's payload with the claim (owners keep no payloads): the
    # won claim's ``ClaimOutcome.payload``. False: the job has none.
    payload: bool
    # The job's concurrency key and tenant (``JobSpec.concurrency_key``):
    # the claim takes a permit of that limit in its own transaction, or
    # waits (``ClaimOutcome.waiting``). "": the job has none, and its claim
    # costs the store nothing more.
    concurrency_key: str
    tenant: str

    def __init__(
        self,
        *,
        job_id: int,
        scheduled_for: int,
        attempt: int,
        fence: int,
        dispatched_at_ms: int,
        advance: bool = True,
        expected_next_run_at: int | None = None,
        new_next_run_at: int | None = None,
        payload: bool = False,
        concurrency_key: str = "",
        tenant: str = "",
    ) -> None:
        self.job_id = job_id
        self.scheduled_for = scheduled_for
        self.attempt = attempt
        self.fence = fence
        self.dispatched_at_ms = dispatched_at_ms
        self.advance = advance
        self.expected_next_run_at = expected_next_run_at
        self.new_next_run_at = new_next_run_at
        self.payload = payload
        self.concurrency_key = concurrency_key
        self.tenant = tenant


@dataclass(frozen=True, slots=True, kw_only=True, init=False)
class ScheduleAdvance:
    """Move a schedule without running a fire (a fire skipped by the overlap
    policy, or fixed_delay's next fire after a completion): compare-and-swap.
    ``ends``: a bounded schedule is over (``new_next_run_at`` is None): an
    active job becomes running while a run of it is in flight, else
    completed."""

    job_id: int
    expected_next_run_at: int | None
    new_next_run_at: int | None
    ends: bool

    def __init__(
        self,
        *,
        job_id: int,
        expected_next_run_at: int | None,
        new_next_run_at: int | None,
        ends: bool = False,
    ) -> None:
        object.__setattr__(self, "job_id", job_id)
        object.__setattr__(self, "expected_next_run_at", expected_next_run_at)
        object.__setattr__(self, "new_next_run_at", new_next_run_at)
        object.__setattr__(self, "ends", ends)


@dataclass(slots=True, kw_only=True, init=False)
class ClaimOutcome:
    claim: FireClaim
    # None: another claim already holds this (fire, attempt), or ``waiting``.
    run_id: int | None
    advanced: bool  # the schedule CAS applied
    # The job's payload, read with a won claim that asked for it.
    payload: bytes
    # Waiting for a permit of its concurrency key: nothing was written for
    # it (no run, no schedule move); the fire is still owed, to be claimed
    # again once a permit may be free.
    waiting: bool

    def __init__(
        self,
        *,
        claim: FireClaim,
        run_id: int | None,
        advanced: bool,
        payload: bytes = b"",
        waiting: bool = False,
    ) -> None:
        self.claim = claim
        self.run_id = run_id
        self.advanced = advanced
        self.payload = payload
        self.waiting = waiting


@dataclass(slots=True, kw_only=True, init=False)
class RunStart:
    run_id: int
    fence: int
    worker_id: str
    started_at_ms: int

    def __init__(self, *, run_id: int, fence: int, worker_id: str, started_at_ms: int) -> None:
        self.run_id = run_id
        self.fence = fence
        self.worker_id = worker_id
        self.started_at_ms = started_at_ms


@dataclass(slots=True, kw_only=True, init=False)
class Completion:
    run_id: int
    fence: int
    state: RunState  # must be terminal
    finished_at_ms: int
    error: str | None
    worker_id: str | None
    # Set for a run whose end is its one-shot's (``model.one_shot_end``):
    # applied, the completion also moves the run's job to this state if its
    # schedule is over (running, completed or failed), in the same
    # transaction; a cancelled or paused job keeps its state. None for the
    # rest (every run of a recurring job): no job row is touched.
    job_state: JobState | None
    # The run's start, kept only where the store has none: a run that ended
    # before its worker's ack was due was never marked running.
    started_at_ms: int | None
    # What the run left (a JSON object, as its worker sent it); None: nothing.
    result: str | None

    def __init__(
        self,
        *,
        run_id: int,
        fence: int,
        state: RunState,
        finished_at_ms: int,
        error: str | None = None,
        worker_id: str | None = None,
        job_state: JobState | None = None,
        started_at_ms: int | None = None,
        result: str | None = None,
    ) -> None:
        self.run_id = run_id
        self.fence = fence
        self.state = state
        self.finished_at_ms = finished_at_ms
        self.error = error
        self.worker_id = worker_id
        self.job_state = job_state
        self.started_at_ms = started_at_ms
        self.result = result


@dataclass(slots=True, kw_only=True, init=False)
class CompletionOutcome:
    run_id: int
    applied: bool  # False: superseded (stale fence, already terminal, unknown run)

    def __init__(self, *, run_id: int, applied: bool) -> None:
        self.run_id = run_id
        self.applied = applied


@dataclass(frozen=True, slots=True, kw_only=True, init=False)
class MissedFire:
    job_id: int
    scheduled_for: int
    reason: MissedReason
    recorded_at_ms: int

    def __init__(
        self, *, job_id: int, scheduled_for: int, reason: MissedReason, recorded_at_ms: int
    ) -> None:
        object.__setattr__(self, "job_id", job_id)
        object.__setattr__(self, "scheduled_for", scheduled_for)
        object.__setattr__(self, "reason", reason)
        object.__setattr__(self, "recorded_at_ms", recorded_at_ms)


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutionRecord:
    run_id: int
    job_id: int
    scheduled_for: int
    attempt: int
    state: RunState
    fence: int
    worker_id: str | None
    dispatched_at_ms: int
    started_at_ms: int | None
    finished_at_ms: int | None
    error: str | None
    # The job's payload: read only for runs in flight (``inflight_runs``),
    # which an owner that adopts them may hand to another worker.
    payload: bytes = b""
    # The run's result (a JSON object), None where it left none.
    result: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class PackedRows:
    """Jobs as the store keeps them, column by column: what an owner takes on
    without parsing a spec (``wheel.engine.jobtable``). ``next_run_at`` is
    ``wheel.engine.jobtable.NO_FIRE`` where the store has none."""

    job_id: npt.NDArray[np.int64]
    paused: npt.NDArray[np.bool_]
    next_run_at: npt.NDArray[np.int64]
    profile_id: npt.NDArray[np.int64]
    param: npt.NDArray[np.int64]
    has_payload: npt.NDArray[np.bool_]

    def __len__(self) -> int:
        return len(self.job_id)

    def __bool__(self) -> bool:
        # Said, not left to __len__: compiled code tests an Optional of a
        # compiled class without __bool__ for None only (mypyc 2.4).
        return len(self) > 0


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardLoad:
    """Everything a new owner needs for its shards."""

    jobs: list[JobRecord]  # active and paused jobs (with ``packed``: the rest of them)
    inflight: list[ExecutionRecord]  # dispatched or running
    watermark: int  # pass to changes_since to see what changed after this load
    # With ``load_shards(..., packed=True)``: the jobs their row alone can
    # arm (paused, or active with a next fire, of a known profile), not in
    # ``jobs``, and the bodies of their profiles by id.
    packed: PackedRows | None = None
    profiles: Mapping[int, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class WriteBatch:
    """One store pass of an owner: what it writes, in the order it writes it
    (see ``wheel.store.base.Store.write_batch``)."""

    completions: Sequence[Completion] = ()
    missed: Sequence[MissedFire] = ()
    advances: Sequence[ScheduleAdvance] = ()
    claims: Sequence[FireClaim] = ()
    starts: Sequence[RunStart] = ()
    # Shard -> the epoch the writer holds it under (None: not checked, for
    # tools and tests that write outside any owner). A write about a shard
    # missing here, or whose epoch in the store is newer, is refused in the
    # same transaction: a node that lost a shard writes nothing more to it
    # once the next owner fenced it (seed C4).
    epochs: Mapping[int, int] | None = None

    def size(self) -> int:
        """Rows this batch writes."""
        return (
            len(self.completions)
            + len(self.missed)
            + len(self.advances)
            + len(self.claims)
            + len(self.starts)
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchOutcome:
    """The store's answer to a ``WriteBatch``, in the batch's order."""

    completions: list[CompletionOutcome]
    claims: list[ClaimOutcome]
    # Shards the store refused this batch's writes for (a newer owner fenced
    # them, or the writer does not hold them): their claims came back unwon,
    # their completions unapplied, and their schedule moves, missed records
    # and starts were not written.
    fenced: frozenset[int] = frozenset()
    # The store's change mark as this batch committed (``Store.change_mark``;
    # 0: the store keeps none).
    change_mark: int = 0
