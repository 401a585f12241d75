"""The Store contract, run against SQLite, PostgreSQL and the reference model alike."""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.store.conftest import interval_job, once_job
from wheel.engine.jobtable import NO_FIRE
from wheel.engine.profiles import join_spec, profile_of, template_of_body
from wheel.engine.records import PackedRows
from wheel.engine.spec import Interval
from wheel.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from wheel.store._schema import PG_MIGRATIONS, SQLITE_MIGRATIONS
from wheel.store.base import (
    SHARD_COUNT,
    Changes,
    Completion,
    FireClaim,
    JobRecord,
    JobRow,
    JobState,
    MissedFire,
    MissedReason,
    RunStart,
    RunState,
    ScheduleAdvance,
    SpecUpdate,
    Store,
    WriteBatch,
    shard_of,
)
from wheel.store.open import open_store

LATEST = max(v for v, _ in SQLITE_MIGRATIONS)
assert max(v for v, _ in PG_MIGRATIONS) == LATEST


def claim(
    job_id: int,
    fire: int,
    *,
    attempt: int = 0,
    fence: int = 1,
    expected: int | None = None,
    new: int | None = None,
    advance: bool = True,
) -> FireClaim:
    return FireClaim(
        job_id=job_id,
        scheduled_for=fire,
        attempt=attempt,
        fence=fence,
        dispatched_at_ms=fire + 3,
        advance=advance,
        expected_next_run_at=fire if expected is None else expected,
        new_next_run_at=new,
    )


def done(run_id: int, fence: int, state: RunState = RunState.SUCCEEDED) -> Completion:
    return Completion(
        run_id=run_id, fence=fence, state=state, finished_at_ms=99_000, worker_id="w-1"
    )


def dispatched(store: Store, name: str, fence: int) -> tuple[JobRecord, int]:
    """A new job whose first fire (60_000) is claimed with ``fence``: the job
    and the run."""
    job, _ = store.submit_job(interval_job(name, next_run_at=60_000))
    [out] = store.claim_fires([claim(job.job_id, 60_000, fence=fence, new=120_000)])
    assert out.run_id is not None
    return job, out.run_id


def read_changes(
    store: Store, mark: int, *, expect: int, owner_moves: bool = True, exclude: Collection[int] = ()
) -> Changes:
    """Every shard's changes after ``mark`` until ``expect`` jobs came (or ten
    seconds went): PostgreSQL hands out a change once every older transaction
    in the cluster has finished, and other sessions on the shared server may
    delay it."""
    seen: list[int] = []
    deadline = time.monotonic() + 10
    while True:
        got, mark = store.changes_since(
            mark, range(SHARD_COUNT), owner_moves=owner_moves, exclude=exclude
        )
        seen += [j.job_id for j in got]
        if len(seen) >= expect or time.monotonic() > deadline:
            return Changes([store.get_job(j) for j in seen], mark)
        time.sleep(0.02)


# -- migrations ------------------------------------------------------------------


def test_migrate_twice_is_a_no_op(store: Store, store_url: str) -> None:
    store.migrate()
    again = open_store(store_url)  # migrates on open
    try:
        job, _ = again.submit_job(interval_job())
        assert store.get_job(job.job_id) == job
        assert again.schema_version() == store.schema_version() == LATEST  # type: ignore[attr-defined]
    finally:
        again.close()


# -- jobs ------------------------------------------------------------------------


def test_submit_then_get_round_trips_the_job(store: Store) -> None:
    new = interval_job(next_run_at=120_000)
    job, created = store.submit_job(new)
    assert created
    assert job.job_id > 0
    assert job.shard == shard_of(job.job_id)
    assert job.spec == new.spec
    assert job.state is JobState.ACTIVE
    assert job.next_run_at == 120_000
    assert job.created_at_ms == job.updated_at_ms == 1_000
    assert store.get_job(job.job_id) == job


def test_a_jobs_priority_round_trips_by_its_spec_and_its_packed_profile(store: Store) -> None:
    new = interval_job("urgent")
    urgent = replace(new, spec=replace(new.spec, priority=0))
    job, _ = store.submit_job(urgent)
    plain, _ = store.submit_job(interval_job("plain"))
    assert store.get_job(job.job_id).spec.priority == 0
    assert store.get_job(plain.job_id).spec.priority == 5
    load = store.load_shards(range(SHARD_COUNT), packed=True)
    rows = load.packed
    assert rows is not None
    by_job = dict(zip(rows.job_id.tolist(), rows.profile_id.tolist(), strict=True))
    priorities = {
        job_id: template_of_body(load.profiles[int(profile)]).priority
        for job_id, profile in by_job.items()
    }
    assert priorities == {job.job_id: 0, plain.job_id: 5}


def test_job_ids_are_unique_positive_and_spread_over_shards(store: Store) -> None:
    ids = [store.submit_job(interval_job(f"j{i}"))[0].job_id for i in range(40)]
    assert len(set(ids)) == 40
    assert all(0 < i < 2**63 for i in ids)
    assert len({shard_of(i) for i in ids}) > 20


def test_get_unknown_job_raises_not_found(store: Store) -> None:
    with pytest.raises(NotFound):
        store.get_job(123_456)


def test_same_idempotency_key_and_body_returns_the_same_job(store: Store) -> None:
    first, created = store.submit_job(interval_job(key="k1"))
    # A retry arrives later (other created_at, other first fire): same body.
    again, created_again = store.submit_job(
        interval_job(key="k1", created_at_ms=5_000, next_run_at=180_000)
    )
    assert created and not created_again
    assert again == first
    assert first.idempotency_key == "k1"


def test_same_idempotency_key_with_another_body_is_already_exists(store: Store) -> None:
    store.submit_job(interval_job(key="k1"))
    with pytest.raises(AlreadyExists):
        store.submit_job(interval_job("another name", key="k1"))


def test_submit_jobs_commits_a_batch_and_isolates_a_key_conflict(store: Store) -> None:
    taken, _ = store.submit_job(interval_job(key="taken"))
    results = store.submit_jobs(
        [
            interval_job("a"),
            interval_job("other body", key="taken"),
            interval_job("b", key="fresh"),
            interval_job("b", key="fresh"),  # the same key twice in one batch
            interval_job("c", key="fresh"),  # ... and once more with another body
            interval_job(key="taken"),  # a retry of the stored one
        ]
    )
    assert isinstance(results[1], AlreadyExists)
    assert isinstance(results[4], AlreadyExists)
    assert results[5] == (taken, False)
    ok = [r for r in results if not isinstance(r, Exception)]
    assert [created for _, created in ok] == [True, True, False, False]
    assert ok[1][0] == ok[2][0]
    for record, _ in ok:
        assert store.get_job(record.job_id) == record
    assert store.submit_jobs([]) == []


AWKWARD_TEXTS = ['say "hi"', "back\\slash", "a,b", "{braces}", "NULL", "", " pad ", "żółw ✓"]


def test_submit_jobs_keeps_every_character_of_names_tenants_and_keys(store: Store) -> None:
    # A batch goes to the store as arrays; text that array literals would
    # have to quote or escape must arrive exactly as it was sent.
    news = [
        interval_job(f"{t}-{i}", tenant=t or "empty", key=f"{t}|{i}")
        for i, t in enumerate(AWKWARD_TEXTS)
    ]
    results = store.submit_jobs([*news, interval_job("NULL", key=None)])
    assert all(not isinstance(r, Exception) and r[1] for r in results)
    for new, result in zip(news, results, strict=False):
        assert not isinstance(result, Exception)
        stored = store.get_job(result[0].job_id)
        assert stored.spec == new.spec
        assert stored.idempotency_key == new.idempotency_key
    # A retry of the whole batch finds every key it sent.
    again = store.submit_jobs(news)
    assert [r[0].job_id for r in again if not isinstance(r, Exception)] == [
        r[0].job_id for r in results[:-1] if not isinstance(r, Exception)
    ]
    assert all(not isinstance(r, Exception) and not r[1] for r in again)


def test_idempotency_keys_are_per_tenant(store: Store) -> None:
    a, _ = store.submit_job(interval_job(key="k1", tenant="a"))
    b, created = store.submit_job(interval_job(key="k1", tenant="b"))
    assert created and a.job_id != b.job_id


def test_list_jobs_pages_stably_and_filters(store: Store) -> None:
    ids = [
        store.submit_job(interval_job(f"j{i}", tenant="a" if i % 2 else "b"))[0].job_id
        for i in range(7)
    ]
    store.set_job_state(ids[1], JobState.PAUSED, next_run_at=None, now_ms=2_000)
    seen: list[int] = []
    after = 0
    while True:
        page = store.list_jobs(after_job_id=after, limit=3)
        if not page:
            break
        seen += [j.job_id for j in page]
        after = page[-1].job_id
    assert seen == sorted(ids)
    assert [j.job_id for j in store.list_jobs(tenant="a")] == ids[1::2]
    assert [j.job_id for j in store.list_jobs(state=JobState.PAUSED)] == [ids[1]]
    assert [j.job_id for j in store.list_jobs(tenant="a", state=JobState.ACTIVE)] == ids[3::2]


def test_list_jobs_by_name_prefix_pages_by_name_then_id(store: Store) -> None:
    names = ["backup-b", "report", "backup-a", "backup-b", "backups", "Backup-c", "backup-é"]
    ids = [
        store.submit_job(interval_job(n, tenant="a" if i % 2 else "b"))[0].job_id
        for i, n in enumerate(names)
    ]
    store.set_job_state(ids[3], JobState.PAUSED, next_run_at=None, now_ms=2_000)
    want = sorted(
        ((n, i) for n, i in zip(names, ids, strict=True) if n.startswith("backup")),
    )
    seen: list[tuple[str, int]] = []
    after: tuple[str, int] | None = None
    while True:
        page = store.list_jobs(
            name_prefix="backup",
            after_name=after[0] if after else None,
            after_job_id=after[1] if after else 0,
            limit=2,
        )
        if not page:
            break
        seen += [(j.spec.name, j.job_id) for j in page]
        after = seen[-1]
    # Case-sensitive, by code point ("backups" after "backup-é"), ties by id.
    assert seen == want
    assert [j.job_id for j in store.list_jobs(name_prefix="backup-b", tenant="a")] == [ids[3]]
    paused = store.list_jobs(name_prefix="backup", state=JobState.PAUSED)
    assert [j.job_id for j in paused] == [ids[3]]
    assert store.list_jobs(name_prefix="nothing") == []
    assert [j.job_id for j in store.list_jobs(name_prefix="\U0010ffff")] == []


