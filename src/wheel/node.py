"""The I/O shell of one node: drives the pure shard owner with a clock, the
record of truth and worker streams.

One asyncio loop iteration (``_loop``):

1. feed the owner ``advance(now)``: due timers fire, work is claimed;
2. run the accumulated store writes in ONE pass on the store thread, in the
   order the owner requires (completions, missed, advances, claims, starts);
3. feed the store's answers back (``on_completed``, ``on_claimed``), which
   produces assignments and results;
4. send one message per worker per kind (batched), then sleep until the
   wheel's next deadline or until an event (a worker message, an API call)
   wakes the loop.

Everything that touches the owner runs on the event loop thread, so the owner
needs no locks. Store calls run on one dedicated thread for dispatch and a
small pool for API reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import TypeVar

from wheel.checkpoint.owner_state import log_entry, log_records, snapshot_chunks
from wheel.checkpoint.wal import Checkpoint, Durability, DutyCycle, Identity
from wheel.engine.model import SHARD_COUNT, JobState
from wheel.engine.owner import Effects, Outcome, Owner, OwnerConfig
from wheel.engine.records import (
    JobRecord,
    NewJob,
)
from wheel.engine.schedule import compile_schedule
from wheel.engine.spec import JobSpec, Once
from wheel.errors import (
    CheckpointError,
    FailedPrecondition,
    NotFound,
    StoreError,
    WheelError,
)
from wheel.recovery import restore_owner
from wheel.store.base import BatchOutcome, Store, WriteBatch

log = logging.getLogger("wheel.node")
# Submits written in one store transaction at most.
MAX_SUBMIT_BATCH = 1_000
# Store batches committing while the loop forms the next one.
MAX_BATCHES_IN_FLIGHT = 2
T = TypeVar("T")
# A snapshot's share of the process's time, taken in chunks of this many jobs
# (each some milliseconds of Python): see wheel.checkpoint.wal.DutyCycle.
SNAPSHOT_SHARE = 0.2
SNAPSHOT_JOBS_PER_CHUNK = 2_000


class Clock:
    """Milliseconds on the wall-clock scale that never step backwards: the wall
    time at start plus monotonic time elapsed since (leases must not jump when
    NTP steps the wall clock)."""

    def __init__(self) -> None:
        self._wall0 = time.time_ns() // 1_000_000
        self._mono0 = time.monotonic_ns()

    def now_ms(self) -> int:
        return self._wall0 + (time.monotonic_ns() - self._mono0) // 1_000_000


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeConfig:
    node_id: str = "node-1"
    owner: OwnerConfig = field(default_factory=OwnerConfig)
    # How often to read jobs changed by others (other nodes, direct writes),
    # and at most how many a read takes. A read that comes back at least half
    # full is followed by the next one at once, not a whole interval later:
    # jobs submitted faster than a page a second must not leave the node ever
    # further behind on pauses and cancels made elsewhere.
    changes_interval_s: float = 1.0
    changes_page: int = 10_000
    # Longest sleep of the dispatch loop without an event.
    max_idle_s: float = 0.5
    # Local LMDB checkpoint for fast restarts (None: rebuild from the store).
    checkpoint_dir: str | None = None
    checkpoint_durability: Durability = Durability.SYNC
    # A checkpoint written for another cluster is never used.
    cluster_id: str = "wheel"
    # Take a snapshot (and truncate the log) once this many job records
    # were logged since the last one began.
    snapshot_every_records: int = 500_000
    # Group commit under load: after a store batch of at least
    # ``group_commit_min_writes`` writes, the next batch is formed no sooner
    # than ``group_commit_ms`` later. Each commit then carries more fires, so
    # fewer fsyncs and fewer store pages written per fire (measured: about a
    # fifth of the node's CPU per dispatch at 10k/s). Light traffic waits
    # ``group_commit_light_ms`` at most.
    group_commit_ms: int = 20
    group_commit_min_writes: int = 64
    # After a smaller batch the next one waits this much: a steady trickle
    # of fires would otherwise commit (and fsync the checkpoint) once per
    # millisecond. At 2,000 dispatches/s on SQLite: 0.75 CPU s per 1,000
    # dispatches and p99 13 ms at 0; 0.46 s and p99 10 ms at 5 ms. A lone
    # event after a quiet spell still commits at once.
    group_commit_light_ms: int = 5


class WorkerSession:
    """One worker stream: the node writes server messages into ``outbox``."""

    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id
        self.outbox: asyncio.Queue[object] = asyncio.Queue()
        self.closed = False


# Translates an owner Effects into per-worker wire messages; set by the rpc layer.
MessageSink = Callable[[WorkerSession, Effects], None]


class Node:
    """One node owning shards (all 256 on a single node)."""

    def __init__(self, store: Store, config: NodeConfig | None = None) -> None:
        self.store = store
        self.config = config or NodeConfig()
        self.clock = Clock()
        self.owner: Owner | None = None
        self.sessions: dict[str, WorkerSession] = {}
        self.message_sink: MessageSink | None = None
        self._fx = Effects()
        self._wake = asyncio.Event()
        self._store_thread = ThreadPoolExecutor(1, thread_name_prefix="wheel-store")
        self._api_threads = ThreadPoolExecutor(4, thread_name_prefix="wheel-api")
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._watermark = 0
        # Change markers of the node's own job writes: its change feed leaves
        # those jobs out (it applied them when it wrote them).
        self._own_changes: set[int] = set()
        self._lags: deque[int] = deque(maxlen=10_000)
        self.alerts: deque[str] = deque(maxlen=1_000)
        self.ready = asyncio.Event()
        self._submits: list[tuple[NewJob, asyncio.Future[tuple[JobRecord, bool] | WheelError]]]
        self._submits = []
        # API calls waiting for the next batch's commit (durable triggers).
        self._commit_waiters: list[asyncio.Future[None]] = []
        self._submit_flusher: asyncio.Task[None] | None = None
        self._checkpoint: Checkpoint | None = None
        self._logged_watermark = -1
        self._snapshot_due = False
        self._snapshotting: threading.Thread | None = None
        # Job records in the log: all logged (counted by the store thread) and
        # those the running or last snapshot covers (set by the loop).
        self._log_records = 0
        self._snapshot_covers = 0
        # Set when the dispatch loop ends; a node whose loop died must exit
        # (and be restarted) rather than keep serving without dispatching.
        self.stopped = asyncio.Event()

    # -- life cycle -------------------------------------------------------------

    async def start(self) -> None:
        await self._api(self.store.migrate)
        shards = list(range(SHARD_COUNT))
        epochs = await self._api(self.store.acquire_epochs, shards, self.config.node_id)
        if self.config.checkpoint_dir is not None:
            self._checkpoint = await self._api(self._open_checkpoint)
        restored = await self._api(
            functools.partial(
                restore_owner,
                self.store,
                self._checkpoint,
                epochs=epochs,
                config=self.config.owner,
                now_ms=self.clock.now_ms(),
            )
        )
        owner = restored.owner
        self._fx = restored.effects
        self._watermark = restored.watermark
        self._log_records, self._snapshot_covers = restored.log_records, 0
        self.owner = owner
        if self._checkpoint is not None:
            if restored.source == "store":
                # A full snapshot follows instead of a huge log batch.
                owner.take_dirty()
                owner.take_new_specs()
                self._start_snapshot()
            self._logged_watermark = -1  # log the watermark with the first batch
        log.info(
            "node %s owns %d shards: %d jobs, %d runs in flight (restored from the %s in %.2fs)",
            self.config.node_id,
            len(epochs),
            owner.job_count(),
            len(owner.runs),
            restored.source,
            restored.seconds,
        )
        self._task = asyncio.create_task(self._loop(), name="wheel-dispatch")
        self._task.add_done_callback(self._loop_done)
        self.ready.set()

    def _loop_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.critical("dispatch loop died", exc_info=task.exception())
        self.stopped.set()

    async def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for session in list(self.sessions.values()):
            session.closed = True
            session.outbox.put_nowait(None)
        self._store_thread.shutdown(wait=True)
        self._api_threads.shutdown(wait=True)
        if self._snapshotting is not None:
            self._snapshotting.join()
        if self._checkpoint is not None:
            self._checkpoint.close()

    # -- the checkpoint ---------------------------------------------------------

    def _open_checkpoint(self) -> Checkpoint | None:
        assert self.config.checkpoint_dir is not None
        path = self.config.checkpoint_dir
        identity = Identity(cluster_id=self.config.cluster_id, shard_set=f"0-{SHARD_COUNT - 1}")
        durability = self.config.checkpoint_durability
        try:
            return Checkpoint.open(path, identity, durability=durability)
        except CheckpointError as exc:
            log.error("checkpoint at %s cannot be opened (%s); starting a new one", path, exc)
            try:
                Checkpoint.destroy(path)
                return Checkpoint.open(path, identity, durability=durability)
            except CheckpointError:
                log.exception("running without a checkpoint")
                return None

    def _start_snapshot(self) -> None:
        """A fuzzy snapshot on its own thread: the log replays everything after
        the sequence number it starts at (see wheel.checkpoint.owner_state)."""
        checkpoint, owner = self._checkpoint, self.owner
        if checkpoint is None or owner is None:
            return
        if self._snapshotting is not None and self._snapshotting.is_alive():
            return
        job_ids = owner.job_ids()
        upto = checkpoint.last_seq()
        covered_before, self._snapshot_covers = self._snapshot_covers, self._log_records
        # The owner reflects every store change up to this watermark, and the
        # fuzzy snapshot holds images at least that new.
        watermark = self._watermark

        def write() -> None:
            started = time.perf_counter()
            try:
                checkpoint.write_snapshot(
                    snapshot_chunks(
                        job_ids,
                        owner.image_of,
                        watermark,
                        SNAPSHOT_JOBS_PER_CHUNK,
                        record_of=owner.dormant_record,
                    ),
                    upto,
                    pause=DutyCycle(SNAPSHOT_SHARE).pause,
                )
            except Exception:
                log.exception("snapshot failed; the log keeps growing until the next one")
                self._snapshot_covers = covered_before  # due again
                return
            log.info(
                "snapshot of %d jobs up to log record %d in %.2fs",
                len(job_ids),
                upto,
                time.perf_counter() - started,
            )

        self._snapshotting = threading.Thread(target=write, name="wheel-snapshot", daemon=True)
        self._snapshotting.start()

    def _owner(self) -> Owner:
        if self.owner is None:
            raise FailedPrecondition("node is starting")
        return self.owner

    async def _api(self, fn: Callable[..., T], *args: object) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._api_threads, fn, *args)

    def wake(self) -> None:
        self._wake.set()

    # -- the dispatch loop ------------------------------------------------------

    async def _loop(self) -> None:
        """Pipelined: while the store thread commits batch N, the loop keeps
        firing timers and serving workers and forms batch N+1. Batches commit
        in order on the one store thread, and their answers are fed back in
        order; a batch's checkpoint records are appended after its store
        commit (never ahead of the store) and before the messages its answers
        produce are sent."""
        loop = asyncio.get_running_loop()
        config = self.config
        next_changes = time.monotonic() + config.changes_interval_s
        pending: deque[tuple[asyncio.Future[BatchOutcome], list[asyncio.Future[None]]]]
        pending = deque()
        next_batch_ms = 0  # group commit: no batch before this (clock ms)
        while not self._stopping:
            owner = self._owner()
            fx = self._fx
            now = self.clock.now_ms()
            owner.advance(now, fx)
            if len(pending) < MAX_BATCHES_IN_FLIGHT and now >= next_batch_ms:
                batch = self._form_batch(owner, fx)
                if batch is not None:
                    if batch[0].size() >= config.group_commit_min_writes:
                        next_batch_ms = now + config.group_commit_ms
                    else:
                        next_batch_ms = now + config.group_commit_light_ms
                    future = loop.run_in_executor(self._store_thread, self._write, *batch)
                    future.add_done_callback(lambda _: self._wake.set())
                    pending.append((future, self._commit_waiters))
                    self._commit_waiters = []
            while pending and pending[0][0].done():
                done, waiters = pending.popleft()
                outcome = done.result()
                now = self.clock.now_ms()
                owner.on_completed(outcome.completions, now, fx)
                owner.on_claimed(outcome.claims, now, fx)
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_result(None)
            self._publish(fx)
            if fx.resync or time.monotonic() >= next_changes:
                busy = await self._read_changes(fx.resync)
                fx.resync = set()
                next_changes = time.monotonic() + (0.0 if busy else config.changes_interval_s)
            deadline = owner.next_deadline()
            if next_batch_ms > self.clock.now_ms():
                # Holding writes for the group commit: wake for it, for the
                # next timer, or for a message; never spin.
                if fx.store_work() or self._commit_waiters:
                    deadline = next_batch_ms if deadline is None else min(deadline, next_batch_ms)
            elif len(pending) < MAX_BATCHES_IN_FLIGHT and (
                fx.store_work() or self._commit_waiters or owner.has_dispatchable_work()
            ):
                await asyncio.sleep(0)  # let stream reads and API calls in
                continue
            if time.monotonic() >= next_changes:  # a busy change feed: next page now
                await asyncio.sleep(0)
                continue
            await self._sleep_until(deadline)
        for future, waiters in pending:
            with contextlib.suppress(Exception):
                await future
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)
        for waiter in self._commit_waiters:
            if not waiter.done():
                waiter.set_exception(FailedPrecondition("node is stopping"))

    def _form_batch(self, owner: Owner, fx: Effects) -> tuple[WriteBatch, list[bytes]] | None:
        """Take the store writes and the checkpoint records of what changed."""
        records: list[bytes] = []
        dirty = owner.take_dirty()
        if self._checkpoint is None:
            owner.take_new_specs()  # nothing is logged: keep no marks
        else:
            full = owner.take_new_specs(dirty)
            watermark = self._watermark if self._watermark != self._logged_watermark else None
            if dirty or watermark is not None:
                records = log_records(dirty, owner.image_of, watermark, full=full)
                if watermark is not None:
                    self._logged_watermark = watermark
        if not fx.store_work() and not records and not self._commit_waiters:
            return None
        work = fx.take_store_work()
        # A run that completes in this batch needs no separate start.
        done = {c.run_id for c in work.completions}
        batch = WriteBatch(
            completions=work.completions,
            missed=work.missed,
            advances=work.advances,
            claims=work.claims,
            starts=[st for st in work.starts if st.run_id not in done],
        )
        return batch, records

    def _write(self, batch: WriteBatch, records: list[bytes]) -> BatchOutcome:
        """On the store thread: commit the batch, retrying an unavailable store
        with backoff (later batches wait behind it, so order holds; claims are
        idempotent by (job, fire, attempt) and completions by fence), then
        append its checkpoint records."""
        backoff = 0.05
        while True:
            try:
                outcome = self.store.write_batch(batch)
                break
            except StoreError as exc:
                if self._stopping:
                    raise
                log.warning("store write failed (%s); retrying in %.2fs", exc, backoff)
                time.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
        checkpoint = self._checkpoint
        if records and checkpoint is not None:
            try:
                checkpoint.append([log_entry(records)])
            except CheckpointError:
                # The store is the record of truth: losing the checkpoint costs
                # a slow restart, not correctness. Say so and go on without it.
                log.exception("checkpoint append failed; continuing without a checkpoint")
                self._checkpoint = None
            else:
                self._log_records += len(records)
                logged = self._log_records - self._snapshot_covers
                if logged >= self.config.snapshot_every_records:
                    self._snapshot_due = True
        return outcome

    async def _sleep_until(self, deadline: int | None) -> None:
        timeout = self.config.max_idle_s
        if deadline is not None:
            timeout = min(timeout, max(0.0, (deadline - self.clock.now_ms()) / 1000))
        if timeout <= 0:
            await asyncio.sleep(0)
            return
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout)

    def _publish(self, fx: Effects) -> None:
        if self._snapshot_due:
            self._snapshot_due = False
            self._start_snapshot()
        for alert in fx.alerts:
            log.warning("alert: %s", alert)
            self.alerts.append(alert)
        fx.alerts.clear()
        self._lags.extend(fx.lags)
        fx.lags.clear()
        workers = (
            set(fx.assignments)
            | set(fx.revokes)
            | set(fx.results)
            | set(fx.rejected_renewals)
            | set(fx.violations)
        )
        for worker_id in workers:
            session = self.sessions.get(worker_id)
            if session is not None and self.message_sink is not None:
                self.message_sink(session, fx)
        fx.assignments.clear()
        fx.revokes.clear()
        fx.results.clear()
        fx.rejected_renewals.clear()
        fx.violations.clear()

    async def _read_changes(self, resync: set[int]) -> bool:
        """Apply the jobs changed since the last read (and re-read ``resync``);
        True when the page was busy enough that more may be waiting."""
        owner = self._owner()
        page = self.config.changes_page
        try:
            records: list[JobRecord] = []
            for job_id in resync:
                with contextlib.suppress(NotFound):
                    records.append(await self._api(self.store.get_job, job_id))
            changed, self._watermark = await self._api(
                functools.partial(
                    self.store.changes_since,
                    self._watermark,
                    list(owner.shards()),
                    page,
                    owner_moves=False,
                    exclude=frozenset(self._own_changes),
                )
            )
            # A marker below the watermark is never reported again.
            self._own_changes = {m for m in self._own_changes if m >= self._watermark}
            records.extend(changed)
        except StoreError as exc:
            log.warning("reading job changes failed: %s", exc)
            return False
        now = self.clock.now_ms()
        for record in records:
            if owner.owns(record.job_id):
                owner.upsert_job(record, now, self._fx)
        # A page can end short of the limit on a whole transaction (PostgreSQL).
        return 2 * len(changed) >= page

    # -- worker streams ---------------------------------------------------------

    def attach_worker(
        self,
        worker_id: str,
        capacity: int,
        pools: Sequence[str],
        *,
        handlers: Sequence[str] = (),
    ) -> WorkerSession:
        old = self.sessions.pop(worker_id, None)
        if old is not None:
            old.closed = True
            old.outbox.put_nowait(None)
        session = WorkerSession(worker_id)
        self.sessions[worker_id] = session
        self._owner().worker_hello(
            worker_id, capacity, pools, self.clock.now_ms(), self._fx, handlers=handlers
        )
        self.wake()
        return session

    def detach_worker(self, session: WorkerSession) -> None:
        session.closed = True
        if self.sessions.get(session.worker_id) is session:
            del self.sessions[session.worker_id]
            self._owner().worker_disconnect(session.worker_id)
            self.wake()

    def worker_ack(self, worker_id: str, refs: Sequence[tuple[int, int]]) -> None:
        self._owner().worker_ack(worker_id, refs, self.clock.now_ms(), self._fx)
        self.wake()

    def worker_heartbeat(self, worker_id: str, refs: Sequence[tuple[int, int]]) -> None:
        self._owner().worker_heartbeat(worker_id, refs, self.clock.now_ms(), self._fx)
        self.wake()

    def worker_complete(
        self, worker_id: str, completions: Sequence[tuple[int, int, Outcome, str]]
    ) -> None:
        self._owner().worker_complete(worker_id, completions, self.clock.now_ms(), self._fx)
        self.wake()

    def worker_credit(self, worker_id: str, add: int) -> None:
        self._owner().worker_credit(worker_id, add, self.clock.now_ms(), self._fx)
        self.wake()

    def worker_capacity(self, worker_id: str) -> int | None:
        return self._owner().worker_capacity(worker_id)

    def worker_drain(self, worker_id: str) -> None:
        self._owner().worker_drain(worker_id)

    # -- the job API --------------------------------------------------------------

    def first_fire(self, job_id: int, spec: JobSpec, now_ms: int) -> int | None:
        return compile_schedule(spec.schedule, jitter_ms=spec.jitter_ms, job_id=job_id).next_fire(
            now_ms - 1
        )

    def submit_later(
        self, spec: JobSpec, idempotency_key: str | None, *, body_hash: str | None = None
    ) -> asyncio.Future[tuple[JobRecord, bool] | WheelError]:
        """Validate now (raising what is wrong with the spec), then queue the
        job to be stored with every other submit waiting at the same moment
        in one transaction (group commit) and scheduled. Returns the future
        of its outcome, a per-job error (a key conflict) included: a batch of
        requests queues all its jobs without a task for each."""
        new = replace(self._new_job(spec, idempotency_key), body_hash=body_hash)
        future: asyncio.Future[tuple[JobRecord, bool] | WheelError] = (
            asyncio.get_running_loop().create_future()
        )
        self._submits.append((new, future))
        if self._submit_flusher is None or self._submit_flusher.done():
            self._submit_flusher = asyncio.create_task(self._flush_submits())
        return future

    async def _flush_submits(self) -> None:
        while self._submits:
            batch, self._submits = (
                self._submits[:MAX_SUBMIT_BATCH],
                self._submits[MAX_SUBMIT_BATCH:],
            )
            try:
                results = await self._api(self.store.submit_jobs, [n for n, _ in batch])
            except Exception as exc:  # every waiter hears of it: none hangs
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                if not isinstance(exc, WheelError):
                    log.exception("storing %d submits failed", len(batch))
                continue
            for (_, future), result in zip(batch, results, strict=True):
                if not isinstance(result, WheelError) and result.created:
                    self._own_changes.add(result.job.change)
                    self._apply_record(result.job)
                if not future.done():
                    future.set_result(result)

    def _new_job(self, spec: JobSpec, idempotency_key: str | None) -> NewJob:
        now = self.clock.now_ms()
        # Validates the schedule (cron syntax, zone) before anything is stored.
        first = self.first_fire(0, spec, now)
        if first is None and isinstance(spec.schedule, Once):
            # A one-shot submitted late is due now, not never: its catch-up
            # policy decides whether it runs or is recorded as missed.
            first = spec.schedule.at_ms
        return NewJob(
            spec=spec, created_at_ms=now, next_run_at=first, idempotency_key=idempotency_key
        )

    def _apply_record(self, record: JobRecord) -> None:
        owner = self._owner()
        if owner.owns(record.job_id):
            owner.upsert_job(record, self.clock.now_ms(), self._fx)
            self.wake()

    async def get_job(self, job_id: int) -> JobRecord:
        return await self._api(self.store.get_job, job_id)

    async def set_state(self, job_id: int, state: JobState) -> JobRecord:
        record = await self.get_job(job_id)
        now = self.clock.now_ms()
        if record.state in (JobState.CANCELLED, JobState.COMPLETED):
            if state is JobState.CANCELLED:
                return record  # cancel is idempotent
            raise FailedPrecondition(f"job {job_id} is {record.state.value}")
        if record.state is state:
            return record
        next_run: int | None = None
        if state is JobState.ACTIVE:
            # Resume from now: fires missed while paused are recorded, not run.
            next_run = self.first_fire(job_id, record.spec, now + 1)
        updated = await self._api(
            functools.partial(
                self.store.set_job_state, job_id, state, next_run_at=next_run, now_ms=now
            )
        )
        self._own_changes.add(updated.change)
        owner = self._owner()
        if owner.owns(job_id):
            if state is JobState.CANCELLED:
                owner.cancel_job(job_id, self._fx, now)
            owner.upsert_job(updated, now, self._fx)
            if state is JobState.ACTIVE:
                owner.record_paused_fires(job_id, record.updated_at_ms, now, self._fx)
            self.wake()
        return updated

    async def trigger(self, job_id: int) -> int:
        record = await self.get_job(job_id)
        if record.state is not JobState.ACTIVE:
            raise FailedPrecondition(f"job {job_id} is {record.state.value}, not active")
        owner = self._owner()
        if not owner.has_job(record.job_id):
            owner.upsert_job(record, self.clock.now_ms(), self._fx)
        at = owner.trigger(job_id, self.clock.now_ms(), self._fx)
        await self._committed()
        return at

    async def backfill(self, job_id: int, fires: Sequence[int]) -> tuple[list[int], int]:
        record = await self.get_job(job_id)
        if record.state is not JobState.ACTIVE:
            raise FailedPrecondition(f"job {job_id} is {record.state.value}, not active")
        existing = await self._api(self.store.fires_exist, job_id, list(fires))
        todo = [f for f in fires if f not in existing]
        owner = self._owner()
        if not owner.has_job(record.job_id):
            owner.upsert_job(record, self.clock.now_ms(), self._fx)
        owner.backfill(job_id, todo, self.clock.now_ms(), self._fx)
        await self._committed()
        return todo, len(fires) - len(todo)

    async def _committed(self) -> None:
        """Wait until what the owner emitted so far is in the store: an
        acknowledged trigger or backfill survives a crash right after."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._commit_waiters.append(waiter)
        self.wake()
        await waiter

    def next_fires(self, job_id: int, count: int) -> list[int]:
        return self._owner().next_fires(job_id, count)

    # -- status -----------------------------------------------------------------

    def lag_percentiles(self) -> tuple[float, float]:
        if not self._lags:
            return 0.0, 0.0
        lags = sorted(self._lags)
        return float(lags[len(lags) // 2]), float(lags[min(len(lags) - 1, len(lags) * 99 // 100)])
