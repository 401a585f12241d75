"""A node's dispatch loop: drives the pure shard owner (through its
``Driver``) with the clock, the store thread and worker streams.

One asyncio loop iteration (``_loop``):

1. feed the owner ``advance(now)``: due timers fire, work is claimed;
2. run the accumulated store writes in ONE pass on the store thread, in the
   order the owner requires (completions, missed, advances, claims, starts);
3. feed the store's answers back (``on_completed``, ``on_claimed``), which
   produces assignments and results;
4. send one message per worker per kind (batched), then sleep until the
   wheel's next deadline or until an event (a worker message, an API call)
   wakes the loop.

The loop's own state is the task it runs in; what it uses (the batches, the
checkpoint, the change feed, shards that move, the node's health and
metrics, the cluster's view, the worker streams) belongs to the node's other
parts, and it is given them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Collection, Mapping

from wheel.coord.base import Coordinator
from wheel.engine.driver import Driver
from wheel.engine.owner import Actions
from wheel.logs import ids
from wheel.node._batches import Batches, StoreWriter, Write
from wheel.node._changes import ChangeFeed
from wheel.node._checkpointing import Checkpointing
from wheel.node._membership import ClusterView
from wheel.node._moving import Moves
from wheel.node._ops import Ops
from wheel.node._reads import Reads
from wheel.node._values import Clock, MessageSink, NodeConfig, Wake, WorkerSession
from wheel.store.base import Store, WriteBatch

log = logging.getLogger("wheel.node")


class Dispatch:
    """The dispatch loop of one node, run as one task from ``start`` until
    the node stops."""

    __slots__ = (
        "_batches",
        "_changes",
        "_checkpointing",
        "_clock",
        "_config",
        "_coordinator",
        "_driver",
        "_hand_over",
        "_moves",
        "_ops",
        "_reads",
        "_sessions",
        "_sink",
        "_stopped",
        "_stopping",
        "_store",
        "_task",
        "_view",
        "_wake",
    )

    def __init__(
        self,
        *,
        config: NodeConfig,
        store: Store,
        clock: Clock,
        coordinator: Coordinator | None,
        driver: Callable[[], Driver],
        wake: Wake,
        batches: Batches,
        checkpointing: Checkpointing,
        changes: ChangeFeed,
        moves: Moves,
        ops: Ops,
        view: ClusterView,
        reads: Reads,
        sessions: Mapping[str, WorkerSession],
        sink: Callable[[], MessageSink | None],
        hand_over: Callable[[Collection[int]], None],
        stopping: Callable[[], bool],
        stopped: asyncio.Event,
    ) -> None:
        self._config = config
        self._store = store
        self._clock = clock
        self._coordinator = coordinator
        # The owner's driver (the node's; it refuses while the node starts).
        self._driver = driver
        # Set by whatever has work for the loop: it ends the loop's sleep.
        self._wake = wake
        self._batches = batches
        self._checkpointing = checkpointing
        self._changes = changes
        self._moves = moves
        # Health, alerts and metrics: told of each store commit and failure.
        self._ops = ops
        self._view = view
        self._reads = reads
        self._sessions = sessions
        # Sends a round's messages to one worker stream (the rpc layer's).
        self._sink = sink
        # Hands shards over at once (when the lease deadline passed).
        self._hand_over = hand_over
        self._stopping = stopping
        # Set when the loop ends, however it ends.
        self._stopped = stopped
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Run the loop (the owner's driver is set by now)."""
        self._task = asyncio.create_task(self._loop(), name="wheel-dispatch")
        self._task.add_done_callback(self._loop_done)

    async def join(self) -> None:
        """Until the loop has ended (it ends once the node is stopping and
        the loop is woken)."""
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def _loop_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.critical("dispatch loop died", exc_info=task.exception())
        self._stopped.set()

    async def _loop(self) -> None:
        """Round after round until the node stops (see the module docstring):
        fire what is due, send a batch when the group commit lets it, take
        in the store's answers, publish what the owner emitted, follow the
        cluster and the change feed, and sleep until the next deadline or
        an event. A batch's checkpoint records are appended after its store
        commit (never ahead of the store) and before the messages its
        answers produce are sent."""
        driver = self._driver()
        write = StoreWriter(
            self._store,
            checkpoint_log=self._checkpointing.log,
            committed=self._ops.store_committed,
            failed=self._ops.store_failed,
            stopping=self._stopping,
        )
        tick = self._config.tick_ms
        tick_at = -tick  # when the last round with store work began (clock ms)
        early = False  # this round only applies a batch's answer (see _sleep_until)
        while not self._stopping():
            # Cleared as a round starts, not as its sleep does: whatever
            # wakes the loop from here on (a batch's answer arriving while
            # the round awaits the change feed, a submit, a message) is seen
            # by the sleep that ends this round. Cleared right before the
            # sleep, such a wake was lost, and a won claim waited up to
            # ``max_idle_s`` to go out (seen: 505 ms).
            self._wake.clear()
            self._quiet_if_lapsed()
            now = self._clock.now_ms()
            # A round that only applies a batch's answer leaves the runs
            # claimed ahead to the tick's round: a tick's runs in one message.
            driver.advance(now, release_held=not early)
            if not early:
                self._send_batch(driver, write, now)
                if self._batches.writing() or driver.has_store_work():
                    # A round with store work starts the tick. One woken by
                    # a submit or a read, with nothing to write, does not
                    # hold the next fire back; nor does one that only logs
                    # what a submit changed to the checkpoint.
                    tick_at = now
            self._take_answers(driver)
            if early and self._batches.parting:  # a burst's next part: an answer made room
                self._send_batch(driver, write, now)
            self._quiet_if_lapsed()  # and before a hand-out leaves
            self._publish(driver, driver.take_messages())
            await self._follow(driver)
            early = await self._sleep_until(
                self._next_wake(driver), tick_at + tick, self._batches.answered, driver.handing_off
            )
        await self._batches.drain()

    def _send_batch(self, driver: Driver, write: Write, now: int) -> None:
        """Group commit: a batch of the store writes and checkpoint records
        so far, once the store thread has room and the last batch's wait is
        over; a burst's claims ahead of it in parts (``Batches.send_parts``)."""
        if not self._batches.may_send(now):
            return
        # Again right before writing: a pause since the round's check lets no claim out.
        self._quiet_if_lapsed()
        self._batches.send_parts(write, driver.take_claims, self._config.burst_batch_claims)
        formed = self._form_batch(driver) if self._batches.may_send(now) else None
        if formed is not None:
            self._batches.send(write, *formed, now)

    def _take_answers(self, driver: Driver) -> None:
        """The store's answers to the batches done, in batch order: their
        checkpoint appends, then the owner's answers (fenced shards handed
        over), then the calls that waited for their commit."""
        while (answer := self._batches.next_answer()) is not None:
            outcome, appended = answer.result()
            self._checkpointing.appended(appended)
            held = driver.shards() if outcome.fenced else {}
            lost = driver.apply(outcome, self._clock.now_ms(), answer.epochs)
            if lost:
                self._moves.ended_dispatching({s: held[s] for s in lost})
            if outcome.fenced:
                log.warning(
                    "the store refused writes for %d shards a newer owner holds: %s"
                    " (%d of them handed over now)",
                    len(outcome.fenced),
                    sorted(outcome.fenced)[:16],
                    len(lost),
                )
            answer.release()

    async def _follow(self, driver: Driver) -> None:
        """The cluster's view pushed to workers, and the change feed read,
        when due (or at once for jobs whose store row disagrees)."""
        resync = driver.take_resync()
        due = self._changes.due()
        if due and self._coordinator is not None:
            self._view.push()
        if resync or due:
            await self._changes.read(driver, resync)

    def _next_wake(self, driver: Driver) -> int | None:
        """When the next round is due (clock ms; None: on an event only)."""
        batches = self._batches
        deadline = driver.next_deadline()
        now = self._clock.now_ms()
        if batches.next_batch_ms > now:
            # Holding writes for the group commit: wake for it, for the
            # next timer, or for a message; never spin.
            if driver.has_store_work() or batches.has_waiters():
                at = batches.next_batch_ms
                deadline = at if deadline is None else min(deadline, at)
        elif batches.has_room() and (batches.has_waiters() or driver.wants_another_pass()):
            deadline = now  # another round now, or at the next tick
        if self._changes.due():  # a busy change feed: next page now
            deadline = now
        return deadline

    def _quiet_if_lapsed(self) -> None:
        """Past the local lease deadline (a pause, a partition), hand every
        shard over at once: nothing more is claimed or handed out until the
        coordinator rejoins with new epochs and gives shards again."""
        coordinator = self._coordinator
        if coordinator is None or time.monotonic() < coordinator.valid_until():
            return
        lapsed = list(self._driver().shards())
        if lapsed:
            log.warning("lease deadline passed: %d shards stop at once", len(lapsed))
            self._hand_over(lapsed)

    def _form_batch(self, driver: Driver) -> tuple[WriteBatch, list[bytes]] | None:
        """Take the store writes and the checkpoint records of what changed."""
        records = self._checkpointing.records(driver)
        if not driver.has_store_work() and not records and not self._batches.has_waiters():
            return None
        return driver.take_batch(), records

    async def _sleep_until(
        self,
        deadline: int | None,
        tick: int,
        answered: Callable[[], bool],
        handing_off: Callable[[], bool],
    ) -> bool:
        """Sleep until ``deadline`` (a timer, the group commit) or an event,
        but not past ``max_idle_s`` and not before ``tick`` (the next round's
        earliest start) unless a store batch's answer came: True then, and
        the round that follows only applies it and hands its runs out. A
        permit handed to claims waiting here (``handing_off``) does not wait
        for the tick either: it is idle until a batch takes it again."""
        clock = self._clock
        if deadline is not None and not handing_off():
            deadline = max(deadline, tick)
        timeout = self._config.max_idle_s
        if deadline is not None:
            timeout = min(timeout, max(0.0, (deadline - clock.now_ms()) / 1000))
        if timeout <= 0:
            await asyncio.sleep(0)  # let stream reads and API calls in
            return False
        wake = self._wake
        while True:
            await wake.wait(timeout)
            now = clock.now_ms()
            if now >= tick or self._stopping():
                return False
            if answered():
                return True
            if handing_off():
                return False  # a run of a key with claims waiting here ended
            # A worker's message, a submit: the next tick takes it.
            wake.clear()
            timeout = (tick - now) / 1000

    def _publish(self, driver: Driver, acts: Actions) -> None:
        """Send what the engine said in a round (``Driver.take_messages``
        took it out): alerts, lag samples, notes and the workers' messages."""
        self._checkpointing.snapshot_if_due(driver)
        if acts.alerts:
            for alert in acts.alerts:
                self._ops.raise_alert(alert)
        for waited in acts.limit_waits:
            self._ops.metrics.limit_wait_seconds.observe(waited / 1000)
        lags = acts.lags
        if lags:
            self._reads.lagged(lags)
            self._ops.lag_histogram.add(lags)
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
        sink = self._sink()
        for worker_id in workers:
            session = self._sessions.get(worker_id)
            if session is not None and sink is not None:
                sink(session, acts)