def test_set_job_state_changes_state_and_schedule(store: Store) -> None:
    job, _ = store.submit_job(interval_job())
    paused = store.set_job_state(job.job_id, JobState.PAUSED, next_run_at=None, now_ms=7_000)
    assert (paused.state, paused.next_run_at, paused.updated_at_ms) == (
        JobState.PAUSED,
        None,
        7_000,
    )
    resumed = store.set_job_state(job.job_id, JobState.ACTIVE, next_run_at=300_000, now_ms=8_000)
    assert (resumed.state, resumed.next_run_at) == (JobState.ACTIVE, 300_000)
    assert store.get_job(job.job_id) == resumed
    with pytest.raises(NotFound):
        store.set_job_state(999_999, JobState.CANCELLED, next_run_at=None, now_ms=1)


# -- claims ----------------------------------------------------------------------


def test_claim_inserts_a_dispatched_run_and_advances_the_schedule(store: Store) -> None:
    job, _ = store.submit_job(interval_job(next_run_at=60_000))
    [out] = store.claim_fires([claim(job.job_id, 60_000, fence=7, new=120_000)])
    assert out.run_id is not None and out.advanced
    run = store.get_run(out.run_id)
    assert (run.job_id, run.scheduled_for, run.attempt, run.fence) == (job.job_id, 60_000, 0, 7)
    assert run.state is RunState.DISPATCHED and run.dispatched_at_ms == 60_003
    assert run.started_at_ms is None and run.finished_at_ms is None and run.worker_id is None
    assert store.get_job(job.job_id).next_run_at == 120_000


def test_a_fire_attempt_is_claimed_once(store: Store) -> None:
    job, _ = store.submit_job(interval_job(next_run_at=60_000))
    [first] = store.claim_fires([claim(job.job_id, 60_000, fence=1, new=120_000)])
    [second] = store.claim_fires([claim(job.job_id, 60_000, fence=2, new=999_000)])
    assert first.run_id is not None
    assert second.run_id is None and not second.advanced
    assert store.get_job(job.job_id).next_run_at == 120_000
    assert len(store.list_runs(job.job_id)) == 1


def test_stale_schedule_cas_leaves_the_schedule_untouched(store: Store) -> None:
    job, _ = store.submit_job(interval_job(next_run_at=120_000))
    # A stale owner still believes the next fire is 60_000: its run is recorded
    # (it is a distinct fire) but the schedule does not move backwards.
    [out] = store.claim_fires([claim(job.job_id, 60_000, expected=60_000, new=120_000)])
    assert out.run_id is not None and not out.advanced
    assert store.get_job(job.job_id).next_run_at == 120_000
    assert store.get_job(job.job_id).updated_at_ms == 1_000


def test_claim_without_advance_keeps_the_schedule(store: Store) -> None:
    job, _ = store.submit_job(interval_job(next_run_at=60_000))
    [out] = store.claim_fires([claim(job.job_id, 60_000, advance=False, new=120_000)])
    assert out.run_id is not None and not out.advanced
    assert store.get_job(job.job_id).next_run_at == 60_000


def test_claiming_a_one_shot_ends_its_schedule_and_it_runs_until_its_fire_ends(
    store: Store,
) -> None:
    """Changed: a claimed one-shot was ``completed`` at once, even while its
    run went on or after it was dead-lettered; it is ``running`` until the
    completion that ends its fire says how (``Completion.job_state``)."""
    job, _ = store.submit_job(once_job(50_000))
    [out] = store.claim_fires([claim(job.job_id, 50_000, new=None)])
    assert out.run_id is not None and out.advanced
    after = store.get_job(job.job_id)
    assert (after.state, after.next_run_at) == (JobState.RUNNING, None)
    # A failed attempt with a retry to follow leaves it running.
    failed = replace(done(out.run_id, 1, RunState.FAILED), job_state=None)
    assert store.complete_runs([failed])[0].applied
    assert store.get_job(job.job_id).state is JobState.RUNNING
    [retry] = store.claim_fires([claim(job.job_id, 50_000, attempt=1, fence=2, advance=False)])
    assert retry.run_id is not None
    last = replace(done(retry.run_id, 2, RunState.DEAD_LETTERED), job_state=JobState.FAILED)
    assert store.complete_runs([last])[0].applied
    assert store.get_job(job.job_id).state is JobState.FAILED
    # A redrive that succeeds completes it.
    [again] = store.claim_fires([claim(job.job_id, 50_000, attempt=2, fence=3, advance=False)])
    assert again.run_id is not None
    won = replace(done(again.run_id, 3), job_state=JobState.COMPLETED)
    assert store.complete_runs([won])[0].applied
    assert store.get_job(job.job_id).state is JobState.COMPLETED


def test_a_completion_ending_a_one_shot_leaves_other_jobs_and_unapplied_ends_alone(
    store: Store,
) -> None:
    """A completion's ``job_state`` moves only a job whose schedule is over,
    and only when the completion applied: a cancelled job stays cancelled, a
    recurring one active, a stale fence changes nothing."""
    cancelled, _ = store.submit_job(once_job(50_000))
    [c] = store.claim_fires([claim(cancelled.job_id, 50_000, new=None)])
    store.set_job_state(cancelled.job_id, JobState.CANCELLED, next_run_at=None, now_ms=51_000)
    live, _ = store.submit_job(interval_job("live", next_run_at=60_000))
    [r] = store.claim_fires([claim(live.job_id, 60_000, new=120_000)])
    stale, _ = store.submit_job(once_job(50_000))
    [s] = store.claim_fires([claim(stale.job_id, 50_000, fence=7, new=None)])
    assert c.run_id is not None and r.run_id is not None and s.run_id is not None
    out = store.complete_runs(
        [
            replace(done(c.run_id, 1), job_state=JobState.COMPLETED),
            replace(done(r.run_id, 1), job_state=JobState.COMPLETED),
            replace(done(s.run_id, 6), job_state=JobState.FAILED),
        ]
    )
    assert [o.applied for o in out] == [True, True, False]
    assert store.get_job(cancelled.job_id).state is JobState.CANCELLED
    assert store.get_job(live.job_id).state is JobState.ACTIVE
    assert store.get_job(stale.job_id).state is JobState.RUNNING


def test_ending_a_recurring_schedule_keeps_it_active(store: Store) -> None:
    job, _ = store.submit_job(interval_job(next_run_at=60_000))
    [out] = store.claim_fires([claim(job.job_id, 60_000, new=None)])
    assert out.advanced
    after = store.get_job(job.job_id)
    assert (after.state, after.next_run_at) == (JobState.ACTIVE, None)


def test_claim_batch_outcomes_follow_claim_order_and_chain_per_job(store: Store) -> None:
    a, _ = store.submit_job(interval_job("a", next_run_at=60_000))
    b, _ = store.submit_job(interval_job("b", next_run_at=60_000))
    store.claim_fires([claim(b.job_id, 60_000, fence=1, new=120_000)])
    claims = [
        claim(a.job_id, 60_000, fence=2, new=120_000),
        claim(b.job_id, 60_000, fence=3, new=120_000),  # already claimed
        claim(a.job_id, 120_000, fence=4, new=180_000),  # a's next fire, same batch
        claim(b.job_id, 120_000, fence=5, new=180_000),
        claim(a.job_id, 60_000, attempt=1, fence=6, advance=False),  # a retry attempt
    ]
    outs = store.claim_fires(claims)
    assert [o.claim for o in outs] == claims
    assert [o.run_id is not None for o in outs] == [True, False, True, True, True]
    assert [o.advanced for o in outs] == [True, False, True, True, False]
    assert store.get_job(a.job_id).next_run_at == 180_000
    assert store.get_job(b.job_id).next_run_at == 180_000
    run_ids = [o.run_id for o in outs if o.run_id is not None]
    assert len(set(run_ids)) == len(run_ids)


def test_empty_batches_are_no_ops(store: Store) -> None:
    assert store.claim_fires([]) == []
    assert store.complete_runs([]) == []
    assert store.mark_running([]) == []
    assert store.advance_schedules([]) == []
    store.record_missed([])


def test_advance_schedules_is_a_cas_that_never_completes_a_job(store: Store) -> None:
    one, _ = store.submit_job(once_job(50_000))
    rec, _ = store.submit_job(interval_job(next_run_at=60_000))
    applied = store.advance_schedules(
        [
            ScheduleAdvance(
                job_id=rec.job_id, expected_next_run_at=60_000, new_next_run_at=120_000
            ),
            ScheduleAdvance(job_id=rec.job_id, expected_next_run_at=60_000, new_next_run_at=1),
            ScheduleAdvance(job_id=one.job_id, expected_next_run_at=50_000, new_next_run_at=None),
            ScheduleAdvance(job_id=424_242, expected_next_run_at=1, new_next_run_at=2),
        ]
    )
    assert applied == [True, False, True, False]
    assert store.get_job(rec.job_id).next_run_at == 120_000
    after = store.get_job(one.job_id)
    assert (after.state, after.next_run_at) == (JobState.ACTIVE, None)


def _bounded(store: Store, next_run_at: int) -> JobRecord:
    new = interval_job(next_run_at=next_run_at)
    spec = replace(new.spec, active_until_ms=next_run_at)
    job, _ = store.submit_job(replace(new, spec=spec))
    return job


