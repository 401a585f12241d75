"""SQLite plans of the web console's job searches: each filter, and each pair
of them, reads a range of one index in the order of the page (no temporary
B-tree to sort, no scan of the jobs), as ``ListJobs`` promises at any size.

The store never runs ANALYZE, so these are the plans it runs with: SQLite
picks by its rules, and an index the query needs that is missing shows as
``SEARCH ... USING INDEX jobs_tenant`` followed by ``USE TEMP B-TREE FOR
ORDER BY`` (every job of the tenant read and sorted for one page).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.store.conftest import interval_job
from wheel.engine.model import JobState
from wheel.store.sqlite import SQLiteStore
from wheel.store.sqlite import _sql as sq

# (ListJobs' filters, the indexes whose range serves them)
SEARCHES: list[tuple[dict[str, Any], set[str]]] = [
    ({"tenant": "t1"}, {"jobs_tenant"}),
    ({"state": JobState.PAUSED}, {"jobs_state"}),
    ({"name_prefix": "job-1"}, {"jobs_name"}),
    ({"name_prefix": "job-1", "after_name": "job-15000", "after_job_id": 15_001}, {"jobs_name"}),
    ({"tenant": "t1", "name_prefix": "job-1"}, {"jobs_tenant_name"}),
    (
        {"tenant": "t1", "name_prefix": "job-1", "after_name": "job-15001", "after_job_id": 15_002},
        {"jobs_tenant_name"},
    ),
    # A state beside another filter is checked on that filter's index rows:
    # no index holds the state with another column (wheel.store._schema).
    ({"state": JobState.PAUSED, "name_prefix": "job-"}, {"jobs_name"}),
    ({"tenant": "t1", "state": JobState.PAUSED}, {"jobs_tenant", "jobs_tenant_name"}),
    ({"tenant": "t1", "state": JobState.PAUSED, "name_prefix": "job-"}, {"jobs_tenant_name"}),
]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """20,000 jobs in four tenants, a few of them paused."""
    s = SQLiteStore(Path(tmp_path_factory.mktemp("plans")) / "plans.db")
    s.migrate()
    ids = s.import_jobs([interval_job(f"job-{i:05d}", tenant=f"t{i % 4}") for i in range(20_000)])
    for job_id in ids[1::400]:
        s.set_job_state(job_id, JobState.PAUSED, next_run_at=None, now_ms=2_000)
    try:
        yield s
    finally:
        s.close()


@pytest.mark.parametrize(
    ("filters", "indexes"), SEARCHES, ids=lambda v: "+".join(sorted(map(str, v)))
)
def test_a_job_search_reads_one_index_range_in_page_order(
    store: SQLiteStore, filters: dict[str, Any], indexes: set[str]
) -> None:
    args: dict[str, Any] = {"tenant": None, "state": None, "after_job_id": 0}
    sql, params = sq.QUERIES.list_jobs(**{**args, **filters}, limit=50)
    plan = [r[3] for r in store._db.conn.execute("EXPLAIN QUERY PLAN " + sql, params)]
    assert not any("TEMP B-TREE" in step for step in plan), plan
    assert not any(step.startswith("SCAN j") for step in plan), plan
    [jobs] = [step for step in plan if step.startswith("SEARCH j ")]
    assert jobs.split()[4] in indexes, plan


def test_the_searches_answer_the_same_pages_through_the_new_indexes(store: SQLiteStore) -> None:
    every = store.list_jobs(limit=20_000)
    for filters, _ in SEARCHES:
        want = [
            j
            for j in every
            if j.spec.tenant == filters.get("tenant", j.spec.tenant)
            and j.state == filters.get("state", j.state)
            and j.spec.name.startswith(filters.get("name_prefix", ""))
        ]
        if "name_prefix" in filters:
            after = (filters.get("after_name", ""), filters.get("after_job_id", 0))
            want = sorted(
                (j for j in want if (j.spec.name, j.job_id) > after),
                key=lambda j: (j.spec.name, j.job_id),
            )
        got = store.list_jobs(**filters, limit=50)
        assert [j.job_id for j in got] == [j.job_id for j in want[:50]], filters


@pytest.mark.parametrize(
    ("name", "params", "index"),
    [
        ("list_runs", (1, 51), "sqlite_autoindex_executions_1 (job_id=?)"),
        ("list_runs_below", (1, 5, 5, 0, 51), "sqlite_autoindex_executions_1 (job_id=? AND"),
        ("purges-executions", (0, 5_000, 999), "executions_finished (finished_at_ms>?"),
        ("purges-missed_fires", (0, 5_000, 999), "missed_fires_recorded (recorded_at_ms>?"),
    ],
)
def test_a_page_of_runs_and_a_retention_range_read_one_index_range(
    store: SQLiteStore, name: str, params: tuple[int, ...], index: str
) -> None:
    """A job's page of runs in page order off its unique key, and a range
    of retention (the top of the range, then its delete) off the index by
    end time: neither reads the rows kept nor sorts."""
    if name.startswith("purges-"):
        which = 0 if name.endswith("executions") else 1
        bound, delete = sq.QUERIES.purges[which]
        statements = [(bound, params), (delete, params[:2])]
    else:
        statements = [(getattr(sq.QUERIES, name), params)]
    for sql, args in statements:
        plan = [r[3] for r in store._db.conn.execute("EXPLAIN QUERY PLAN " + sql, args)]
        assert not any("TEMP B-TREE" in step for step in plan), plan
        [step] = plan
        assert step.startswith("SEARCH ") and index in step, plan
