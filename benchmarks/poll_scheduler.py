"""The design wheel replaces: the polling scheduler of the seed (sections 4 and 6,
with revisions R1, R2 and R4), written from its SQL.

Every 500 ms (``--poll-interval-ms``; the seed's interval is the default) the
scheduler, owning all 256 shards, runs one claim transaction:

    BEGIN;
    SELECT job_id, schedule, next_run_at, max_attempts, timeout_s FROM jobs
     WHERE shard = ANY(owned) AND state = 'active' AND next_run_at <= now()
     ORDER BY next_run_at LIMIT n FOR UPDATE SKIP LOCKED;
    WITH claimed AS (INSERT INTO executions ... 'dispatched', nextval('fence_seq'),
                     now() + 5 s ON CONFLICT DO NOTHING RETURNING ...)      -- R1 grace
    UPDATE jobs SET next_run_at = next FROM claimed
     WHERE job_id = claimed.job_id AND next_run_at = claimed.scheduled_for;  -- R4 CAS
    COMMIT;
    -- then, only after commit, enqueue (run_id, fence) to the workers.

plus the lease reaper of section 7 (dispatched runs whose grace lapsed with no
live lease are marked lost and re-dispatched as attempt + 1). Workers claim a
lease row (R2: liveness out of the executions row) and write the terminal state
fenced (``bench_worker.py``).

Deviations, all stated: ids are 64-bit integers, not UUIDs (wheel uses int64
ids; integer keys are what a tuned deployment would pick, so the baseline is
not slowed by uuid handling). The seed's row-at-a-time R4 statement is sent
as one statement over arrays (``unnest``) on PostgreSQL — same semantics, one
round trip. LIMIT is 10,000 (the seed's 200 would cap it at 400/s, below its
own 830/s peak) and a poll that returns a full batch polls again at once.
SQLite has no FOR UPDATE SKIP LOCKED and no sequences: the single scheduler
takes BEGIN IMMEDIATE (a write lock for the whole claim) and fences come from
a one-row counter table in the same transaction; times are integer ms.
"""

from __future__ import annotations

import argparse
import json
import signal
import sqlite3
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import Dispatcher, Workload, now_ms

POLL_INTERVAL_MS = 500  # the seed's
DEFAULT_LIMIT = 10_000
REAP_LIMIT = 100  # the seed's reaper batch (critique C2)
GRACE_S = 5  # R1: dispatch grace before a worker's claim
SHARDS = 256

PG_SCHEMA = """
CREATE TABLE jobs (
    job_id        bigint PRIMARY KEY,
    tenant_id     bigint      NOT NULL,
    shard         smallint    NOT NULL,
    name          text        NOT NULL,
    payload_ref   text,
    schedule      jsonb       NOT NULL,
    next_run_at   timestamptz,
    state         text        NOT NULL,
    max_attempts  int         NOT NULL DEFAULT 5,
    timeout_s     int         NOT NULL DEFAULT 300,
    created_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX jobs_due ON jobs (shard, next_run_at)
    WHERE state = 'active' AND next_run_at IS NOT NULL;
CREATE TABLE executions (
    run_id        bigint PRIMARY KEY,
    job_id        bigint      NOT NULL,
    scheduled_for timestamptz NOT NULL,
    attempt       int         NOT NULL,
    state         text        NOT NULL,
    fence         bigint      NOT NULL,
    worker_id     text,
    lease_expires timestamptz,
    started_at    timestamptz,
    finished_at   timestamptz,
    error         text,
    UNIQUE (job_id, scheduled_for, attempt)
);
CREATE INDEX exec_leases ON executions (lease_expires)
    WHERE state IN ('dispatched', 'running');
CREATE TABLE leases (
    run_id     bigint PRIMARY KEY,
    worker_id  text        NOT NULL,
    fence      bigint      NOT NULL,
    expires_at timestamptz NOT NULL
);
CREATE SEQUENCE fence_seq;
CREATE SEQUENCE run_seq;
"""