def test_a_bounded_schedule_s_last_claim_runs_the_job_until_its_run_ends(store: Store) -> None:
    job = _bounded(store, 60_000)
    [out] = store.claim_fires([claim(job.job_id, 60_000, fence=1, expected=60_000, new=None)])
    assert out.run_id is not None and out.advanced
    assert store.get_job(job.job_id).state is JobState.RUNNING
    store.complete_runs([replace(done(out.run_id, 1), job_state=JobState.COMPLETED)])
    after = store.get_job(job.job_id)
    assert (after.state, after.next_run_at) == (JobState.COMPLETED, None)


def test_an_advance_that_ends_a_bounded_schedule_completes_its_job(store: Store) -> None:
    """Its last fire recorded missed: completed at once with no run in
    flight, running while one is (its end completes it)."""
    idle, busy = _bounded(store, 60_000), _bounded(store, 60_000)
    [out] = store.claim_fires([claim(busy.job_id, 30_000, fence=1, advance=False)])
    assert out.run_id is not None
    ends = [
        ScheduleAdvance(
            job_id=j.job_id, expected_next_run_at=60_000, new_next_run_at=None, ends=True
        )
        for j in (idle, busy)
    ]
    assert store.advance_schedules(ends) == [True, True]
    assert store.get_job(idle.job_id).state is JobState.COMPLETED
    assert store.get_job(busy.job_id).state is JobState.RUNNING
    store.complete_runs([replace(done(out.run_id, 1), job_state=JobState.COMPLETED)])
    assert store.get_job(busy.job_id).state is JobState.COMPLETED


# -- running and completion ---------------------------------------------------------


def test_mark_running_needs_the_current_fence(store: Store) -> None:
    job, _ = store.submit_job(interval_job())
    [out] = store.claim_fires([claim(job.job_id, 60_000, fence=5, new=120_000)])
    assert out.run_id is not None
    starts = [
        RunStart(run_id=out.run_id, fence=4, worker_id="w-0", started_at_ms=61_000),
        RunStart(run_id=out.run_id, fence=5, worker_id="w-1", started_at_ms=61_000),
        RunStart(run_id=out.run_id, fence=5, worker_id="w-1", started_at_ms=61_000),
    ]
    assert store.mark_running(starts) == [False, True, False]
    run = store.get_run(out.run_id)
    assert (run.state, run.worker_id, run.started_at_ms) == (RunState.RUNNING, "w-1", 61_000)


def test_completion_applies_once_with_the_right_fence(store: Store) -> None:
    job, _ = store.submit_job(interval_job())
    [out] = store.claim_fires([claim(job.job_id, 60_000, fence=5, new=120_000)])
    assert out.run_id is not None
    store.mark_running(
        [RunStart(run_id=out.run_id, fence=5, worker_id="w-1", started_at_ms=61_000)]
    )
    outcomes = store.complete_runs(
        [
            done(out.run_id, 4),  # stale fence
            Completion(
                run_id=out.run_id,
                fence=5,
                state=RunState.FAILED,
                finished_at_ms=62_000,
                error="boom",
            ),
            done(out.run_id, 5),  # already terminal
            done(777_777, 1),  # unknown run
        ]
    )
    assert [o.applied for o in outcomes] == [False, True, False, False]
    assert [o.run_id for o in outcomes] == [out.run_id, out.run_id, out.run_id, 777_777]
    run = store.get_run(out.run_id)
    assert (run.state, run.finished_at_ms, run.error, run.worker_id) == (
        RunState.FAILED,
        62_000,
        "boom",
        "w-1",
    )
    assert store.complete_runs([done(out.run_id, 5)])[0].applied is False


def test_a_completion_records_the_start_of_a_run_never_marked_running(store: Store) -> None:
    # A run that ends before its worker's ack was due is never marked
    # running: its completion brings its start, kept only where none is.
    job, _ = store.submit_job(interval_job())
    [quick, acked] = store.claim_fires(
        [
            claim(job.job_id, 60_000, fence=5, new=120_000),
            claim(job.job_id, 120_000, fence=6, expected=120_000, new=180_000),
        ]
    )
    assert quick.run_id is not None and acked.run_id is not None
    store.mark_running(
        [RunStart(run_id=acked.run_id, fence=6, worker_id="w-1", started_at_ms=121_000)]
    )
    ends = [
        Completion(
            run_id=run_id,
            fence=fence,
            state=RunState.SUCCEEDED,
            finished_at_ms=at + 1_500,
            started_at_ms=at + 1_450,
        )
        for run_id, fence, at in ((quick.run_id, 5, 60_000), (acked.run_id, 6, 120_000))
    ]
    assert [o.applied for o in store.complete_runs(ends)] == [True, True]
    starts = [store.get_run(r).started_at_ms for r in (quick.run_id, acked.run_id)]
    assert starts == [61_450, 121_000]


def test_completion_with_an_older_fence_is_rejected_after_a_newer_attempt(store: Store) -> None:
    job, _ = store.submit_job(interval_job())
    [old] = store.claim_fires([claim(job.job_id, 60_000, fence=10, new=120_000)])
    # The lease was lost; the fire is re-dispatched as attempt 1 with a newer fence.
    [new] = store.claim_fires([claim(job.job_id, 60_000, attempt=1, fence=11, advance=False)])
    assert old.run_id is not None and new.run_id is not None
    assert store.complete_runs([done(old.run_id, 10)])[0].applied is False
    assert store.get_run(old.run_id).state is RunState.DISPATCHED
    assert store.complete_runs([done(new.run_id, 11)])[0].applied is True


def test_completion_state_must_be_terminal(store: Store) -> None:
    with pytest.raises(InvalidArgument):
        store.complete_runs([done(1, 1, RunState.RUNNING)])


def test_get_run_and_list_runs(store: Store) -> None:
    job, _ = store.submit_job(interval_job(next_run_at=60_000))
    outs = store.claim_fires(
        [claim(job.job_id, 60_000 * k, fence=k, new=60_000 * (k + 1)) for k in range(1, 6)]
    )
    ids = [o.run_id for o in outs]
    assert all(ids)
    runs = store.list_runs(job.job_id, limit=3)
    assert [r.run_id for r in runs] == sorted(ids, reverse=True)[:3]  # type: ignore[type-var]
    rest = store.list_runs(job.job_id, before_run_id=runs[-1].run_id)
    assert [r.run_id for r in rest] == sorted(ids, reverse=True)[3:]  # type: ignore[type-var]
    with pytest.raises(NotFound):
        store.get_run(10**12)


def test_runs_are_paged_newest_by_fire_then_attempt_across_a_retry_and_a_backfill(
    store: Store,
) -> None:
    """A retry follows its first attempt and a backfilled old fire comes at
    its fire time, though both were claimed later; pages from a cursor
    give every run once, in that order."""
    job, _ = store.submit_job(interval_job())

    def claimed(fire: int, fence: int, attempt: int = 0) -> int:
        [out] = store.claim_fires(
            [claim(job.job_id, fire, attempt=attempt, fence=fence, advance=False)]
        )
        assert out.run_id is not None
        return out.run_id

    first = [claimed(60_000 * k, fence=k) for k in range(1, 5)]  # fires 1-4
    failed = Completion(run_id=first[1], fence=2, state=RunState.FAILED, finished_at_ms=200_000)
    store.complete_runs([failed])
    retry = claimed(120_000, fence=5, attempt=1)  # fire 2 again
    backfilled = claimed(30_000, fence=6)  # older than every fire
    latest = claimed(300_000, fence=7)  # fire 5
    newest_first = [latest, first[3], first[2], retry, first[1], first[0], backfilled]
    assert [r.run_id for r in store.list_runs(job.job_id)] == newest_first
    pages, before = [], None
    while True:
        page = store.list_runs(job.job_id, before_run_id=before, limit=2)
        if not page:
            break
        pages.append([r.run_id for r in page])
        before = page[-1].run_id
    assert pages == [newest_first[i : i + 2] for i in range(0, 7, 2)]
    # A cursor whose run went (retention): the runs claimed before it.
    store.complete_runs([done(first[2], 3)])  # ended at 99_000
    assert store.purge_history(100_000) == 1
    below_gone = store.list_runs(job.job_id, before_run_id=first[2])
    assert [r.run_id for r in below_gone] == [first[1], first[0]]


def test_runs_of_fires_are_every_attempt_of_those_fires_only(store: Store) -> None:
    job, _ = store.submit_job(interval_job())
    outs = store.claim_fires(
        [claim(job.job_id, 60_000 * k, fence=k, advance=False) for k in (1, 2, 3)]
    )
    runs = [o.run_id for o in outs]
    assert runs[1] is not None
    store.complete_runs([done(runs[1], 2, RunState.FAILED)])
    [retry] = store.claim_fires([claim(job.job_id, 120_000, attempt=1, fence=4, advance=False)])
    got = store.runs_of_fires(job.job_id, [180_000, 120_000, 999_000])
    assert [(r.scheduled_for, r.attempt, r.run_id) for r in got] == [
        (120_000, 0, runs[1]),
        (120_000, 1, retry.run_id),
        (180_000, 0, runs[2]),
    ]
    assert store.runs_of_fires(job.job_id, []) == []
    assert store.runs_of_fires(job.job_id + 1, [120_000]) == []


# -- a dispatch-loop batch -----------------------------------------------------------


def test_a_batch_applies_its_kinds_in_order(store: Store) -> None:
    """Completions, missed fires, advances, claims, starts: the advance a
    claim expects comes first, and every kind answers in the batch's order."""
    ran, failed = dispatched(store, "ran", fence=1)
    _, acked = dispatched(store, "acked", fence=2)
    skips, _ = store.submit_job(interval_job("skips", next_run_at=60_000))
    outcome = store.write_batch(
        WriteBatch(
            completions=[done(failed, 1, RunState.FAILED)],
            missed=[
                MissedFire(
                    job_id=skips.job_id,
                    scheduled_for=60_000,
                    reason=MissedReason.OVERLAP,
                    recorded_at_ms=61_000,
                )
            ],
            advances=[
                ScheduleAdvance(
                    job_id=skips.job_id, expected_next_run_at=60_000, new_next_run_at=120_000
                )
            ],
            claims=[
                claim(skips.job_id, 120_000, fence=3, expected=120_000, new=180_000),
                claim(ran.job_id, 60_000, attempt=1, fence=4, advance=False),
            ],
            starts=[RunStart(run_id=acked, fence=2, worker_id="w-2", started_at_ms=61_000)],
        )
    )
    assert [c.applied for c in outcome.completions] == [True]
    assert [(c.run_id is not None, c.advanced) for c in outcome.claims] == [
        (True, True),
        (True, False),
    ]
    assert store.get_job(skips.job_id).next_run_at == 180_000
    assert [m.scheduled_for for m in store.list_missed(skips.job_id)] == [60_000]
    assert store.get_run(failed).state is RunState.FAILED
    assert store.get_run(acked).state is RunState.RUNNING


