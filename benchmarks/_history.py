"""Rows straight into a store, the fast way: ``jobs`` jobs through the
store's own batch submit (in this process, no node), then ``runs`` ended
runs and a few missed fires inserted in one transaction (SQLite) or copied
(PostgreSQL), spread over the last ``days`` days, and their minutes counted
as migration 25 counts a store's rows. What ``console.py --runs`` measures
the overview's calls against.

Each job gets ``runs // jobs`` runs, evenly apart; run ids grow with time as
a node's would. Outcomes: 1 in 50 failed, 1 in 100 timed out, 1 in 200
lost, 1 in 200 dead-lettered, the rest succeeded; 1 in 50 fires also has a
missed fire beside it. Half the jobs are acme's, half globex's; the handler
is one of four."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from wheel.engine.spec import Interval, JobSpec
from wheel.store._rollup import backfill
from wheel.store.base import NewJob
from wheel.store.open import open_store

BATCH = 10_000
HANDLERS = ("reports.build", "mail.send", "ledger.sync", "cache.warm")
HOUR_MS = 3_600_000
Outcomes = Callable[[int], tuple[str, str | None]]


def outcome(i: int) -> tuple[str, str | None]:
    if i % 200 == 7:
        return "dead_lettered", "permanent failure: bad input"
    if i % 200 == 11:
        return "lost", None
    if i % 100 == 3:
        return "timed_out", None
    if i % 50 == 1:
        return "failed", "connection refused"
    return "succeeded", None


def settled(i: int) -> tuple[str, str | None]:
    """Outcomes with nothing owed: as ``outcome``, but a fire whose run failed,
    was lost or timed out has used its attempts up (dead-lettered). A store
    a node has run for a month holds few runs owed a retry; ``outcome``'s
    would each be one for a node starting on them."""
    state, error = outcome(i)
    if state in ("failed", "lost", "timed_out"):
        return "dead_lettered", error or state.replace("_", " ")
    return state, error


def load_history(
    url: str,
    *,
    jobs: int,
    runs: int,
    days: float,
    first_fire_in_ms: int = HOUR_MS,
    outcomes: Outcomes = outcome,
) -> dict[str, float]:
    """Fill the store at ``url`` (``sqlite:///...`` or ``postgresql://...``);
    seconds each part took. The jobs' next fire is ``first_fire_in_ms``
    from now (nothing of them fires while measured); no runs: the jobs
    alone. Run ``i`` ends as ``outcomes(i)`` says."""
    now = int(time.time() * 1000)
    took: dict[str, float] = {}
    started = time.perf_counter()
    store = open_store(url)
    try:
        for first in range(0, jobs, BATCH):
            news = [
                NewJob(
                    spec=JobSpec(
                        name=f"job-{i:06d}",
                        handler=HANDLERS[i % len(HANDLERS)],
                        tenant="acme" if i % 2 else "globex",
                        schedule=Interval(period_ms=6 * HOUR_MS),
                    ),
                    created_at_ms=now - int(days * 24 * HOUR_MS),
                    # Nothing fires while measured.
                    next_run_at=now + first_fire_in_ms,
                )
                for i in range(first, min(jobs, first + BATCH))
            ]
            for result in store.submit_jobs(news):
                if isinstance(result, Exception):
                    raise result
    finally:
        store.close()
    took["jobs_s"] = time.perf_counter() - started

    started = time.perf_counter()
    span = int(days * 24 * HOUR_MS)
    first_ms = now - span
    if runs and url.startswith("sqlite:///"):
        path = url.removeprefix("sqlite:///").split("?")[0]  # without its options
        _fill_sqlite(Path(path), runs, first_ms, span, outcomes)
    elif runs:
        _fill_postgres(url, runs, first_ms, span, outcomes)
    took["runs_s"] = time.perf_counter() - started
    return took


def _runs(
    ids: list[int], runs: int, first_ms: int, span: int, outcomes: Outcomes
) -> Iterator[tuple[object, ...]]:
    for i in range(runs):
        job_id = ids[i % len(ids)]
        fire = first_ms + (i * span) // runs
        state, error = outcomes(i)
        took_ms = 20 + (i * 7919) % 3000
        yield (
            i + 1, job_id, fire, 0, state, i + 1, "w-1",
            fire + 3, fire + 5, fire + 5 + took_ms, error,
        )  # fmt: skip


def _missed(ids: list[int], runs: int, first_ms: int, span: int) -> Iterator[tuple[int, int, int]]:
    for i in range(0, runs, 50):
        at = first_ms + (i * span) // runs
        yield ids[i % len(ids)], at + 1, at


RUN_COLUMNS = (
    "run_id, job_id, scheduled_for, attempt, state, fence,"
    " worker_id, dispatched_at_ms, started_at_ms, finished_at_ms, error"
)


def _fill_sqlite(db: Path, runs: int, first_ms: int, span: int, outcomes: Outcomes) -> None:
    con = sqlite3.connect(db, isolation_level=None)
    try:
        ids = [r[0] for r in con.execute("SELECT job_id FROM jobs ORDER BY job_id")]
        con.execute("BEGIN")
        con.executemany(
            f"INSERT INTO executions ({RUN_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            _runs(ids, runs, first_ms, span, outcomes),
        )
        con.execute("UPDATE counters SET value = ? WHERE name = 'run_id'", (runs,))
        con.executemany(
            "INSERT INTO missed_fires (job_id, scheduled_for, reason, recorded_at_ms)"
            " VALUES (?, ?, 'overlap', ?)",
            _missed(ids, runs, first_ms, span),
        )
        # The rows went in beside the store's writes: their minutes are
        # counted as migration 25 counts what a store kept before it.
        con.execute("DELETE FROM run_minutes")
        for statement in backfill():
            con.execute(statement)
        # No ANALYZE: a node's store runs without statistics, so its plans
        # are measured as they are.
        con.execute("COMMIT")
        # Into the database file, as a store's own checkpoints would have
        # put a month of runs: not a WAL of the whole table to copy back
        # during the measured window.
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        con.close()


def _fill_postgres(url: str, runs: int, first_ms: int, span: int, outcomes: Outcomes) -> None:
    import psycopg

    with psycopg.connect(url) as con:
        ids = [r[0] for r in con.execute("SELECT job_id FROM jobs ORDER BY job_id")]
        with con.cursor() as cur:
            with cur.copy(f"COPY executions ({RUN_COLUMNS}) FROM STDIN") as copy:
                for row in _runs(ids, runs, first_ms, span, outcomes):
                    copy.write_row(row)
            with cur.copy(
                "COPY missed_fires (job_id, scheduled_for, reason, recorded_at_ms) FROM STDIN"
            ) as copy:
                for job_id, fire, at in _missed(ids, runs, first_ms, span):
                    copy.write_row((job_id, fire, "overlap", at))
            ids_of_runs = "pg_get_serial_sequence('executions', 'run_id')"
            cur.execute(f"SELECT setval({ids_of_runs}, %s)", (runs,))
            cur.execute("DELETE FROM run_minutes")
            for statement in backfill():
                cur.execute(statement)
        con.commit()
        # A month of runs in a store was written over a month: vacuumed,
        # its hint bits set and checkpointed long ago. Rows copied in a
        # minute are none of that, and the vacuum, the hint-bit writes and
        # the checkpoint of the whole table a store never sees at once
        # would fall in the measured window (at 30 million runs: p99 lag
        # 87 ms against 40 with an empty table, the dispatch arm's extra
        # CPU the database's). Statistics come with the vacuum, as
        # autovacuum gathers them.
        con.autocommit = True
        con.execute("VACUUM (ANALYZE) executions")
        con.execute("VACUUM (ANALYZE) missed_fires")
        con.execute("ANALYZE")
        con.execute("CHECKPOINT")
