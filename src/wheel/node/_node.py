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
import time
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from wheel._retry import Backoff
from wheel.checkpoint.owner_state import encode_mark, log_entry
from wheel.coord.base import Coordinator
from wheel.engine.driver import Driver
from wheel.engine.model import SHARD_COUNT
from wheel.engine.owner import Actions, Outcome, Owner, ShardContents
from wheel.engine.records import JobRecord, NewJob
from wheel.errors import CheckpointError, FailedPrecondition, StoreError, WheelError
from wheel.logs import ids
from wheel.node._checkpointing import NodeCheckpoint
from wheel.node._cluster import ShardOwnership
from wheel.node._jobs import NodeJobs
from wheel.node._membership import NodeMembership
from wheel.node._moving import NodeMoving
from wheel.node._ops import NodeOps
from wheel.node._reads import NodeReads
from wheel.node._tenancy import NodeTenancy
from wheel.node._updates import NodeUpdates
from wheel.node._values import (
    Clock,
    Membership,
    MessageSink,
    MovedRun,
    NodeConfig,
    Wake,
    WorkerSession,
    read_store_clock,
    trim_heap,
)
from wheel.recovery import restore_owner
from wheel.store.base import BatchOutcome, Store, WriteBatch

log = logging.getLogger("wheel.node")
# A host clock further than this off the store's is reported at start.
CLOCK_WARN_MS = 500
# Store batches committing while the loop forms the next one.
MAX_BATCHES_IN_FLIGHT = 2
# An unavailable store: its batch is written again after these waits.
STORE_WRITE_BACKOFF = Backoff(initial=0.05, max=2.0)
# The epochs a batch was written under (``WriteBatch.epochs``).
Epochs = Mapping[int, int] | None
T = TypeVar("T")