def test_a_batch_written_again_reports_what_its_first_write_applied(store: Store) -> None:
    """The node writes a whole batch again when writing it failed, after some
    of it may have committed (PostgreSQL commits a batch's kinds apart, and
    a lost COMMIT leaves any store unsure). The second write must report the
    first one's claims as won, with their runs, and its starts and
    completions as applied: a claim reported lost would be dropped by the
    owner while its run sat dispatched in the store, and a failed run's
    completion reported superseded would never be retried."""
    a, _ = store.submit_job(interval_job("a", next_run_at=60_000))
    _, ran_b = dispatched(store, "b", fence=1)
    _, ran_c = dispatched(store, "c", fence=2)
    batch = WriteBatch(
        completions=[done(ran_b, 1, RunState.FAILED)],
        claims=[
            claim(a.job_id, 60_000, fence=3, new=120_000),
            claim(a.job_id, 120_000, fence=4, new=180_000),
        ],
        starts=[RunStart(run_id=ran_c, fence=2, worker_id="w-1", started_at_ms=60_500)],
    )
    first = store.write_batch(batch)
    again = store.write_batch(batch)
    assert all(o.run_id is not None and o.advanced for o in first.claims)
    assert [o.run_id for o in again.claims] == [o.run_id for o in first.claims]
    # Where the schedule stands: the job's last claim moved it. An earlier
    # one of the same job reads as not moved, and the owner re-reads the job.
    assert [o.advanced for o in again.claims] == [False, True]
    assert [o.applied for o in again.completions] == [True]
    assert len(store.list_runs(a.job_id)) == 2
    assert store.get_job(a.job_id).next_run_at == 180_000
    assert store.get_run(ran_b).state is RunState.FAILED
    assert store.mark_running(batch.starts) == [True]
    # A write of the same run that differs from the one recorded is still
    # refused, and so is a repeat inside one batch.
    other = Completion(run_id=ran_b, fence=1, state=RunState.SUCCEEDED, finished_at_ms=62_000)
    assert [o.applied for o in store.complete_runs([other])] == [False]
    assert store.mark_running([*batch.starts, *batch.starts]) == [True, False]
    late = RunStart(run_id=ran_c, fence=2, worker_id="w-2", started_at_ms=60_500)
    assert store.mark_running([late]) == [False]
    # A claim of the same fire attempt with another fence is not ours.
    [rival] = store.claim_fires([claim(a.job_id, 60_000, fence=9, new=999_000)])
    assert rival.run_id is None and not rival.advanced


# -- missed fires ----------------------------------------------------------------------


def test_missed_fires_are_recorded_once_and_listed_newest_first(store: Store) -> None:
    job, _ = store.submit_job(interval_job())
    store.record_missed(
        [
            MissedFire(
                job_id=job.job_id, scheduled_for=t, reason=MissedReason.OVERLAP, recorded_at_ms=t
            )
            for t in (1_000, 2_000, 3_000)
        ]
    )
    store.record_missed(
        [
            MissedFire(
                job_id=job.job_id,
                scheduled_for=2_000,
                reason=MissedReason.PAUSED,
                recorded_at_ms=9,
            )
        ]
    )
    missed = store.list_missed(job.job_id)
    assert [(m.scheduled_for, m.reason) for m in missed] == [
        (3_000, MissedReason.OVERLAP),
        (2_000, MissedReason.OVERLAP),
        (1_000, MissedReason.OVERLAP),
    ]
    assert [m.scheduled_for for m in store.list_missed(job.job_id, before_scheduled_for=3_000)] == [
        2_000,
        1_000,
    ]


def test_fires_exist_sees_runs_and_missed_fires(store: Store) -> None:
    job, _ = store.submit_job(interval_job())
    store.claim_fires([claim(job.job_id, 60_000, new=120_000)])
    store.record_missed(
        [
            MissedFire(
                job_id=job.job_id,
                scheduled_for=180_000,
                reason=MissedReason.SKIPPED,
                recorded_at_ms=1,
            )
        ]
    )
    assert store.fires_exist(job.job_id, [60_000, 120_000, 180_000]) == {60_000, 180_000}
    assert store.fires_exist(job.job_id, []) == set()


# -- ownership ---------------------------------------------------------------------------


def test_epochs_strictly_increase_per_shard(store: Store) -> None:
    first = store.acquire_epochs([0, 5, 255], "node-a")
    second = store.acquire_epochs([5, 7], "node-b")
    assert first == {0: 1, 5: 1, 255: 1}
    assert second == {5: 2, 7: 1}
    assert store.acquire_epochs([5], "node-a") == {5: 3}
    with pytest.raises(InvalidArgument):
        store.acquire_epochs([SHARD_COUNT], "node-a")


def test_fence_shards_raises_epochs_never_lowers_them_and_says_where_they_stand(
    store: Store,
) -> None:
    assert store.shard_epochs([3, 9]) == {}
    assert store.fence_shards({3: 5, 9: 2}, "node-a") == {3: 5, 9: 2}
    # An older fence comes late: the newer owner's epoch stays, and the answer shows it.
    assert store.fence_shards({3: 4, 9: 7}, "node-b") == {3: 5, 9: 7}
    assert store.fence_shards({3: 5}, "node-a") == {3: 5}  # the same again: a no-op
    assert store.shard_epochs([3, 9, 10]) == {3: 5, 9: 7}
    with pytest.raises(InvalidArgument):
        store.fence_shards({SHARD_COUNT: 1}, "node-a")


def test_release_unsent_marks_the_owner_s_unsent_runs_of_its_epoch_only(store: Store) -> None:
    epoch = 3
    every = range(SHARD_COUNT)
    store.fence_shards(dict.fromkeys(every, epoch), "node-a")
    fence = (epoch << 32) | 1
    _, unsent = dispatched(store, "unsent", fence)
    _, sent = dispatched(store, "sent", fence)  # sent to a worker, not acked yet
    _, acked = dispatched(store, "acked", fence)
    _, older = dispatched(store, "older", ((epoch - 1) << 32) | 9)  # adopted from before
    start = RunStart(run_id=acked, fence=fence, worker_id="w-1", started_at_ms=61_000)
    assert store.mark_running([start]) == [True]

    assert store.release_unsent(every, [sent]) == 1
    assert store.get_run(unsent).worker_id == ""
    assert store.get_run(sent).worker_id is None
    assert store.get_run(acked).worker_id == "w-1"
    assert store.get_run(older).worker_id is None
    # Once a newer owner fenced the shards, the old one marks nothing more.
    _, again = dispatched(store, "again", fence)
    store.fence_shards(dict.fromkeys(every, epoch + 1), "node-b")
    assert store.release_unsent(every, []) == 0
    assert store.get_run(again).worker_id is None
    # The next owner takes the mark, once.
    assert store.take_unsent([unsent, sent, again]) == {unsent}
    assert store.get_run(unsent).worker_id is None
    assert store.take_unsent([unsent]) == set()


# -- the epoch check of a batch (seed C4) ---------------------------------------------


@dataclass(frozen=True)
class ShardWork:
    """Two jobs of one shard, each with its 60_000 fire claimed (schedules at
    120_000): what a batch writes about the shard, one write of each kind."""

    shard: int
    ran: JobRecord  # its run completes; its 120_000 fire is missed and skipped
    runs: JobRecord  # its run starts; its 120_000 fire is claimed
    ran_run: int
    runs_run: int

    def batch(self, fence: int) -> WriteBatch:
        """The shard's writes, ``fence`` that of its new claim."""
        return WriteBatch(
            completions=[done(self.ran_run, 1)],
            missed=[
                MissedFire(
                    job_id=self.ran.job_id,
                    scheduled_for=120_000,
                    reason=MissedReason.OVERLAP,
                    recorded_at_ms=121_000,
                )
            ],
            advances=[
                ScheduleAdvance(
                    job_id=self.ran.job_id, expected_next_run_at=120_000, new_next_run_at=180_000
                )
            ],
            claims=[claim(self.runs.job_id, 120_000, fence=fence, new=180_000)],
            starts=[RunStart(run_id=self.runs_run, fence=2, worker_id="w-1", started_at_ms=61_000)],
        )

    def untouched(self, store: Store) -> None:
        """Nothing of ``batch`` reached the store."""
        assert store.get_run(self.ran_run).state is RunState.DISPATCHED
        assert store.list_missed(self.ran.job_id) == []
        assert store.get_job(self.ran.job_id).next_run_at == 120_000
        assert [r.run_id for r in store.list_runs(self.runs.job_id)] == [self.runs_run]
        assert store.get_job(self.runs.job_id).next_run_at == 120_000
        started = store.get_run(self.runs_run)
        assert (started.state, started.worker_id) == (RunState.DISPATCHED, None)

    def written(self, store: Store) -> None:
        """All of ``batch`` reached the store."""
        assert store.get_run(self.ran_run).state is RunState.SUCCEEDED
        assert [m.scheduled_for for m in store.list_missed(self.ran.job_id)] == [120_000]
        assert store.get_job(self.ran.job_id).next_run_at == 180_000
        assert len(store.list_runs(self.runs.job_id)) == 2
        assert store.get_job(self.runs.job_id).next_run_at == 180_000
        assert store.get_run(self.runs_run).state is RunState.RUNNING


