"""Shards gained and lost, each as one operation: a shard's jobs and runs
taken on (from a checkpoint or the store) with the epoch its fences carry,
or handed over whole."""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING

from wheel.engine.model import SHARD_COUNT, JobState, RunState, shard_of
from wheel.engine.owner._claims import Claims
from wheel.engine.owner._fleet import Fleet
from wheel.engine.owner._redos import Redo, Redos
from wheel.engine.owner._runtable import RunTable, _Run
from wheel.engine.owner._shardmap import ShardMap
from wheel.engine.owner._state import _Job
from wheel.engine.owner._tenants import Tenants
from wheel.engine.owner._values import (
    FIRE,
    Actions,
    OwnerConfig,
    Phase,
    RunRef,
    ShardContents,
)
from wheel.engine.policy import should_retry
from wheel.engine.profiles import split_spec
from wheel.engine.records import ExecutionRecord, JobRecord, RowChanges
from wheel.engine.timerwheel import TimerWheel

if TYPE_CHECKING:
    from wheel.engine.owner._dispatch import Dispatcher
    from wheel.engine.owner._jobs import JobBook
    from wheel.engine.owner._runs import RunEndings

log = logging.getLogger("wheel.owner")


class ShardMoves:
    """Shards gained and lost, each as one operation: a gained shard's jobs,
    runs in flight and retries owed taken on into the book, the run table
    and the redos; a lost shard's handed over whole."""

    __slots__ = (
        "book",
        "claims",
        "config",
        "dispatcher",
        "ends",
        "redos",
        "runs",
        "shard_map",
        "tenants",
        "wheel",
        "workers",
    )

    def __init__(
        self,
        *,
        book: JobBook,
        claims: Claims,
        config: OwnerConfig,
        dispatcher: Dispatcher,
        ends: RunEndings,
        redos: Redos,
        runs: RunTable,
        shard_map: ShardMap,
        tenants: Tenants,
        wheel: TimerWheel,
        workers: Fleet,
    ) -> None:
        self.book = book
        self.claims = claims
        self.config = config
        self.dispatcher = dispatcher
        self.ends = ends
        self.redos = redos
        self.runs = runs
        self.shard_map = shard_map
        self.tenants = tenants
        self.wheel = wheel
        self.workers = workers

    def owns(self, job_id: int) -> bool:
        return self.shard_map.owns(job_id)

    def shards(self) -> Mapping[int, int]:
        """Shard -> the epoch this owner holds it under (not to be changed:
        the same mapping until the shards held change)."""
        return self.shard_map.epochs()

    # -- gaining shards -----------------------------------------------------------

    def add_shards(
        self, epochs: Mapping[int, int], contents: ShardContents, now_ms: int, acts: Actions
    ) -> None:
        """Take on the shards of ``epochs`` (shard -> the epoch this owner now
        holds it under): arm their jobs, keep the jobs that only finish their
        runs, adopt their runs in flight with fresh leases (their workers
        renew them; the others lapse and are dispatched again) and owe their
        pending retries. Whatever in ``contents`` belongs to other shards is
        left out. A shard must not be held already: to change a shard's epoch
        the owner hands it over first."""
        held = {s for s in epochs if s in self.shard_map}
        if held:
            raise ValueError(f"shards already held: {sorted(held)[:10]}")
        numbers = [self.book.profiles.add(p) for p in contents.profiles]
        for shard, epoch in epochs.items():
            gained = self.shard_map.add(shard, epoch)
            table = contents.tables.get(shard)
            if table is not None:
                self.book.take_on_table(gained, table, numbers)
                continue
            rows = contents.packed.get(shard)
            if rows is not None:
                self.book.take_on_rows(gained, rows, numbers)
        ours = None if len(self.shard_map) == SHARD_COUNT else set(epochs)
        for changes in contents.rows:
            self.apply_rows(changes, now_ms, acts, ours)
        for record in contents.jobs:
            if ours is not None and shard_of(record.job_id) not in ours:
                continue
            try:
                self.book.upsert_job(record, now_ms, acts)
            except Exception:
                # One bad row (an expression this version rejects) must not keep
                # every other job of the shard from running.
                log.exception("job %s could not be loaded; skipped", record.job_id)
        self._adopt_finished(contents.finished, ours)
        self._restore_inflight(contents.inflight, ours, now_ms, acts)
        self._restore_retries(contents.retries, ours, now_ms)

    def apply_rows(
        self, changes: RowChanges, now_ms: int, acts: Actions, ours: set[int] | None = None
    ) -> None:
        """Jobs as the store has them now, as rows (``Store.changed_rows``):
        each taken on by its profile, with no spec to parse; those stored
        before profiles as records. ``ours``: the shards to take them for
        (None: every shard held)."""
        profiles = self.book.profiles
        for row in changes.rows:
            shard = shard_of(row.job_id)
            if shard not in self.shard_map or (ours is not None and shard not in ours):
                continue
            index = profiles.index_of(row.profile_id)
            if index is None:
                index = profiles.add_body(row.profile_id, changes.profiles[row.profile_id])
            self.book.upsert(
                row.job_id,
                row.state,
                row.next_run_at,
                index,
                row.param,
                row.has_payload,
                now_ms,
                acts,
            )
        for record in changes.jobs:
            if ours is None or shard_of(record.job_id) in ours:
                self.book.upsert_job(record, now_ms, acts)

    def _adopt_finished(self, records: Sequence[JobRecord], ours: set[int] | None) -> None:
        """Jobs whose schedule is over but that still have runs in flight or
        retries owed.

        A completed one-shot schedules nothing more, but its fire's runs,
        retries and re-dispatches go on exactly as they would have without the
        restart: the job is not paused, or a re-dispatch of its lost run would
        wait for a resume that cannot come (a silent drop). A cancelled job
        is kept only to end its runs as the cancel would have."""
        for record in records:
            job_id = record.job_id
            if (ours is not None and shard_of(job_id) not in ours) or self.book.has_job(job_id):
                continue
            template, param = split_spec(record.spec)
            prof = self.book.profiles.intern(template)
            job = _Job(
                job_id,
                template,
                self.book.compile_spec(job_id, template, param),
                prof,
                param,
                bool(record.spec.payload),
            )
            if record.state is JobState.CANCELLED:
                job.paused = job.cancelled = True
            self.book.keep_job(job)

    def _restore_inflight(
        self,
        executions: Sequence[ExecutionRecord],
        ours: set[int] | None,
        now_ms: int,
        acts: Actions,
    ) -> None:
        """Runs the store says are in flight. A running run gets a full lease
        from now and one never acked the grace lease (seed R1): their workers
        renew (adopt) them; runs nobody renews expire and are re-dispatched.
        One its previous owner marked unsent goes to a worker at once.
        A run of a cancelled job is cancelled, as the cancel would have done
        had its owner lived."""
        for ex in executions:
            if ex.run_id in self.runs or (ours is not None and shard_of(ex.job_id) not in ours):
                continue
            run = _Run(ex.run_id, ex.job_id, ex.scheduled_for, ex.attempt, ex.fence, ex.payload)
            if ex.state is RunState.RUNNING:
                run.phase = Phase.RUNNING
                run.lease_deadline = now_ms + self.config.lease_ms
            else:
                run.phase = Phase.DISPATCHED
                run.lease_deadline = now_ms + self.config.grace_lease_ms
            run.held_out = True
            self.runs.adopt(run)
            job = self.book.job(ex.job_id)
            if job is not None:
                job.inflight += 1
                job.running += 1
                self.tenants.hold_if_limited(run.run_id, job.spec.tenant)
                run.timeout_deadline = ex.dispatched_at_ms + job.spec.timeout_ms
                self.runs.time_out_at(run, max(now_ms, run.timeout_deadline))
            self.runs.add(run)
            self.shard_map.adopt_fence(shard_of(ex.job_id), ex.fence)
            if job is not None and job.cancelled:
                self.ends.end_run(run, RunState.CANCELLED, "job cancelled", acts, now_ms)
            elif job is not None and ex.state is RunState.DISPATCHED and ex.worker_id == "":
                # Its previous owner handed it over unsent (a planned move,
                # ``Store.release_unsent``): sent now, same attempt and fence.
                # Its hand-out here is its first: its lag counts if it was
                # claimed as a fire on time (not a backfill's, claimed late).
                run.timed = (
                    ex.attempt == 0
                    and ex.dispatched_at_ms - ex.scheduled_for <= self.config.overdue_after_ms
                )
                self.ends.take_back(run, now_ms)

    def _restore_retries(
        self, executions: Sequence[ExecutionRecord], ours: set[int] | None, now_ms: int
    ) -> None:
        """Latest attempts that ended failed, lost or timed out with no newer
        attempt: their retry (or re-dispatch) was pending when the previous
        owner stopped. Without this a restart would silently drop them."""
        for ex in executions:
            if ours is not None and shard_of(ex.job_id) not in ours:
                continue
            job = self.book.job(ex.job_id)
            if job is None or job.cancelled:
                continue
            redo = Redo(job.job_id, ex.scheduled_for, ex.attempt + 1)
            if ex.state is RunState.LOST:
                job.inflight += 1
                self.redos.reap_later(redo)
            elif should_retry(job.spec.retry, failed_attempt=ex.attempt):
                job.inflight += 1
                self.redos.retry_at(redo, now_ms)

    # -- losing shards ------------------------------------------------------------

    def remove_shards(self, shards: Collection[int]) -> list[RunRef]:
        """Hand the shards over: forget their jobs, timers, queued work,
        claims on their way and runs, at once and without a store write. No
        run is marked lost: its worker goes on, and the next owner adopts it
        from the store. Returns the runs handed over, as (run id, fence)."""
        gone = self.shard_map.remove(shards)
        if not gone:
            return []
        lost = {state.shard for state in gone}
        handed: list[RunRef] = []
        wheel = self.wheel
        for state in gone:
            table = state.table
            for job_id in table.awake_ids():
                self.book.jobs.pop(job_id, None)
                self.book.settling.discard(job_id)
                wheel.cancel((job_id << 2) | FIRE)
            for job_id in table.armed_before(self.book.armed_until):
                wheel.cancel((job_id << 2) | FIRE)
        if self.book.dirty:
            self.book.dirty = {j for j in self.book.dirty if shard_of(j) not in lost}
        for run_id, run in self.runs.items():
            if shard_of(run.job_id) in lost:
                self.runs.drop(run)
                self.tenants.unhold(run_id)
                if run.worker_id is not None:
                    worker = self.workers.get(run.worker_id)
                    if worker is not None:
                        worker.held.discard(run_id)
                handed.append((run_id, run.fence))
        for pend in self.claims.drop(lambda j: shard_of(j) in lost):
            worker = self.workers.get(pend.worker_id) if pend.worker_id else None
            if worker is not None:
                worker.reserved -= 1
        self.redos.drop(lambda j: shard_of(j) in lost)
        # Claims waiting for a permit hold no worker credit: they just go.
        self.dispatcher.keywaits.drop(lambda j: shard_of(j) in lost)
        later = self.book.later.claims
        if later:
            self.book.later.claims = [c for c in later if shard_of(c.job_id) not in lost]
        # Their queued work goes too: an id left in a queue was skipped when
        # its turn came, but on a route no worker serves that turn never
        # comes, and the route's waiting count kept it.
        self.dispatcher.unqueue_shards(lost)
        return handed
