"""The loop of one shard owner, without its I/O.

``Driver`` is what every shell of the owner runs -- the node (``wheel.node``,
with a real clock, a store thread and gRPC streams), the simulator and the
engine tests (a simulated clock and an in-memory store) -- so that there is
one copy of it:

1. ``advance(now)``: due timers fire and work is claimed (``Owner.advance``);
2. ``take_batch()``: the writes accumulated since the last batch, as ONE
   ``WriteBatch`` in the owner's order (a burst's claims first: ``take_claims``);
3. the shell writes the batch (on a thread, in order with the batches before
   it) and hands the store's answer to ``apply(outcome, now)``, which
   produces assignments and results;
4. the shell sends the messages ``take_messages()`` gives it, reads the jobs
   that need re-reading (``take_resync``) and the change feed, feeds them to
   ``apply_changes``, and sleeps until ``next_deadline()`` or an event.

What the owner decides accumulates in one ``Actions``, held here: the
owner's methods append to the one the driver passes them, and only the
driver takes anything out of it (``take_batch``, ``take_messages``,
``take_resync``, and ``hand_over``, which drops what is not this owner's to
do any more). A shell reads what it is given and never clears the
accumulator; it asks for a job to be read again with ``reread``.

The job API's logic is here too, between the shell's store reads and writes:
what a submit stores (``new_job``), what a pause, resume or cancel writes
(``state_change``) and what the owner makes of it (``state_changed``),
triggers and backfills. The shell only moves values between the store, the
clock and the network. When a schedule fires, from a spec or a stored record
alone, is ``wheel.engine.fires``'s to say.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from wheel.engine.calendars import Calendar
from wheel.engine.fires import bounds, first_fire, with_last_fire
from wheel.engine.jobtable import Columns
from wheel.engine.model import SCHEDULE_OVER, JobState, shard_of
from wheel.engine.owner import (
    Actions,
    FireHold,
    Outcome,
    Owner,
    OwnerStats,
    PackedJob,
    RunRef,
    ShardContents,
    TenantLimit,
    Unserved,
    WorkerView,
)
from wheel.engine.profiles import Profile, split_spec
from wheel.engine.records import (
    BatchOutcome,
    JobRecord,
    NewJob,
    RowChanges,
    SpecUpdate,
    WriteBatch,
)
from wheel.engine.spec import DEFAULT_LIMITS, Cron, Interval, JobSpec, Once
from wheel.errors import FailedPrecondition, InvalidArgument, LimitExceeded

__all__ = [
    "Census",
    "Driver",
    "FireHold",
    "RunView",
    "StateChange",
]

# The field a schedule's first fire comes from, named when it is too far ahead.
_HORIZON_FIELD = {
    Once: "spec.schedule.once.at_ms",
    Interval: "spec.schedule.interval.start_at_ms",
    Cron: "spec.schedule.cron.expr",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class StateChange:
    """What the store must write for a pause, resume or cancel: the new state
    and schedule (a resume starts from now), or nothing (``noop``: the job is
    already so, or a cancel of a finished job, which is idempotent)."""

    state: JobState
    next_run_at: int | None = None
    noop: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Census:
    """What the owner holds now, counted (a node's status)."""

    shards: Mapping[int, int]
    jobs: int
    jobs_awake: int
    pending_timers: int
    in_flight: int
    # Runs waiting for a worker: fresh ones and those already late.
    backlog: int
    overdue_backlog: int
    workers: list[WorkerView]
    stats: OwnerStats
    reaper_paused: bool
    unserved: list[Unserved]


@dataclass(frozen=True, slots=True, kw_only=True)
class RunView:
    """A run the owner holds, as an operator sees it."""

    run_id: int
    job_id: int
    scheduled_for: int
    attempt: int
    fence: int
    worker_id: str | None
    # claiming, ready, dispatched, running, ending.
    phase: str


class Driver:
    """One owner's loop and job API, fed values and time by its shell.

    The shell reaches the owner through it alone: the methods below the loop
    and the job API (shards, workers, tenants, the checkpoint's view, what
    an operator reads) pass the shell's values and the owner's effects on.
    """

    __slots__ = ("acts", "owner")

    def __init__(self, owner: Owner, acts: Actions | None = None) -> None:
        self.owner = owner
        # What the owner emitted and the shell has not carried out yet.
        self.acts = acts if acts is not None else Actions()

    # -- the loop -------------------------------------------------------------------

    def advance(self, now_ms: int, *, release_held: bool = True) -> None:
        """Fire what is due and hand out what workers can take (runs claimed
        ahead whose time has come only with ``release_held``)."""
        self.owner.advance(now_ms, self.acts, release_held=release_held)

    def has_store_work(self) -> bool:
        return self.acts.store_work()

    def take_batch(self) -> WriteBatch:
        """The store writes emitted so far, as one batch: completions, missed
        fires, schedule advances, claims, starts. A run that completes in this
        batch needs no separate start."""
        work = self.acts.take_store_work()
        if work.claims:
            self.owner.batch_taken()
        starts = work.starts
        if starts and work.completions:
            done = {c.run_id for c in work.completions}
            starts = [st for st in starts if st.run_id not in done]
        return WriteBatch(
            completions=work.completions,
            missed=work.missed,
            advances=work.advances,
            claims=work.claims,
            starts=starts,
            epochs=self.owner.shards(),
        )

    def take_claims(self, limit: int) -> WriteBatch | None:
        """``take_batch`` with only the first ``limit`` claims while more wait
        (a burst; the rest go in the next batches); None when they fit one."""
        acts = self.acts
        if not limit or len(acts.claims) <= limit:
            return None
        rest, acts.claims = acts.claims[limit:], acts.claims[:limit]
        batch = self.take_batch()
        acts.claims = rest
        return batch

    def sent_runs(self, shards: Collection[int]) -> set[int]:
        """The runs of ``shards`` a worker was sent: handed out, their
        hand-out published (not waiting in the actions), or adopted from a
        previous owner, who may have sent them. The others, claimed and
        never sent, a planned hand-over gives the next owner to send at once
        (``Store.release_unsent``)."""
        lost = set(shards)
        waiting = {a.run_id for handouts in self.acts.assignments.values() for a in handouts}
        return {
            run_id
            for run_id, run in self.owner.runs.items()
            if run.held_out and run_id not in waiting and shard_of(run.job_id) in lost
        }

    def runs_at_workers(self, shards: Collection[int]) -> list[tuple[str, int, int, int]]:
        """(worker, run, fence, job) of the runs of ``shards`` that a worker
        holds or has completed without an answer yet: whom to tell where
        they report once the shards are handed over."""
        lost = set(shards)
        return [
            (run.worker_id, run_id, run.fence, run.job_id)
            for run_id, run in self.owner.runs.items()
            if run.worker_id is not None and shard_of(run.job_id) in lost
        ]

    def hand_over(self, shards: Collection[int]) -> list[RunRef]:
        """Stop serving ``shards`` at once: the owner forgets them
        (``Owner.remove_shards``), and the store writes emitted for them and
        not yet in a batch are dropped -- written under this owner's epoch
        after the next owner fenced the shard, they would be refused, or,
        if they landed first, leave a claim no owner knows -- and so are the
        hand-outs and revokes of its runs not sent yet. A completion dropped
        here was not answered yet: its worker reports it again to the next
        owner. Returns the runs handed over."""
        handed = self.owner.remove_shards(shards)
        lost = set(shards)
        acts = self.acts
        runs = {run_id for run_id, _ in handed}
        # Hand-outs and revokes of these runs not sent yet are not this
        # owner's to send any more: the next owner decides.
        if acts.assignments or acts.revokes:
            for worker_id, handouts in list(acts.assignments.items()):
                acts.assignments[worker_id] = [a for a in handouts if a.run_id not in runs]
            for worker_id, revokes in list(acts.revokes.items()):
                acts.revokes[worker_id] = [r for r in revokes if r.run_id not in runs]
        if acts.store_work():
            acts.completions = [c for c in acts.completions if c.run_id not in runs]
            acts.starts = [s for s in acts.starts if s.run_id not in runs]
            acts.claims = [c for c in acts.claims if shard_of(c.job_id) not in lost]
            acts.advances = [a for a in acts.advances if shard_of(a.job_id) not in lost]
            acts.missed = [m for m in acts.missed if shard_of(m.job_id) not in lost]
        return handed

    def apply(
        self, outcome: BatchOutcome, now_ms: int, epochs: Mapping[int, int] | None = None
    ) -> frozenset[int]:
        """The store's answer to a batch, fed back in batch order. ``epochs``:
        the ones the batch was written under (its ``WriteBatch.epochs``;
        None: the owner's own, for a caller that applies each answer before
        it takes the next batch).

        Shards the store refused under the hold this owner still has (a newer
        owner fenced them) are handed over at once and returned: that hold
        is over, whatever its coordinator has told it so far. A refusal of an
        earlier hold leaves a newer one alone: a batch written under the old
        epochs can come back after the owner lost the shard and gained it
        again under a newer epoch."""
        owner, acts = self.owner, self.acts
        lost: frozenset[int] = frozenset()
        if outcome.fenced:
            held = owner.shards()
            under = held if epochs is None else epochs
            lost = frozenset(s for s in outcome.fenced if s in held and under.get(s) == held[s])
            if lost:
                self.hand_over(lost)
        owner.on_completed(outcome.completions, now_ms, acts)
        owner.on_claimed(outcome.claims, now_ms, acts)
        return lost

    def wants_another_pass(self) -> bool:
        """Whether the loop should go round again at once: store writes wait,
        or the answers left work that can go out now (a released buffered
        fire, a run whose claim outlived its worker)."""
        return self.acts.store_work() or self.owner.has_dispatchable_work()

    def next_deadline(self) -> int | None:
        return self.owner.next_deadline()

    def permit_freed(self, tenant: str, key: str) -> bool:
        return self.owner.permit_freed(tenant, key)

    def handing_off(self) -> bool:
        """Write without waiting for the tick (``Dispatcher.handing_off``)."""
        return self.owner.handing_off(bool(self.acts.claims))

    def take_messages(self) -> Actions:
        """The messages decided since the last call, for the shell to send:
        hand-outs, revokes, answers, refused renewals, protocol errors and
        credit answers by worker, and the alerts, run notes and lag samples.
        Taken out: the next call gives only what came after."""
        return self.acts.take_messages()

    def reread(self, job_ids: Iterable[int]) -> None:
        """Read these jobs again from the store (``take_resync`` gives them):
        a read that failed, or jobs another member changed."""
        self.acts.resync.update(job_ids)

    def take_resync(self) -> set[int]:
        """Jobs whose store row disagrees with the owner: to be read again
        and given to ``apply_changes``."""
        resync, self.acts.resync = self.acts.resync, set()
        return resync

    def apply_changes(self, records: Iterable[JobRecord], now_ms: int) -> None:
        """Jobs as the store has them now (the change feed, re-reads): the
        store wins. Jobs of shards this owner does not hold are left out."""
        owner, acts = self.owner, self.acts
        for record in records:
            if owner.owns(record.job_id):
                owner.upsert_job(record, now_ms, acts)

    def apply_rows(self, changes: RowChanges, now_ms: int) -> None:
        """``apply_changes`` of jobs read as rows: each taken on by its
        profile, with no spec to parse."""
        self.owner.apply_rows(changes, now_ms, self.acts)

    # -- the job API ------------------------------------------------------------------

    def new_job(
        self,
        spec: JobSpec,
        idempotency_key: str | None,
        now_ms: int,
        *,
        body_hash: str | None = None,
    ) -> NewJob:
        """What a submit stores: the spec validated, its first fire, and its
        profile (interned here once, for the store and the owner both). A
        one-shot submitted late is due now, not never: its catch-up policy
        decides whether it runs or is recorded missed. A first fire further
        ahead than the horizon is a mistake (seconds for milliseconds, a wrong
        year), not a job to keep: ``LimitExceeded``. A bounded schedule with
        no fire left in its bounds is refused: ``InvalidArgument``."""
        spec = with_last_fire(spec, now_ms)
        first = first_fire(0, spec, now_ms)
        if first is None and spec.bounded:
            raise InvalidArgument(
                "spec.active_until_ms", "no fire of the schedule is left before it"
            )
        if first is None and isinstance(spec.schedule, Once):
            first = spec.schedule.at_ms
        limit = DEFAULT_LIMITS.max_horizon_ms
        if first is not None and first - now_ms > limit:
            raise LimitExceeded(
                _HORIZON_FIELD[type(spec.schedule)],
                f"first fire {first} is more than the schedule horizon of {limit} ms ahead",
            )
        template, param = split_spec(spec)
        profiles = self.owner.profiles
        return NewJob(
            spec=spec,
            created_at_ms=now_ms,
            next_run_at=first,
            idempotency_key=idempotency_key,
            body_hash=body_hash,
            profile=profiles[profiles.intern(template)],
            param=param,
        )

    def submitted(self, record: JobRecord, now_ms: int, new: NewJob | None = None) -> None:
        """A job the store just created: armed at once (at rest). ``new``:
        the submit it came from, whose profile is interned already."""
        owner = self.owner
        if not owner.owns(record.job_id):
            return
        profile = new.profile if new is not None else None
        index = owner.profiles.index_of(profile.profile_id) if profile is not None else None
        if new is None or index is None:
            owner.upsert_job(record, now_ms, self.acts)
            return
        owner.upsert(
            record.job_id,
            record.state,
            record.next_run_at,
            index,
            new.param,
            bool(record.spec.payload),
            now_ms,
            self.acts,
        )

    def state_change(self, record: JobRecord, state: JobState, now_ms: int) -> StateChange:
        """What to write for ``record`` to become ``state``. Raises
        ``FailedPrecondition`` for a finished job (a cancel of one is a no-op)."""
        if record.state is JobState.CANCELLED or record.state in SCHEDULE_OVER:
            if state is JobState.CANCELLED:
                return StateChange(state=state, noop=True)
            raise FailedPrecondition(f"job {record.job_id} is {record.state.value}")
        if record.state is state:
            return StateChange(state=state, noop=True)
        next_run: int | None = None
        if state is JobState.ACTIVE:
            # Resume from now: fires missed while paused are recorded, not run.
            next_run = first_fire(record.job_id, record.spec, now_ms + 1)
            if next_run is None and record.spec.bounded:
                # Its bounds passed while it was paused: its schedule is over.
                return StateChange(state=JobState.COMPLETED)
        return StateChange(state=state, next_run_at=next_run)

    def state_changed(
        self, before: JobRecord, after: JobRecord, state: JobState, now_ms: int
    ) -> None:
        """The store wrote ``state``: a cancel ends the job's runs, a resume
        records the fires missed while it was paused."""
        owner, acts = self.owner, self.acts
        if not owner.owns(after.job_id):
            return
        if state is JobState.CANCELLED:
            owner.cancel_job(after.job_id, acts, now_ms)
        owner.upsert_job(after, now_ms, acts)
        if state is JobState.ACTIVE:
            owner.record_paused_fires(after.job_id, before.updated_at_ms, now_ms, acts)

    def update(
        self,
        record: JobRecord,
        spec: JobSpec,
        now_ms: int,
        *,
        idempotency_key: str | None = None,
        body_hash: str = "",
        updated_by: str = "",
    ) -> tuple[SpecUpdate, FireHold | None]:
        """What to store for ``record`` to take ``spec`` (validated here:
        cron syntax, zone, horizon), and the hold of its fires that keeps
        the old schedule from firing until the store answers: give the
        stored job to ``updated``, or the hold to ``update_failed``.

        The change is at ``now_ms``: fires of the old schedule due by then
        come due under it, and the new schedule owes its fires from the first
        one after ``now_ms``; when a fire of the old schedule was due and
        could not be claimed yet (no worker free), the new schedule owes its
        fires from that one on instead, so that the change drops no fire that
        was owed (its catch-up policy decides). A paused job
        stays without a next fire (its resume computes one), and so does a
        completed one, whose schedule may not change."""
        if record.state is JobState.CANCELLED:
            raise FailedPrecondition(f"job {record.job_id} is cancelled")
        spec = replace(spec, tenant=record.spec.tenant)
        spec = self._last_fire_of_update(record, spec)
        if record.state in SCHEDULE_OVER and (
            spec.schedule != record.spec.schedule or bounds(spec) != bounds(record.spec)
        ):
            # A finished one-shot's payload and policies may change (to fix
            # what its dead letters need before a redrive); its schedule is over.
            raise FailedPrecondition(
                f"job {record.job_id} is {record.state.value}: its schedule is over (its"
                " payload and policies may still change)"
            )
        active = record.state is JobState.ACTIVE
        # Computed for a paused job too: it validates the schedule (cron
        # syntax, zone), which must not reach the store to fail at a resume.
        nxt = self._first_of_update(record.job_id, spec, now_ms + 1)
        if not active:
            nxt = None
        elif nxt is None and spec.bounded:
            raise InvalidArgument(
                "spec.max_fires" if spec.last_fire_ms else "spec.active_until_ms",
                "no fire of the schedule is left in the new bounds",
            )
        hold = None
        if active and self.owner.owns(record.job_id):
            # Fires due by now come due (and are claimed, workers willing)
            # under the old spec: the change is at this instant.
            self.advance(now_ms)
            hold = self.owner.hold_fires(record.job_id)
            if hold is not None and hold.oldest is not None and hold.oldest <= now_ms:
                nxt = self._first_of_update(record.job_id, spec, hold.oldest)
        template, param = split_spec(spec)
        profiles = self.owner.profiles
        update = SpecUpdate(
            job_id=record.job_id,
            spec=spec,
            next_run_at=nxt,
            updated_at_ms=now_ms,
            idempotency_key=idempotency_key,
            body_hash=body_hash,
            updated_by=updated_by,
            profile=profiles[profiles.intern(template)],
            param=param,
        )
        return update, hold

    @staticmethod
    def _last_fire_of_update(record: JobRecord, spec: JobSpec) -> JobSpec:
        """``spec`` with its last fire (``with_last_fire``): the stored one
        while the schedule and its bounds stay, else counted again over the
        new schedule from the job's submit, as if it had always had it."""
        old = record.spec
        if spec.schedule == old.schedule and bounds(spec) == bounds(old):
            return replace(spec, last_fire_ms=old.last_fire_ms)
        return with_last_fire(spec, record.created_at_ms)

    def _first_of_update(self, job_id: int, spec: JobSpec, from_ms: int) -> int | None:
        first = first_fire(job_id, spec, from_ms)
        if first is None and isinstance(spec.schedule, Once):
            first = spec.schedule.at_ms  # a one-shot moved into the past is due now
        limit = DEFAULT_LIMITS.max_horizon_ms
        if first is not None and first - from_ms > limit:
            raise LimitExceeded(
                _HORIZON_FIELD[type(spec.schedule)],
                f"first fire {first} is more than the schedule horizon of {limit} ms ahead",
            )
        return first

    def updated(self, record: JobRecord, now_ms: int) -> None:
        """The store has the job's new spec and next fire: its owner
        re-arms from them (``Owner.respecify``)."""
        if self.owner.owns(record.job_id):
            self.owner.respecify(record, now_ms, self.acts)

    def update_failed(self, job_id: int, hold: FireHold | None, now_ms: int) -> None:
        """The store did not take the change: the job fires on as before."""
        if hold is not None and self.owner.owns(job_id):
            self.owner.release_fires(job_id, hold, now_ms)

    def redrive(self, record: JobRecord, fires: Sequence[tuple[int, int]], now_ms: int) -> None:
        """Dead-lettered fires of ``record``, each as the attempt given, claimed
        at once: the shell answers once the claims are in the store. A
        completed one-shot's are run too (its job is held for them until
        they end); a cancelled job's are not."""
        if record.state is JobState.CANCELLED:
            raise FailedPrecondition(f"job {record.job_id} is cancelled")
        owner = self.owner
        if not owner.has_job(record.job_id):
            if record.state in SCHEDULE_OVER:
                # Its schedule is over: held awake, with nothing armed, for
                # the runs redriven, and forgotten when they end.
                record = replace(record, state=JobState.ACTIVE, next_run_at=None)
            owner.upsert_job(record, now_ms, self.acts)
        owner.redrive(record.job_id, fires, now_ms, self.acts)

    def _active(self, record: JobRecord, now_ms: int) -> None:
        if record.state is not JobState.ACTIVE:
            raise FailedPrecondition(f"job {record.job_id} is {record.state.value}, not active")
        if not self.owner.has_job(record.job_id):
            self.owner.upsert_job(record, now_ms, self.acts)

    def trigger(self, record: JobRecord, now_ms: int) -> int:
        """An out-of-band fire now, claimed at once; returns its
        scheduled_for. The shell answers once the claim is in the store."""
        self._active(record, now_ms)
        return self.owner.trigger(record.job_id, now_ms, self.acts)

    def backfill(self, record: JobRecord, fires: Sequence[int], now_ms: int) -> None:
        """Past fires not in history yet, claimed at once as catch-up work."""
        self._active(record, now_ms)
        self.owner.backfill(record.job_id, fires, now_ms, self.acts)

    # -- shards -------------------------------------------------------------------

    def shards(self) -> Mapping[int, int]:
        """The shards held, each with the epoch it is held under."""
        return self.owner.shards()

    def owns(self, job_id: int) -> bool:
        return self.owner.owns(job_id)

    def add_shards(self, epochs: Mapping[int, int], contents: ShardContents, now_ms: int) -> None:
        """Shards fenced and loaded: their jobs armed, their runs adopted."""
        self.owner.add_shards(epochs, contents, now_ms, self.acts)

    def add_rest(self, packed: Mapping[int, Columns], profiles: Sequence[Profile]) -> int:
        """The rest of shards taken on due first; how many jobs it added."""
        return self.owner.add_rest(packed, profiles)

    # -- workers ------------------------------------------------------------------

    def worker_hello(
        self,
        worker_id: str,
        capacity: int,
        pools: Sequence[str],
        now_ms: int,
        *,
        handlers: Sequence[str] = (),
    ) -> None:
        self.owner.worker_hello(worker_id, capacity, pools, now_ms, self.acts, handlers=handlers)

    def worker_disconnect(self, worker_id: str) -> None:
        self.owner.worker_disconnect(worker_id)

    def worker_ack(self, worker_id: str, refs: Sequence[tuple[int, int]], now_ms: int) -> None:
        self.owner.worker_ack(worker_id, refs, now_ms, self.acts)

    def worker_heartbeat(
        self, worker_id: str, refs: Sequence[tuple[int, int]], now_ms: int
    ) -> None:
        self.owner.worker_heartbeat(worker_id, refs, now_ms, self.acts)

    def worker_complete(
        self,
        worker_id: str,
        completions: Sequence[tuple[int, int, Outcome, str]],
        now_ms: int,
        ran_ms: Mapping[int, int] | None = None,
        results: Mapping[int, str] | None = None,
        retry_after_ms: Mapping[int, int] | None = None,
    ) -> None:
        self.owner.worker_complete(
            worker_id,
            completions,
            now_ms,
            self.acts,
            ran_ms=ran_ms,
            results=results,
            retry_after_ms=retry_after_ms,
        )

    def worker_credit(self, worker_id: str, add: int, now_ms: int, *, seq: int = 0) -> None:
        self.owner.worker_credit(worker_id, add, now_ms, self.acts, seq=seq)

    def worker_capacity(self, worker_id: str) -> int | None:
        return self.owner.worker_capacity(worker_id)

    def worker_drain(self, worker_id: str) -> None:
        self.owner.worker_drain(worker_id)

    # -- tenants ------------------------------------------------------------------

    def tenant_limits(self) -> dict[str, TenantLimit]:
        return self.owner.tenant_limits()

    def set_tenant_limits(self, limits: Mapping[str, TenantLimit], now_ms: int) -> None:
        self.owner.set_tenant_limits(limits, now_ms)

    def set_calendars(self, calendars: Mapping[tuple[str, str], Calendar], now_ms: int) -> int:
        """Every calendar as the store has them: the jobs skipping one that
        changed are re-armed (how many moved)."""
        return self.owner.set_calendars(calendars, now_ms, self.acts)

    # -- the checkpoint's view ----------------------------------------------------

    def take_dirty(self) -> set[int]:
        """The jobs changed since the last call (to log)."""
        return self.owner.take_dirty()

    def job_images(self) -> Callable[[int], PackedJob | None]:
        """A job's row as the checkpoint keeps it, by job id."""
        return self.owner.image_of

    def profile(self, profile_id: int) -> Profile | None:
        return self.owner.profile(profile_id)

    def profiles(self) -> list[Profile]:
        """Every profile interned, numbered as ``snapshot_columns`` names them."""
        return list(self.owner.profiles.items)

    def snapshot_columns(self, shard: int) -> Columns | None:
        return self.owner.snapshot_columns(shard)

    # -- what an operator reads ---------------------------------------------------

    def job_count(self) -> int:
        return self.owner.job_count()

    def run_count(self) -> int:
        return len(self.owner.runs)

    def next_fires(self, job_id: int, count: int) -> list[int]:
        """The job's next ``count`` fires as the owner has them armed."""
        return self.owner.next_fires(job_id, count)

    def reaper_paused(self) -> bool:
        return self.owner.reaper_paused

    def unserved(self) -> list[Unserved]:
        return self.owner.unserved()

    def unserved_alert_ms(self) -> int:
        return self.owner.config.unserved_alert_ms

    def limit_waiting(self) -> dict[tuple[str, str], int]:
        """Claims waiting for a permit of their concurrency key, by (tenant,
        key)."""
        return self.owner.limit_waiting()

    def census(self) -> Census:
        owner = self.owner
        fresh, overdue = owner.backlog()
        return Census(
            shards=owner.shards(),
            jobs=owner.job_count(),
            jobs_awake=owner.awake_count(),
            pending_timers=owner.pending_timers(),
            in_flight=len(owner.runs),
            backlog=fresh + overdue,
            overdue_backlog=overdue,
            workers=owner.worker_views(),
            stats=owner.stats.copy(),
            reaper_paused=owner.reaper_paused,
            unserved=owner.unserved(),
        )

    def runs_in_flight(self, limit: int) -> tuple[list[RunView], int]:
        """Up to ``limit`` of the runs held, by run id, and how many in all."""
        runs = self.owner.runs
        return [
            RunView(
                run_id=run.run_id,
                job_id=run.job_id,
                scheduled_for=run.scheduled_for,
                attempt=run.attempt,
                fence=run.fence,
                worker_id=run.worker_id,
                phase=run.phase.name.lower(),
            )
            for run in (runs[i] for i in heapq.nsmallest(max(0, limit), runs))
        ], len(runs)
