"""PostgreSQL plans of the overview's counts, feed and a job's day: with
20,000 ended runs (and statistics, as autovacuum keeps them), a bucket's
runs are read through ``executions_finished``, the feed through the primary
key, a job's day through that job's runs, and no plan scans the executions
table whole."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.store.conftest import interval_job
from tests.store.test_contract import claim
from wheel.store._overview import outcome_sql, run_stats_sql
from wheel.store.base import Completion, RunState
from wheel.store.postgres import PostgresStore

pytestmark = pytest.mark.postgres

RUNS = 20_000


@pytest.fixture(scope="module")
def store(module_pg_dsn: str) -> Iterator[PostgresStore]:
    s = PostgresStore(module_pg_dsn)
    s.migrate()
    ids = s.import_jobs([interval_job(f"j{i}", tenant=f"t{i % 4}") for i in range(RUNS // 10)])
    claims = [
        claim(job_id, 60_000 * (k + 1), fence=1 + k, new=None, advance=False)
        for k in range(10)
        for job_id in ids
    ]
    outs = [o for i in range(0, len(claims), 2_000) for o in s.claim_fires(claims[i : i + 2_000])]
    ends = [
        Completion(
            run_id=o.run_id,
            fence=o.claim.fence,
            state=RunState.SUCCEEDED,
            finished_at_ms=o.claim.scheduled_for + 500,
            worker_id="w",
        )
        for o in outs
        if o.run_id is not None
    ]
    for i in range(0, len(ends), 2_000):
        s.complete_runs(ends[i : i + 2_000])
    with s._db.pool.connection() as conn:
        conn.execute("ANALYZE")
    try:
        yield s
    finally:
        s.close()


def scans(store: PostgresStore, sql: str, params: tuple[Any, ...]) -> list[tuple[str, str]]:
    """(node type, relation or index) of every scan in the statement's plan."""
    with store._db.pool.connection() as conn:
        row = conn.execute("EXPLAIN (FORMAT JSON) " + sql, params).fetchone()
        conn.rollback()
    assert row is not None
    doc = row[0] if not isinstance(row[0], str | bytes) else json.loads(row[0])
    found: list[tuple[str, str]] = []

    def walk(node: dict[str, Any]) -> None:
        if "Scan" in node["Node Type"]:
            found.append(
                (node["Node Type"], node.get("Index Name") or node.get("Relation Name", ""))
            )
        for child in node.get("Plans", []):
            walk(child)

    walk(doc[0]["Plan"])
    return found


@pytest.mark.parametrize("tenant", [False, True], ids=["every tenant", "one tenant"])
def test_a_buckets_runs_are_read_through_their_index(store: PostgresStore, tenant: bool) -> None:
    runs, _ = outcome_sql("%s", tenant=tenant)
    params: tuple[Any, ...] = (600_000, 660_000, *(["t1"] if tenant else []))
    found = scans(store, runs, params)
    assert any(name == "executions_finished" for _, name in found), found
    assert ("Seq Scan", "executions") not in found, found


def test_the_feed_reads_runs_by_id_and_jobs_by_key(store: PostgresStore) -> None:
    page = store.recent_runs(tenant="t1", limit=50)
    assert len(page.runs) == 50 and page.next_before is not None
    assert {r.tenant for r in page.runs} == {"t1"}
    ids = [r.run.run_id for r in page.runs]
    assert ids == sorted(ids, reverse=True)


def test_a_jobs_day_reads_that_jobs_runs_not_the_days(store: PostgresStore) -> None:
    job_id = store.recent_runs(limit=1).runs[0].run.job_id
    found = scans(store, run_stats_sql("%s"), (job_id, 0))
    indexes = {name for kind, name in found if "Index" in kind}
    assert indexes == {"executions_fire_attempt"}, found
    assert ("Seq Scan", "executions") not in found, found