def work_in_shards(store: Store, count: int) -> list[ShardWork]:
    """``ShardWork`` in ``count`` shards: consecutive job ids spread over
    the shards, so enough jobs are submitted for some shards to get two."""
    submitted = store.submit_jobs([interval_job(f"j{i}", next_run_at=60_000) for i in range(300)])
    by_shard: dict[int, list[JobRecord]] = {}
    for s in submitted:
        assert not isinstance(s, Exception)
        by_shard.setdefault(s.job.shard, []).append(s.job)
    pairs = [(shard, jobs[:2]) for shard, jobs in sorted(by_shard.items()) if len(jobs) >= 2]
    assert len(pairs) >= count
    out = []
    for shard, (ran, runs) in pairs[:count]:
        claimed = store.claim_fires(
            [
                claim(ran.job_id, 60_000, fence=1, new=120_000),
                claim(runs.job_id, 60_000, fence=2, new=120_000),
            ]
        )
        ran_run, runs_run = (o.run_id for o in claimed)
        assert ran_run is not None and runs_run is not None
        out.append(ShardWork(shard, ran, runs, ran_run, runs_run))
    return out


def one_batch(parts: Sequence[WriteBatch], epochs: dict[int, int] | None) -> WriteBatch:
    return WriteBatch(
        completions=[c for p in parts for c in p.completions],
        missed=[m for p in parts for m in p.missed],
        advances=[a for p in parts for a in p.advances],
        claims=[c for p in parts for c in p.claims],
        starts=[s for p in parts for s in p.starts],
        epochs=epochs,
    )


def test_a_batch_from_an_older_epoch_than_its_shard_s_is_refused_for_that_shard_only(
    store: Store,
) -> None:
    """Seed C4: a node that lost shard A to a newer owner writes a batch for
    A and B. Nothing of A's part reaches the store -- no run created, no
    schedule moved, no missed fire recorded, no run started or ended -- its
    claims come back unwon and its completions unapplied; B's part is
    written; ``fenced`` names A."""
    a, b = work_in_shards(store, 2)
    store.fence_shards({a.shard: 1, b.shard: 1}, "node-old")
    assert store.fence_shards({a.shard: 2}, "node-new") == {a.shard: 2}
    out = store.write_batch(
        one_batch([a.batch(fence=3), b.batch(fence=4)], {a.shard: 1, b.shard: 1})
    )
    assert out.fenced == {a.shard}
    won = [(c.claim.fence, c.run_id is not None, c.advanced) for c in out.claims]
    assert won == [(3, False, False), (4, True, True)]
    assert [(c.run_id, c.applied) for c in out.completions] == [
        (a.ran_run, False),
        (b.ran_run, True),
    ]
    a.untouched(store)
    b.written(store)
    # The new owner writes the same about A under its epoch: all of it goes in.
    out = store.write_batch(one_batch([a.batch(fence=5)], {a.shard: 2, b.shard: 1}))
    assert out.fenced == frozenset()
    assert [c.run_id is not None and c.advanced for c in out.claims] == [True]
    assert [c.applied for c in out.completions] == [True]
    a.written(store)


def test_fenced_names_every_shard_whose_epoch_is_newer_than_the_writers(store: Store) -> None:
    """Also a shard the batch has nothing for: the writer learns every shard
    it lost at once."""
    [a] = work_in_shards(store, 1)
    quiet = (a.shard + 1) % SHARD_COUNT
    store.fence_shards({a.shard: 1, quiet: 1}, "node-old")
    store.fence_shards({a.shard: 4, quiet: 3}, "node-new")
    out = store.write_batch(one_batch([a.batch(fence=3)], {a.shard: 3, quiet: 2}))
    assert out.fenced == {a.shard, quiet}
    a.untouched(store)


def test_a_writer_at_the_current_epoch_writes_everything(store: Store) -> None:
    """Epochs as the store has them, or for a shard never fenced (no epoch
    stored), are current: nothing is refused."""
    a, b = work_in_shards(store, 2)
    store.fence_shards({a.shard: 7}, "node-a")
    out = store.write_batch(
        one_batch([a.batch(fence=3), b.batch(fence=4)], {a.shard: 7, b.shard: 1})
    )
    assert out.fenced == frozenset()
    assert all(c.run_id is not None and c.advanced for c in out.claims)
    assert all(c.applied for c in out.completions)
    a.written(store)
    b.written(store)


def test_writes_about_a_shard_the_writer_does_not_hold_are_refused(store: Store) -> None:
    """A shard missing from the batch's epochs is refused like a fenced one,
    fenced by a newer owner or never fenced at all."""
    a, b, c = work_in_shards(store, 3)
    store.fence_shards({a.shard: 1, c.shard: 1}, "node-a")
    out = store.write_batch(
        one_batch([a.batch(fence=3), b.batch(fence=4), c.batch(fence=5)], {c.shard: 1})
    )
    assert out.fenced == {a.shard, b.shard}
    assert [o.run_id is not None for o in out.claims] == [False, False, True]
    assert [o.applied for o in out.completions] == [False, False, True]
    a.untouched(store)
    b.untouched(store)
    c.written(store)


def test_a_batch_without_epochs_is_not_checked(store: Store) -> None:
    """``epochs=None``: tools and tests writing outside any owner."""
    [a] = work_in_shards(store, 1)
    store.fence_shards({a.shard: 9}, "node-a")
    out = store.write_batch(a.batch(fence=3))
    assert out.fenced == frozenset()
    a.written(store)


def test_load_shards_returns_live_jobs_and_inflight_runs_of_those_shards(store: Store) -> None:
    jobs = [store.submit_job(interval_job(f"j{i}"))[0] for i in range(30)]
    mine = {jobs[0].shard, jobs[1].shard, jobs[2].shard}
    store.set_job_state(jobs[1].job_id, JobState.PAUSED, next_run_at=None, now_ms=2)
    store.set_job_state(jobs[2].job_id, JobState.CANCELLED, next_run_at=None, now_ms=2)
    outs = store.claim_fires([claim(j.job_id, 60_000, fence=1, new=120_000) for j in jobs])
    finished = outs[0].run_id
    assert finished is not None
    store.complete_runs([done(finished, 1)])
    load = store.load_shards(mine)
    expected_jobs = [j.job_id for j in jobs if j.shard in mine and j is not jobs[2]]
    assert [j.job_id for j in load.jobs] == expected_jobs
    assert {j.state for j in load.jobs} <= {JobState.ACTIVE, JobState.PAUSED}
    expected_runs = sorted(
        o.run_id or 0
        for o, j in zip(outs, jobs, strict=True)
        if j.shard in mine and o.run_id != finished
    )
    assert [r.run_id for r in load.inflight] == expected_runs
    assert all(r.state is RunState.DISPATCHED for r in load.inflight)


def test_load_shards_packed_gives_the_jobs_their_row_arms_as_columns(store: Store) -> None:
    jobs = [store.submit_job(interval_job(f"j{i}"))[0] for i in range(6)]
    store.submit_job(once_job())
    store.set_job_state(jobs[1].job_id, JobState.PAUSED, next_run_at=None, now_ms=2)
    store.set_job_state(jobs[2].job_id, JobState.ACTIVE, next_run_at=None, now_ms=2)
    store.set_job_state(jobs[3].job_id, JobState.CANCELLED, next_run_at=None, now_ms=2)
    shards = range(SHARD_COUNT)
    parsed = store.load_shards(shards)
    load = store.load_shards(shards, packed=True)
    # Active with no next fire: only its spec can say what arms it.
    assert [j.job_id for j in load.jobs] == [jobs[2].job_id]
    live = {j.job_id: j for j in parsed.jobs}
    rows = load.packed
    assert rows is not None
    assert sorted(rows.job_id.tolist()) == sorted(set(live) - {jobs[2].job_id})
    for i, job_id in enumerate(rows.job_id.tolist()):
        record = live[job_id]
        assert bool(rows.paused[i]) == (record.state is JobState.PAUSED)
        nxt = int(rows.next_run_at[i])
        assert (None if nxt == NO_FIRE else nxt) == record.next_run_at
        assert bool(rows.has_payload[i]) == bool(record.spec.payload)
        # Its profile and parameter say everything of its spec but its name
        # and payload.
        template = template_of_body(load.profiles[int(rows.profile_id[i])])
        assert profile_of(template).profile_id == int(rows.profile_id[i])
        spec = join_spec(template, int(rows.param[i]))
        assert spec == replace(record.spec, name="", payload=b"")
    assert load.inflight == parsed.inflight


def test_a_load_due_first_and_its_rest_make_up_the_whole_load(store: Store) -> None:
    """A gain due first: the rows due by the bound (with the parsed jobs and
    the runs in flight), then the others (paused or due later, no runs):
    together the packed rows of one whole load, each once."""
    jobs = [store.submit_job(interval_job(f"d{i}", next_run_at=60_000 * i))[0] for i in range(1, 9)]
    store.set_job_state(jobs[0].job_id, JobState.PAUSED, next_run_at=None, now_ms=2)
    store.set_job_state(jobs[1].job_id, JobState.ACTIVE, next_run_at=None, now_ms=2)
    store.set_job_state(jobs[7].job_id, JobState.CANCELLED, next_run_at=None, now_ms=2)
    [out] = store.claim_fires([claim(jobs[2].job_id, 180_000, new=600_000)])
    shards = sorted({j.shard for j in jobs})
    whole = store.load_shards(shards, packed=True)
    bound = 300_000
    due = store.load_shards(shards, packed=True, due_by=bound)
    later = store.load_shards(shards, packed=True, later_than=bound)

    def rows(r: PackedRows | None) -> dict[int, tuple[bool, int]]:
        assert r is not None
        return {
            int(j): (bool(paused), int(n))
            for j, paused, n in zip(r.job_id, r.paused, r.next_run_at, strict=True)
        }

    first, rest, every = rows(due.packed), rows(later.packed), rows(whole.packed)
    assert first.keys().isdisjoint(rest.keys())
    assert {**first, **rest} == every
    assert all(not paused and n <= bound for paused, n in first.values())
    assert all(paused or n > bound for paused, n in rest.values())
    assert jobs[3].job_id in first and jobs[0].job_id in rest and jobs[2].job_id in rest
    # The first part carries what the rows cannot say, and the runs.
    assert [j.job_id for j in due.jobs] == [jobs[1].job_id] == [j.job_id for j in whole.jobs]
    assert [r.run_id for r in due.inflight] == [out.run_id]
    assert later.jobs == [] and later.inflight == []
    with pytest.raises(InvalidArgument):
        store.load_shards(shards, due_by=bound)


