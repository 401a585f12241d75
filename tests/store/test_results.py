"""Run results in the store, on every backend: a completion's result is kept
with its run (any terminal state), only when the completion applies, and
every read of runs returns it; a batch without any result writes none."""

from __future__ import annotations

import json

from tests.store.conftest import interval_job
from tests.store.test_contract import claim, done
from wheel.store.base import Completion, RunState, Store, WriteBatch

HTTP = json.dumps(
    {"http_status": 503, "duration_ms": 12, "response_excerpt": "busy \u00e9\u2603 <b>"}
)


def runs_of(store: Store, count: int) -> tuple[int, list[int]]:
    """A job and ``count`` of its fires claimed (fences 1..count)."""
    job, _ = store.submit_job(interval_job(next_run_at=60_000))
    outs = store.claim_fires(
        [claim(job.job_id, 60_000 * k, fence=k, new=60_000 * (k + 1)) for k in range(1, count + 1)]
    )
    ids = [o.run_id for o in outs]
    assert all(ids)
    return job.job_id, [i for i in ids if i is not None]


def ended(run_id: int, fence: int, state: RunState, result: str | None) -> Completion:
    return Completion(
        run_id=run_id,
        fence=fence,
        state=state,
        finished_at_ms=99_000,
        error=None if state is RunState.SUCCEEDED else "boom",
        worker_id="w-1",
        result=result,
    )


def test_a_completion_keeps_its_result_and_every_read_of_runs_returns_it(store: Store) -> None:
    job_id, [ok, failed, dead, plain] = runs_of(store, 4)
    outcomes = store.complete_runs(
        [
            ended(ok, 1, RunState.SUCCEEDED, '{"value": [1, "two"]}'),
            ended(failed, 2, RunState.FAILED, HTTP),
            ended(dead, 3, RunState.DEAD_LETTERED, '{"http_status": 404}'),
            ended(plain, 4, RunState.SUCCEEDED, None),
        ]
    )
    assert [o.applied for o in outcomes] == [True, True, True, True]
    want = {
        ok: '{"value": [1, "two"]}',
        failed: HTTP,
        dead: '{"http_status": 404}',
        plain: None,
    }
    assert {r: store.get_run(r).result for r in want} == want
    assert {r.run_id: r.result for r in store.list_runs(job_id)} == want
    [letter] = store.list_dead_letters(job_id=job_id)
    assert (letter.run_id, letter.result) == (dead, '{"http_status": 404}')


def test_a_batch_without_results_stores_none_and_a_late_result_changes_nothing(
    store: Store,
) -> None:
    job_id, [a, b] = runs_of(store, 2)
    assert [o.applied for o in store.complete_runs([done(a, 1), done(b, 2)])] == [True, True]
    assert [r.result for r in store.list_runs(job_id)] == [None, None]
    # A completion that does not apply (the run already ended, a stale
    # fence) leaves the run's result as it was, in a batch with a result
    # that does apply beside it.
    _, [c] = runs_of(store, 1)
    outcomes = store.complete_runs(
        [
            ended(a, 1, RunState.FAILED, '{"value": "late"}'),
            ended(c, 0, RunState.SUCCEEDED, '{"value": "stale fence"}'),
            ended(c, 1, RunState.SUCCEEDED, '{"value": "c"}'),
        ]
    )
    assert [o.applied for o in outcomes] == [False, False, True]
    assert store.get_run(a).result is None
    assert store.get_run(c).result == '{"value": "c"}'


def test_a_result_of_the_largest_size_comes_back_whole_through_a_batch(store: Store) -> None:
    _, [run] = runs_of(store, 1)
    big = json.dumps({"value": "\u2603" * 20_000 + "x" * 5_000}, ensure_ascii=False)
    assert len(big.encode()) <= 65536
    store.write_batch(WriteBatch(completions=[ended(run, 1, RunState.SUCCEEDED, big)]))
    assert store.get_run(run).result == big


def test_runs_in_flight_read_with_no_result(store: Store) -> None:
    job_id, [run] = runs_of(store, 1)
    assert store.get_run(run).result is None
    assert [r.result for r in store.list_runs(job_id)] == [None]
