"""Restart of a shard owner: from the local checkpoint when it is usable, from
the store otherwise, and reconciled with the store either way (it wins).

1. Checkpoint: snapshot + log replay gives every job's image and the store
   watermark the images reflect; jobs are armed without parsing their specs.
   Then every job the store changed since that watermark is applied on top
   (jobs submitted, cancelled or advanced by others, or by this node after its
   last logged batch).
2. Store: ``load_shards`` -- every active and paused job. Those the row
   alone arms (paused, or with a next fire) are made into images and armed
   as a checkpoint's are, unparsed; only the rest are parsed and compiled.
3. Either way, in-flight executions come from the store (with their fences),
   and so do retries that were pending: the latest failed/lost attempt of a
   fire with no newer one.

A checkpoint that is corrupt, of another cluster or shard set, or of an
unknown format is discarded with an error in the log, never served.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from wheel.checkpoint.owner_state import decode_image, encode_job_fields, recover_state
from wheel.checkpoint.wal import Checkpoint
from wheel.engine.model import JobState
from wheel.engine.owner import Effects, Owner, OwnerConfig, ShardContents
from wheel.engine.records import ExecutionRecord, JobRecord, UnparsedJob
from wheel.errors import CheckpointError, NotFound
from wheel.store.base import Store

log = logging.getLogger("wheel.recovery")

CHANGES_PAGE = 10_000


@dataclass(slots=True)
class Restored:
    owner: Owner
    watermark: int
    source: str  # "checkpoint" or "store"
    # Job records replayed from the checkpoint's log (0: rebuilt from the store).
    log_records: int
    seconds: float
    # Effects produced while reconciling (missed fires of paused jobs, ...).
    effects: Effects


def restore_owner(
    store: Store,
    checkpoint: Checkpoint | None,
    *,
    epochs: dict[int, int],
    config: OwnerConfig,
    now_ms: int,
) -> Restored:
    """A new owner of the shards in ``epochs``, from the checkpoint when it is
    usable, else from the store; reconciled with the store either way."""
    started = time.perf_counter()
    shards = sorted(epochs)
    owner = Owner(now_ms=now_ms, config=config)
    fx = Effects()
    state = None
    if checkpoint is not None:
        try:
            recovery = checkpoint.recover()
            for warning in recovery.warnings:
                log.warning("checkpoint: %s", warning)
            if recovery.snapshot is not None or recovery.records:
                state = recover_state(recovery)
        except CheckpointError as exc:
            log.error("checkpoint unusable, rebuilding from the store: %s", exc)
            checkpoint.reset()
    if state is not None:
        watermark = state.watermark
        changed: list[JobRecord] = []
        while True:
            page, new_watermark = store.changes_since(watermark, shards, CHANGES_PAGE)
            changed.extend(page)
            done = len(page) < CHANGES_PAGE or new_watermark == watermark
            watermark = new_watermark
            if done:
                break
        contents = shard_contents(
            store,
            shards,
            images=state.images,
            jobs=changed,
            inflight=store.inflight_runs(shards),
        )
        source = "checkpoint"
        log_records = state.log_records
    else:
        load = store.load_shards(shards, unparsed=True)
        contents = shard_contents(
            store,
            shards,
            images=_images_of_rows(load.unparsed),
            jobs=load.jobs,
            inflight=load.inflight,
        )
        watermark = load.watermark
        source = "store"
        log_records = 0
    owner.add_shards(epochs, contents, now_ms, fx)
    return Restored(
        owner=owner,
        watermark=watermark,
        source=source,
        log_records=log_records,
        seconds=time.perf_counter() - started,
        effects=fx,
    )


def load_shard_contents(store: Store, shards: Sequence[int]) -> tuple[ShardContents, int]:
    """A shard's contents from the store alone (a node gaining shards in a
    cluster), and the change-feed watermark they reflect."""
    load = store.load_shards(shards, unparsed=True)
    contents = shard_contents(
        store,
        shards,
        images=_images_of_rows(load.unparsed),
        jobs=load.jobs,
        inflight=load.inflight,
    )
    return contents, load.watermark


def shard_contents(
    store: Store,
    shards: Sequence[int],
    *,
    images: Mapping[int, tuple[int | None, object]],
    jobs: Sequence[JobRecord],
    inflight: Sequence[ExecutionRecord],
) -> ShardContents:
    """What an owner takes on with ``shards``: the jobs it arms (as images
    and as records), their runs in flight and pending retries from the store,
    and the finished jobs those runs and retries still belong to."""
    retries = store.retry_candidates(shards)
    latest = {r.job_id: r for r in jobs}
    over = {i: r for i, r in latest.items() if r.state not in _SCHEDULED}
    known = (images.keys() - over.keys()) | (latest.keys() - over.keys())
    finished: list[JobRecord] = []
    for job_id in sorted({e.job_id for e in (*inflight, *retries)} - known):
        record = over.get(job_id)
        if record is None:
            try:
                record = store.get_job(job_id)
            except NotFound:
                log.warning("run of unknown job %s ignored", job_id)
                continue
        finished.append(record)
    return ShardContents(
        images=images,
        decode=decode_image,
        jobs=jobs,
        finished=finished,
        inflight=inflight,
        retries=retries,
    )


_SCHEDULED = (JobState.ACTIVE, JobState.PAUSED)


def _images_of_rows(rows: Sequence[UnparsedJob]) -> dict[int, tuple[int | None, bytes]]:
    """Store rows as checkpoint images, armed at the nominal time of their
    next fire (the owner applies a jitter when it wakes the job)."""
    images: dict[int, tuple[int | None, bytes]] = {}
    for row in rows:
        due_at = None if row.paused else row.next_run_at
        images[row.job_id] = (
            due_at,
            encode_job_fields(
                row.job_id, row.spec_json.encode(), row.paused, row.next_run_at, due_at
            ),
        )
    return images
