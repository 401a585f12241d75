"""SQLite plans of the overview's counts (``OverviewStore.outcome_counts``):
runs by when they ended read a range of ``executions_finished`` alone (the
index covers the count), a tenant's look each run's job up by its id, and
missed fires read a range of ``missed_fires_recorded``; none scans a table.
The store never runs ANALYZE: these are the plans it runs with."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from wheel.store._overview import outcome_sql, run_stats_sql
from wheel.store.sqlite import SQLiteStore


def plan(db: Path, sql: str, args: list[object]) -> str:
    con = sqlite3.connect(db)
    try:
        rows = con.execute("EXPLAIN QUERY PLAN " + sql, args).fetchall()
    finally:
        con.close()
    return "\n".join(str(r[-1]) for r in rows)


@pytest.mark.parametrize("tenant", [False, True], ids=["every tenant", "one tenant"])
def test_the_counts_read_index_ranges_and_scan_no_table(tmp_path: Path, tenant: bool) -> None:
    db = tmp_path / "plans.db"
    SQLiteStore(db).migrate()
    runs, missed = outcome_sql("?", tenant=tenant)
    tenants: list[object] = ["acme"] if tenant else []
    ran = plan(db, runs, [60_000, 120_000, *tenants])
    assert "COVERING INDEX executions_finished (finished_at_ms>? AND finished_at_ms<?)" in ran, ran
    if tenant:  # each run's job, by its id
        assert "SEARCH j USING COVERING INDEX jobs_tenant (tenant=? AND job_id=?" in ran, ran
    skipped = plan(db, missed, [60_000, 60_000, 1_000, *tenants])
    assert "INDEX missed_fires_recorded (recorded_at_ms>?)" in skipped, skipped
    assert "SCAN x" not in ran + skipped and "SCAN j" not in ran + skipped


def test_a_jobs_day_reads_that_jobs_runs_not_the_days(tmp_path: Path) -> None:
    db = tmp_path / "plans.db"
    SQLiteStore(db).migrate()
    found = plan(db, run_stats_sql("?"), [7, 60_000])
    # The day's fires of the job, a range of its fire key: not every run it had.
    range_ = "(job_id=? AND scheduled_for>?)"
    assert found == f"SEARCH executions USING INDEX sqlite_autoindex_executions_1 {range_}", found