def test_a_load_due_first_splits_at_its_bound_across_due_buckets(store: Store) -> None:
    """The bound splits exactly, wherever it falls among the coarse due
    buckets a store may index: a job due in an earlier bucket, at the bound,
    just after it, and in the next bucket."""
    edge = 5 << 20
    bound = edge + 10
    times = [edge - 1, edge, bound, bound + 1, edge + (1 << 20), 3]
    jobs = [store.submit_job(interval_job(f"b{i}", next_run_at=t))[0] for i, t in enumerate(times)]
    shards = sorted({j.shard for j in jobs})
    due = store.load_shards(shards, packed=True, due_by=bound)
    later = store.load_shards(shards, packed=True, later_than=bound)
    assert due.packed is not None and later.packed is not None
    assert sorted(due.packed.next_run_at.tolist()) == [3, edge - 1, edge, bound]
    assert sorted(later.packed.next_run_at.tolist()) == [bound + 1, edge + (1 << 20)]


def test_changed_rows_and_job_rows_give_the_change_feeds_jobs_as_rows(store: Store) -> None:
    """What a running owner reads: the change feed's jobs with no spec, each
    by its profile, schedule parameter and whether it has a payload."""
    shards = range(SHARD_COUNT)
    start = store.load_shards(shards).watermark
    jobs = [store.submit_job(interval_job(f"r{i}", next_run_at=60_000 + i))[0] for i in range(3)]
    once, _ = store.submit_job(once_job())
    store.set_job_state(jobs[1].job_id, JobState.PAUSED, next_run_at=None, now_ms=5)
    expected = {r.job_id: r for r in (store.get_job(j.job_id) for j in [*jobs, once])}
    rows: dict[int, JobRow] = {}
    profiles: dict[int, str] = {}
    mark = start
    deadline = time.monotonic() + 10
    while len(rows) < len(expected) and time.monotonic() < deadline:
        page = store.changed_rows(mark, shards)
        rows.update((r.job_id, r) for r in page.rows)
        profiles.update(page.profiles)
        assert page.jobs == []  # every job has a profile
        mark = page.watermark
    by_id = store.job_rows([*expected, 987_654_321])
    assert {r.job_id: r for r in by_id.rows} == rows
    for job_id, record in expected.items():
        row = rows[job_id]
        assert (row.state, row.next_run_at) == (record.state, record.next_run_at)
        assert row.has_payload == bool(record.spec.payload)
        template = template_of_body(profiles[row.profile_id])
        assert join_spec(template, row.param) == replace(record.spec, name="", payload=b"")
        assert by_id.profiles[row.profile_id] == profiles[row.profile_id]


def test_a_won_claim_reads_its_jobs_payload_when_asked(store: Store) -> None:
    job, _ = store.submit_job(interval_job(next_run_at=60_000))
    plain, _ = store.submit_job(once_job(60_000))
    with_payload = replace(claim(job.job_id, 60_000, new=120_000), payload=True)
    without = claim(plain.job_id, 60_000)
    out = store.claim_fires([with_payload, without])
    assert [o.payload for o in out] == [b"\x00payload", b""]
    # An adopting owner reads the payloads of the runs in flight too.
    runs = {r.job_id: r.payload for r in store.inflight_runs(range(SHARD_COUNT))}
    assert runs == {job.job_id: b"\x00payload", plain.job_id: b""}
    assert store.get_job(job.job_id).spec.payload == b"\x00payload"


def test_a_claim_of_a_fire_held_by_another_run_still_moves_the_schedule(store: Store) -> None:
    """A trigger at the very instant of a scheduled fire holds that fire
    (the same job, instant and attempt): the scheduled claim loses, and the
    schedule moves past the fire all the same, or it would come due again
    and again."""
    job, _ = store.submit_job(interval_job(next_run_at=60_000))
    one, _ = store.submit_job(once_job(60_000))
    triggers = [
        claim(job.job_id, 60_000, fence=5, advance=False),
        claim(one.job_id, 60_000, fence=5, advance=False),
    ]
    assert all(o.run_id is not None for o in store.claim_fires(triggers))
    scheduled = [
        claim(job.job_id, 60_000, fence=6, new=120_000),
        claim(one.job_id, 60_000, fence=6),
    ]
    out = store.claim_fires(scheduled)
    assert [(o.run_id, o.advanced) for o in out] == [(None, True), (None, True)]
    assert store.get_job(job.job_id).next_run_at == 120_000
    # A one-shot whose only fire is held is over: running until it ends.
    assert store.get_job(one.job_id).state is JobState.RUNNING
    # Moved already: another try moves nothing.
    again = store.claim_fires([claim(job.job_id, 60_000, fence=7, new=120_000)])
    assert [(o.run_id, o.advanced) for o in again] == [(None, False)]


def test_changes_since_reports_every_kind_of_change_after_a_load(store: Store) -> None:
    job, _ = store.submit_job(interval_job(next_run_at=60_000))
    shards = range(SHARD_COUNT)
    load = store.load_shards(shards)
    mark = load.watermark
    # What the load saw may come back once more: on PostgreSQL a transaction
    # elsewhere in the cluster, open when the load's snapshot was taken, holds
    # the load's watermark below the job's change. A repeat of the loaded state
    # is allowed; anything else is a change the test did not make.
    loaded = (job.job_id, JobState.ACTIVE, 60_000)

    def changes(expect: int = 1) -> list[tuple[int, JobState, int | None]]:
        # PostgreSQL hands out a change once every older transaction in the
        # cluster has finished; other sessions on the shared server may delay it.
        nonlocal mark
        seen: list[tuple[int, JobState, int | None]] = []
        deadline = time.monotonic() + 10
        while True:
            got, mark = store.changes_since(mark, shards)
            seen += [(j.job_id, j.state, j.next_run_at) for j in got]
            seen = [change for change in seen if change != loaded]
            if len(seen) >= expect or time.monotonic() > deadline:
                return seen
            time.sleep(0.02)

    assert changes(expect=0) == []
    other, _ = store.submit_job(interval_job("other"))
    assert changes() == [(other.job_id, JobState.ACTIVE, 60_000)]
    store.claim_fires([claim(job.job_id, 60_000, new=120_000)])
    assert changes() == [(job.job_id, JobState.ACTIVE, 120_000)]
    store.set_job_state(job.job_id, JobState.PAUSED, next_run_at=None, now_ms=5)
    assert changes() == [(job.job_id, JobState.PAUSED, None)]
    store.set_job_state(job.job_id, JobState.ACTIVE, next_run_at=240_000, now_ms=6)
    store.set_job_state(other.job_id, JobState.CANCELLED, next_run_at=None, now_ms=6)
    assert sorted(changes(expect=2)) == sorted(
        [(job.job_id, JobState.ACTIVE, 240_000), (other.job_id, JobState.CANCELLED, None)]
    )
    # A stale CAS changes nothing and reports nothing.
    store.claim_fires([claim(job.job_id, 60_000, attempt=1, expected=60_000, new=1)])
    store.set_job_state(other.job_id, JobState.CANCELLED, next_run_at=None, now_ms=7)
    assert changes() == [(other.job_id, JobState.CANCELLED, None)]


def test_changes_since_can_leave_out_the_owner_s_own_schedule_moves(store: Store) -> None:
    shards = range(SHARD_COUNT)
    job, _ = store.submit_job(interval_job(next_run_at=60_000))

    def settled() -> int:
        # A watermark past the job's last change through the API. On PostgreSQL
        # a transaction anywhere in the cluster that began before that change
        # and is still open (another test's, beside this one) holds the
        # watermark below it, and the job would come back as a change. A write
        # after it moves a store's marker past it (the job is the one watched).
        store.submit_job(interval_job(f"after-{time.monotonic_ns()}"))
        deadline = time.monotonic() + 60
        while True:
            got = store.load_shards(shards).watermark
            if got > store.get_job(job.job_id).change or time.monotonic() > deadline:
                return got
            time.sleep(0.01)

    mark = settled()

    def changes(owner_moves: bool, expect: int) -> list[tuple[int, int | None]]:
        seen: list[tuple[int, int | None]] = []
        got_mark = mark
        deadline = time.monotonic() + 10
        while True:
            got, got_mark = store.changes_since(got_mark, shards, owner_moves=owner_moves)
            seen += [(j.job_id, j.next_run_at) for j in got if j.job_id == job.job_id]
            if len(seen) >= expect or time.monotonic() > deadline:
                return seen

    store.claim_fires([claim(job.job_id, 60_000, new=120_000)])
    store.advance_schedules(
        [ScheduleAdvance(job_id=job.job_id, expected_next_run_at=120_000, new_next_run_at=180_000)]
    )
    # A restarting owner sees its predecessor's moves; a running one does not.
    assert changes(owner_moves=True, expect=1) == [(job.job_id, 180_000)]
    assert changes(owner_moves=False, expect=0) == []
    # A change through the API is seen either way, even after owner moves.
    store.set_job_state(job.job_id, JobState.PAUSED, next_run_at=None, now_ms=9)
    assert changes(owner_moves=False, expect=1) == [(job.job_id, None)]
    # ... and an owner move after it does not hide it: a running owner that
    # had not read it yet still gets the job, as it is now.
    mark = settled()
    store.set_job_state(job.job_id, JobState.ACTIVE, next_run_at=240_000, now_ms=10)
    store.advance_schedules(
        [ScheduleAdvance(job_id=job.job_id, expected_next_run_at=240_000, new_next_run_at=300_000)]
    )
    assert changes(owner_moves=False, expect=1) == [(job.job_id, 300_000)]
    assert changes(owner_moves=True, expect=1) == [(job.job_id, 300_000)]


