"""The store batches of a node's dispatch loop on their way: formed on the
loop, written in order on the one store thread, answered in order.

Pipelined: while the store thread commits batch N, the loop keeps firing
timers and serving workers and forms batch N+1 (at most
``MAX_BATCHES_IN_FLIGHT`` at once). Group commit: after a batch, the next
waits ``group_commit_ms`` (``group_commit_light_ms`` after a light one), so
that a busy loop writes few large batches rather than many small ones. API
calls that must not answer before what the owner emitted is in the store
(a trigger, a backfill) wait for the next batch's commit
(``commit_waiter``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass

from wheel._retry import Backoff
from wheel.errors import FailedPrecondition, StoreError
from wheel.node._checkpointing import Appended, CheckpointLog
from wheel.node._values import NodeConfig
from wheel.store.base import BatchOutcome, Store, WriteBatch

# An unavailable store: its batch is written again after these waits.
STORE_WRITE_BACKOFF = Backoff(initial=0.05, max=2.0)

log = logging.getLogger("wheel.node")

# Store batches committing while the loop forms the next one.
MAX_BATCHES_IN_FLIGHT = 2

# What the store thread does with a batch and its checkpoint records.
Write = Callable[[WriteBatch, list[bytes]], tuple[BatchOutcome, Appended | None]]


class StoreWriter:
    """The store thread's side of a batch (a ``Write``): commit it, then
    append its checkpoint records (never ahead of the store)."""

    __slots__ = ("_checkpoint_log", "_committed", "_failed", "_stopping", "_store")

    def __init__(
        self,
        store: Store,
        *,
        checkpoint_log: CheckpointLog | None,
        committed: Callable[[float], None],
        failed: Callable[[StoreError], None],
        stopping: Callable[[], bool],
    ) -> None:
        self._store = store
        self._checkpoint_log = checkpoint_log
        # Told of each commit (its seconds) and each failure (the node's health).
        self._committed = committed
        self._failed = failed
        self._stopping = stopping

    def __call__(
        self, batch: WriteBatch, records: list[bytes]
    ) -> tuple[BatchOutcome, Appended | None]:
        """On the store thread: commit the batch, retrying an unavailable store
        with backoff (later batches wait behind it, so order holds; claims are
        idempotent by (job, fire, attempt) and completions by fence), then
        append its checkpoint records."""
        delays = STORE_WRITE_BACKOFF.delays()
        started = time.perf_counter()
        while True:
            try:
                outcome = self._store.write_batch(batch)
                break
            except StoreError as exc:
                self._failed(exc)
                if self._stopping():
                    raise
                backoff = delays.wait()
                log.warning("store write failed (%s); retrying in %.2fs", exc, backoff)
                time.sleep(backoff)
        if batch.size():
            # A batch of checkpoint records alone asked the store nothing: it
            # is no answer from it, and must not hide an outage from the
            # health probe (which runs only when the store has been quiet).
            self._committed(time.perf_counter() - started)
        if self._checkpoint_log is None:
            return outcome, None
        return outcome, self._checkpoint_log.append(records, outcome.change_mark)


@dataclass(slots=True, kw_only=True)
class Answer:
    """A batch the store thread is done with (``future`` done)."""

    future: asyncio.Future[tuple[BatchOutcome, Appended | None]]
    # The epochs the batch was written under (``WriteBatch.epochs``).
    epochs: Mapping[int, int] | None
    # The API calls waiting for its commit.
    waiters: list[asyncio.Future[None]]
    # Whether it writes to the store (a batch may carry checkpoint records
    # alone).
    writes: bool

    def result(self) -> tuple[BatchOutcome, Appended | None]:
        return self.future.result()

    def release(self) -> None:
        """Answer the calls that waited for this commit."""
        for waiter in self.waiters:
            if not waiter.done():
                waiter.set_result(None)


class Batches:
    """The batches on the store thread, oldest first, and the group commit."""

    def __init__(
        self, config: NodeConfig, store_thread: Executor, *, wake: Callable[[], None]
    ) -> None:
        self._config = config
        self._store_thread = store_thread
        self._wake = wake
        self._pending: deque[Answer] = deque()
        # Group commit: no batch before this (clock ms).
        self.next_batch_ms = 0
        # API calls waiting for the next batch's commit.
        self._waiters: list[asyncio.Future[None]] = []
        # A burst's parts stopped for room (``send_parts``): the rest goes
        # as soon as an answer makes room, not at the next tick; the next
        # part takes this many claims.
        self.parting = False
        self._part_claims = 0

    def commit_waiter(self) -> asyncio.Future[None]:
        """Done once the next batch commits (woken by the loop's wake)."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        return waiter

    def has_waiters(self) -> bool:
        return bool(self._waiters)

    def may_send(self, now_ms: int) -> bool:
        """Room on the store thread, and the group commit's wait is over."""
        return len(self._pending) < MAX_BATCHES_IN_FLIGHT and now_ms >= self.next_batch_ms

    def has_room(self) -> bool:
        return len(self._pending) < MAX_BATCHES_IN_FLIGHT

    def send(self, write: Write, batch: WriteBatch, records: list[bytes], now_ms: int) -> None:
        """Hand ``batch`` and its checkpoint records to the store thread; the
        calls waiting for a commit now wait for this one."""
        config = self._config
        if batch.size() >= config.group_commit_min_writes:
            self.next_batch_ms = now_ms + config.group_commit_ms
        else:
            self.next_batch_ms = now_ms + config.group_commit_light_ms
        future = asyncio.get_running_loop().run_in_executor(
            self._store_thread, write, batch, records
        )
        future.add_done_callback(lambda _: self._wake())
        writes = batch.size() > 0 or bool(self._waiters)
        self._pending.append(
            Answer(future=future, epochs=batch.epochs, waiters=self._waiters, writes=writes)
        )
        self._waiters = []

    def send_parts(
        self, write: Write, take: Callable[[int], WriteBatch | None], limit: int
    ) -> None:
        """A burst's claims in parts (``take``: ``Driver.take_claims``), to the
        store thread while it has room: each part is handed out as soon as
        it is stored, while the store commits the next, instead of every run
        of the burst waiting for the commit of them all. The first part
        takes ``limit`` claims and each next one twice the last: a burst's
        first runs go early, and a backlog (a node behind) soon goes in
        batches as large as before, each commit carrying many claims. A part
        has no checkpoint records and answers no call waiting for a commit
        (those go with the batch that takes the rest: never ahead of the
        store), and no group commit's wait follows it (the claims after it
        are due already)."""
        size = self._part_claims or limit
        while self.has_room():
            part = take(size)
            if part is None:
                self.parting = False
                self._part_claims = 0
                return
            future = asyncio.get_running_loop().run_in_executor(self._store_thread, write, part, [])
            future.add_done_callback(lambda _: self._wake())
            self._pending.append(Answer(future=future, epochs=part.epochs, waiters=[], writes=True))
            size *= 2
        self.parting = True
        self._part_claims = size

    def writing(self) -> bool:
        """A batch on its way writes to the store."""
        return any(p.writes for p in self._pending)

    def answered(self) -> bool:
        """The oldest batch on its way has its answer."""
        pending = self._pending
        return bool(pending) and pending[0].future.done()

    def next_answer(self) -> Answer | None:
        """The oldest batch's answer, if it came (answers go in batch order)."""
        if self.answered():
            return self._pending.popleft()
        return None

    async def drain(self) -> None:
        """At stop: wait for the batches on their way and answer their
        callers; the calls waiting for a batch not sent are refused."""
        for answer in self._pending:
            with contextlib.suppress(Exception):
                await answer.future
            answer.release()
        self._pending.clear()
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_exception(FailedPrecondition("node is stopping"))