class Node(
    NodeReads,
    NodeMembership,
    NodeOps,
    NodeTenancy,
    NodeCheckpoint,
    NodeMoving,
    NodeJobs,
    NodeUpdates,
):
    """One node owning shards (all 256 on a single node)."""

    def __init__(
        self,
        store: Store,
        config: NodeConfig | None = None,
        *,
        coordinator: Coordinator | None = None,
        clock: Clock | None = None,
    ) -> None:
        """A single node owning every shard, or with ``coordinator`` a member
        of a cluster owning the shards the coordinator gives it; ``clock``:
        the host's clock as the node reads it (default: the host's own)."""
        self.store = store
        self.config = config or NodeConfig()
        self.coordinator = coordinator
        self._ownership: ShardOwnership | None = None
        # The change feed's watermark to go back to once the read on its way
        # returns: shards gained meanwhile were loaded as of it.
        self._rewind: int | None = None
        self._reading_changes = False
        # Awaited by ``stop`` (the rpc layer's channels to other members).
        self._closers: list[Callable[[], Awaitable[None]]] = []
        self._left = False
        self.clock = clock or Clock()
        # The owner's loop and job API without I/O; set by ``start``.
        self._driver: Driver | None = None
        self.sessions: dict[str, WorkerSession] = {}
        self.message_sink: MessageSink | None = None
        # Pushes the cluster's view to a worker stream (set by the rpc layer);
        # the view last pushed, to push only changes.
        self.membership_sink: Callable[[WorkerSession, Membership], None] | None = None
        self.moved_sink: Callable[[WorkerSession, list[MovedRun]], None] | None = None
        self._pushed_view: Membership | None = None
        self._wake = Wake()
        self._store_thread = ThreadPoolExecutor(1, thread_name_prefix="wheel-store")
        self._api_threads = ThreadPoolExecutor(4, thread_name_prefix="wheel-api")
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._watermark = 0
        # Change markers of the node's own job writes: its change feed leaves
        # those jobs out (it applied them when it wrote them).
        self._own_changes: set[int] = set()
        self._lags: deque[int] = deque(maxlen=10_000)
        self.ready = asyncio.Event()
        self._submits: list[tuple[NewJob, asyncio.Future[tuple[JobRecord, bool] | WheelError]]]
        self._submits = []
        # API calls waiting for the next batch's commit (durable triggers).
        self._commit_waiters: list[asyncio.Future[None]] = []
        self._submit_flusher: asyncio.Task[None] | None = None
        self._init_checkpointing()
        self._init_moving()
        # Set when the dispatch loop ends; a node whose loop died must exit
        # (and be restarted) rather than keep serving without dispatching.
        self.stopped = asyncio.Event()
        # Health, alerts, metrics and retention (wheel.node._ops).
        self._init_ops()

    # -- life cycle -------------------------------------------------------------

    async def start(self) -> None:
        await self._api(self.store.migrate)
        await self._anchor_clock()
        if self.coordinator is not None:
            await self._start_in_cluster(self.coordinator)
            return
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
        self._driver = Driver(owner, restored.actions)
        self._began_dispatching(owner.shards())
        trim_heap()
        self._watermark = restored.watermark
        self._log_records, self._snapshot_covers = restored.log_records, 0
        if self._checkpoint is not None:
            if restored.source == "store":
                # A full snapshot follows instead of a huge log batch.
                owner.take_dirty()
                self._start_snapshot()
            else:
                self._covered = set(epochs)
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
        self._start_ops()

    async def _anchor_clock(self) -> None:
        """Read the store's clock and run on it: fires come due by the record
        of truth's time, not by this host's, which may be off (a node started
        on a wrong clock would otherwise fire early or late by that much)."""
        before, after, store_ms = await self._api(read_store_clock, self.store.clock_ms)
        mid = (before + after) // 2
        host_ms = self.clock.wall_ms() - (time.monotonic_ns() - mid) // 1_000_000
        self.clock.anchor_read(before, after, store_ms)
        off = host_ms - store_ms
        if abs(off) > CLOCK_WARN_MS:
            log.warning("this host's clock is %+d ms off the store's; running on the store's", off)

    async def _start_in_cluster(self, coordinator: Coordinator) -> None:
        """Join: an owner with no shards, its loop running, then the
        coordinator's first shards fenced, loaded and added as they come: a
        shard this node held before its restart from its checkpoint and the
        store's changes since, the others from the store."""
        if self.config.checkpoint_dir is not None:
            self._checkpoint = await self._api(self._open_checkpoint)
            self._recovered = await self._api(self._recover_checkpoint)
            if self._recovered is not None:
                log.info(
                    "checkpoint holds %d jobs of %d shards to gain back",
                    self._recovered.job_count(),
                    len(self._recovered.as_of),
                )
        self._driver = Driver(Owner(now_ms=self.clock.now_ms(), config=self.config.owner))
        self._watermark = (await self._api(self.store.load_shards, [])).watermark
        self._ownership = ShardOwnership(self, coordinator)
        self._task = asyncio.create_task(self._loop(), name="wheel-dispatch")
        self._task.add_done_callback(self._loop_done)
        await coordinator.start()
        log.info(
            "node %s joined the cluster: %d shards held, %d being loaded",
            self.config.node_id,
            len(coordinator.owned()),
            len(self._ownership.gaining()),
        )
        self.ready.set()
        self._start_ops()

    # -- shards gained and lost (see wheel.node._cluster) -------------------------

    def on_stop(self, close: Callable[[], Awaitable[None]]) -> None:
        """Await ``close()`` when the node stops."""
        self._closers.append(close)

    @property
    def stopping(self) -> bool:
        return self._stopping

    async def in_thread(self, fn: Callable[..., T], *args: object) -> T:
        """Run a blocking store call off the event loop."""
        return await self._api(fn, *args)

    def held_shards(self) -> Collection[int]:
        """The shards the owner holds now (none while the node starts)."""
        return () if self._driver is None else self._driver.owner.shards().keys()

    def hand_over(self, shards: Collection[int]) -> None:
        """Stop dispatching ``shards`` at once and forget them; their runs go
        on and their next owner adopts them from the store."""
        driver = self._the_driver()
        epochs = driver.owner.shards()
        held = [s for s in shards if s in epochs]
        if not held:
            return
        self._ended_dispatching({s: epochs[s] for s in held})
        handed = driver.hand_over(held)
        self._covered.difference_update(held)
        self._partial.difference_update(held)
        log.info("handed over %d shards with %d runs in flight", len(held), len(handed))
        self._push_membership()
        self.wake()

    def take_on(
        self,
        epochs: Mapping[int, int],
        contents: ShardContents,
        watermark: int,
        *,
        from_checkpoint: bool = False,
        how: str = "",
    ) -> None:
        """Add shards fenced and loaded as of ``watermark``: the change feed
        goes back there, so changes made through other nodes since are read.
        ``from_checkpoint``: loaded from this node's checkpoint and the store's
        changes since, which the log gets as they apply."""
        driver = self._the_driver()
        held = driver.owner.shards()
        stale = {s: held[s] for s in epochs if s in held}
        if stale:
            # Held under an older epoch still (its loss not heard yet): the
            # new hold replaces it whole.
            self._ended_dispatching(stale)
            driver.hand_over(stale)
        driver.owner.add_shards(epochs, contents, self.clock.now_ms(), driver.acts)
        self._began_dispatching(epochs)
        self.gained(epochs, covered=from_checkpoint)
        if self._reading_changes:
            self._rewind = watermark if self._rewind is None else min(self._rewind, watermark)
        else:
            self._watermark = min(self._watermark, watermark)
        log.info(
            "took on %d shards from %s: %d jobs, %d runs in flight",
            len(epochs),
            how or ("its checkpoint" if from_checkpoint else "the store"),
            len(contents.jobs) + sum(len(rows) for rows in contents.packed.values()),
            len(contents.inflight),
        )
        self._push_membership()
        self.wake()
        # Off the loop: with a large heap it takes a good part of a second,
        # and the shards just taken on are to dispatch now.
        asyncio.get_running_loop().run_in_executor(None, trim_heap)

    def _loop_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.critical("dispatch loop died", exc_info=task.exception())
        self.stopped.set()

    async def leave(self) -> None:
        """In a cluster, before anything else of a stop: let the members
        taking its shards load them, hand every shard over, release them in
        etcd so the other members take them at once (not a TTL later), and
        end the worker streams; the workers report
        their runs to the new owners. A single node has nothing to hand
        over: its stop ends the streams after the last batches' answers."""
        if self._left or self.coordinator is None:
            return
        self._left = True
        # The members taking the shards load them first, while this node
        # still serves them: the switch below then costs them a fence and
        # the changes since.
        await self.coordinator.hand_off()
        await self.hand_over_planned(self.held_shards())
        await self.coordinator.stop()
        for session in list(self.sessions.values()):
            session.closed = True
            session.outbox.put_nowait(None)

    async def stop(self) -> None:
        """Stop dispatching (after ``leave``, if it was not called)."""
        await self.leave()
        self._stopping = True
        await self._stop_ops()
        self._wake.set()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for close in self._closers:
            await close()
        for session in list(self.sessions.values()):
            session.closed = True
            session.outbox.put_nowait(None)
        await self._stop_snapshot()
        self._store_thread.shutdown(wait=True)
        self._api_threads.shutdown(wait=True)
        if self._checkpoint is not None:
            self._checkpoint.close()

    # -- the checkpoint ---------------------------------------------------------

    def _has_checkpoint(self) -> bool:
        return self._checkpoint is not None

    def _the_driver(self) -> Driver:
        if self._driver is None:
            raise FailedPrecondition("node is starting")
        return self._driver

    def _owner(self) -> Owner:
        return self._the_driver().owner

    @property
    def _acts(self) -> Actions:
        return self._the_driver().acts

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
        # Batches on the store thread: each one's answer, the epochs it was
        # written under, the commits waiting for it and whether it writes to
        # the store (a batch may carry checkpoint records alone).
        pending: deque[
            tuple[asyncio.Future[BatchOutcome], Epochs, list[asyncio.Future[None]], bool]
        ]
        pending = deque()
        next_batch_ms = 0  # group commit: no batch before this (clock ms)
        driver = self._the_driver()
        coordinator = self.coordinator
        tick = config.tick_ms
        tick_at = -tick  # when the last round with store work began (clock ms)
        early = False  # this round only applies a batch's answer (see _sleep_until)
        while not self._stopping:
            # Cleared as a round starts, not as its sleep does: whatever
            # wakes the loop from here on (a batch's answer arriving while
            # the round awaits the change feed, a submit, a message) is seen
            # by the sleep that ends this round. Cleared right before the
            # sleep, such a wake was lost, and a won claim waited up to
            # ``max_idle_s`` to go out (seen: 505 ms).
            self._wake.clear()
            self._quiet_if_lapsed()
            now = self.clock.now_ms()
            driver.advance(now)
            if not early and len(pending) < MAX_BATCHES_IN_FLIGHT and now >= next_batch_ms:
                # Checked again right before writing: a pause between the
                # check above and here must not let a claim out either.
                self._quiet_if_lapsed()
                batch = self._form_batch(driver)
                if batch is not None:
                    if batch[0].size() >= config.group_commit_min_writes:
                        next_batch_ms = now + config.group_commit_ms
                    else:
                        next_batch_ms = now + config.group_commit_light_ms
                    future = loop.run_in_executor(self._store_thread, self._write, *batch)
                    future.add_done_callback(lambda _: self._wake.set())
                    writes = batch[0].size() > 0 or bool(self._commit_waiters)
                    pending.append((future, batch[0].epochs, self._commit_waiters, writes))
                    self._commit_waiters = []
            if not early and (any(p[3] for p in pending) or driver.has_store_work()):
                # A round with store work starts the tick. One woken by a
                # submit or a read, with nothing to write, does not hold the
                # next fire back; nor does one that only logs what a submit
                # changed to the checkpoint.
                tick_at = now
            while pending and pending[0][0].done():
                done, epochs, waiters, _ = pending.popleft()
                outcome = done.result()
                held = driver.owner.shards() if outcome.fenced else {}
                lost = driver.apply(outcome, self.clock.now_ms(), epochs)
                if lost:
                    self._ended_dispatching({s: held[s] for s in lost})
                if outcome.fenced:
                    log.warning(
                        "the store refused writes for %d shards a newer owner holds: %s"
                        " (%d of them handed over now)",
                        len(outcome.fenced),
                        sorted(outcome.fenced)[:16],
                        len(lost),
                    )
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_result(None)
            self._quiet_if_lapsed()  # and before a hand-out leaves
            self._publish(driver.take_messages())
            resync = driver.take_resync()
            if coordinator is not None and time.monotonic() >= next_changes:
                self._push_membership()
            if resync or time.monotonic() >= next_changes:
                busy = await self._read_changes(resync)
                next_changes = time.monotonic() + (0.0 if busy else config.changes_interval_s)
            deadline = driver.next_deadline()
            now = self.clock.now_ms()
            if next_batch_ms > now:
                # Holding writes for the group commit: wake for it, for the
                # next timer, or for a message; never spin.
                if driver.has_store_work() or self._commit_waiters:
                    deadline = next_batch_ms if deadline is None else min(deadline, next_batch_ms)
            elif len(pending) < MAX_BATCHES_IN_FLIGHT and (
                self._commit_waiters or driver.wants_another_pass()
            ):
                deadline = now  # another round now, or at the next tick
            if time.monotonic() >= next_changes:  # a busy change feed: next page now
                deadline = now
            early = await self._sleep_until(
                deadline, tick_at + tick, lambda: bool(pending) and pending[0][0].done()
            )
        for future, _, waiters, _ in pending:
            with contextlib.suppress(Exception):
                await future
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)
        for waiter in self._commit_waiters:
            if not waiter.done():
                waiter.set_exception(FailedPrecondition("node is stopping"))

    def _quiet_if_lapsed(self) -> None:
        """Past the local lease deadline (a pause, a partition), hand every
        shard over at once: nothing more is claimed or handed out until the
        coordinator rejoins with new epochs and gives shards again."""
        coordinator = self.coordinator
        if coordinator is None or time.monotonic() < coordinator.valid_until():
            return
        lapsed = list(self._owner().shards())
        if lapsed:
            log.warning("lease deadline passed: %d shards stop at once", len(lapsed))
            self.hand_over(lapsed)

    def _form_batch(self, driver: Driver) -> tuple[WriteBatch, list[bytes]] | None:
        """Take the store writes and the checkpoint records of what changed."""
        records = self._checkpoint_records()
        if not driver.has_store_work() and not records and not self._commit_waiters:
            return None
        return driver.take_batch(), records

    def _write(self, batch: WriteBatch, records: list[bytes]) -> BatchOutcome:
        """On the store thread: commit the batch, retrying an unavailable store
        with backoff (later batches wait behind it, so order holds; claims are
        idempotent by (job, fire, attempt) and completions by fence), then
        append its checkpoint records."""
        delays = STORE_WRITE_BACKOFF.delays()
        started = time.perf_counter()
        while True:
            try:
                outcome = self.store.write_batch(batch)
                break
            except StoreError as exc:
                self._store_failed(exc)
                if self._stopping:
                    raise
                backoff = delays.wait()
                log.warning("store write failed (%s); retrying in %.2fs", exc, backoff)
                time.sleep(backoff)
        self._store_committed(time.perf_counter() - started)
        checkpoint = self._checkpoint
        if records and checkpoint is not None:
            if outcome.change_mark > self._logged_mark:
                # With the rows: a restore finds a store that lost this commit.
                records.append(encode_mark(outcome.change_mark))
                self._logged_mark = outcome.change_mark
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

    async def _sleep_until(
        self, deadline: int | None, tick: int, answered: Callable[[], bool]
    ) -> bool:
        """Sleep until ``deadline`` (a timer, the group commit) or an event,
        but not past ``max_idle_s`` and not before ``tick`` (the next round's
        earliest start) unless a store batch's answer came: True then, and
        the round that follows only applies it and hands its runs out."""
        clock = self.clock
        if deadline is not None:
            deadline = max(deadline, tick)
        timeout = self.config.max_idle_s
        if deadline is not None:
            timeout = min(timeout, max(0.0, (deadline - clock.now_ms()) / 1000))
        if timeout <= 0:
            await asyncio.sleep(0)  # let stream reads and API calls in
            return False
        wake = self._wake
        while True:
            await wake.wait(timeout)
            now = clock.now_ms()
            if now >= tick or self._stopping:
                return False
            if answered():
                return True
            # A worker's message, a submit: the next tick takes it.
            wake.clear()
            timeout = (tick - now) / 1000

    def _publish(self, acts: Actions) -> None:
        if self._snapshot_due and self._start_snapshot():
            self._snapshot_due = False
        if acts.alerts:
            for alert in acts.alerts:
                self._raise(alert)
        lags = acts.lags
        if lags:
            self._lags.extend(lags)
            self.lag_histogram.add(lags)
        if acts.notes:
            for note in acts.notes:
                log.warning(
                    "run %d of job %d %s (worker %s)",
                    note.run_id,
                    note.job_id,
                    note.what,
                    note.worker or "-",
                    extra=ids(
                        job_id=note.job_id, run_id=note.run_id, fence=note.fence, worker=note.worker
                    ),
                )
        workers = (
            set(acts.assignments)
            | set(acts.revokes)
            | set(acts.results)
            | set(acts.rejected_renewals)
            | set(acts.violations)
            | set(acts.credited)
        )
        for worker_id in workers:
            session = self.sessions.get(worker_id)
            if session is not None and self.message_sink is not None:
                self.message_sink(session, acts)

    async def _read_changes(self, resync: set[int]) -> bool:
        """Apply the jobs changed since the last read (and re-read ``resync``);
        True when the page was busy enough that more may be waiting."""
        driver = self._the_driver()
        page = self.config.changes_page
        self._reading_changes = True
        try:
            # Jobs as rows: an owner takes them on by profile, parsing no spec.
            reread = await self._api(self.store.job_rows, resync) if resync else None
            changed = await self._api(
                functools.partial(
                    self.store.changed_rows,
                    self._watermark,
                    list(driver.owner.shards()),
                    page,
                    owner_moves=False,
                    exclude=frozenset(self._own_changes),
                )
            )
            self._watermark = changed.watermark
            # A marker below the watermark is never reported again.
            self._own_changes = {m for m in self._own_changes if m >= self._watermark}
        except StoreError as exc:
            self.metrics.store_errors.labels("changes").inc()
            log.warning("reading job changes failed: %s", exc)
            driver.reread(resync)  # read again next time
            return False
        finally:
            self._reading_changes = False
            if self._rewind is not None:
                # Shards were gained while this read was on its way: read
                # again from where they were loaded.
                self._watermark = min(self._watermark, self._rewind)
                self._rewind = None
        now = self.clock.now_ms()
        if reread is not None:
            driver.apply_rows(reread, now)
        driver.apply_rows(changed, now)
        # A page can end short of the limit on a whole transaction (PostgreSQL).
        return 2 * (len(changed.rows) + len(changed.jobs)) >= page

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
            worker_id, capacity, pools, self.clock.now_ms(), self._acts, handlers=handlers
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
        self._owner().worker_ack(worker_id, refs, self.clock.now_ms(), self._acts)
        self.wake()

    def worker_heartbeat(self, worker_id: str, refs: Sequence[tuple[int, int]]) -> None:
        self._owner().worker_heartbeat(worker_id, refs, self.clock.now_ms(), self._acts)
        self.wake()

    def worker_complete(
        self,
        worker_id: str,
        completions: Sequence[tuple[int, int, Outcome, str]],
        ran_ms: Mapping[int, int] | None = None,
    ) -> None:
        self._owner().worker_complete(
            worker_id, completions, self.clock.now_ms(), self._acts, ran_ms=ran_ms
        )
        self.wake()

    def worker_credit(self, worker_id: str, add: int, seq: int = 0) -> None:
        self._owner().worker_credit(worker_id, add, self.clock.now_ms(), self._acts, seq=seq)
        self.wake()

    def worker_capacity(self, worker_id: str) -> int | None:
        return self._owner().worker_capacity(worker_id)

    def worker_drain(self, worker_id: str) -> None:
        self._owner().worker_drain(worker_id)
