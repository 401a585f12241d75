"""What an owner reads of its shards on SQLite: the whole of them when it
gains them, and the change feed after that. Each function runs inside the
caller's read transaction, which is one snapshot.

SQLite serializes writers, and each write takes its change number from a
counter row inside its transaction, so numbers are handed out in commit
order and every committed change has a number at most the counter's value:
the feed is a plain "above the watermark, up to the counter". The watermark
is inclusive: "every change numbered up to it was seen". An API change takes
its number in ``change_seq`` (indexed); an owner's schedule move in
``move_seq``, which no index covers, so a claim's update of its job writes
no index (unless it ends a one-shot: state is in ``jobs_state``) and a
restarting owner reads the moves with a scan of the table for each page.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from wheel.store._shared import job_from_row, load_packed, run_from_row
from wheel.store.base import SHARD_COUNT, ShardLoad
from wheel.store.sqlite._sql import DIALECT, LAST_CHANGE, QUERIES


def load_shards(
    cur: sqlite3.Cursor,
    shards: Sequence[int],
    packed: bool,
    due_by: int | None = None,
    later_than: int | None = None,
) -> ShardLoad:
    watermark = cur.execute(LAST_CHANGE).fetchone()[0]
    inflight = []
    if later_than is None:
        runs = cur.execute(QUERIES.inflight_runs, (DIALECT.ints(shards),)).fetchall()
        inflight = [run_from_row(r) for r in runs]
    if packed:
        jobs, rows, profiles = load_packed(
            cur, QUERIES, shards, due_by=due_by, later_than=later_than
        )
        return ShardLoad(
            jobs=jobs, inflight=inflight, watermark=int(watermark), packed=rows, profiles=profiles
        )
    # All shards (one node: always) read the table in job_id order; through
    # the index of live jobs by shard (dropped in migration 15) the rows came
    # in shard order and were sorted, 4x slower at a million jobs.
    if len(shards) == SHARD_COUNT:
        found = cur.execute(QUERIES.live_jobs).fetchall()
    else:
        found = cur.execute(QUERIES.live_jobs_of_shards, (DIALECT.ints(shards),)).fetchall()
    return ShardLoad(
        jobs=[job_from_row(r) for r in found], inflight=inflight, watermark=int(watermark)
    )
