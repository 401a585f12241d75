"""PostgreSQL plans of the batch statements stay linear in the batch size.

A plan that runs the batch's ``unnest`` once per looked-up row costs B x B:
at B = 100 a completion batch took 8.5 ms instead of 1.8 ms. These tests read
the executed plan (``EXPLAIN ANALYZE``) of the real statements with real
parameters and require every scan of the batch to run once.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from tests.store.conftest import idle_jobs
from tests.store.test_contract import claim
from wheel.store._schema import DUE_BUCKET_SHIFT, RETRY_WHERE
from wheel.store.base import Completion, MissedFire, MissedReason, NewJob, RunStart, RunState
from wheel.store.postgres import PostgresStore
from wheel.store.postgres import _sql as pg_sql

pytestmark = pytest.mark.postgres

BATCH = 100


@pytest.fixture
def store(pg_dsn: str) -> Iterator[PostgresStore]:
    s = PostgresStore(pg_dsn)
    s.migrate()
    try:
        yield s
    finally:
        s.close()


def batch_runs(store: PostgresStore, jobs: int) -> list[tuple[int, int]]:
    """(run id, fence) of one claimed run for each of ``jobs`` new jobs."""
    from tests.store.conftest import interval_job

    news: list[NewJob] = [interval_job(f"j{i}") for i in range(jobs)]
    ids = store.import_jobs(news)
    claims = [claim(job_id, 60_000, fence=1_000 + i, new=120_000) for i, job_id in enumerate(ids)]
    outs = [o for k in range(0, jobs, 2_000) for o in store.claim_fires(claims[k : k + 2_000])]
    runs = [(o.run_id, o.claim.fence) for o in outs if o.run_id is not None]
    assert len(runs) == jobs
    with store._db.pool.connection() as conn:
        conn.execute("ANALYZE executions")  # as autovacuum would have by now
    return runs


def function_scan_loops(plan: dict[str, Any]) -> list[int]:
    """Actual loops of every Function Scan (the batch's unnest) in a plan tree."""
    loops = [int(plan["Actual Loops"])] if plan["Node Type"] == "Function Scan" else []
    for child in plan.get("Plans", []):
        loops += function_scan_loops(child)
    return loops


def executed_plan(store: PostgresStore, sql: str, params: dict[str, Any]) -> dict[str, Any]:
    with store._db.pool.connection() as conn, conn.cursor(binary=True) as cur:
        cur.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params)
        row = cur.fetchone()
        conn.rollback()
    assert row is not None
    doc = row[0] if not isinstance(row[0], str | bytes) else json.loads(row[0])
    return dict(doc[0]["Plan"])


def test_completion_and_start_batches_scan_their_arrays_once(store: PostgresStore) -> None:
    # A table of 20,000 runs: with 2,000 the planner happened to pick a
    # linear plan even for the old statements.
    runs = batch_runs(store, 200 * BATCH)[:BATCH]
    starts = [RunStart(run_id=r, fence=f, worker_id="w", started_at_ms=61_000) for r, f in runs]
    plan = executed_plan(store, pg_sql.MARK_RUNNING_SQL, pg_sql.start_arrays(range(BATCH), starts))
    assert function_scan_loops(plan) == [1], json.dumps(plan)[:2000]
    completions = [
        Completion(run_id=r, fence=f, state=RunState.SUCCEEDED, finished_at_ms=70_000)
        for r, f in runs
    ]
    plan = executed_plan(
        store, pg_sql.COMPLETE_SQL, pg_sql.completion_arrays(range(BATCH), completions)
    )
    assert function_scan_loops(plan) == [1], json.dumps(plan)[:2000]


def test_the_planner_is_the_one_the_store_configures(store: PostgresStore) -> None:
    with store._db.pool.connection() as conn:
        assert isinstance(conn, psycopg.Connection)
        assert conn.execute("SHOW plan_cache_mode").fetchone() == ("force_custom_plan",)


def plan_nodes(plan: dict[str, Any]) -> list[tuple[str, str]]:
    """(node type, relation or index) of every node of a plan tree."""
    out = [(plan["Node Type"], plan.get("Index Name") or plan.get("Relation Name") or "")]
    for child in plan.get("Plans", []):
        out += plan_nodes(child)
    return out


