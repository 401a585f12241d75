"""What a node does to change a job's spec in place and to run its dead
letters again: the store write between the owner's hold of the job's fires
and its re-arming (``Driver.update``), and redrives claimed at once like a
trigger."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from wheel.engine.driver import Driver
from wheel.engine.records import ExecutionRecord, JobChange, Updated
from wheel.engine.spec import JobSpec
from wheel.errors import FailedPrecondition, NotFound
from wheel.node._changes import ChangeFeed, InThread
from wheel.node._jobs import Jobs
from wheel.node._values import Clock, NodeConfig, check_interval
from wheel.store.base import RunState, Store

# Dead letters a redrive of a whole job claims at most (the newest): a call
# claims them in one go, and says where the rest begin (``Redriven``).
MAX_REDRIVE = 1_000


@dataclass(frozen=True, slots=True, kw_only=True)
class Redriven:
    """What one redrive claimed: the new attempts, and, when older dead
    letters of the job remain past ``MAX_REDRIVE``, the run id to redrive
    below next (those claimed here are no longer dead letters, and any made
    since are newer)."""

    runs: list[ExecutionRecord]
    more_before_run_id: int | None = None


class Updates:
    """Spec updates and dead-letter redrives of a node's jobs."""

    def __init__(
        self,
        config: NodeConfig,
        store: Store,
        clock: Clock,
        *,
        in_thread: InThread,
        driver: Callable[[], Driver],
        changes: ChangeFeed,
        jobs: Jobs,
        wake: Callable[[], None],
    ) -> None:
        self._config = config
        self._store = store
        self._clock = clock
        self._in_thread = in_thread
        # The node's driver (``FailedPrecondition`` while it starts).
        self._driver = driver
        # The node's own job writes are left out of its change feed.
        self._changes = changes
        # Reads a job, and waits for the next batch's commit.
        self._jobs = jobs
        self._wake = wake

    async def update_job(
        self,
        job_id: int,
        spec: JobSpec,
        *,
        idempotency_key: str | None = None,
        body_hash: str = "",
        updated_by: str = "",
        if_version: int | None = None,
    ) -> Updated:
        """Give the job ``spec`` (its tenant kept), on the owner of its shard.
        From the request on, the old schedule fires nothing more; the store
        takes the new spec, next fire and a history row in one transaction,
        and the owner re-arms from them as soon as it answers (or, if it
        refused, fires on as before). Runs claimed earlier finish under the
        spec they were claimed with. ``spec`` is validated first: a bad one
        changes nothing; so does an update on the condition ``if_version``
        (see ``Store.update_job``) that does not hold."""
        record = await self._jobs.get_job(job_id)
        if spec.schedule != record.spec.schedule:
            # A job stored before a higher minimum keeps its schedule through
            # updates of its other fields.
            check_interval(spec, self._config.min_interval_ms)
        driver, now = self._driver(), self._clock.now_ms()
        update, hold = driver.update(
            record,
            spec,
            now,
            idempotency_key=idempotency_key,
            body_hash=body_hash,
            updated_by=updated_by,
        )
        try:
            result = await self._in_thread(
                functools.partial(self._store.update_job, update, if_version=if_version)
            )
        except BaseException:
            driver.update_failed(job_id, hold, self._clock.now_ms())
            self._wake()
            raise
        if not result.applied:
            driver.update_failed(job_id, hold, self._clock.now_ms())
        else:
            self._changes.own((result.job.change,))
            driver.updated(result.job, self._clock.now_ms())
        self._wake()
        return result

    async def list_job_updates(
        self, job_id: int, *, before_version: int | None, limit: int
    ) -> list[JobChange]:
        return await self._in_thread(
            functools.partial(
                self._store.list_job_updates, job_id, before_version=before_version, limit=limit
            )
        )

    async def list_dead_letters(
        self,
        *,
        job_id: int | None,
        tenant: str | None,
        before_run_id: int | None,
        limit: int,
    ) -> list[ExecutionRecord]:
        return await self._in_thread(
            functools.partial(
                self._store.list_dead_letters,
                job_id=job_id,
                tenant=tenant,
                before_run_id=before_run_id,
                limit=limit,
            )
        )

    async def redrive(
        self, job_id: int, run_id: int | None = None, *, before_run_id: int | None = None
    ) -> Redriven:
        """The job's dead letters (the newest ``MAX_REDRIVE`` below
        ``before_run_id``; or the one of ``run_id``) claimed again at once,
        each as the next attempt of its fire with a new fence; returns the
        new attempts, once they are in the store, and where older dead
        letters remain. A dead letter redriven already is not one any more:
        redriving it again does nothing."""
        record = await self._jobs.get_job(job_id)
        more: int | None = None
        if run_id is None:
            # One more than the bound: whether older ones remain.
            dead = await self.list_dead_letters(
                job_id=job_id, tenant=None, before_run_id=before_run_id, limit=MAX_REDRIVE + 1
            )
            if len(dead) > MAX_REDRIVE:
                dead = dead[:MAX_REDRIVE]
                more = dead[-1].run_id
        else:
            # The dead letters at and below ``run_id``, newest first: it is the
            # first if it is one.
            dead = await self.list_dead_letters(
                job_id=job_id, tenant=None, before_run_id=run_id + 1, limit=1
            )
            dead = [r for r in dead if r.run_id == run_id]
            if not dead:
                run = await self._in_thread(self._store.get_run, run_id)  # NotFound
                if run.job_id != job_id:
                    raise NotFound(f"run {run_id} is not a run of job {job_id}")
                if run.state is not RunState.DEAD_LETTERED:
                    raise FailedPrecondition(
                        f"run {run_id} is {run.state.value}, not dead-lettered"
                    )
                return Redriven(runs=[])  # redriven already: a later attempt has its fire
        if not dead:
            return Redriven(runs=[])
        fires = sorted((r.scheduled_for, r.attempt + 1) for r in dead)
        self._driver().redrive(record, fires, self._clock.now_ms())
        await self._jobs.committed()
        # The new attempts, read by their fires: newest first, a job's runs
        # put an old fire's new attempt below every fire since.
        tried = await self._in_thread(
            self._store.runs_of_fires, job_id, [scheduled_for for scheduled_for, _ in fires]
        )
        wanted = set(fires)
        runs = [r for r in tried if (r.scheduled_for, r.attempt) in wanted]
        return Redriven(runs=runs, more_before_run_id=more)
