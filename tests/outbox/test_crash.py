"""The outbox across crashes, with real node processes: a node SIGKILLed
between storing a batch's jobs and recording their rows' fate, and the
outbox's PostgreSQL restarted under a relaying node (a server of the test's
own, not the machine's), as the application's database or as wheel's own
store. Each row ends as exactly one job."""

from __future__ import annotations

import signal
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from testkit.procs import ServerProc, wait_for, wheelctl
from tests.outbox._pg import OwnPostgres
from wheel import outbox
from wheel.client import Client
from wheel.node._outbox import BATCH_ROWS, LANES

pytestmark = pytest.mark.slow


def job(name: str, i: int) -> dict[str, Any]:
    return {"name": name, "handler": "noop", "at": timedelta(hours=1), "payload": i}


def count(conn: psycopg.Connection[Any], query: str, *args: Any) -> int:
    (n,) = conn.execute(query, args).fetchone() or (0,)
    conn.commit()
    return int(n)


@pytest.mark.postgres
def test_a_node_killed_after_storing_jobs_but_before_their_fate_makes_each_row_one_job(
    tmp_path: Path, pg_dsn: str
) -> None:
    # A batch for each lane, the last one short: every row is claimed at once.
    rows = LANES * BATCH_ROWS - 1_000
    server = ServerProc(tmp_path / "data", store=pg_dsn)
    # The first node stores its first batch's jobs, then waits before it
    # records their rows' fate: the window a crash can fall in.
    server.args = ("--outbox-record-delay", "60")
    server.start()
    try:
        with psycopg.connect(pg_dsn) as conn:
            entries = outbox.submit_many(conn, [job("crash", i) for i in range(rows)])
            conn.commit()
            ids = [e.id for e in entries]
            jobs = "SELECT count(*) FROM jobs WHERE name = 'crash'"
            wait_for(lambda: count(conn, jobs) == rows, 30, "both batches' jobs")
            assert server.proc is not None
            server.proc.send_signal(signal.SIGKILL)
            server.proc.wait(10)
            # Every row is pending still, and every row's job exists.
            pending = "SELECT count(*) FROM wheel_outbox WHERE state = 'pending'"
            assert count(conn, pending) == rows
            before = {
                r[0]
                for r in conn.execute("SELECT job_id FROM jobs WHERE name = 'crash'").fetchall()
            }
            assert len(before) == rows
            server.args = ()
            server.start()
            wait_for(lambda: count(conn, pending) == 0, 60, "every row's fate", interval=0.2)
            fates = conn.execute(
                "SELECT id, state, job_id FROM wheel_outbox WHERE id = ANY(%s) ORDER BY id",
                (ids,),
            ).fetchall()
            assert {state for _, state, _ in fates} == {"done"}
            job_ids = [job_id for _, _, job_id in fates]
            assert len(set(job_ids)) == rows
            assert count(conn, jobs) == rows
            # The rows picked up twice name the jobs the first pick-up made.
            assert set(job_ids) == before
    finally:
        server.stop()


@pytest.mark.parametrize("where", ["application", "store"])
def test_rows_committed_around_a_postgresql_restart_each_become_one_job(
    tmp_path: Path, where: str
) -> None:
    """``application``: the outbox in the application's database, wheel's
    store SQLite; ``store``: the outbox in wheel's own PostgreSQL store, whose
    restart takes the node's store down with it (the relay's submits fail
    and their rows wait)."""
    pg = OwnPostgres()
    try:
        pg.start()
        if where == "application":
            assert wheelctl("outbox", "init", "--dsn", pg.dsn).returncode == 0
            server = ServerProc(tmp_path / "data", args=("--outbox-dsn", pg.dsn))
        else:
            server = ServerProc(tmp_path / "data", store=pg.dsn)
        server.start()
        try:
            _across_a_restart(pg, server)
        finally:
            server.stop()
    finally:
        pg.remove()


def _across_a_restart(pg: OwnPostgres, server: ServerProc) -> None:
    def commit(name: str, n: int) -> list[int]:
        with psycopg.connect(pg.dsn) as conn:
            entries = outbox.submit_many(conn, [job(name, i) for i in range(n)])
            conn.commit()
        return [e.id for e in entries]

    def done(ids: list[int]) -> bool:
        try:
            with psycopg.connect(pg.dsn, connect_timeout=2) as conn:
                return count(
                    conn,
                    "SELECT count(*) FROM wheel_outbox WHERE id = ANY(%s) AND state = 'done'",
                    ids,
                ) == len(ids)
        except psycopg.OperationalError:
            return False

    before = commit("before", 200)
    wait_for(lambda: done(before), 20, "the rows before the restart")
    # Committed just before the server goes down: the relay is woken and
    # its claim, or its record, may meet the shutdown.
    around = commit("around", 3_000)
    pg.stop("fast")
    pg.start()
    after = commit("after", 200)
    # The listener reconnects (backoff at most 5 s) and the poll finds the
    # rest; the rows committed while nobody listened are read at once then.
    wait_for(lambda: done(before + around + after), 30, "every row's fate", interval=0.2)
    with Client(server.target) as client:
        names = Counter(j.name for j in client.jobs())
    assert names == {"before": 200, "around": 3_000, "after": 200}
    with psycopg.connect(pg.dsn) as conn:
        job_ids = conn.execute("SELECT job_id FROM wheel_outbox").fetchall()
    assert len({j for (j,) in job_ids}) == 3_400
    status = wheelctl("outbox", "status", "--dsn", pg.dsn, "--json")
    assert '"pending": 0' in status.stdout and '"failed": 0' in status.stdout
