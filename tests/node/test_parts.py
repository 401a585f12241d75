"""The node's parts on their own: the checkpoint log the store thread
appends and what the loop learns of it, and the batches on their way to a
real store with the calls that wait for their commit."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from wheel.checkpoint import Checkpoint, Identity
from wheel.engine.records import WriteBatch
from wheel.errors import FailedPrecondition, StoreError
from wheel.node import NodeConfig
from wheel.node._batches import Batches, StoreWriter
from wheel.node._checkpointing import Checkpointing, CheckpointLog
from wheel.store.open import open_store

IDENTITY = Identity(cluster_id="test", shard_set="0-255")


def test_a_checkpoint_log_answers_each_append_with_where_the_log_stands(tmp_path: Path) -> None:
    checkpoint = Checkpoint.open(tmp_path / "checkpoint", IDENTITY)
    try:
        log = CheckpointLog(checkpoint, records=10)
        first = log.append([b"a", b"b"], change_mark=5)
        assert first is not None and not first.failed
        # The store's change mark goes in with the rows, counted as a record.
        assert (first.mark, first.records, first.seq) == (5, 13, checkpoint.last_seq())
        # Nothing to log: no entry, no answer.
        assert log.append([], change_mark=6) is None
        second = log.append([b"c"], change_mark=5)  # the mark did not move
        assert second is not None
        assert (second.mark, second.records, second.seq) == (5, 14, checkpoint.last_seq())
        assert second.seq > first.seq
    finally:
        checkpoint.close()


def test_a_failed_append_ends_the_log_and_the_loop_drops_the_checkpoint(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'wheel.db'}")
    checkpoint = Checkpoint.open(tmp_path / "checkpoint", IDENTITY)
    checkpointing = Checkpointing(NodeConfig(), store, watermark=lambda: 0)
    checkpointing.use(checkpoint)
    checkpointing.start_log()
    log = checkpointing.log
    assert log is not None
    checkpoint.close()  # every append fails from here on
    answer = log.append([b"a"], change_mark=1)
    assert answer is not None and answer.failed
    assert log.append([b"b"], change_mark=2) is None
    checkpointing.appended(answer)
    assert not checkpointing.enabled()
    assert checkpointing.log_records() is None
    store.close()


def test_the_loop_counts_the_records_logged_since_the_last_snapshot(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'wheel.db'}")
    checkpoint = Checkpoint.open(tmp_path / "checkpoint", IDENTITY)
    try:
        checkpointing = Checkpointing(
            NodeConfig(snapshot_every_records=1_000), store, watermark=lambda: 0
        )
        checkpointing.use(checkpoint)
        checkpointing.start_log(records=7)
        assert checkpointing.log_records() == 7
        log = checkpointing.log
        assert log is not None
        checkpointing.appended(log.append([b"a", b"b"], change_mark=3))
        assert checkpointing.log_records() == 10
        assert checkpointing.logged() == (checkpoint.last_seq(), 10)
    finally:
        checkpoint.close()
        store.close()


def test_a_commit_waiter_is_answered_once_its_batch_is_taken_in(tmp_path: Path) -> None:
    asyncio.run(commit_waiter_answered(tmp_path))


async def commit_waiter_answered(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'wheel.db'}")
    thread = ThreadPoolExecutor(1)
    woken = asyncio.Event()
    try:
        config = NodeConfig(group_commit_ms=20, group_commit_light_ms=5)
        batches = Batches(config, thread, wake=woken.set)
        failures: list[StoreError] = []
        writer = StoreWriter(
            store,
            checkpoint_log=None,
            committed=lambda seconds: None,
            failed=failures.append,
            stopping=lambda: False,
        )
        waiter = batches.commit_waiter()
        assert batches.has_waiters() and batches.may_send(1_000)
        batches.send(writer, WriteBatch(), [], 1_000)
        # The waiter goes with the batch; a light batch holds the next 5 ms.
        assert not batches.has_waiters()
        assert batches.next_batch_ms == 1_005
        assert not batches.may_send(1_004) and batches.may_send(1_005)
        assert batches.writing()  # a waiter makes it a write
        await asyncio.wait_for(woken.wait(), 10)
        answer = batches.next_answer()
        assert answer is not None and batches.next_answer() is None
        outcome, appended = answer.result()
        assert appended is None and not outcome.fenced and not failures
        assert not waiter.done()
        answer.release()
        assert waiter.done()
        # At stop, a call still waiting for a batch that never goes is refused.
        late = batches.commit_waiter()
        await batches.drain()
        assert isinstance(late.exception(), FailedPrecondition)
    finally:
        thread.shutdown(wait=True)
        store.close()


def test_a_bursts_parts_go_while_the_store_thread_has_room_and_wait_for_no_commit(
    tmp_path: Path,
) -> None:
    asyncio.run(burst_parts(tmp_path))


async def burst_parts(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'wheel.db'}")
    thread = ThreadPoolExecutor(1)
    woken = asyncio.Event()
    try:
        batches = Batches(NodeConfig(group_commit_ms=20), thread, wake=woken.set)
        writer = StoreWriter(
            store,
            checkpoint_log=None,
            committed=lambda seconds: None,
            failed=lambda exc: None,
            stopping=lambda: False,
        )
        parts = [WriteBatch(), WriteBatch(), WriteBatch()]
        limits: list[int] = []

        def take(limit: int) -> WriteBatch | None:
            limits.append(limit)
            return parts.pop(0) if parts else None

        waiter = batches.commit_waiter()
        batches.send_parts(writer, take, 500)
        # Two on their way at most: the third waits for room, and says so.
        # Each part takes twice the claims of the one before.
        assert (len(parts), limits, batches.parting) == (1, [500, 1_000], True)
        assert not batches.may_send(1_000) and batches.writing()
        # No group commit's wait after a part, and no call answered by one.
        assert batches.next_batch_ms == 0 and batches.has_waiters()
        while (answer := batches.next_answer()) is None:
            woken.clear()
            await asyncio.wait_for(woken.wait(), 10)
        answer.release()
        assert not waiter.done()
        batches.send_parts(writer, take, 500)
        assert not parts and batches.parting and limits[2:] == [2_000]
        while batches.next_answer() is None:
            woken.clear()
            await asyncio.wait_for(woken.wait(), 10)
        # Nothing left: the batch with everything else (and the waiter) goes;
        # the next burst starts again at the first part's size.
        batches.send_parts(writer, take, 500)
        assert not batches.parting and limits[3:] == [4_000]
        parts.append(WriteBatch())
        batches.send_parts(writer, take, 500)
        assert limits[4:] == [500]
        batches.send(writer, WriteBatch(), [], 1_000)
        assert not batches.has_waiters()
        await batches.drain()
        assert waiter.done()
    finally:
        thread.shutdown(wait=True)
        store.close()
