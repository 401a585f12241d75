"""Jobs on SQLite: submits (set-based, with idempotency keys), bulk imports,
reads and state changes. Each function runs inside the caller's write
transaction; a write takes one change number for every job it changes."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence

from wheel.errors import StoreError, WheelError
from wheel.store._shared import (
    batch_keys,
    created_record,
    get_job,
    job_from_row,
    key_conflict,
    new_job_row,
    new_profiles,
    spec_row,
)
from wheel.store.base import JobRecord, JobState, NewJob, Submitted
from wheel.store.sqlite import _sql as sql
from wheel.store.sqlite._db import bump


def submit_many(cur: sqlite3.Cursor, news: Sequence[NewJob]) -> list[Submitted | WheelError]:
    """Set-based: one lookup of the batch's keys, one bump of each counter
    and one statement per table, instead of seven statements per job. A key
    conflict is returned in that submit's place."""
    digests, first = batch_keys(news)
    held: dict[tuple[str, str], tuple[str, int]] = {}  # key -> (digest, job id)
    if first:
        for tenant, key, digest, job_id in cur.execute(sql.HELD_KEYS, (json.dumps(list(first)),)):
            held[(tenant, key)] = (digest, job_id)
    made = [
        i
        for i, n in enumerate(news)
        if n.idempotency_key is None
        or (
            (n.spec.tenant, n.idempotency_key) not in held
            and first[(n.spec.tenant, n.idempotency_key)] == i
        )
    ]
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
                (n.spec.tenant, n.idempotency_key, digests[i], ids[i], n.created_at_ms)
                for i in made
                if (n := news[i]).idempotency_key is not None
            ],
        )
    existing: dict[int, JobRecord] = {}
    if held:
        job_ids = [job_id for _, job_id in held.values()]
        for row in cur.execute(sql.QUERIES.jobs_by_id, (json.dumps(job_ids),)):
            record = job_from_row(row)
            existing[record.job_id] = record
    out: list[Submitted | WheelError] = []
    created: dict[int, JobRecord] = {}
    for i, n in enumerate(news):
        if i in ids:
            created[i] = record = created_record(ids[i], n, change)
            out.append(Submitted(record, True))
            continue
        assert n.idempotency_key is not None
        pair = (n.spec.tenant, n.idempotency_key)
        if pair in held:
            digest, job_id = held[pair]
            same = existing.get(job_id)
        else:  # the key's first use is earlier in this batch
            digest, same = digests[first[pair]], created[first[pair]]
        if digest != digests[i]:
            out.append(key_conflict(n))
        elif same is None:  # pragma: no cover - a key row keeps its job
            raise StoreError(f"job of idempotency key {n.idempotency_key!r} is gone")
        else:
            out.append(Submitted(same, False))
    return out


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