def test_a_restart_finds_runs_owed_a_retry_without_reading_every_execution(
    store: PostgresStore,
) -> None:
    runs = batch_runs(store, 20_000)
    ended = [
        Completion(run_id=r, fence=f, state=RunState.SUCCEEDED, finished_at_ms=70_000)
        for r, f in runs[:-3]
    ]
    ended += [
        Completion(run_id=r, fence=f, state=RunState.FAILED, finished_at_ms=70_000, error="x")
        for r, f in runs[-3:]
    ]
    store.complete_runs(ended)
    with store._db.pool.connection() as conn:
        conn.execute("ANALYZE executions")
        plan = conn.execute(
            "EXPLAIN (FORMAT JSON) " + pg_sql.QUERIES.runs_of_shards(RETRY_WHERE),
            (list(range(256)),),
        ).fetchone()
    assert plan is not None
    nodes = plan_nodes(plan[0][0]["Plan"])
    assert ("Seq Scan", "executions") not in nodes, nodes
    assert any(name == "executions_unwell" for _, name in nodes), nodes
    assert sorted(r.run_id for r in store.retry_candidates(range(256))) == sorted(
        r for r, _ in runs[-3:]
    )


DAY_MS = 86_400_000


def test_a_gain_due_first_finds_the_jobs_due_soon_through_an_index(store: PostgresStore) -> None:
    """The first part of a gain reads a shard's jobs due soon (and those
    with no next fire, or no profile) through indexes: with 20,000 jobs due
    in days it must not read them all."""
    now = 40 * DAY_MS
    ids = store.import_jobs(idle_jobs(20_000, now, soon=5))
    with store._db.pool.connection() as conn:
        conn.execute("ANALYZE jobs")
        bound = now + 60_000
        shards = list(range(0, 256, 3))
        q = pg_sql.QUERIES
        for sql, params in (
            (q.packed_due_of_shards, (bound >> DUE_BUCKET_SHIFT, bound, shards)),
            (q.unpacked_due_of_shards, (shards,)),
        ):
            plan = conn.execute("EXPLAIN (FORMAT JSON) " + sql, params).fetchone()
            assert plan is not None
            nodes = plan_nodes(plan[0][0]["Plan"])
            assert ("Seq Scan", "jobs") not in nodes, nodes
            assert any(name in {"jobs_due_soon", "jobs_unprofiled"} for _, name in nodes), nodes
    due = store.load_shards(shards, packed=True, due_by=bound)
    assert due.packed is not None
    assert set(due.packed.job_id.tolist()) <= set(ids[-5:])


def due_plan(store: PostgresStore, bound: int, shards: list[int]) -> list[tuple[str, str]]:
    """The plan of a gain's read of the jobs due by ``bound``."""
    params = (bound >> DUE_BUCKET_SHIFT, bound, shards)
    with store._db.pool.connection() as conn:
        plan = conn.execute(
            "EXPLAIN (FORMAT JSON) " + pg_sql.QUERIES.packed_due_of_shards, params
        ).fetchone()
        conn.rollback()
    assert plan is not None
    return plan_nodes(plan[0][0]["Plan"])


def test_statistics_a_bulk_load_left_behind_are_refreshed_so_a_gain_reads_the_due_index(
    store: PostgresStore,
) -> None:
    """Jobs loaded in bulk into a table the planner last saw nearly empty
    (autovacuum late, or off as on this machine's server): from those
    statistics it read a gain's few due jobs through the index of every
    active job (0.6 s at 800,000 jobs). ``refresh_statistics`` analyzes the
    tables whose rows changed by more than a tenth since, and then only,
    after which the gain reads the due index."""
    now = 40 * DAY_MS
    store.import_jobs(idle_jobs(20_000, now, soon=5))
    bound, shards = now + 60_000, list(range(0, 256, 3))
    assert any(name == "jobs_state" for _, name in due_plan(store, bound, shards))

    # The server's counts of changed rows reach its statistics views within
    # a second or so of the load's commit.
    deadline = time.monotonic() + 15
    while not (analyzed := store.refresh_statistics()):
        assert time.monotonic() < deadline, "the loaded jobs table was never found stale"
        time.sleep(0.2)
    assert [(t, n >= 20_005) for t, n in analyzed] == [("jobs", True)]

    nodes = due_plan(store, bound, shards)
    assert any(name == "jobs_due_soon" for _, name in nodes), nodes
    assert not any(name == "jobs_state" for _, name in nodes), nodes
    # Fresh now: nothing more to analyze until a tenth of the rows change.
    assert store.refresh_statistics() == []