def test_a_write_stamps_the_jobs_it_changes_with_one_change_marker(store: Store) -> None:
    made = store.submit_jobs([interval_job("a"), interval_job("b", key="k"), interval_job("c")])
    records = [r.job for r in made if not isinstance(r, Exception)]
    assert len(records) == 3
    marker = records[0].change
    assert [r.change for r in records] == [marker] * 3
    assert [store.get_job(r.job_id).change for r in records] == [marker] * 3
    # The same key and body again: no write, the job as the first one left it.
    [again] = store.submit_jobs([interval_job("b", key="k")])
    assert not isinstance(again, Exception) and again == (records[1], False)
    later, _ = store.submit_job(interval_job("d"))
    assert later.change > marker
    paused = store.set_job_state(records[0].job_id, JobState.PAUSED, next_run_at=None, now_ms=5)
    assert paused.change > later.change
    assert store.get_job(records[0].job_id).change == paused.change
    # An owner's schedule move is not a change through the API.
    store.claim_fires([claim(records[1].job_id, 60_000, new=120_000)])
    assert store.get_job(records[1].job_id).change == marker


def test_changes_since_leaves_out_the_callers_own_writes(store: Store) -> None:
    """A node passes back the markers of its own submits and state changes:
    it has those jobs already. What others changed still comes, the jobs
    the node wrote included, and the watermark moves past what was left out."""
    mark = store.load_shards(range(SHARD_COUNT)).watermark
    made = store.submit_jobs([interval_job("a"), interval_job("b")])
    mine = [r.job for r in made if not isinstance(r, Exception)]
    theirs, _ = store.submit_job(interval_job("c"))
    paused = store.set_job_state(mine[0].job_id, JobState.PAUSED, next_run_at=None, now_ms=5)
    own = {mine[0].change, paused.change}
    # Another writer resumes b, which this caller submitted.
    resumed = store.set_job_state(mine[1].job_id, JobState.ACTIVE, next_run_at=120_000, now_ms=6)
    got, mark = read_changes(store, mark, expect=2, owner_moves=False, exclude=own)
    assert sorted(j.job_id for j in got) == sorted([theirs.job_id, resumed.job_id])
    # The same with owner moves, and one of them after the caller's pause of
    # a: the move is not the caller's, so a comes as it is now.
    store.advance_schedules(
        [ScheduleAdvance(job_id=mine[0].job_id, expected_next_run_at=None, new_next_run_at=9)]
    )
    got, mark = read_changes(store, mark, expect=1, exclude=own)
    assert [(j.job_id, j.next_run_at) for j in got] == [(mine[0].job_id, 9)]
    # Nothing below the watermark comes again, left out or not.
    assert store.changes_since(mark, range(SHARD_COUNT)).jobs == []


def test_changes_since_filters_shards_and_pages_without_losing_changes(store: Store) -> None:
    jobs = [store.submit_job(interval_job(f"j{i}"))[0] for i in range(25)]
    # One transaction changes many jobs: a page must not split it unsafely.
    store.claim_fires([claim(j.job_id, 60_000, new=120_000) for j in jobs[:15]])
    shards = {j.shard for j in jobs[::2]}
    expected = {j.job_id for j in jobs if j.shard in shards}
    seen: set[int] = set()
    mark = 0
    deadline = time.monotonic() + 10
    while seen != expected and time.monotonic() < deadline:
        page, new_mark = store.changes_since(mark, shards, limit=4)
        assert new_mark >= mark
        assert len(page) <= 4 or len({j.updated_at_ms for j in page}) == 1
        assert all(j.shard in shards for j in page)
        seen |= {j.job_id for j in page}
        mark = new_mark
    assert seen == expected


# -- retention ---------------------------------------------------------------------------


def test_purge_history_deletes_only_old_terminal_rows(store: Store) -> None:
    job, _ = store.submit_job(interval_job())
    outs = store.claim_fires(
        [claim(job.job_id, 60_000 * k, fence=k, advance=False) for k in range(1, 8)]
    )
    ids = [o.run_id for o in outs]
    assert all(i is not None for i in ids)
    old = [
        Completion(run_id=i, fence=k, state=RunState.SUCCEEDED, finished_at_ms=1_000)
        for k, i in enumerate(ids[:5], start=1)
        if i is not None
    ]
    store.complete_runs(old)
    late = ids[5]
    assert late is not None
    store.complete_runs(
        [Completion(run_id=late, fence=6, state=RunState.FAILED, finished_at_ms=9_000)]
    )
    store.record_missed(
        [
            MissedFire(
                job_id=job.job_id, scheduled_for=t, reason=MissedReason.SKIPPED, recorded_at_ms=t
            )
            for t in (500, 1_500, 8_000)
        ]
    )
    assert store.purge_history(5_000, batch=2) == 5 + 2
    left = {r.run_id for r in store.list_runs(job.job_id)}
    assert left == {ids[5], ids[6]}  # the late one and the one still in flight
    assert [m.scheduled_for for m in store.list_missed(job.job_id)] == [8_000]


def test_purge_steps_delete_exactly_what_is_past_the_horizon(store: Store) -> None:
    """Terminal runs finished before the cutoff and missed fires recorded
    before it go, each step a transaction of its own; runs in flight, however
    old, and anything at or after the cutoff stay."""
    job, _ = store.submit_job(interval_job())
    fires = [60_000 * k for k in range(1, 41)]
    outs = store.claim_fires(
        [claim(job.job_id, f, fence=k, advance=False) for k, f in enumerate(fires, start=1)]
    )
    runs = [o.run_id for o in outs]
    assert all(r is not None for r in runs)
    terminal = [s for s in RunState if s not in (RunState.DISPATCHED, RunState.RUNNING)]
    finished: dict[int, int] = {}  # run -> finished_at, for the 30 that ended
    completions = []
    for k, run in enumerate(runs[:30], start=1):
        assert run is not None
        finished[run] = 100 * k  # 100 .. 3_000
        completions.append(
            Completion(
                run_id=run,
                fence=k,
                state=terminal[k % len(terminal)],
                finished_at_ms=100 * k,
                error=None if k % 2 else "boom",
            )
        )
    assert all(o.applied for o in store.complete_runs(completions))
    store.record_missed(
        [
            MissedFire(
                job_id=job.job_id,
                scheduled_for=5_000_000 + t,
                reason=MissedReason.OVERLAP,
                recorded_at_ms=t,
            )
            for t in range(0, 3_000, 150)
        ]
    )
    cutoff = 1_500  # runs that finished at 100 .. 1_400 and missed fires 0 .. 1_350 go
    gone_runs = {r for r, at in finished.items() if at < cutoff}
    gone_missed = {5_000_000 + t for t in range(0, 3_000, 150) if t < cutoff}
    steps = store.purge_steps(cutoff, batch=4)
    first = [next(steps) for _ in range(2)]
    del steps  # dropped half-way: what it deleted stays deleted
    deleted = sum(first) + sum(store.purge_steps(cutoff, batch=4))
    assert deleted == len(gone_runs) + len(gone_missed)
    left = {r.run_id for r in store.list_runs(job.job_id, limit=100)}
    assert left == {r for r in runs if r is not None} - gone_runs
    assert len(left) == 40 - len(gone_runs)  # the 10 in flight and the late finishers
    missed = {m.scheduled_for for m in store.list_missed(job.job_id, limit=100)}
    assert missed == {5_000_000 + t for t in range(0, 3_000, 150)} - gone_missed
    assert sum(store.purge_steps(cutoff, batch=4)) == 0  # nothing more past it
    assert store.purge_history(2**62) == len(finished) - len(gone_runs) + 20 - len(gone_missed)
    assert {r.state for r in store.list_runs(job.job_id, limit=100)} == {RunState.DISPATCHED}


def test_a_purge_pass_takes_the_steps_what_expired_needs_not_what_is_kept(store: Store) -> None:
    """Expired runs interleaved in run id with kept ones (late finishers and
    runs in flight): the expired go, the rest stay, and the pass takes as
    many steps as the expired rows fill, not as the table's rows do."""
    job, _ = store.submit_job(interval_job())
    outs = store.claim_fires(
        [claim(job.job_id, 60_000 * k, fence=k, advance=False) for k in range(1, 121)]
    )
    runs = [o.run_id for o in outs]
    assert all(r is not None for r in runs)
    expired: list[int] = []
    completions: list[Completion] = []
    for k, run in enumerate(runs, start=1):
        assert run is not None
        if k % 4 == 1:  # a quarter ends before the cutoff
            expired.append(run)
            completions.append(
                Completion(run_id=run, fence=k, state=RunState.SUCCEEDED, finished_at_ms=1_000 + k)
            )
        elif k % 4 != 0:  # half end after it; the last quarter is in flight
            completions.append(
                Completion(run_id=run, fence=k, state=RunState.SUCCEEDED, finished_at_ms=9_000 + k)
            )
    assert all(o.applied for o in store.complete_runs(completions))
    store.record_missed(
        [
            MissedFire(
                job_id=job.job_id,
                scheduled_for=10_000_000 + t,
                reason=MissedReason.OVERLAP,
                recorded_at_ms=t,
            )
            for t in range(0, 12_000, 200)  # 60, the first 25 before the cutoff
        ]
    )
    steps = list(store.purge_steps(5_000, batch=4))
    assert sum(steps) == len(expired) + 25
    # 30 expired runs and 25 missed fires fill 8 and 7 ranges of 4, and each
    # table may take one more to find its end; a walk of all 120 runs and 60
    # missed fires took 47.
    assert len(steps) <= 8 + 7 + 2, steps
    left = {r.run_id for r in store.list_runs(job.job_id, limit=200)}
    assert left == set(runs) - set(expired)
    assert len(store.list_missed(job.job_id, limit=200)) == 35


def test_ping_answers_while_the_store_is_there(store: Store) -> None:
    store.ping()


# -- a reference model -------------------------------------------------------------------

