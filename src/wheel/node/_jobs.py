"""The job API of ``wheel.node.Node``: submits group-committed into the
store and armed in the owner, reads, pauses, resumes and cancels (the store
first, then the owner), triggers and backfills acknowledged once their
claims are in the store."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Sequence

from wheel.engine.calendars import CalendarDays
from wheel.engine.driver import Driver
from wheel.engine.fires import next_fires_of
from wheel.engine.model import JobState
from wheel.engine.records import JobRecord, NewJob
from wheel.engine.spec import JobSpec
from wheel.errors import FailedPrecondition, WheelError
from wheel.node._batches import Batches
from wheel.node._changes import ChangeFeed, InThread
from wheel.node._values import Clock, NodeConfig, check_interval, trim_heap
from wheel.store.base import Store

log = logging.getLogger("wheel.node")
# Submits written in one store transaction at most: a bulk submit's 10,000
# jobs take two commits (each an fsync), not ten.
MAX_SUBMIT_BATCH = 5_000


# A submit's outcome: its job and whether the submit created it, or what
# refused it (a key conflict).
Outcome = asyncio.Future[tuple[JobRecord, bool] | WheelError]


class Submits:
    """A bulk submit's jobs (``Jobs.submit_batch``): each validated and queued for
    the node's group commits as it comes (the first are stored while the
    rest are checked), and their outcomes answered together, in order, by
    one future once the batch is closed and the last is in: not a future a
    job. A store write that fails with a ``WheelError`` is the outcome of
    each job it carried; any other failure fails the future."""

    __slots__ = ("_closed", "_jobs", "_left", "_results", "future")

    def __init__(self, jobs: Jobs) -> None:
        self._jobs = jobs
        self.future: asyncio.Future[list[tuple[JobRecord, bool] | WheelError]] = (
            asyncio.get_running_loop().create_future()
        )
        self._results: list[tuple[JobRecord, bool] | WheelError] = []
        self._left = 0
        self._closed = False

    def submit(
        self,
        spec: JobSpec,
        idempotency_key: str | None,
        *,
        body_hash: str | None = None,
        now_ms: int | None = None,
    ) -> None:
        """Validate the job now (raising what is wrong with the spec; nothing
        is queued then) and queue it; its outcome is the next in order."""
        new = self._jobs.new_submit(spec, idempotency_key, body_hash=body_hash, now_ms=now_ms)
        self._results.append(_UNSET)
        self._left += 1
        self._jobs.queue(new, self, len(self._results) - 1)

    def close(self) -> asyncio.Future[list[tuple[JobRecord, bool] | WheelError]]:
        """No more jobs: the future of every outcome, in the order submitted."""
        self._closed = True
        self._answer()
        return self.future

    def put(self, index: int, result: tuple[JobRecord, bool] | WheelError) -> None:
        self._results[index] = result
        self._left -= 1
        self._answer()

    def failed(self, index: int, exc: Exception) -> None:
        """The store write that carried job ``index`` failed."""
        if isinstance(exc, WheelError):
            self.put(index, exc)
        elif not self.future.done():
            self.future.set_exception(exc)

    def _answer(self) -> None:
        if self._closed and not self._left and not self.future.done():
            self.future.set_result(self._results)


_UNSET = WheelError("no outcome yet")


class Jobs:
    """Submits, reads and state changes of a node's jobs."""

    def __init__(
        self,
        config: NodeConfig,
        store: Store,
        clock: Clock,
        *,
        in_thread: InThread,
        driver: Callable[[], Driver],
        changes: ChangeFeed,
        batches: Batches,
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
        # A durable trigger waits for the next batch's commit.
        self._batches = batches
        self._wake = wake
        # Queued submits, each with where its outcome goes: its own future,
        # or its place in a batch's (``Submits``).
        self._submits: list[tuple[NewJob, Outcome | Submits, int]] = []
        self._submit_flusher: asyncio.Task[None] | None = None

    def submit_later(
        self,
        spec: JobSpec,
        idempotency_key: str | None,
        *,
        body_hash: str | None = None,
        now_ms: int | None = None,
    ) -> asyncio.Future[tuple[JobRecord, bool] | WheelError]:
        """Validate now (raising what is wrong with the spec), then queue the
        job to be stored with every other submit waiting at the same moment
        in one transaction (group commit) and scheduled. Returns the future
        of its outcome, a per-job error (a key conflict) included: a batch of
        requests queues all its jobs without a task for each."""
        new = self.new_submit(spec, idempotency_key, body_hash=body_hash, now_ms=now_ms)
        future: Outcome = asyncio.get_running_loop().create_future()
        self.queue(new, future, 0)
        return future

    def new_submit(
        self,
        spec: JobSpec,
        idempotency_key: str | None,
        *,
        body_hash: str | None = None,
        now_ms: int | None = None,
    ) -> NewJob:
        """What a submit stores, validated (raising what is wrong with the
        spec), to queue."""
        check_interval(spec, self._config.min_interval_ms)
        now = self._clock.now_ms() if now_ms is None else now_ms
        return self._driver().new_job(spec, idempotency_key, now, body_hash=body_hash)

    def submit_batch(self) -> Submits:
        """A bulk submit's batch: ``submit_later`` of each of its jobs with
        one future of every outcome (``Submits``)."""
        return Submits(self)

    def queue(self, new: NewJob, to: Outcome | Submits, index: int) -> None:
        """Queue a validated submit for the next group commit; its outcome
        goes to ``to`` (at ``index`` of a batch's)."""
        self._submits.append((new, to, index))
        if self._submit_flusher is None or self._submit_flusher.done():
            self._submit_flusher = asyncio.create_task(self._flush_submits())

    async def _flush_submits(self) -> None:
        flushed = 0
        while self._submits:
            batch, self._submits = (
                self._submits[:MAX_SUBMIT_BATCH],
                self._submits[MAX_SUBMIT_BATCH:],
            )
            try:
                results = await self._in_thread(self._store.submit_jobs, [n for n, _, _ in batch])
            except Exception as exc:  # every waiter hears of it: none hangs
                for _, to, index in batch:
                    if isinstance(to, Submits):
                        to.failed(index, exc)
                    elif not to.done():
                        to.set_exception(exc)
                if not isinstance(exc, WheelError):
                    log.exception("storing %d submits failed", len(batch))
                continue
            driver, now = self._driver(), self._clock.now_ms()
            markers: set[int] = set()
            for i, ((new, to, index), result) in enumerate(zip(batch, results, strict=True)):
                if i % 250 == 249:
                    await asyncio.sleep(0)  # let the loop in between
                if not isinstance(result, WheelError) and result.created:
                    driver.submitted(result.job, now, new)
                    if driver.owns(result.job.job_id):
                        markers.add(result.job.change)
                    # Else its shard is being gained: the gain's load may
                    # have read the store before this job, and the change
                    # feed, read on from the load's watermark, brings it.
                    # Left out of the feed as the node's own, it was never
                    # armed (a state change or update of such a shard is
                    # refused as moving; a submit is not).
                if isinstance(to, Submits):
                    to.put(index, result)
                elif not to.done():
                    to.set_result(result)
            # Left out of the change feed only now that every job they mark is
            # in the owner: a read meanwhile brings them (applied twice,
            # harmlessly), and a watermark logged past them never comes before
            # the jobs' own rows in the checkpoint.
            self._changes.own(markers)
            flushed += len(batch)
            self._wake()
        if flushed >= MAX_SUBMIT_BATCH:
            # What a bulk submit's requests and records left free, given back
            # off the loop (not waited for: submits may come meanwhile): with a
            # large heap it takes a good part of a second.
            asyncio.get_running_loop().run_in_executor(None, trim_heap)

    async def get_job(self, job_id: int) -> JobRecord:
        return await self._in_thread(self._store.get_job, job_id)

    async def set_state(self, job_id: int, state: JobState) -> JobRecord:
        """Pause, resume or cancel: the store first, then the owner."""
        record = await self.get_job(job_id)
        now = self._clock.now_ms()
        change = self._driver().state_change(record, state, now)
        if change.noop:
            return record
        updated = await self._in_thread(
            functools.partial(
                self._store.set_job_state,
                job_id,
                change.state,
                next_run_at=change.next_run_at,
                now_ms=now,
            )
        )
        self._changes.own((updated.change,))
        self._driver().state_changed(record, updated, change.state, now)
        self._wake()
        return updated

    async def trigger(self, job_id: int) -> int:
        record = await self.get_job(job_id)
        at = self._driver().trigger(record, self._clock.now_ms())
        await self.committed()
        return at

    async def backfill(self, job_id: int, fires: Sequence[int]) -> tuple[list[int], int]:
        record = await self.get_job(job_id)
        if record.state is not JobState.ACTIVE:
            raise FailedPrecondition(f"job {job_id} is {record.state.value}, not active")
        existing = await self._in_thread(self._store.fires_exist, job_id, list(fires))
        todo = [f for f in fires if f not in existing]
        self._driver().backfill(record, todo, self._clock.now_ms())
        await self.committed()
        return todo, len(fires) - len(todo)

    async def committed(self) -> None:
        """Wait until what the owner emitted so far is in the store: an
        acknowledged trigger or backfill survives a crash right after."""
        waiter = self._batches.commit_waiter()
        self._wake()
        await waiter

    def next_fires(
        self,
        job_id: int,
        count: int,
        record: JobRecord | None = None,
        days: CalendarDays | None = None,
    ) -> list[int]:
        """The job's next fires: as its owner has them armed, or, for a job
        held by another node, as its schedule computes them from ``record``
        (skipping ``days``, its calendars')."""
        driver = self._driver()
        if driver.owns(job_id) or record is None:
            return driver.next_fires(job_id, count)
        return next_fires_of(record, count, days)