def test_a_name_search_and_a_state_filter_read_an_index_not_every_job(
    store: PostgresStore,
) -> None:
    """The web console's ListJobs by name prefix, and by a state few jobs
    are in, read a range of ``jobs_name`` / ``jobs_state``: with 20,000
    jobs they must not read them all."""
    from tests.store.conftest import interval_job
    from wheel.engine.model import JobState

    news = [interval_job(f"job-{i:05d}") for i in range(20_000)]
    ids = store.import_jobs([*news, interval_job("nightly-report")])
    store.set_job_state(ids[7], JobState.PAUSED, next_run_at=None, now_ms=2_000)
    with store._db.pool.connection() as conn:
        conn.execute("ANALYZE jobs")
        q = pg_sql.QUERIES
        for kwargs, index in (
            ({"name_prefix": "nightly"}, "jobs_name"),
            ({"name_prefix": "job-1", "after_name": "job-15000"}, "jobs_name"),
            ({"state": JobState.PAUSED}, "jobs_state"),
        ):
            args: dict[str, Any] = {"tenant": None, "state": None, "after_job_id": 0}
            sql, params = q.list_jobs(**{**args, **kwargs}, limit=100)
            plan = conn.execute("EXPLAIN (FORMAT JSON) " + sql, params).fetchone()
            assert plan is not None
            nodes = plan_nodes(plan[0][0]["Plan"])
            assert ("Seq Scan", "jobs") not in nodes, (kwargs, nodes)
            assert any(name == index for _, name in nodes), (kwargs, nodes)
    assert [j.job_id for j in store.list_jobs(name_prefix="nightly")] == [ids[-1]]
    assert [j.job_id for j in store.list_jobs(state=JobState.PAUSED)] == [ids[7]]


def test_a_search_by_two_filters_reads_one_index_in_page_order_not_a_filter_sorted(
    store: PostgresStore,
) -> None:
    """The console's searches within a tenant (every one, with auth on) read
    a range of ``jobs_tenant_name`` in the page's order: with 20,000 jobs no
    plan reads a tenant's every job and sorts them. A state beside another
    filter reads either one's index (no index holds a state with another
    column: see wheel.store._schema): a rare state's few jobs may be sorted,
    a common state is checked on the other's rows in page order."""
    from tests.store.conftest import interval_job
    from wheel.engine.model import JobState

    news = [interval_job(f"job-{i:05d}", tenant=f"t{i % 40}") for i in range(20_000)]
    ids = store.import_jobs(news)
    for job_id in ids[1::400]:
        store.set_job_state(job_id, JobState.PAUSED, next_run_at=None, now_ms=2_000)
    paused, active = JobState.PAUSED, JobState.ACTIVE
    with store._db.pool.connection() as conn:
        conn.execute("ANALYZE jobs")
        q = pg_sql.QUERIES
        # (the search, the indexes that serve it: where a filter is nearly
        # every job, as active is, the planner may read the other's index)
        for kwargs, indexes, sorted_ok in (
            ({"tenant": "t1", "name_prefix": "job-1"}, {"jobs_tenant_name"}, False),
            ({"tenant": "t1", "name_prefix": "job-", "after_name": "job-05001",
              "after_job_id": ids[5_001]}, {"jobs_tenant_name"}, False),
            ({"state": paused, "name_prefix": "job-"}, {"jobs_state", "jobs_name"}, True),
            ({"state": active, "name_prefix": "job-1"}, {"jobs_name"}, False),
            ({"tenant": "t1", "state": paused}, {"jobs_state", "jobs_tenant"}, True),
        ):  # fmt: skip
            args: dict[str, Any] = {"tenant": None, "state": None, "after_job_id": 0}
            sql, params = q.list_jobs(**{**args, **kwargs}, limit=50)
            plan = conn.execute("EXPLAIN (FORMAT JSON) " + sql, params).fetchone()
            assert plan is not None
            nodes = plan_nodes(plan[0][0]["Plan"])
            assert ("Seq Scan", "jobs") not in nodes, (kwargs, nodes)
            sorts = [kind for kind, _ in nodes if kind in {"Sort", "Incremental Sort"}]
            assert sorted_ok or not sorts, (kwargs, nodes)
            assert any(name in indexes for _, name in nodes), (kwargs, nodes)
    t1 = [ids[i] for i in range(1, 20_000, 40)]
    assert [j.job_id for j in store.list_jobs(tenant="t1", name_prefix="job-1")] == [
        j for j in t1 if j >= ids[10_000]
    ][:100]
    assert [j.job_id for j in store.list_jobs(tenant="t1", state=paused)] == ids[1::400]