SQLITE_SCHEMA = """
CREATE TABLE jobs (
    job_id        INTEGER PRIMARY KEY,
    tenant_id     INTEGER NOT NULL,
    shard         INTEGER NOT NULL,
    name          TEXT    NOT NULL,
    payload_ref   TEXT,
    schedule      TEXT    NOT NULL,
    next_run_at   INTEGER,
    state         TEXT    NOT NULL,
    max_attempts  INTEGER NOT NULL DEFAULT 5,
    timeout_s     INTEGER NOT NULL DEFAULT 300,
    created_at    INTEGER NOT NULL
                  DEFAULT (CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER))
);
CREATE INDEX jobs_due ON jobs (shard, next_run_at)
    WHERE state = 'active' AND next_run_at IS NOT NULL;
CREATE TABLE executions (
    run_id        INTEGER PRIMARY KEY,
    job_id        INTEGER NOT NULL,
    scheduled_for INTEGER NOT NULL,
    attempt       INTEGER NOT NULL,
    state         TEXT    NOT NULL,
    fence         INTEGER NOT NULL,
    worker_id     TEXT,
    lease_expires INTEGER,
    started_at    INTEGER,
    finished_at   INTEGER,
    error         TEXT,
    UNIQUE (job_id, scheduled_for, attempt)
);
CREATE INDEX exec_leases ON executions (lease_expires)
    WHERE state IN ('dispatched', 'running');
CREATE TABLE leases (
    run_id     INTEGER PRIMARY KEY,
    worker_id  TEXT    NOT NULL,
    fence      INTEGER NOT NULL,
    expires_at INTEGER NOT NULL
);
CREATE TABLE fence_seq (value INTEGER NOT NULL);
INSERT INTO fence_seq VALUES (0);
"""


def shard_of(job_id: int) -> int:
    return ((job_id * 0x9E3779B97F4A7C15) >> 56) & 0xFF


def _schedule(period_ms: int, first_ms: int) -> str:
    if period_ms:
        return json.dumps({"type": "interval", "period_ms": period_ms, "mode": "fixed_rate"})
    return json.dumps({"type": "once", "at_ms": first_ms})


