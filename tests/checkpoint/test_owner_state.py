"""The owner's records in the checkpoint: full images, moves without the spec,
tombstones, and a fuzzy snapshot, replayed from a real LMDB checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest

from wheel.checkpoint import Checkpoint, CheckpointError, Identity
from wheel.checkpoint.owner_state import (
    OwnerState,
    apply_records,
    decode_image,
    encode_job,
    encode_move,
    log_entry,
    log_records,
    recover_state,
    snapshot_chunks,
)
from wheel.engine.model import SHARD_COUNT, JobState, shard_of
from wheel.engine.owner import Effects, JobImage, Outcome, Owner, ShardContents
from wheel.engine.records import ClaimOutcome, CompletionOutcome, JobRecord
from wheel.engine.spec import Interval, JobSpec, Once

IDENT = Identity(cluster_id="cluster-a", shard_set="0-255")
T0 = 1_800_000_000_000


def test_a_move_keeps_the_spec_of_the_last_full_image() -> None:
    state = OwnerState()
    first = JobImage(spec_json=b'{"a":1}', paused=False, store_next=100, due_at=105)
    moved = JobImage(spec_json=b"not logged", paused=True, store_next=200, due_at=None)
    apply_records(state, encode_job(7, first))
    apply_records(state, encode_move(7, moved))
    due_at, raw = state.images[7]
    assert due_at is None
    assert decode_image(raw) == JobImage(
        spec_json=b'{"a":1}', paused=True, store_next=200, due_at=None
    )


def test_a_move_of_a_job_with_no_image_makes_the_checkpoint_unusable() -> None:
    image = JobImage(spec_json=b"{}", paused=False, store_next=1, due_at=1)
    with pytest.raises(CheckpointError, match="job 9"):
        apply_records(OwnerState(), encode_move(9, image))


def test_log_records_write_full_images_only_for_new_specs() -> None:
    images = {
        1: JobImage(spec_json=b"x" * 50, paused=False, store_next=5, due_at=5),
        2: JobImage(spec_json=b"y" * 50, paused=False, store_next=6, due_at=6),
    }
    records = log_records([1, 2, 3], images.get, None, full={2})
    assert records[0] == encode_move(1, images[1])
    assert records[1] == encode_job(2, images[2])
    assert len(records[0]) < 50 < len(records[1])
    assert log_records([1], images.get, None) == [encode_job(1, images[1])]


def test_a_job_adopted_for_its_runs_is_logged_whole_when_it_first_changes() -> None:
    """A finished job kept for its in-flight runs after a restart was never
    in the checkpoint: a move of it would replay onto nothing."""
    owner = Owner(epochs=dict.fromkeys(range(SHARD_COUNT), 1), now_ms=T0)
    spec = JobSpec(name="once", handler="h", schedule=Once(at_ms=T0))
    record = JobRecord(
        job_id=5,
        shard=shard_of(5),
        spec=spec,
        state=JobState.COMPLETED,
        next_run_at=None,
        created_at_ms=T0,
        updated_at_ms=T0,
    )
    owner.add_shards({}, ShardContents(finished=[record]), T0, Effects())
    assert owner.take_new_specs(set()) == set()  # not logged in this batch: still marked
    full = owner.take_new_specs({5})
    assert full == {5}
    state = OwnerState()
    for r in log_records({5}, owner.image_of, None, full=full):
        apply_records(state, r)
    assert decode_image(state.images[5][1]).spec_json == spec.to_json().encode()
    assert owner.take_new_specs({5}) == set()  # once logged whole, moves will do


def _owner_with_jobs(n: int) -> Owner:
    owner = Owner(epochs=dict.fromkeys(range(SHARD_COUNT), 1), now_ms=T0)
    fx = Effects()
    for job_id in range(1, n + 1):
        if job_id % 3:
            schedule: Once | Interval = Interval(period_ms=40, start_at_ms=T0 + job_id)
        else:
            schedule = Once(at_ms=T0 + 10 * job_id)
        record = JobRecord(
            job_id=job_id,
            shard=shard_of(job_id),
            spec=JobSpec(name=f"job-{job_id}", handler="h", schedule=schedule),
            state=JobState.ACTIVE,
            next_run_at=schedule.start_at_ms if isinstance(schedule, Interval) else schedule.at_ms,
            created_at_ms=T0,
            updated_at_ms=T0,
        )
        owner.upsert_job(record, T0, fx)
    owner.worker_hello("w", 10_000, ["default"], T0, fx)
    return owner


def _tick(owner: Owner, now: int, run_ids: list[int]) -> None:
    """One node pass with a store that accepts everything and a worker that
    completes each run at once."""
    fx = Effects()
    owner.advance(now, fx)
    work = fx.take_store_work()
    claimed = []
    for c in work.claims:
        run_ids.append(len(run_ids) + 1)
        claimed.append(ClaimOutcome(claim=c, run_id=len(run_ids), advanced=c.advance))
    owner.on_completed(
        [CompletionOutcome(run_id=c.run_id, applied=True) for c in work.completions], now, fx
    )
    owner.on_claimed(claimed, now, fx)
    for worker_id, assignments in fx.assignments.items():
        done = [(a.run_id, a.fence, Outcome.SUCCEEDED, "") for a in assignments]
        owner.worker_complete(worker_id, done, now, fx)
    # The store applies those completions too (left unanswered, every run
    # would stay in flight and each later fire would wait behind it).
    ended = fx.take_store_work().completions
    owner.on_completed([CompletionOutcome(run_id=c.run_id, applied=True) for c in ended], now, fx)


@pytest.mark.parametrize("per_batch", [True, False], ids=["entry-per-batch", "entry-per-record"])
def test_replaying_a_snapshot_and_moves_restores_every_image(
    tmp_path: Path, per_batch: bool
) -> None:
    """The node's way of logging (a log entry per batch, full images for new
    specs, moves otherwise, a fuzzy snapshot in the middle), against the live
    owner's images. A log written an entry per record (as before batches were
    joined) replays the same."""
    owner = _owner_with_jobs(60)
    cp = Checkpoint.open(tmp_path / "cp", IDENT)
    run_ids: list[int] = []
    moves = 0
    after_snapshot = 0
    try:
        for step in range(1, 400):
            now = T0 + step
            _tick(owner, now, run_ids)
            dirty = owner.take_dirty()
            full = owner.take_new_specs(dirty)
            records = log_records(dirty, owner.image_of, watermark=step, full=full)
            moves += sum(1 for r in records if r[0] == 4)
            cp.append([log_entry(records)] if per_batch else records)
            if step > 150:
                after_snapshot += len(records)
            if step == 150:
                upto = cp.last_seq()
                cp.write_snapshot(snapshot_chunks(owner.job_ids(), owner.image_of, step), upto)
        recovery = cp.recover()
        state = recover_state(recovery)
    finally:
        cp.close()
    assert moves > 100  # the interval jobs fired many times
    assert run_ids
    assert state.watermark == 399
    assert state.log_records == after_snapshot  # what the node counts toward a snapshot
    assert len(recovery.records) == (399 - 150 if per_batch else after_snapshot)
    live = {job_id: owner.image_of(job_id) for job_id in owner.job_ids()}
    restored = {job_id: decode_image(raw) for job_id, (_, raw) in state.images.items()}
    assert restored == live
    for job_id, (due_at, _) in state.images.items():
        image = live[job_id]
        assert image is not None and due_at == image.due_at


def test_a_snapshot_copies_the_records_of_jobs_not_woken_since_a_restart(
    tmp_path: Path,
) -> None:
    owner = Owner(now_ms=T0)
    images = {}
    for job_id in range(1, 41):
        spec = JobSpec(
            name=f"job-{job_id}", handler="h", schedule=Interval(period_ms=60_000, start_at_ms=T0)
        )
        nxt = T0 + 1_000 * job_id
        paused = job_id % 5 == 0
        images[job_id] = JobImage(
            spec_json=spec.to_json().encode(),
            paused=paused,
            store_next=nxt,
            due_at=None if paused else nxt,
        )
    contents = ShardContents(
        images={j: (im.due_at, encode_job(j, im)) for j, im in images.items()}, decode=decode_image
    )
    owner.add_shards(dict.fromkeys(range(SHARD_COUNT), 1), contents, T0, Effects())
    woken = list(range(1, 41, 4))
    for job_id in woken:
        owner.next_fires(job_id, 1)  # touched: awake, its image is built anew
    decoded: list[int] = []

    def image_of(job_id: int) -> JobImage | None:
        decoded.append(job_id)
        return owner.image_of(job_id)

    cp = Checkpoint.open(tmp_path / "cp", IDENT)
    try:
        chunks = snapshot_chunks(owner.job_ids(), image_of, 7, record_of=owner.dormant_record)
        cp.write_snapshot(chunks, cp.last_seq())
        state = recover_state(cp.recover())
    finally:
        cp.close()
    assert sorted(decoded) == woken
    assert state.watermark == 7
    restored = {job_id: decode_image(raw) for job_id, (_, raw) in state.images.items()}
    assert restored == {job_id: owner.image_of(job_id) for job_id in owner.job_ids()}
    assert restored == images
