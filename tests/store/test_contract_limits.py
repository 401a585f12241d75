"""The Store contract for concurrency keys and rate limits (schema 20), run
against SQLite, PostgreSQL and the reference model alike (the ``store``
fixture): permits taken by claims in their own transaction, given back by
every end of a run, never more in flight than the limit."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import pytest

from tests.store.conftest import interval_job
from tests.store.reference import ReferenceStore
from wheel.engine.model import RunState
from wheel.store.base import (
    ClaimOutcome,
    Completion,
    FireClaim,
    LimitRecord,
    RunStart,
    Store,
)
from wheel.store.open import open_store

HOUR_MS = 3_600_000


def keyed_claim(job_id: int, fire: int, *, key: str = "db", fence: int = 1) -> FireClaim:
    return FireClaim(
        job_id=job_id,
        scheduled_for=fire,
        attempt=0,
        fence=fence,
        dispatched_at_ms=fire + 3,
        advance=True,
        expected_next_run_at=fire,
        new_next_run_at=fire + 60_000,
        concurrency_key=key,
        tenant="acme",
    )


def jobs(store: Store, n: int, prefix: str = "job") -> list[int]:
    return [
        store.submit_job(interval_job(f"{prefix}-{i}", next_run_at=60_000)).job.job_id
        for i in range(n)
    ]


def in_flight(store: Store, key: str = "db") -> int:
    [limit] = [x for x in store.list_limits("acme") if x.key == key]
    return limit.in_flight


def end(store: Store, outs: Sequence[ClaimOutcome], state: RunState) -> None:
    applied = store.complete_runs(
        [
            Completion(run_id=o.run_id, fence=o.claim.fence, state=state, finished_at_ms=99_000)
            for o in outs
            if o.run_id is not None
        ]
    )
    assert all(a.applied for a in applied)


def test_set_list_and_delete_a_limit(store: Store) -> None:
    made = store.set_limit(
        LimitRecord(tenant="acme", key="db", max_concurrent=3, rate=10, rate_period_ms=60_000),
        1_000,
    )
    assert (made.max_concurrent, made.rate, made.rate_period_ms, made.burst) == (3, 10, 60_000, 10)
    assert made.in_flight == 0 and made.updated_at_ms == 1_000
    store.set_limit(LimitRecord(tenant="other", key="db", max_concurrent=1), 1_000)
    assert [(x.tenant, x.key) for x in store.list_limits()] == [("acme", "db"), ("other", "db")]
    assert [x.tenant for x in store.list_limits("other")] == ["other"]
    again = store.set_limit(LimitRecord(tenant="acme", key="db", max_concurrent=5), 2_000)
    assert (again.max_concurrent, again.rate) == (5, 0)
    assert store.delete_limit("acme", "db") == 1
    assert store.delete_limit("acme", "db") == 0
    assert [x.tenant for x in store.list_limits()] == ["other"]


def test_claims_past_the_limit_wait_and_write_nothing(store: Store) -> None:
    store.set_limit(LimitRecord(tenant="acme", key="db", max_concurrent=2), 1_000)
    ids = jobs(store, 3)
    outs = store.claim_fires([keyed_claim(j, 60_000) for j in ids])
    assert [o.run_id is not None for o in outs] == [True, True, False]
    assert [o.waiting for o in outs] == [False, False, True]
    assert in_flight(store) == 2
    # The waiting claim moved no schedule and made no run: the fire is owed.
    assert not outs[2].advanced
    assert store.get_job(ids[2]).next_run_at == 60_000
    assert store.list_runs(ids[2]) == []


@pytest.mark.parametrize(
    "state", [RunState.SUCCEEDED, RunState.FAILED, RunState.LOST, RunState.TIMED_OUT]
)
def test_every_end_of_a_run_gives_its_permit_back(store: Store, state: RunState) -> None:
    store.set_limit(LimitRecord(tenant="acme", key="db", max_concurrent=1), 1_000)
    first, second = jobs(store, 2)
    [won] = store.claim_fires([keyed_claim(first, 60_000)])
    [waits] = store.claim_fires([keyed_claim(second, 60_000)])
    assert won.run_id is not None and waits.waiting
    end(store, [won], state)
    assert in_flight(store) == 0
    [now] = store.claim_fires([keyed_claim(second, 60_000)])
    assert now.run_id is not None and now.advanced
    assert in_flight(store) == 1


def test_a_superseded_completion_gives_nothing_back(store: Store) -> None:
    store.set_limit(LimitRecord(tenant="acme", key="db", max_concurrent=2), 1_000)
    [job] = jobs(store, 1)
    [won] = store.claim_fires([keyed_claim(job, 60_000, fence=5)])
    assert won.run_id is not None
    [stale] = store.complete_runs(
        [Completion(run_id=won.run_id, fence=4, state=RunState.LOST, finished_at_ms=9)]
    )
    assert not stale.applied
    assert in_flight(store) == 1


def test_a_returned_handler_gives_its_permit_back_once(store: Store) -> None:
    store.set_limit(LimitRecord(tenant="acme", key="db", max_concurrent=1), 1_000)
    first, second = jobs(store, 2)
    [won] = store.claim_fires([keyed_claim(first, 60_000, fence=5)])
    assert won.run_id is not None
    # Its worker says its handler returned, its owner has not heard yet.
    assert store.release_returned("w1", [(won.run_id, 5), (won.run_id, 5)]) == 1
    assert in_flight(store) == 0
    assert store.release_returned("w1", [(won.run_id, 5)]) == 0
    [now] = store.claim_fires([keyed_claim(second, 60_000)])
    assert now.run_id is not None
    assert in_flight(store) == 1
    # The run is still in flight: its end, when its owner writes it, gives
    # nothing back a second time.
    [run] = store.list_runs(first)
    assert run.state is RunState.DISPATCHED
    end(store, [won], RunState.SUCCEEDED)
    assert in_flight(store) == 1
    assert store.recount_limits() == 0


def test_only_the_run_in_flight_under_its_fence_and_worker_gives_back(store: Store) -> None:
    store.set_limit(LimitRecord(tenant="acme", key="db", max_concurrent=3), 1_000)
    ids = jobs(store, 3)
    outs = store.claim_fires([keyed_claim(j, 60_000, fence=5) for j in ids])
    runs = [o.run_id for o in outs]
    assert None not in runs
    acked, ended, other = (r for r in runs if r is not None)
    assert store.mark_running(
        [RunStart(run_id=acked, fence=5, worker_id="w2", started_at_ms=61_000)]
    ) == [True]
    end(store, outs[1:2], RunState.SUCCEEDED)
    assert in_flight(store) == 2
    given = store.release_returned("w1", [(acked, 5), (ended, 5), (other, 4), (other + 1_000, 5)])
    assert given == 0 and in_flight(store) == 2
    assert store.release_returned("w2", [(acked, 5)], acked_only=True) == 1
    assert in_flight(store) == 1
    # A run no worker acked yet: any worker's word, unless only acked runs count.
    assert store.release_returned("w2", [(other, 5)], acked_only=True) == 0
    assert store.release_returned("w2", [(other, 5)]) == 1
    assert in_flight(store) == 0


def test_a_run_another_writer_holds_is_left_to_it_without_waiting(
    backend: str, store: Store, store_url: str
) -> None:
    if backend != "postgres":
        pytest.skip("only PostgreSQL has writers that lock rows one by one")
    store.set_limit(LimitRecord(tenant="acme", key="db", max_concurrent=2), 1_000)
    [job] = jobs(store, 1)
    [won] = store.claim_fires([keyed_claim(job, 60_000, fence=5)])
    assert won.run_id is not None
    other = open_store(store_url)
    held, done = threading.Event(), threading.Event()

    def hold(cur: Any) -> None:
        # Another writer (its owner ending it, say) has the run's row.
        cur.execute("SELECT 1 FROM executions WHERE run_id = %s FOR UPDATE", (won.run_id,))
        held.set()
        done.wait(10)

    writer = threading.Thread(target=other._write, args=(hold,))  # type: ignore[attr-defined]
    writer.start()
    try:
        assert held.wait(10)
        assert store.release_returned("w1", [(won.run_id, 5)]) == 0
        assert not done.is_set()  # answered while the other still held it
    finally:
        done.set()
        writer.join(10)
        other.close()
    assert in_flight(store) == 1
    assert store.release_returned("w1", [(won.run_id, 5)]) == 1


def test_a_claim_written_again_counts_its_permit_once(store: Store) -> None:
    store.set_limit(LimitRecord(tenant="acme", key="db", max_concurrent=5), 1_000)
    [job] = jobs(store, 1)
    claim = keyed_claim(job, 60_000, fence=7)
    [first] = store.claim_fires([claim])
    [again] = store.claim_fires([claim])  # our own earlier commit
    assert first.run_id == again.run_id is not None
    assert in_flight(store) == 1


def test_a_key_without_a_limit_runs_unlimited_and_counts_once_one_is_set(store: Store) -> None:
    ids = jobs(store, 3)
    outs = store.claim_fires([keyed_claim(j, 60_000) for j in ids])
    assert all(o.run_id is not None for o in outs)
    made = store.set_limit(LimitRecord(tenant="acme", key="db", max_concurrent=3), 1_000)
    assert made.in_flight == 3
    end(store, outs[:1], RunState.SUCCEEDED)
    assert in_flight(store) == 2


def test_set_limit_counts_the_runs_again_after_a_delete(store: Store) -> None:
    store.set_limit(LimitRecord(tenant="acme", key="db", max_concurrent=3), 1_000)
    ids = jobs(store, 3)
    outs = store.claim_fires([keyed_claim(j, 60_000) for j in ids])
    store.delete_limit("acme", "db")
    end(store, outs[:2], RunState.SUCCEEDED)  # no row to give back to
    made = store.set_limit(LimitRecord(tenant="acme", key="db", max_concurrent=3), 2_000)
    assert made.in_flight == 1


def test_recount_repairs_a_drift(store: Store) -> None:
    store.set_limit(LimitRecord(tenant="acme", key="db", max_concurrent=4), 1_000)
    ids = jobs(store, 2)
    store.claim_fires([keyed_claim(j, 60_000) for j in ids])
    if isinstance(store, ReferenceStore):
        store.limits[("acme", "db")][1].in_flight = 0
    else:
        store._write(  # type: ignore[attr-defined]
            lambda cur: cur.execute("UPDATE limits SET in_flight = 0")
        )
    assert in_flight(store) == 0
    assert store.recount_limits() == 1
    assert in_flight(store) == 2
    assert store.recount_limits() == 0


def test_keys_are_per_tenant_and_per_key(store: Store) -> None:
    store.set_limit(LimitRecord(tenant="acme", key="db", max_concurrent=1), 1_000)
    store.set_limit(LimitRecord(tenant="acme", key="api", max_concurrent=1), 1_000)
    ids = jobs(store, 3)
    outs = store.claim_fires(
        [
            keyed_claim(ids[0], 60_000),
            keyed_claim(ids[1], 60_000, key="api"),
            keyed_claim(ids[2], 60_000),
        ]
    )
    assert [o.waiting for o in outs] == [False, False, True]
    assert in_flight(store, "db") == in_flight(store, "api") == 1


def test_the_rate_bucket_grants_its_burst_then_waits(store: Store) -> None:
    # Two starts an hour: the bucket starts full and refills too slowly to
    # matter during the test.
    store.set_limit(LimitRecord(tenant="acme", key="db", rate=2, rate_period_ms=HOUR_MS), 1_000)
    ids = jobs(store, 3)
    outs = store.claim_fires([keyed_claim(j, 60_000) for j in ids])
    assert [o.waiting for o in outs] == [False, False, True]
    end(store, outs[:2], RunState.SUCCEEDED)  # an end gives back no token
    [again] = store.claim_fires([keyed_claim(ids[2], 60_000)])
    assert again.waiting
    [limit] = store.list_limits("acme")
    assert limit.tokens < 1


def test_both_limits_bind_whichever_is_lower(store: Store) -> None:
    store.set_limit(
        LimitRecord(tenant="acme", key="db", max_concurrent=1, rate=5, rate_period_ms=HOUR_MS),
        1_000,
    )
    ids = jobs(store, 2)
    outs = store.claim_fires([keyed_claim(j, 60_000) for j in ids])
    assert [o.waiting for o in outs] == [False, True]


def test_claims_at_once_from_two_writers_never_exceed_the_limit(
    backend: str, store: Store, store_url: str
) -> None:
    store.set_limit(LimitRecord(tenant="acme", key="db", max_concurrent=3), 1_000)
    ids = jobs(store, 40)
    other = open_store(store_url)
    won: list[int] = []
    lock = threading.Lock()

    def claim_all(s: Store, part: list[int], fence: int) -> None:
        for j in part:
            [out] = s.claim_fires([keyed_claim(j, 60_000, fence=fence)])
            if out.run_id is not None:
                with lock:
                    won.append(out.run_id)
                    assert len(won) <= 3

    try:
        threads = [
            threading.Thread(target=claim_all, args=(s, ids[i::2], 10 + i))
            for i, s in enumerate([store, other])
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert len(won) == 3 == in_flight(store)
    finally:
        other.close()