fire_times = st.sampled_from([60_000, 120_000, 180_000])
claim_ops = st.lists(
    st.tuples(
        st.integers(0, 2),  # job index
        fire_times,
        st.integers(0, 1),  # attempt
        st.sampled_from([None, 60_000, 120_000, 180_000]),  # expected
        st.booleans(),  # advance
    ),
    min_size=1,
    max_size=12,
)


@settings(
    deadline=None,
    max_examples=15,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(batches=st.lists(claim_ops, min_size=1, max_size=3))
def test_claims_match_a_reference_model(
    store: Store, batches: list[list[tuple[int, int, int, int | None, bool]]]
) -> None:
    jobs = [store.submit_job(interval_job(f"m{i}", next_run_at=60_000))[0].job_id for i in range(3)]
    # Each example gets fresh jobs; the model starts from their state.
    taken: set[tuple[int, int, int]] = set()
    schedule = dict.fromkeys(jobs, 60_000)
    fence = 0
    for batch in batches:
        claims = []
        for j, fire, attempt, expected, advance in batch:
            fence += 1
            claims.append(
                claim(
                    jobs[j],
                    fire,
                    attempt=attempt,
                    fence=fence,
                    expected=expected if expected is not None else fire,
                    new=fire + 60_000,
                    advance=advance,
                )
            )
        outs = store.claim_fires(claims)
        for c, o in zip(claims, outs, strict=True):
            key = (c.job_id, c.scheduled_for, c.attempt)
            wins = key not in taken
            taken.add(key)
            # Won or not (the fire held by another run), a claim moves its
            # schedule when it still stands at the claim's expected value.
            moves = c.advance and schedule[c.job_id] == c.expected_next_run_at
            if moves:
                assert c.new_next_run_at is not None
                schedule[c.job_id] = c.new_next_run_at
            assert (o.run_id is not None, o.advanced) == (wins, moves)
    for job_id, next_run_at in schedule.items():
        assert store.get_job(job_id).next_run_at == next_run_at


def test_inflight_runs_and_retry_candidates_tell_a_restarting_owner_what_was_pending(
    store: Store,
) -> None:
    shards = range(SHARD_COUNT)
    job, _ = store.submit_job(interval_job(next_run_at=60_000))
    first = store.claim_fires([claim(job.job_id, 60_000, new=120_000)])[0].run_id
    assert first is not None
    assert [r.run_id for r in store.inflight_runs(shards)] == [first]
    assert store.retry_candidates(shards) == []

    store.complete_runs([done(first, 1, RunState.FAILED)])
    assert store.inflight_runs(shards) == []
    pending = store.retry_candidates(shards)
    assert [(r.run_id, r.attempt, r.state) for r in pending] == [(first, 0, RunState.FAILED)]

    # Once the next attempt exists the failed one is no longer pending.
    retry = store.claim_fires([claim(job.job_id, 60_000, attempt=1, fence=2, advance=False)])
    assert retry[0].run_id is not None
    assert store.retry_candidates(shards) == []
    assert [r.attempt for r in store.inflight_runs(shards)] == [1]

    # A cancelled job's failed attempts are not retried.
    store.complete_runs([done(retry[0].run_id, 2, RunState.LOST)])
    assert [r.state for r in store.retry_candidates(shards)] == [RunState.LOST]
    store.set_job_state(job.job_id, JobState.CANCELLED, next_run_at=None, now_ms=7)
    assert store.retry_candidates(shards) == []


# -- spec updates and dead letters --------------------------------------------------


def spec_update(
    job: JobRecord, *, period_ms: int, next_run_at: int | None, key: str | None = None, **kw: object
) -> SpecUpdate:
    schedule = Interval(period_ms=period_ms)
    return SpecUpdate(
        job_id=job.job_id,
        spec=replace(job.spec, schedule=schedule, payload=b"new", tenant="other"),
        next_run_at=next_run_at,
        updated_at_ms=9_000,
        idempotency_key=key,
        body_hash=f"digest-{period_ms}",
        updated_by="acme/t-1",
        **kw,  # type: ignore[arg-type]
    )


def test_update_job_replaces_spec_and_schedule_in_one_change_and_records_it(
    store: Store,
) -> None:
    job, _ = store.submit_job(interval_job(next_run_at=60_000))
    mark = store.changes_since(0, range(SHARD_COUNT)).watermark
    updated = store.update_job(spec_update(job, period_ms=5_000, next_run_at=65_000))
    assert updated.applied
    after = updated.job
    assert after.job_id == job.job_id and after.spec.schedule.period_ms == 5_000  # type: ignore[union-attr]
    assert after.spec.payload == b"new" and after.spec.tenant == "acme"  # the tenant never moves
    assert (after.next_run_at, after.updated_at_ms) == (65_000, 9_000)
    assert store.get_job(job.job_id) == after
    # The owner reads the new spec and schedule together, as one change.
    [changed] = read_changes(store, mark, expect=1).jobs
    assert changed == after
    [row] = store.job_rows([job.job_id]).rows
    assert row.next_run_at == 65_000
    change = updated.change
    assert (change.version, change.updated_at_ms, change.updated_by) == (1, 9_000, "acme/t-1")
    assert change.old_spec.schedule == job.spec.schedule and change.new_spec == replace(
        after.spec, payload=b""
    )
    assert change.payload_changed
    second = store.update_job(spec_update(after, period_ms=7_000, next_run_at=67_000))
    assert second.change.version == 2
    assert [c.version for c in store.list_job_updates(job.job_id)] == [2, 1]
    assert [c.version for c in store.list_job_updates(job.job_id, before_version=2)] == [1]
    assert store.list_job_updates(job.job_id, limit=1) == [second.change]


def test_update_job_is_idempotent_by_key_per_job(store: Store) -> None:
    job, _ = store.submit_job(interval_job())
    first = store.update_job(spec_update(job, period_ms=5_000, next_run_at=65_000, key="k"))
    again = store.update_job(spec_update(job, period_ms=5_000, next_run_at=65_000, key="k"))
    assert not again.applied and again.change == first.change and again.job == first.job
    assert len(store.list_job_updates(job.job_id)) == 1
    with pytest.raises(AlreadyExists):
        store.update_job(spec_update(job, period_ms=6_000, next_run_at=66_000, key="k"))
    assert store.get_job(job.job_id) == first.job
    # The key is the job's own: another job may use it.
    other, _ = store.submit_job(interval_job("other"))
    assert store.update_job(spec_update(other, period_ms=6_000, next_run_at=1, key="k")).applied


def test_an_update_on_a_version_that_is_no_longer_the_newest_changes_nothing(
    store: Store,
) -> None:
    job, _ = store.submit_job(interval_job())
    first = store.update_job(
        spec_update(job, period_ms=5_000, next_run_at=65_000, key="a"), if_version=0
    )
    assert first.applied and first.change.version == 1
    # Computed from the job as it was before the first update: refused.
    with pytest.raises(FailedPrecondition, match="if_version"):
        store.update_job(spec_update(job, period_ms=6_000, next_run_at=66_000), if_version=0)
    assert store.get_job(job.job_id) == first.job
    assert [c.version for c in store.list_job_updates(job.job_id)] == [1]
    # The first update again by its key is the same update, not a new one.
    again = store.update_job(
        spec_update(job, period_ms=5_000, next_run_at=65_000, key="a"), if_version=0
    )
    assert not again.applied and again.change == first.change
    second = store.update_job(
        spec_update(first.job, period_ms=7_000, next_run_at=67_000), if_version=1
    )
    assert second.applied and second.change.version == 2


def test_a_failed_one_shots_spec_may_be_updated_and_it_stays_failed(store: Store) -> None:
    job, _ = store.submit_job(once_job(50_000))
    [out] = store.claim_fires([claim(job.job_id, 50_000, new=None)])
    assert out.advanced and out.run_id is not None
    dead = replace(done(out.run_id, 1, RunState.DEAD_LETTERED), job_state=JobState.FAILED)
    assert store.complete_runs([dead])[0].applied
    assert store.get_job(job.job_id).state is JobState.FAILED
    fixed = replace(job.spec, payload=b"fixed")
    update = SpecUpdate(job_id=job.job_id, spec=fixed, next_run_at=None, updated_at_ms=60_000)
    after = store.update_job(update).job
    assert (after.state, after.next_run_at, after.spec.payload) == (
        JobState.FAILED,
        None,
        b"fixed",
    )


def test_update_job_of_an_unknown_or_cancelled_job_changes_nothing(store: Store) -> None:
    job, _ = store.submit_job(interval_job())
    with pytest.raises(NotFound):
        store.update_job(replace(spec_update(job, period_ms=5_000, next_run_at=1), job_id=999_999))
    cancelled = store.set_job_state(job.job_id, JobState.CANCELLED, next_run_at=None, now_ms=2)
    with pytest.raises(FailedPrecondition):
        store.update_job(spec_update(job, period_ms=5_000, next_run_at=1))
    assert store.get_job(job.job_id) == cancelled
    assert store.list_job_updates(job.job_id) == []


def test_dead_letters_are_listed_until_a_later_attempt_redrives_them(store: Store) -> None:
    job, run = dispatched(store, "a", fence=1)
    _, other_run = dispatched(store, "b", fence=2)
    store.complete_runs([done(run, 1, RunState.DEAD_LETTERED)])
    store.complete_runs([done(other_run, 2, RunState.DEAD_LETTERED)])
    assert [r.run_id for r in store.list_dead_letters()] == [other_run, run]
    assert [r.run_id for r in store.list_dead_letters(job_id=job.job_id)] == [run]
    assert [r.run_id for r in store.list_dead_letters(before_run_id=other_run)] == [run]
    assert [r.run_id for r in store.list_dead_letters(limit=1)] == [other_run]
    assert [r.run_id for r in store.list_dead_letters(tenant="acme")] == [other_run, run]
    assert store.list_dead_letters(tenant="nobody") == []
    # A redrive is a new attempt of the fire: the dead letter leaves the list.
    [out] = store.claim_fires([claim(job.job_id, 60_000, attempt=1, fence=3, advance=False)])
    assert out.run_id is not None
    assert [r.run_id for r in store.list_dead_letters()] == [other_run]
