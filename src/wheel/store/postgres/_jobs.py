"""Jobs on PostgreSQL: submits (set-based, with idempotency keys), bulk
imports, reads and state changes. Each function runs inside the caller's
transaction."""

from __future__ import annotations

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
    digests, first = batch_keys(news)
    ids: dict[int, int] = {}  # index -> new job id
    if first:
        won = conn.execute(
            sql.CLAIM_KEYS_SQL,
            (
                Texts([t for t, _ in first]),
                Texts([k for _, k in first]),
                Texts([digests[i] for i in first.values()]),
                Int8s([news[i].created_at_ms for i in first.values()]),
            ),
        ).fetchall()
        for tenant, key, job_id in won:
            ids[first[(tenant, key)]] = int(job_id)
    fresh = [i for i, n in enumerate(news) if n.idempotency_key is None]
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
                Bools([not n.spec.recurring for n in fresh_news]),
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
    # Keys held by an earlier request (or earlier in this batch).
    taken = {
        (n.spec.tenant, n.idempotency_key)
        for i, n in enumerate(news)
        if n.idempotency_key is not None and i not in ids
    }
    held: dict[tuple[str, str], tuple[str, int]] = {}
    if taken:
        for tenant, key, digest, job_id in conn.execute(
            sql.HELD_KEYS_SQL, (Texts([t for t, _ in taken]), Texts([k for _, k in taken]))
        ).fetchall():
            held[(tenant, key)] = (digest, int(job_id))
    existing: dict[int, JobRecord] = {}
    if held:
        for row in conn.execute(
            sql.QUERIES.jobs_by_id, ([job_id for _, job_id in held.values()],)
        ).fetchall():
            record = job_from_row(row)
            existing[record.job_id] = record
    out: list[Submitted | WheelError] = []
    for i, n in enumerate(news):
        if i in ids:
            out.append(Submitted(created_record(ids[i], n, change), True))
            continue
        assert n.idempotency_key is not None
        pair = (n.spec.tenant, n.idempotency_key)
        if pair not in held:  # pragma: no cover - the key row committed
            raise StoreError("idempotency key vanished during submit")
        digest, job_id = held[pair]
        if digest != digests[i]:
            out.append(key_conflict(n))
        else:
            out.append(Submitted(existing[job_id], False))
    return out


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