def _dt(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


def _ms(dt: datetime) -> int:
    return round(dt.timestamp() * 1000)


def sqlite_connect(url: str) -> sqlite3.Connection:
    conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    # NORMAL in WAL mode: a commit survives a process crash (what the seed needs from a
    # scheduler restart) without an fsync per commit; the same setting for every writer.
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute("PRAGMA busy_timeout = 30000")
    return conn


def create_schema(url: str) -> None:
    if url.startswith("postgresql"):
        import psycopg

        with psycopg.connect(url, autocommit=True) as pg:
            pg.execute(PG_SCHEMA)
    else:
        lite = sqlite_connect(url)
        lite.executescript(SQLITE_SCHEMA)
        lite.close()


def submit(url: str, workload: Workload) -> None:
    """The API tier's writes: each job with its first next_run_at (not measured)."""
    rows = [
        (j.index, 1, shard_of(j.index), f"bench-{j.index}", _schedule(j.period_ms, j.first_ms))
        for j in workload.jobs
    ]
    firsts = [j.first_ms for j in workload.jobs]
    if url.startswith("postgresql"):
        import psycopg

        with psycopg.connect(url) as conn, conn.cursor() as cur:
            with cur.copy(
                "COPY jobs (job_id, tenant_id, shard, name, schedule, next_run_at, state)"
                " FROM STDIN"
            ) as copy:
                for r, first in zip(rows, firsts, strict=True):
                    copy.write_row((*r, _dt(first), "active"))
            conn.commit()
            conn.execute("ANALYZE jobs")
            conn.commit()
    else:
        lite = sqlite_connect(url)
        lite.execute("BEGIN IMMEDIATE")
        lite.executemany(
            "INSERT INTO jobs (job_id, tenant_id, shard, name, schedule, next_run_at, state)"
            " VALUES (?, ?, ?, ?, ?, ?, 'active')",
            [(*r, first) for r, first in zip(rows, firsts, strict=True)],
        )
        lite.execute("COMMIT")
        lite.execute("ANALYZE")
        lite.close()


def _next_ms(schedule: dict[str, Any], fired_ms: int) -> int | None:
    """fixed_rate interval: the next fire after the one just claimed; one-shot: none."""
    if schedule["type"] == "interval":
        return fired_ms + int(schedule["period_ms"])
    return None


PG_CLAIM = """
WITH claimed AS (
  INSERT INTO executions (run_id, job_id, scheduled_for, attempt, state, fence, lease_expires)
  SELECT nextval('run_seq'), u.job_id, u.scheduled_for, 0, 'dispatched', nextval('fence_seq'),
         now() + interval '5 s'
    FROM unnest(%s::bigint[], %s::timestamptz[]) AS u(job_id, scheduled_for)
  ON CONFLICT (job_id, scheduled_for, attempt) DO NOTHING
  RETURNING run_id, job_id, scheduled_for, fence
), advanced AS (
  UPDATE jobs j
     SET next_run_at = n.next_run_at
    FROM claimed c
    JOIN unnest(%s::bigint[], %s::timestamptz[]) AS n(job_id, next_run_at)
      ON n.job_id = c.job_id
   WHERE j.job_id = c.job_id
     AND j.next_run_at = c.scheduled_for
  RETURNING j.job_id
)
SELECT c.run_id, c.job_id, (extract(epoch FROM c.scheduled_for) * 1000)::bigint, c.fence
  FROM claimed c
"""

PG_REAP = """
SELECT e.run_id, e.job_id, e.scheduled_for, e.attempt
  FROM executions e
 WHERE e.state = 'dispatched' AND e.lease_expires < now()
   AND NOT EXISTS (SELECT 1 FROM leases l WHERE l.run_id = e.run_id AND l.expires_at >= now())
 ORDER BY e.lease_expires
 LIMIT %s
   FOR UPDATE OF e SKIP LOCKED
"""


class PgPoller:
    """One scheduler replica on PostgreSQL owning every shard."""

    def __init__(self, url: str, limit: int) -> None:
        import psycopg

        self.conn = psycopg.connect(url)
        self.limit = limit
        self.owned = list(range(SHARDS))

    def poll(self) -> tuple[list[tuple[int, int, int, int]], bool]:
        with self.conn.transaction(), self.conn.cursor() as cur:
            cur.execute(
                "SELECT job_id, schedule, next_run_at, max_attempts, timeout_s FROM jobs"
                " WHERE shard = ANY(%s) AND state = 'active' AND next_run_at <= now()"
                " ORDER BY next_run_at LIMIT %s FOR UPDATE SKIP LOCKED",
                (self.owned, self.limit),
            )
            due = cur.fetchall()
            if not due:
                return [], False
            ids = [r[0] for r in due]
            fired = [r[2] for r in due]
            nexts: list[datetime | None] = []
            for _, schedule, at, _, _ in due:
                nxt = _next_ms(schedule, _ms(at))
                nexts.append(None if nxt is None else at + timedelta(milliseconds=nxt - _ms(at)))
            cur.execute(PG_CLAIM, (ids, fired, ids, nexts))
            runs = [(int(a), int(b), int(c), int(d)) for a, b, c, d in cur.fetchall()]
        return runs, len(due) >= self.limit

    def reap(self) -> list[tuple[int, int, int, int]]:
        with self.conn.transaction(), self.conn.cursor() as cur:
            cur.execute(PG_REAP, (REAP_LIMIT,))
            lost = cur.fetchall()
            if not lost:
                return []
            cur.execute(
                "UPDATE executions SET state = 'lost', finished_at = now() WHERE run_id = ANY(%s)",
                ([r[0] for r in lost],),
            )
            cur.execute(
                "INSERT INTO executions (run_id, job_id, scheduled_for, attempt, state, fence,"
                " lease_expires)"
                " SELECT nextval('run_seq'), u.job_id, u.scheduled_for, u.attempt + 1,"
                " 'dispatched', nextval('fence_seq'), now() + interval '5 s'"
                " FROM unnest(%s::bigint[], %s::timestamptz[], %s::int[])"
                " AS u(job_id, scheduled_for, attempt)"
                " ON CONFLICT (job_id, scheduled_for, attempt) DO NOTHING"
                " RETURNING run_id, job_id,"
                " (extract(epoch FROM scheduled_for) * 1000)::bigint, fence",
                ([r[1] for r in lost], [r[2] for r in lost], [r[3] for r in lost]),
            )
            return [(int(a), int(b), int(c), int(d)) for a, b, c, d in cur.fetchall()]


class SqlitePoller:
    """The same claim on SQLite: one scheduler under BEGIN IMMEDIATE (no SKIP LOCKED)."""

    def __init__(self, url: str, limit: int) -> None:
        self.conn = sqlite_connect(url)
        self.limit = limit
        owned = ",".join(str(s) for s in range(SHARDS))
        self.select = (
            "SELECT job_id, schedule, next_run_at, max_attempts, timeout_s FROM jobs"
            f" WHERE shard IN ({owned}) AND state = 'active' AND next_run_at <= ?"
            " ORDER BY next_run_at LIMIT ?"
        )

    def poll(self) -> tuple[list[tuple[int, int, int, int]], bool]:
        c = self.conn
        c.execute("BEGIN IMMEDIATE")
        try:
            now = now_ms()
            due = c.execute(self.select, (now, self.limit)).fetchall()
            runs: list[tuple[int, int, int, int]] = []
            if due:
                (top,) = c.execute(
                    "UPDATE fence_seq SET value = value + ? RETURNING value", (len(due),)
                ).fetchone()
                fence = top - len(due)
                for job_id, schedule, at, _, _ in due:
                    fence += 1
                    won = c.execute(
                        "INSERT INTO executions (job_id, scheduled_for, attempt, state, fence,"
                        " lease_expires) VALUES (?, ?, 0, 'dispatched', ?, ?)"
                        " ON CONFLICT (job_id, scheduled_for, attempt) DO NOTHING"
                        " RETURNING run_id",
                        (job_id, at, fence, now + GRACE_S * 1000),
                    ).fetchone()
                    if won is None:
                        continue
                    c.execute(
                        "UPDATE jobs SET next_run_at = ? WHERE job_id = ? AND next_run_at = ?",
                        (_next_ms(json.loads(schedule), at), job_id, at),
                    )
                    runs.append((won[0], job_id, at, fence))
            c.execute("COMMIT")
        except BaseException:
            c.execute("ROLLBACK")
            raise
        return runs, len(due) >= self.limit

    def reap(self) -> list[tuple[int, int, int, int]]:
        c = self.conn
        c.execute("BEGIN IMMEDIATE")
        try:
            now = now_ms()
            lost = c.execute(
                "SELECT e.run_id, e.job_id, e.scheduled_for, e.attempt FROM executions e"
                " WHERE e.state = 'dispatched' AND e.lease_expires < ?"
                " AND NOT EXISTS (SELECT 1 FROM leases l WHERE l.run_id = e.run_id"
                " AND l.expires_at >= ?) ORDER BY e.lease_expires LIMIT ?",
                (now, now, REAP_LIMIT),
            ).fetchall()
            runs: list[tuple[int, int, int, int]] = []
            if lost:
                (top,) = c.execute(
                    "UPDATE fence_seq SET value = value + ? RETURNING value", (len(lost),)
                ).fetchone()
                fence = top - len(lost)
                for run_id, job_id, at, attempt in lost:
                    fence += 1
                    c.execute(
                        "UPDATE executions SET state = 'lost', finished_at = ? WHERE run_id = ?",
                        (now, run_id),
                    )
                    won = c.execute(
                        "INSERT INTO executions (job_id, scheduled_for, attempt, state, fence,"
                        " lease_expires) VALUES (?, ?, ?, 'dispatched', ?, ?)"
                        " ON CONFLICT (job_id, scheduled_for, attempt) DO NOTHING"
                        " RETURNING run_id",
                        (job_id, at, attempt + 1, fence, now + GRACE_S * 1000),
                    ).fetchone()
                    if won is not None:
                        runs.append((won[0], job_id, at, fence))
            c.execute("COMMIT")
        except BaseException:
            c.execute("ROLLBACK")
            raise
        return runs


_stop = False


def _on_term(signum: int, frame: Any) -> None:
    global _stop
    _stop = True


def serve(url: str, workers: int, limit: int, interval_ms: int = POLL_INTERVAL_MS) -> None:
    """The scheduler process: accept the workers' queue connections, then
    poll every ``interval_ms``."""
    signal.signal(signal.SIGTERM, _on_term)
    dispatcher = Dispatcher(workers)
    print(f"PORT {dispatcher.port}", flush=True)
    dispatcher.accept_all()
    poller: PgPoller | SqlitePoller = (
        PgPoller(url, limit) if url.startswith("postgresql") else SqlitePoller(url, limit)
    )
    print("READY", flush=True)
    next_poll = time.monotonic()
    while not _stop:
        runs, full = poller.poll()
        dispatcher.send(runs)  # enqueue only after the claim committed
        dispatcher.send(poller.reap())
        if full:
            continue  # a full batch: more is due right now
        next_poll += interval_ms / 1000
        delay = next_poll - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        else:
            next_poll = time.monotonic()
    dispatcher.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--store", required=True, help="sqlite:///PATH or a postgresql:// DSN")
    p.add_argument("--workers", type=int, required=True)
    p.add_argument("--limit", type=int, default=DEFAULT_LIMIT)
    p.add_argument(
        "--poll-interval-ms",
        type=int,
        default=POLL_INTERVAL_MS,
        help="ms from one poll's start to the next (default: the seed's %(default)s)",
    )
    args = p.parse_args()
    if args.poll_interval_ms < 1:
        p.error("--poll-interval-ms must be at least 1")
    serve(args.store, args.workers, args.limit, args.poll_interval_ms)


if __name__ == "__main__":
    main()
