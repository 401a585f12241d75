"""A node on PostgreSQL keeps the planner's statistics of its busiest
tables from lagging far behind their rows: jobs loaded in bulk while it
serves are analyzed within its statistics interval, whether or not the
server's autovacuum comes round (this machine's has it off)."""

from __future__ import annotations

import time

import psycopg
import pytest

from tests.ops._node import LiveNode
from tests.rpc.test_api import wait_for
from tests.store.conftest import idle_jobs
from wheel.node import NodeConfig
from wheel.store.postgres import PostgresStore

pytestmark = pytest.mark.postgres


def jobs_statistics(dsn: str) -> tuple[int, float | None]:
    """The rows of ``jobs`` changed since its last analysis, and when that
    was (None: never), as the server counts them for the DSN's schema."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT n_mod_since_analyze,"
            " extract(epoch FROM GREATEST(last_analyze, last_autoanalyze))"
            " FROM pg_stat_user_tables WHERE schemaname = current_schema() AND relname = 'jobs'"
        ).fetchone()
    assert row is not None
    return int(row[0]), None if row[1] is None else float(row[1])


def test_a_node_analyzes_the_jobs_table_after_a_bulk_load(pg_dsn: str) -> None:
    config = NodeConfig(statistics_interval_s=0.2, retain_ms=None)
    with LiveNode(pg_dsn, config):
        assert jobs_statistics(pg_dsn)[1] is None
        loader = PostgresStore(pg_dsn)
        try:
            loader.import_jobs(idle_jobs(20_000, int(time.time() * 1000)))
        finally:
            loader.close()
        wait_for(lambda: jobs_statistics(pg_dsn)[1] is not None, 20, "jobs to be analyzed")


def test_a_node_told_not_to_leaves_the_statistics_to_the_server(pg_dsn: str) -> None:
    config = NodeConfig(statistics_interval_s=0, retain_ms=None)
    with LiveNode(pg_dsn, config):
        loader = PostgresStore(pg_dsn)
        try:
            loader.import_jobs(idle_jobs(5_000, int(time.time() * 1000)))
        finally:
            loader.close()
        # The same load is found stale from outside (the server's counts
        # reach its views within ten seconds of a commit), and left so.
        wait_for(lambda: jobs_statistics(pg_dsn)[0] >= 5_000, 20, "the load in the statistics")
        time.sleep(1.0)  # five of the other test's intervals
        assert jobs_statistics(pg_dsn)[1] is None
