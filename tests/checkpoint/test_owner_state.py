"""The owner's records in the checkpoint: packed rows, profiles logged once,
tombstones, and a fuzzy snapshot of whole shards, replayed from a real LMDB
checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest

from wheel.checkpoint import Checkpoint, CheckpointError, Identity
from wheel.checkpoint.owner_state import (
    OwnerState,
    apply_records,
    encode_gone,
    encode_held,
    encode_mark,
    encode_profile,
    encode_row,
    encode_shard,
    encode_watermark,
    log_entry,
    log_records,
    recover_state,
    restored_rows,
    snapshot_chunks,
)
from wheel.engine.jobtable import NEVER, Columns
from wheel.engine.model import SHARD_COUNT, JobState, shard_of
from wheel.engine.owner import Actions, Outcome, Owner, PackedJob, ShardContents
from wheel.engine.profiles import profile_of, split_spec
from wheel.engine.records import ClaimOutcome, CompletionOutcome, JobRecord
from wheel.engine.spec import Interval, JobSpec, Once

IDENT = Identity(cluster_id="cluster-a", shard_set="0-255")
T0 = 1_800_000_000_000
PROFILE = profile_of(split_spec(JobSpec(name="", handler="h", schedule=Once(at_ms=0)))[0])


def test_a_row_replays_over_the_last_one_and_a_tombstone_removes_the_job() -> None:
    state = OwnerState()
    first = PackedJob(7, 100, 105, 3, PROFILE.profile_id, 0)
    moved = PackedJob(7, 200, NEVER, 3, PROFILE.profile_id, 1)
    apply_records(state, log_entry([encode_profile(PROFILE), encode_row(first)]))
    apply_records(state, encode_row(moved))
    assert state.log.last(7) == moved
    apply_records(state, encode_gone(7))
    assert state.log.last(7) is None
    assert [len(rows) for rows in restored_rows(state).packed.values()] == [0]


def test_a_row_naming_a_profile_the_log_never_had_makes_the_checkpoint_unusable() -> None:
    with pytest.raises(CheckpointError, match="job 9"):
        apply_records(OwnerState(), encode_row(PackedJob(9, 1, 1, 0, 12345, 0)))


def test_records_of_the_earlier_per_job_spec_layout_are_refused() -> None:
    """Kind 1 was a job image with its spec: such a checkpoint is rebuilt
    from the store, never read as rows."""
    with pytest.raises(CheckpointError, match="unknown owner record kind 1"):
        apply_records(OwnerState(), bytes([1]) + bytes(40))


def test_the_highest_change_mark_logged_or_snapshotted_is_what_the_store_must_have(
    tmp_path: Path,
) -> None:
    """Marks come with the batches (and the snapshot carries the last one):
    the state keeps the highest, and a store whose mark is lower lost commits
    the rows reflect, so the state refuses it; at or above it, it stands."""
    with Checkpoint.open(tmp_path / "cp", IDENT) as cp:
        cp.append([log_entry([encode_watermark(3), encode_mark(40)])])
        cp.write_snapshot(snapshot_chunks([], lambda s: None, lambda: [], 3, 41), cp.last_seq())
        cp.append([log_entry([encode_mark(45)])])
        cp.append([log_entry([encode_mark(44), encode_watermark(4)])])
        recovery = cp.recover()
    state = recover_state(recovery, 45)
    assert state.store_mark == 45
    state.check_mark(46)
    with pytest.raises(CheckpointError, match="change mark is 44, below the 45"):
        recover_state(recovery, 44)
    snapshot_only = OwnerState()
    for chunk in snapshot_chunks([], lambda s: None, lambda: [], 3, 41):
        apply_records(snapshot_only, chunk, snapshot=True)
    assert snapshot_only.store_mark == 41
    # A checkpoint that logged no mark (a store that keeps none) takes any store.
    OwnerState().check_mark(0)


def test_log_records_write_a_profiles_body_once_before_the_first_row_that_names_it() -> None:
    images = {
        1: PackedJob(1, 5, 5, 0, PROFILE.profile_id, 0),
        2: PackedJob(2, 6, 6, 0, PROFILE.profile_id, 0),
    }
    logged: set[int] = set()
    profiles = {PROFILE.profile_id: PROFILE}
    records = log_records([1, 2, 3], images.get, 9, profile_of=profiles.get, logged=logged)
    assert records == [
        encode_profile(PROFILE),
        encode_row(images[1]),
        encode_row(images[2]),
        encode_gone(3),
        records[-1],
    ]
    assert logged == {PROFILE.profile_id}
    again = log_records([1], images.get, None, profile_of=profiles.get, logged=logged)
    assert again == [encode_row(images[1])]


def _owner_with_jobs(n: int) -> Owner:
    owner = Owner(epochs=dict.fromkeys(range(SHARD_COUNT), 1), now_ms=T0)
    acts = Actions()
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
        owner.upsert_job(record, T0, acts)
    owner.worker_hello("w", 10_000, ["default"], T0, acts)
    return owner


def _tick(owner: Owner, now: int, run_ids: list[int]) -> None:
    """One node pass with a store that accepts everything and a worker that
    completes each run at once."""
    acts = Actions()
    owner.advance(now, acts)
    work = acts.take_store_work()
    claimed = []
    for c in work.claims:
        run_ids.append(len(run_ids) + 1)
        claimed.append(ClaimOutcome(claim=c, run_id=len(run_ids), advanced=c.advance))
    owner.on_completed(
        [CompletionOutcome(run_id=c.run_id, applied=True) for c in work.completions], now, acts
    )
    owner.on_claimed(claimed, now, acts)
    for worker_id, assignments in acts.assignments.items():
        done = [(a.run_id, a.fence, Outcome.SUCCEEDED, "") for a in assignments]
        owner.worker_complete(worker_id, done, now, acts)
    # The store applies those completions too (left unanswered, every run
    # would stay in flight and each later fire would wait behind it).
    ended = acts.take_store_work().completions
    owner.on_completed([CompletionOutcome(run_id=c.run_id, applied=True) for c in ended], now, acts)


def _snapshot(owner: Owner, watermark: int) -> list[bytes]:
    return list(
        snapshot_chunks(
            sorted(owner.shards()), owner.snapshot_columns, lambda: owner.profiles.items, watermark
        )
    )


def _restored_images(state: OwnerState) -> dict[int, PackedJob]:
    restored = restored_rows(state)
    out = {}
    for rows in restored.packed.values():
        for i, job_id in enumerate(rows.ids.tolist()):
            out[job_id] = PackedJob(
                job_id,
                int(rows.nxt[i]),
                int(rows.due[i]),
                int(rows.param[i]),
                restored.profiles[int(rows.prof[i])].profile_id,
                int(rows.flags[i]),
            )
    return out


@pytest.mark.parametrize("per_batch", [True, False], ids=["entry-per-batch", "entry-per-record"])
def test_replaying_a_snapshot_and_rows_restores_every_job(tmp_path: Path, per_batch: bool) -> None:
    """The node's way of logging (a log entry per batch of rows, each profile
    once, a fuzzy snapshot in the middle), against the live owner's rows. A
    log written an entry per record replays the same."""
    owner = _owner_with_jobs(60)
    cp = Checkpoint.open(tmp_path / "cp", IDENT)
    run_ids: list[int] = []
    rows_logged = 0
    after_snapshot = 0
    logged: set[int] = set()
    try:
        for step in range(1, 400):
            now = T0 + step
            _tick(owner, now, run_ids)
            dirty = owner.take_dirty()
            records = log_records(
                dirty, owner.image_of, step, profile_of=owner.profile, logged=logged
            )
            rows_logged += sum(1 for r in records if r[0] == 5)
            cp.append([log_entry(records)] if per_batch else records)
            if step > 150:
                after_snapshot += len(records)
            if step == 150:
                upto = cp.last_seq()
                cp.write_snapshot(_snapshot(owner, step), upto)
        recovery = cp.recover()
        state = recover_state(recovery)
    finally:
        cp.close()
    assert rows_logged > 100  # the interval jobs fired many times
    assert run_ids
    assert state.watermark == 399
    assert state.log_records == after_snapshot  # what the node counts toward a snapshot
    assert len(recovery.records) == (399 - 150 if per_batch else after_snapshot)
    live = {job_id: owner.image_of(job_id) for job_id in owner.job_ids()}
    assert _restored_images(state) == live


def test_a_snapshot_holds_jobs_at_rest_and_awake_as_they_rest_and_restores_them(
    tmp_path: Path,
) -> None:
    owner = Owner(now_ms=T0)
    acts = Actions()
    owner.add_shards(dict.fromkeys(range(SHARD_COUNT), 1), ShardContents(), T0, acts)
    for job_id in range(1, 41):
        spec = JobSpec(
            name=f"job-{job_id}",
            handler="h",
            payload=b"p" if job_id % 7 == 0 else b"",
            schedule=Interval(period_ms=60_000, start_at_ms=T0 + job_id),
        )
        record = JobRecord(
            job_id=job_id,
            shard=shard_of(job_id),
            spec=spec,
            state=JobState.PAUSED if job_id % 5 == 0 else JobState.ACTIVE,
            next_run_at=T0 + job_id,
            created_at_ms=T0,
            updated_at_ms=T0,
        )
        owner.upsert_job(record, T0, acts)
    assert not owner.jobs  # all at rest
    woken = list(range(1, 41, 4))
    for job_id in woken:
        owner.next_fires(job_id, 1)  # touched: awake
    assert sorted(owner.jobs) == woken
    cp = Checkpoint.open(tmp_path / "cp", IDENT)
    try:
        cp.write_snapshot(_snapshot(owner, 7), cp.last_seq())
        state = recover_state(cp.recover())
    finally:
        cp.close()
    assert state.watermark == 7
    live = {job_id: owner.image_of(job_id) for job_id in owner.job_ids()}
    assert _restored_images(state) == live
    assert {j for j, image in live.items() if image and image.flags & 1} == set(range(5, 41, 5))
    # An owner restored from it holds the same jobs, all at rest.
    restored = restored_rows(state)
    again = Owner(now_ms=T0)
    again.add_shards(
        dict.fromkeys(range(SHARD_COUNT), 2),
        ShardContents(packed=restored.packed, profiles=restored.profiles),
        T0,
        Actions(),
    )
    assert not again.jobs
    assert {j: again.image_of(j) for j in again.job_ids()} == live


def test_only_shards_the_snapshot_wrote_are_restorable_and_the_log_moves_them_on() -> None:
    """A node in a cluster gains a shard back from its checkpoint only when
    the checkpoint holds the shard's rows whole: a shard the log held but the
    snapshot did not write (lost while it was written, or gained since) has
    only the rows logged after it, and must load from the store."""
    a, b = shard_of(1), next(s for s in range(SHARD_COUNT) if s != shard_of(1))
    snapshot = [
        encode_watermark(100) + encode_held([a, b]),
        encode_shard(a, Columns.empty()),
        encode_profile(PROFILE, 0),
    ]
    state = OwnerState()
    for chunk in snapshot:
        apply_records(state, chunk, snapshot=True)
    assert state.restorable() == {a: 100}
    # The log after the snapshot: a watermark while both are held moves a on
    # (b has no rows to move on), then b is handed over.
    apply_records(state, encode_watermark(140))
    apply_records(state, encode_held([a]) + encode_watermark(180))
    assert state.restorable() == {a: 180}
    assert state.as_of[b] == 140  # held in the log, but never whole


def test_a_bounded_job_restored_from_a_snapshot_keeps_its_bounds(tmp_path: Path) -> None:
    owner = Owner(now_ms=T0)
    owner.add_shards(dict.fromkeys(range(SHARD_COUNT), 1), ShardContents(), T0, Actions())
    spec = JobSpec(
        name="bounded",
        handler="h",
        schedule=Interval(period_ms=60_000, start_at_ms=T0 + 60_000),
        active_from_ms=T0 + 3 * 60_000,
        max_fires=4,
        last_fire_ms=T0 + 6 * 60_000,
    )
    record = JobRecord(
        job_id=7,
        shard=shard_of(7),
        spec=spec,
        state=JobState.ACTIVE,
        next_run_at=T0 + 3 * 60_000,
        created_at_ms=T0,
        updated_at_ms=T0,
    )
    owner.upsert_job(record, T0, Actions())
    fires = [T0 + k * 60_000 for k in (3, 4, 5, 6)]
    assert owner.next_fires(7, 10) == fires
    cp = Checkpoint.open(tmp_path / "cp", IDENT)
    try:
        cp.write_snapshot(_snapshot(owner, 3), cp.last_seq())
        restored = restored_rows(recover_state(cp.recover()))
    finally:
        cp.close()
    again = Owner(now_ms=T0)
    again.add_shards(
        dict.fromkeys(range(SHARD_COUNT), 2),
        ShardContents(packed=restored.packed, profiles=restored.profiles),
        T0,
        Actions(),
    )
    assert again.next_fires(7, 10) == fires