def hot_updates(store: PostgresStore) -> int:
    with store._db.pool.connection() as conn:
        row = conn.execute(
            "SELECT n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = 'jobs'::regclass"
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_a_fire_that_stays_in_its_due_bucket_is_a_hot_update(store: PostgresStore) -> None:
    """The due bucket's index moves an entry only when a fire crosses a
    bucket: a recurring job's claim inside its bucket stays a HOT update,
    one across a boundary does not."""
    from tests.store.conftest import interval_job

    start = 7 << DUE_BUCKET_SHIFT
    ids = store.import_jobs([interval_job(f"r{i}", next_run_at=start) for i in range(4_000)])
    # One job of every few pages, so that each page has room for the new
    # version (a HOT update stays on its page).
    picked = ids[::200]
    inside, across = picked[::2], picked[1::2]
    before = hot_updates(store)
    claims = [claim(j, start, new=start + 60_000) for j in inside]
    claims += [claim(j, start, new=start + (2 << DUE_BUCKET_SHIFT)) for j in across]
    assert all(o.run_id is not None for o in store.claim_fires(claims))
    # The server publishes a backend's counts within seconds of its going idle.
    deadline = time.monotonic() + 30
    while hot_updates(store) < before + len(inside) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert hot_updates(store) - before == len(inside)


def test_dead_letters_are_listed_through_their_index_not_a_scan_of_the_executions(
    store: PostgresStore,
) -> None:
    runs = batch_runs(store, 20_000)
    ended = [
        Completion(run_id=r, fence=f, state=RunState.SUCCEEDED, finished_at_ms=70_000)
        for r, f in runs[:-3]
    ]
    ended += [
        Completion(run_id=r, fence=f, state=RunState.DEAD_LETTERED, finished_at_ms=70_000)
        for r, f in runs[-3:]
    ]
    store.complete_runs(ended)
    job_of_dead = store.get_run(runs[-1][0]).job_id
    sql = store._updates
    with store._db.pool.connection() as conn:
        conn.execute("ANALYZE executions")
        for statement, params in (
            (sql.dead_of_all, (2**63 - 1, 100)),
            (sql.dead_of_job, (job_of_dead, 2**63 - 1, 100)),
            (sql.dead_of_tenant, ("acme", 2**63 - 1, 100)),
        ):
            plan = conn.execute("EXPLAIN (FORMAT JSON) " + statement, params).fetchone()
            assert plan is not None
            nodes = plan_nodes(plan[0][0]["Plan"])
            assert ("Seq Scan", "executions") not in nodes, nodes
    assert [r.run_id for r in store.list_dead_letters()] == [r for r, _ in runs[-3:]][::-1]


def test_a_page_of_runs_reads_the_jobs_key_backwards_not_every_run_sorted(
    store: PostgresStore,
) -> None:
    runs = batch_runs(store, 20_000)
    job_id = store.get_run(runs[0][0]).job_id
    q = pg_sql.QUERIES
    with store._db.pool.connection() as conn:
        for statement, params in (
            (q.list_runs, (job_id, 51)),
            (q.list_runs_below, (job_id, 60_000, 60_000, 0, 51)),
        ):
            plan = conn.execute("EXPLAIN (FORMAT JSON) " + statement, params).fetchone()
            assert plan is not None
            nodes = plan_nodes(plan[0][0]["Plan"])
            assert ("Index Scan", "executions_fire_attempt") in nodes, nodes
            assert not any(kind in ("Sort", "Seq Scan") for kind, _ in nodes), nodes


def test_a_retention_range_is_read_and_deleted_through_the_end_time_index(
    store: PostgresStore,
) -> None:
    """One range of expired runs, and of missed fires: read off the index by
    end (or recording) time, never a scan of the table's kept rows."""
    runs = batch_runs(store, 20_000)
    ended = [
        Completion(run_id=r, fence=f, state=RunState.SUCCEEDED, finished_at_ms=70_000 + i)
        for i, (r, f) in enumerate(runs)
    ]
    store.complete_runs(ended)
    jobs = [store.get_run(r).job_id for r, _ in runs[:2_000]]
    store.record_missed(
        [
            MissedFire(
                job_id=job_id,
                scheduled_for=k,
                reason=MissedReason.OVERLAP,
                recorded_at_ms=70_000 + 10 * i + k,
            )
            for i, job_id in enumerate(jobs)
            for k in range(10)
        ]
    )
    q = pg_sql.QUERIES
    (runs_bound, runs_delete), (missed_bound, missed_delete) = q.purges
    with store._db.pool.connection() as conn:
        conn.execute("ANALYZE executions")
        conn.execute("ANALYZE missed_fires")
        for statement, params, index in (
            (runs_bound, (70_000, 90_000, 999), "executions_finished"),
            (runs_delete, (70_000, 70_999), "executions_finished"),
            (missed_bound, (70_000, 90_000, 999), "missed_fires_recorded"),
            (missed_delete, (70_000, 70_999), "missed_fires_recorded"),
        ):
            plan = conn.execute("EXPLAIN (FORMAT JSON) " + statement, params).fetchone()
            assert plan is not None
            nodes = plan_nodes(plan[0][0]["Plan"])
            assert any(name == index for _, name in nodes), nodes
            assert not any(kind == "Seq Scan" for kind, _ in nodes), nodes
