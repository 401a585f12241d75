"""A node's checkpoint: opening it, logging what each store batch changed,
fuzzy snapshots that never stall the event loop, and the shards it covers.

The log is appended on the store thread right after each batch commits (never
ahead of the store): the rows of the jobs the batch's owner pass changed
(``wheel.checkpoint.owner_state``). A snapshot copies the owner's tables one
shard at a time on the event loop -- a memcpy of some 40,000 rows, well under
a millisecond -- and a thread of its own writes them to LMDB, taking at most
``SNAPSHOT_SHARE`` of the process's time; the log replays everything after the
sequence number the snapshot started at.

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
from collections.abc import Collection
from typing import TYPE_CHECKING

from wheel.checkpoint import Checkpoint, DutyCycle, Identity
from wheel.checkpoint.owner_state import (
    OwnerState,
    encode_held,
    encode_mark,
    encode_profile,
    encode_shard,
    encode_watermark,
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


class NodeCheckpoint:
    """The checkpoint of ``wheel.node.Node``."""

    config: NodeConfig
    store: Store
    _driver: Driver | None
    _checkpoint: Checkpoint | None
    _watermark: int
    _logged_watermark: int
    _logged_mark: int
    _log_records: int
    _snapshot_covers: int
    _snapshot_due: bool

    def _init_checkpointing(self) -> None:
        self._checkpoint = None
        self._logged_watermark = -1
        # The store's change mark as last logged (on the store thread).
        self._logged_mark = 0
        self._snapshot_due = False
        self._snapshot_task: asyncio.Task[None] | None = None
        self._snapshot_thread: threading.Thread | None = None
        # Job records in the log: all logged (counted by the store thread) and
        # those the running or last snapshot covers (set by the loop).
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

    def _checkpoint_records(self) -> list[bytes]:
        """The log records of what changed since the last batch (on the loop,
        when a batch is formed): nothing without a checkpoint."""
        driver = self._driver
        assert driver is not None
        owner = driver.owner
        dirty = owner.take_dirty()
        if self._checkpoint is None:
            return []
        records: list[bytes] = []
        held = self._covered & owner.shards().keys()
        if held != self._logged_held:
            # Before the watermark: it tells how current these shards are.
            records.append(encode_held(held))
            self._logged_held = held
        watermark = self._watermark if self._watermark != self._logged_watermark else None
        if not dirty and watermark is None:
            return records
        records += owner_log_records(
            dirty,
            owner.image_of,
            watermark,
            profile_of=owner.profile,
            logged=self._logged_profiles,
        )
        if watermark is not None:
            self._logged_watermark = watermark
        return records

    def _recover_checkpoint(self) -> OwnerState | None:
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
            return recover_state(recovery, self.store.change_mark())
        except CheckpointError as exc:
            log.error("checkpoint unusable, shards will load from the store: %s", exc)
            checkpoint.reset()
            return None

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

    def recovered(self) -> OwnerState | None:
        return self._recovered

    def release_recovered(self) -> None:
        """The first gains are done: what was restored and not gained back
        is left to the store."""
        self._recovered = None

    def _start_snapshot(self) -> bool:
        """A fuzzy snapshot: shard by shard copied on the loop, written on a
        thread of its own (see the module docstring). False: one is running
        (or there is no checkpoint)."""
        checkpoint, driver = self._checkpoint, self._driver
        if checkpoint is None or driver is None:
            return False
        if self._snapshot_task is not None and not self._snapshot_task.done():
            return False
        self._snapshot_task = asyncio.get_running_loop().create_task(
            self._snapshot(checkpoint, driver), name="wheel-snapshot"
        )
        return True

    async def _snapshot(self, checkpoint: Checkpoint, driver: Driver) -> None:
        owner = driver.owner
        upto = checkpoint.last_seq()
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

        held = sorted(s for s in owner.shards() if s not in self._partial)
        try:
            # The watermark, then the shards the log after this snapshot starts
            # out holding (what it said last): each shard chunk is whole as of
            # the watermark, and the log's later watermarks move on the shards
            # it names.
            await put(
                encode_watermark(self._watermark)
                + encode_mark(self._logged_mark)
                + encode_held(self._logged_held or ())
            )
            for shard in held:
                rows = owner.snapshot_columns(shard)
                if rows is not None:
                    jobs += len(rows)
                    await put(encode_shard(shard, rows))
            profiles = list(owner.profiles.items)
            await put(b"".join(encode_profile(p, n) for n, p in enumerate(profiles)))
        finally:
            await put(None)
        await asyncio.get_running_loop().run_in_executor(None, thread.join)
        if failed:
            log.error("snapshot failed; the log keeps growing until the next one: %s", failed[0])
            self._snapshot_covers = covered_before  # due again
            return
        # Written whole: covered, those still held.
        self._covered.update(s for s in held if s in owner.shards())
        log.info(
            "snapshot of %d jobs up to log record %d in %.2fs",
            jobs,
            upto,
            time.perf_counter() - started,
        )

    async def _stop_snapshot(self) -> None:
        task = self._snapshot_task
        if task is not None and not task.done():
            await asyncio.gather(task, return_exceptions=True)
