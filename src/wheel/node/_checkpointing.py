"""A node's checkpoint: opening it, logging what each store batch changed,
fuzzy snapshots that never stall the event loop, and the shards it covers.

The log is appended on the store thread right after each batch commits (never
ahead of the store): the rows of the jobs the batch's owner pass changed
(``wheel.checkpoint.owner_state``). ``CheckpointLog`` is the store thread's
side, and the only code that appends; it answers each append with what it did
(``Appended``), which the loop's side, ``Checkpointing``, takes in with the
batch's answer. Nothing else of the checkpoint changes off the event loop.

A snapshot copies the owner's tables one shard at a time on the event loop --
a memcpy of some 40,000 rows, well under a millisecond -- and a thread of its
own writes them to LMDB, taking at most ``SNAPSHOT_SHARE`` of the process's
time; the log replays everything after the sequence number the snapshot
started at (the last one the batches answered so far appended).

A node in a cluster keeps a checkpoint too. It covers the shards whose rows
it holds whole: those restored from it, and those a snapshot wrote since they
were gained. The log says which (``encode_held``), so that every watermark
logged after marks how current each covered shard's rows are. A shard the
node gains again after a restart loads from its rows and the store's changes
since then (``wheel.recovery.checkpoint_contents``), not from the store alone.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING

from wheel.checkpoint import Checkpoint, DutyCycle, Identity
from wheel.checkpoint.owner_state import (
    OwnerState,
    encode_held,
    encode_mark,
    encode_profile,
    encode_shard,
    encode_watermark,
    log_entry,
    recover_state,
)
from wheel.checkpoint.owner_state import log_records as owner_log_records
from wheel.engine.model import SHARD_COUNT
from wheel.errors import CheckpointError
from wheel.node._values import NodeConfig

if TYPE_CHECKING:
    from wheel.engine.driver import Driver
    from wheel.store.base import Store

log = logging.getLogger("wheel.node")

# A snapshot's share of the process's time (see wheel.checkpoint.wal.DutyCycle).
SNAPSHOT_SHARE = 0.2
# Snapshot chunks copied ahead of the writer thread.
SNAPSHOT_QUEUE = 4


@dataclass(frozen=True, slots=True, kw_only=True)
class Appended:
    """What one append to the log did, as of its end: the log's last seq,
    the store's change mark logged last, and the job records logged in all.
    ``failed``: the append failed and the log takes no more."""

    seq: int
    mark: int
    records: int
    failed: bool = False


class CheckpointLog:
    """The checkpoint's log as the store thread appends it: each batch's
    records right after the batch commits, with the store's change mark
    when it moved. Used on the store thread alone."""

    __slots__ = ("_checkpoint", "_failed", "_mark", "_records")

    def __init__(self, checkpoint: Checkpoint, *, records: int) -> None:
        self._checkpoint = checkpoint
        self._mark = 0
        self._records = records
        self._failed = False

    def append(self, records: list[bytes], change_mark: int) -> Appended | None:
        """Log ``records`` of a batch the store committed at ``change_mark``;
        None when there is nothing to log (or the log failed before)."""
        if not records or self._failed:
            return None
        if change_mark > self._mark:
            # With the rows: a restore finds a store that lost this commit.
            records.append(encode_mark(change_mark))
            self._mark = change_mark
        try:
            seq = self._checkpoint.append([log_entry(records)])
        except CheckpointError:
            # The store is the record of truth: losing the checkpoint costs
            # a slow restart, not correctness. Say so and go on without it.
            log.exception("checkpoint append failed; continuing without a checkpoint")
            self._failed = True
            return Appended(seq=0, mark=self._mark, records=self._records, failed=True)
        self._records += len(records)
        return Appended(seq=seq, mark=self._mark, records=self._records)


class Checkpointing:
    """A node's checkpoint on the event loop: the records of what changed
    for each batch, the log's progress as the store thread reports it,
    snapshots, and the shards covered."""

    def __init__(self, config: NodeConfig, store: Store, *, watermark: Callable[[], int]) -> None:
        self._config = config
        self._store = store
        # The change feed's watermark now (the node's).
        self._watermark = watermark
        self._checkpoint: Checkpoint | None = None
        # The store thread's side, made when the node starts logging.
        self.log: CheckpointLog | None = None
        self._logged_watermark = -1
        self._snapshot_due = False
        self._snapshot_task: asyncio.Task[None] | None = None
        self._snapshot_thread: threading.Thread | None = None
        # The log as the answers of the batches so far left it (see
        # ``Appended``): its last seq, the change mark logged last, the job
        # records in it, and those the running or last snapshot covers.
        self._log_seq = 0
        self._logged_mark = 0
        self._log_records = 0
        self._snapshot_covers = 0
        # Profiles whose body the log holds (a row names its profile by id).
        self._logged_profiles: set[int] = set()
        # Shards whose rows the checkpoint holds whole (see the module
        # docstring), and the set the log said last.
        self._covered: set[int] = set()
        self._logged_held: set[int] | None = None
        # Shards gained due first whose rest is still loading: a snapshot
        # leaves them out (a chunk of half a shard would restore half of it).
        self._partial: set[int] = set()
        # What a cluster node restored from its checkpoint at start, for the
        # shards it gains back; released once its first gains are done.
        self._recovered: OwnerState | None = None

    # -- opening and closing ------------------------------------------------------

    @property
    def checkpoint(self) -> Checkpoint | None:
        """The open checkpoint (None: none, or it failed)."""
        return self._checkpoint

    def enabled(self) -> bool:
        return self._checkpoint is not None

    def open_file(self) -> Checkpoint | None:
        """On a thread: the checkpoint opened (a damaged one made anew), or
        None to run without one. ``use`` it on the loop."""
        config = self._config
        assert config.checkpoint_dir is not None
        path = config.checkpoint_dir
        identity = Identity(cluster_id=config.cluster_id, shard_set=f"0-{SHARD_COUNT - 1}")
        durability = config.checkpoint_durability
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

    def use(self, checkpoint: Checkpoint | None) -> None:
        self._checkpoint = checkpoint

    def recover_file(self) -> OwnerState | None:
        """On a thread, at the start of a cluster node: what its checkpoint
        holds (None: nothing usable; a damaged one is reset)."""
        checkpoint = self._checkpoint
        if checkpoint is None:
            return None
        try:
            recovery = checkpoint.recover()
            for warning in recovery.warnings:
                log.warning("checkpoint: %s", warning)
            if recovery.snapshot is None and not recovery.records:
                return None
            return recover_state(recovery, self._store.change_mark())
        except CheckpointError as exc:
            log.error("checkpoint unusable, shards will load from the store: %s", exc)
            checkpoint.reset()
            return None

    def keep_recovered(self, state: OwnerState | None) -> None:
        self._recovered = state

    def start_log(self, *, records: int = 0, covered: Collection[int] = ()) -> None:
        """Before the dispatch loop starts: the log takes batches from now
        on, holding ``records`` job records already; ``covered``: shards
        restored whole from the checkpoint."""
        checkpoint = self._checkpoint
        self._log_records, self._snapshot_covers = records, 0
        if checkpoint is None:
            return
        self.log = CheckpointLog(checkpoint, records=records)
        self._log_seq = checkpoint.last_seq()
        self._covered.update(covered)
        self._logged_watermark = -1  # log the watermark with the first batch

    def appended(self, answer: Appended | None) -> None:
        """The store thread's answer to a batch's append, in batch order."""
        if answer is None:
            return
        if answer.failed:
            self._checkpoint = None
            return
        self._log_seq, self._logged_mark, self._log_records = (
            answer.seq,
            answer.mark,
            answer.records,
        )
        if self._log_records - self._snapshot_covers >= self._config.snapshot_every_records:
            self._snapshot_due = True

    def close(self) -> None:
        """After the store thread stopped."""
        if self._checkpoint is not None:
            self._checkpoint.close()

    # -- what each batch logs -----------------------------------------------------

    def records(self, driver: Driver) -> list[bytes]:
        """The log records of what changed since the last batch (on the loop,
        when a batch is formed): nothing without a checkpoint."""
        dirty = driver.take_dirty()
        if self._checkpoint is None:
            return []
        records: list[bytes] = []
        held = self._covered & driver.shards().keys()
        if held != self._logged_held:
            # Before the watermark: it tells how current these shards are.
            records.append(encode_held(held))
            self._logged_held = held
        now = self._watermark()
        watermark = now if now != self._logged_watermark else None
        if not dirty and watermark is None:
            return records
        records += owner_log_records(
            dirty,
            driver.job_images(),
            watermark,
            profile_of=driver.profile,
            logged=self._logged_profiles,
        )
        if watermark is not None:
            self._logged_watermark = watermark
        return records

    def log_records(self) -> int | None:
        """Job records logged since the last snapshot began (None: no
        checkpoint)."""
        if self._checkpoint is None:
            return None
        return max(0, self._log_records - self._snapshot_covers)

    def logged(self) -> tuple[int, int]:
        """The log's last seq and the job records in it, as the batches
        answered so far left them."""
        return self._log_seq, self._log_records

    # -- shards -------------------------------------------------------------------

    def checkpointed(self, shards: Collection[int]) -> dict[int, int]:
        """Of ``shards``, those the node's checkpoint can give back, each with
        the watermark its rows are current up to."""
        state = self._recovered
        if state is None:
            return {}
        whole = state.restorable()
        return {s: whole[s] for s in shards if s in whole}

    def gained(self, shards: Collection[int], *, covered: bool) -> None:
        """Shards were added to the owner: from the checkpoint (``covered``:
        its rows and the changes since, which the log gets as they apply),
        or from the store (written whole by the next snapshot)."""
        state = self._recovered
        if state is not None:
            for shard in shards:  # given back: the memory can go
                state.as_of.pop(shard, None)
                state.shards.pop(shard, None)
        if covered:
            self._covered.update(shards)
        elif self._checkpoint is not None:
            self._snapshot_due = True

    def handed_over(self, shards: Collection[int]) -> None:
        """Shards the owner no longer holds: covered no more."""
        self._covered.difference_update(shards)
        self._partial.difference_update(shards)

    def loading_rest(self, shards: Collection[int]) -> None:
        """``shards`` were taken on due first; their rest is on its way."""
        self._partial.update(shards)

    def rest_loaded(self, shards: Collection[int]) -> None:
        """The rest of ``shards`` is in (or will not come): the next snapshot
        writes them whole."""
        self._partial.difference_update(shards)
        self._snapshot_due = self._checkpoint is not None

    def partial(self) -> set[int]:
        """Shards whose rest is still loading."""
        return set(self._partial)

    def recovered(self) -> OwnerState | None:
        return self._recovered

    def release_recovered(self) -> None:
        """The first gains are done: what was restored and not gained back
        is left to the store."""
        self._recovered = None

    # -- snapshots ----------------------------------------------------------------

    def snapshot_if_due(self, driver: Driver) -> None:
        if self._snapshot_due and self.start_snapshot(driver):
            self._snapshot_due = False

    def start_snapshot(self, driver: Driver) -> bool:
        """A fuzzy snapshot: shard by shard copied on the loop, written on a
        thread of its own (see the module docstring). False: one is running
        (or there is no checkpoint)."""
        checkpoint = self._checkpoint
        if checkpoint is None:
            return False
        if self._snapshot_task is not None and not self._snapshot_task.done():
            return False
        self._snapshot_task = asyncio.get_running_loop().create_task(
            self._snapshot(checkpoint, driver), name="wheel-snapshot"
        )
        return True

    async def _snapshot(self, checkpoint: Checkpoint, driver: Driver) -> None:
        # Where the log stands as the batches answered so far left it: every
        # record up to this seq was formed before the rows below are copied.
        upto = self._log_seq
        covered_before, self._snapshot_covers = self._snapshot_covers, self._log_records
        # The owner reflects every store change up to this watermark, and the
        # fuzzy snapshot holds rows at least that new.
        chunks: queue.Queue[bytes | None] = queue.Queue(SNAPSHOT_QUEUE)
        failed: list[BaseException] = []
        started = time.perf_counter()

        def write() -> None:
            try:
                checkpoint.write_snapshot(
                    iter(chunks.get, None), upto, pause=DutyCycle(SNAPSHOT_SHARE).pause
                )
            except BaseException as exc:
                failed.append(exc)
                while chunks.get() is not None:  # let the loop's side finish
                    pass

        thread = self._snapshot_thread = threading.Thread(
            target=write, name="wheel-snapshot", daemon=True
        )
        thread.start()
        jobs = 0

        async def put(chunk: bytes | None) -> None:
            while True:
                try:
                    chunks.put_nowait(chunk)
                    return
                except queue.Full:
                    await asyncio.sleep(0.005)

        held = sorted(s for s in driver.shards() if s not in self._partial)
        try:
            # The watermark, then the shards the log after this snapshot starts
            # out holding (what it said last): each shard chunk is whole as of
            # the watermark, and the log's later watermarks move on the shards
            # it names.
            await put(
                encode_watermark(self._watermark())
                + encode_mark(self._logged_mark)
                + encode_held(self._logged_held or ())
            )
            for shard in held:
                rows = driver.snapshot_columns(shard)
                if rows is not None:
                    jobs += len(rows)
                    await put(encode_shard(shard, rows))
            profiles = driver.profiles()
            await put(b"".join(encode_profile(p, n) for n, p in enumerate(profiles)))
        finally:
            await put(None)
        await asyncio.get_running_loop().run_in_executor(None, thread.join)
        if failed:
            log.error("snapshot failed; the log keeps growing until the next one: %s", failed[0])
            self._snapshot_covers = covered_before  # due again
            return
        # Written whole: covered, those still held.
        self._covered.update(s for s in held if s in driver.shards())
        log.info(
            "snapshot of %d jobs up to log record %d in %.2fs",
            jobs,
            upto,
            time.perf_counter() - started,
        )

    async def stop_snapshot(self) -> None:
        task = self._snapshot_task
        if task is not None and not task.done():
            await asyncio.gather(task, return_exceptions=True)
