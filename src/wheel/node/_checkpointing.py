"""A node's checkpoint: opening it, logging what each store batch changed, and
fuzzy snapshots that never stall the event loop.

The log is appended on the store thread right after each batch commits (never
ahead of the store): the rows of the jobs the batch's owner pass changed
(``wheel.checkpoint.owner_state``). A snapshot copies the owner's tables one
shard at a time on the event loop -- a memcpy of some 40,000 rows, well under
a millisecond -- and a thread of its own writes them to LMDB, taking at most
``SNAPSHOT_SHARE`` of the process's time; the log replays everything after the
sequence number the snapshot started at.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from typing import TYPE_CHECKING

from wheel.checkpoint import Checkpoint, DutyCycle, Identity
from wheel.checkpoint.owner_state import encode_profile, encode_shard, encode_watermark
from wheel.checkpoint.owner_state import log_records as owner_log_records
from wheel.engine.model import SHARD_COUNT
from wheel.errors import CheckpointError
from wheel.node._values import NodeConfig

if TYPE_CHECKING:
    from wheel.engine.driver import Driver

log = logging.getLogger("wheel.node")

# A snapshot's share of the process's time (see wheel.checkpoint.wal.DutyCycle).
SNAPSHOT_SHARE = 0.2
# Snapshot chunks copied ahead of the writer thread.
SNAPSHOT_QUEUE = 4


class NodeCheckpoint:
    """The checkpoint of ``wheel.node.Node``."""

    config: NodeConfig
    _driver: Driver | None
    _checkpoint: Checkpoint | None
    _watermark: int
    _logged_watermark: int
    _log_records: int
    _snapshot_covers: int
    _snapshot_due: bool

    def _init_checkpointing(self) -> None:
        self._checkpoint = None
        self._logged_watermark = -1
        self._snapshot_due = False
        self._snapshot_task: asyncio.Task[None] | None = None
        self._snapshot_thread: threading.Thread | None = None
        # Job records in the log: all logged (counted by the store thread) and
        # those the running or last snapshot covers (set by the loop).
        self._log_records = 0
        self._snapshot_covers = 0
        # Profiles whose body the log holds (a row names its profile by id).
        self._logged_profiles: set[int] = set()

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
        watermark = self._watermark if self._watermark != self._logged_watermark else None
        if not dirty and watermark is None:
            return []
        records = owner_log_records(
            dirty,
            owner.image_of,
            watermark,
            profile_of=owner.profile,
            logged=self._logged_profiles,
        )
        if watermark is not None:
            self._logged_watermark = watermark
        return records

    def _start_snapshot(self) -> None:
        """A fuzzy snapshot: shard by shard copied on the loop, written on a
        thread of its own (see the module docstring)."""
        checkpoint, driver = self._checkpoint, self._driver
        if checkpoint is None or driver is None:
            return
        if self._snapshot_task is not None and not self._snapshot_task.done():
            return
        self._snapshot_task = asyncio.get_running_loop().create_task(
            self._snapshot(checkpoint, driver), name="wheel-snapshot"
        )

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

        try:
            await put(encode_watermark(self._watermark))
            for shard in sorted(owner.shards()):
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
