"""Jobs on PostgreSQL: submits (set-based, with idempotency keys), bulk
imports, reads and state changes. Each function runs inside the caller's
transaction."""

from __future__ import annotations

from collections.abc import Sequence

from wheel.errors import WheelError
from wheel.store._keys import KeyedSubmits
from wheel.store._shared import (
    get_job,
    new_job_row,
    new_profiles,
    new_spec_text,
    profile_and_param,
    spec_row,
)
from wheel.store.base import JobRecord, JobState, NewJob, Submitted, shard_of
from wheel.store.postgres import _sql as sql
from wheel.store.postgres._arrays import Bools, Int4s, Int8s, Texts
from wheel.store.postgres._db import Conn


def submit_many(conn: Conn, news: Sequence[NewJob]) -> list[Submitted | WheelError]:
    """Set-based: a handful of statements for the whole batch instead of
    four round trips per job. A key conflict is returned in that submit's
    place."""
    keyed = KeyedSubmits(news)
    first = keyed.first
    ids: dict[int, int] = {}  # index -> new job id
    if first:
        won = conn.execute(
            sql.CLAIM_KEYS_SQL,
            (
                Texts([t for t, _ in first]),
                Texts([k for _, k in first]),
                Texts([keyed.digests[i] for i in first.values()]),
                Int8s([news[i].created_at_ms for i in first.values()]),
            ),
        ).fetchall()
        for tenant, key, job_id in won:
            ids[first[(tenant, key)]] = int(job_id)
    fresh = keyed.keyless()
    if fresh:
        rows = conn.execute(sql.NEW_JOB_IDS_SQL, (len(fresh),)).fetchall()
        for i, row in zip(fresh, rows, strict=True):
            ids[i] = int(row[0])
    made = sorted(ids)
    change = 0
    if made:
        job_ids = Int8s([ids[i] for i in made])
        fresh_news = [news[i] for i in made]
        profiles = new_profiles(fresh_news)
        conn.execute(
            sql.INSERT_PROFILES_SQL,
            (Int8s([p for p, _ in profiles]), Texts([b for _, b in profiles])),
        )
        packed = [profile_and_param(n) for n in fresh_news]
        inserted = conn.execute(
            sql.INSERT_JOBS_SQL,
            (
                job_ids,
                Int4s([shard_of(ids[i]) for i in made]),
                Texts([n.spec.tenant for n in fresh_news]),
                Texts([n.spec.name for n in fresh_news]),
                Int8s([n.next_run_at for n in fresh_news]),
                Bools([n.spec.schedule_ends for n in fresh_news]),
                Texts([n.idempotency_key for n in fresh_news]),
                Int8s([n.created_at_ms for n in fresh_news]),
                Int8s([p.profile_id for p, _ in packed]),
                Int8s([param for _, param in packed]),
                Bools([bool(n.spec.payload) for n in fresh_news]),
            ),
        ).fetchone()
        assert inserted is not None
        change = int(inserted[0])
        conn.execute(
            sql.INSERT_SPECS_SQL,
            (
                job_ids,
                Texts([new_spec_text(n) for n in fresh_news]),
                [n.spec.payload for n in fresh_news],
            ),
        )
    # Keys held by an earlier request (or taken earlier in this batch).
    taken = keyed.not_created(ids)
    if taken:
        keyed.hold(
            conn.execute(
                sql.HELD_KEYS_SQL, (Texts([t for t, _ in taken]), Texts([k for _, k in taken]))
            ).fetchall()
        )
    return keyed.answers(conn, sql.QUERIES, ids, change)


def import_jobs(conn: Conn, news: Sequence[NewJob]) -> list[int]:
    """Jobs without keys through COPY; their ids in order."""
    ids = [int(r[0]) for r in conn.execute(sql.NEW_JOB_IDS_SQL, (len(news),))]
    profiles = new_profiles(news)
    conn.execute(
        sql.INSERT_PROFILES_SQL, (Int8s([p for p, _ in profiles]), Texts([b for _, b in profiles]))
    )
    with conn.cursor() as cur:
        with cur.copy(sql.COPY_JOBS_SQL) as copy:
            for job_id, n in zip(ids, news, strict=True):
                copy.write_row(new_job_row(job_id, n))
        with cur.copy(sql.COPY_SPECS_SQL) as copy:
            for job_id, n in zip(ids, news, strict=True):
                copy.write_row(spec_row(job_id, n))
    return ids


def set_state(
    conn: Conn, job_id: int, state: JobState, next_run_at: int | None, now_ms: int
) -> JobRecord:
    conn.execute(sql.SET_STATE_SQL, (state.value, next_run_at, now_ms, job_id))
    return get_job(conn, sql.QUERIES, job_id)
