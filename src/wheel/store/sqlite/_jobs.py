"""Jobs on SQLite: submits (set-based, with idempotency keys), bulk imports,
reads and state changes. Each function runs inside the caller's write
transaction; a write takes one change number for every job it changes."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence

from wheel.errors import WheelError
from wheel.store._keys import KeyedSubmits
from wheel.store._shared import get_job, new_job_row, new_profiles, spec_row
from wheel.store.base import JobRecord, JobState, NewJob, Submitted
from wheel.store.sqlite import _sql as sql
from wheel.store.sqlite._db import bump


def submit_many(cur: sqlite3.Cursor, news: Sequence[NewJob]) -> list[Submitted | WheelError]:
    """Set-based: one lookup of the batch's keys, one bump of each counter
    and one statement per table, instead of seven statements per job. A key
    conflict is returned in that submit's place. The write lock, held since
    the transaction began, keeps the keys read here from being taken before
    the jobs are written."""
    keyed = KeyedSubmits(news)
    if keyed.first:
        keyed.hold(cur.execute(sql.HELD_KEYS, (json.dumps(keyed.keys()),)))
    made = keyed.to_create()
    ids: dict[int, int] = {}  # index -> new job id
    change = 0
    if made:
        base = bump(cur, "job_id", len(made))
        change = bump(cur, "change_seq")
        ids = {i: base + k for k, i in enumerate(made)}
        cur.executemany(sql.INSERT_PROFILE, new_profiles([news[i] for i in made]))
        cur.executemany(sql.INSERT_JOB, [(*new_job_row(ids[i], news[i]), change) for i in made])
        cur.executemany(sql.INSERT_SPEC, [spec_row(ids[i], news[i]) for i in made])
        cur.executemany(
            sql.INSERT_KEY,
            [
                (n.spec.tenant, n.idempotency_key, keyed.digests[i], ids[i], n.created_at_ms)
                for i in made
                if (n := news[i]).idempotency_key is not None
            ],
        )
    return keyed.answers(cur, sql.QUERIES, ids, change)


def import_jobs(cur: sqlite3.Cursor, news: Sequence[NewJob]) -> list[int]:
    """Jobs without keys; their ids in order."""
    first = bump(cur, "job_id", len(news))
    change = bump(cur, "change_seq")
    ids = list(range(first, first + len(news)))
    cur.executemany(sql.INSERT_PROFILE, new_profiles(news))
    cur.executemany(
        sql.INSERT_JOB, [(*new_job_row(i, n), change) for i, n in zip(ids, news, strict=True)]
    )
    cur.executemany(sql.INSERT_SPEC, [spec_row(i, n) for i, n in zip(ids, news, strict=True)])
    return ids


def set_state(
    cur: sqlite3.Cursor, job_id: int, state: JobState, next_run_at: int | None, now_ms: int
) -> JobRecord:
    change = bump(cur, "change_seq")
    cur.execute(sql.SET_STATE, (state.value, next_run_at, now_ms, change, job_id))
    return get_job(cur, sql.QUERIES, job_id)
