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


def last_analyzed(dsn: str, table: str) -> float | None:
    """When ``table`` of the DSN's schema was last analyzed, by anyone."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT extract(epoch FROM GREATEST(last_analyze, last_autoanalyze))"
            " FROM pg_stat_user_tables WHERE schemaname = current_schema() AND relname = %s",
            (table,),
        ).fetchone()
    return None if row is None or row[0] is None else float(row[0])


def test_a_node_analyzes_the_jobs_table_after_a_bulk_load(pg_dsn: str) -> None:
    config = NodeConfig(statistics_interval_s=0.2, retain_ms=None)
    with LiveNode(pg_dsn, config):
        assert last_analyzed(pg_dsn, "jobs") is None
        loader = PostgresStore(pg_dsn)
        try:
            loader.import_jobs(idle_jobs(20_000, int(time.time() * 1000)))
        finally:
            loader.close()
        wait_for(lambda: last_analyzed(pg_dsn, "jobs") is not None, 20, "jobs to be analyzed")


def test_a_node_told_not_to_leaves_the_statistics_to_the_server(pg_dsn: str) -> None:
    config = NodeConfig(statistics_interval_s=0, retain_ms=None)
    with LiveNode(pg_dsn, config):
        loader = PostgresStore(pg_dsn)
        try:
            loader.import_jobs(idle_jobs(5_000, int(time.time() * 1000)))
            # The same load is found stale from outside (the server's counts
            # reach its views within ten seconds of a commit), and left so.
            deadline = time.monotonic() + 20
            while not loader._db.run(stale_jobs, idempotent=True):
                assert time.monotonic() < deadline, "the load never showed in the statistics"
                time.sleep(0.2)
        finally:
            loader.close()
        time.sleep(1.0)  # five of the other test's intervals
        assert last_analyzed(pg_dsn, "jobs") is None


def stale_jobs(conn: psycopg.Connection, _: object) -> bool:
    row = conn.execute(
        "SELECT n_mod_since_analyze FROM pg_stat_user_tables"
        " WHERE schemaname = current_schema() AND relname = 'jobs'"
    ).fetchone()
    return row is not None and int(row[0]) >= 5_000
