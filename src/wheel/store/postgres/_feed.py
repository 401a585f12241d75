"""What an owner reads of its shards on PostgreSQL: the whole of them when
it gains them, and the change feed after that. Each function runs inside the
caller's transaction.

The change feed cannot use a sequence: a transaction that took sequence
value 10 may commit after one that took 11, and a reader that saw 11 and
moved its watermark past it would never see 10. Instead each job row carries
the id of the transaction that last changed it (``change_xid`` for a change
through the API, ``move_xid`` for an owner's schedule move), and a reader
only hands out transactions below its snapshot's ``xmin``: all of those have
finished, so nothing can still commit below the new watermark. Changes of
transactions at or above ``xmin`` wait for a later read (a long-running
transaction anywhere in the cluster delays, never loses, them). The
watermark is exclusive: "every change with an xid below it was seen".

``change_xid`` is indexed, and a running owner reads only those changes.
``move_xid`` is not, so a claim's update of its job stays a HOT update (no
new index entries); a restarting owner finds the moves with a scan of the
jobs table for each page.
"""

from __future__ import annotations

from collections.abc import Sequence

from wheel.store._shared import Executor, job_from_row, load_packed, run_from_row
from wheel.store.base import ShardLoad
from wheel.store.postgres._db import Conn
from wheel.store.postgres._sql import QUERIES

# Reads of a load or a page see one snapshot.
ONE_SNAPSHOT = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"


def safe_xid(conn: Executor) -> int:
    """The oldest transaction still running when this transaction's snapshot
    was taken: every change by a transaction below it has committed (and is
    visible to this snapshot) or rolled back."""
    row = conn.execute("SELECT pg_snapshot_xmin(pg_current_snapshot())::text").fetchone()
    assert row is not None
    return int(row[0])


def load_shards(
    conn: Conn,
    shards: Sequence[int],
    packed: bool,
    due_by: int | None = None,
    later_than: int | None = None,
) -> ShardLoad:
    conn.execute(ONE_SNAPSHOT)
    watermark = safe_xid(conn)
    inflight = []
    if later_than is None:
        runs = conn.execute(QUERIES.inflight_runs, (shards,)).fetchall()
        inflight = [run_from_row(r) for r in runs]
    if packed:
        jobs, rows, profiles = load_packed(
            conn, QUERIES, shards, due_by=due_by, later_than=later_than
        )
        return ShardLoad(
            jobs=jobs, inflight=inflight, watermark=watermark, packed=rows, profiles=profiles
        )
    found = conn.execute(QUERIES.live_jobs_of_shards, (shards,)).fetchall()
    return ShardLoad(jobs=[job_from_row(r) for r in found], inflight=inflight, watermark=watermark)
