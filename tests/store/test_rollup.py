"""The minutes' counts of runs and missed fires (``wheel.store._rollup``) on
both SQL stores: migration 25 fills them from the runs and missed fires a
store kept before it, retention drops the minutes it passes, two
PostgreSQL writers on one slot count every run once, and SQLite reads a
window's minutes through the table's key."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.store.conftest import interval_job
from tests.store.test_contract import claim
from wheel.store._rollup import counts_sql
from wheel.store._schema import PG_MIGRATIONS, SQLITE_MIGRATIONS
from wheel.store.base import Completion, MissedFire, MissedReason, RunState
from wheel.store.postgres import PostgresStore
from wheel.store.sqlite import SQLiteStore

MINUTE = 60_000
Store = SQLiteStore | PostgresStore
DIRECT = (
    "SELECT (x.finished_at_ms / 60000) * 60000, j.tenant, x.state, count(*)"
    " FROM executions AS x JOIN jobs AS j ON j.job_id = x.job_id"
    " WHERE x.finished_at_ms IS NOT NULL GROUP BY 1, 2, 3"
    " UNION ALL SELECT (m.recorded_at_ms / 60000) * 60000, j.tenant, 'missed', count(*)"
    " FROM missed_fires AS m JOIN jobs AS j ON j.job_id = m.job_id GROUP BY 1, 2"
)
ROLLED = "SELECT minute_ms, tenant, outcome, sum(runs) FROM run_minutes GROUP BY 1, 2, 3"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def sql_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A store of either backend, not migrated yet."""
    store: SQLiteStore | PostgresStore
    if request.param == "sqlite":
        store = SQLiteStore(tmp_path / "store.db")
    else:
        store = PostgresStore(str(request.getfixturevalue("pg_dsn")))
    try:
        yield store
    finally:
        store.close()


def rows(store: Store, sql: str) -> set[tuple[Any, ...]]:
    got = store._read(lambda cur: cur.execute(sql).fetchall())
    return {(int(m), str(t), str(o), int(n)) for m, t, o, n in got}


def test_migration_25_counts_what_the_store_kept_before_it(sql_store: Store) -> None:
    """Runs ended and fires recorded missed at schema 24 (written as its
    code wrote them, without counts) are counted by the migration, as a
    count over them finds; runs ended after it are added."""
    sql_store._migrations = [
        m for m in (PG_MIGRATIONS if sql_store._param == "%s" else SQLITE_MIGRATIONS) if m[0] <= 24
    ]
    sql_store.migrate()
    assert sql_store.schema_version() == 24
    ids = [
        sql_store.submit_job(interval_job(f"j{k}", tenant=("acme", "globex")[k % 2]))[0].job_id
        for k in range(4)
    ]
    claims = [claim(ids[k % 4], (k + 1) * 7_000, advance=False) for k in range(40)]
    runs = [o.run_id or 0 for o in sql_store.claim_fires(claims)]
    p = sql_store._param
    states = ["succeeded", "failed", "succeeded", "dead_lettered", "timed_out"]

    def old_writes(cur: Any) -> None:
        for k, run_id in enumerate(runs[:36]):  # four stay in flight
            cur.execute(
                f"UPDATE executions SET state = {p}, finished_at_ms = {p} WHERE run_id = {p}",
                (states[k % 5], (k + 1) * 9_000, run_id),
            )
        for k in range(10):
            cur.execute(
                "INSERT INTO missed_fires (job_id, scheduled_for, reason, recorded_at_ms)"
                f" VALUES ({p}, {p}, 'overlap', {p})",
                (ids[k % 4], k, k * 31_000),
            )

    sql_store._write(old_writes)
    direct = rows(sql_store, DIRECT)
    sql_store._migrations = PG_MIGRATIONS if p == "%s" else SQLITE_MIGRATIONS
    sql_store.migrate()
    assert rows(sql_store, ROLLED) == direct and len(direct) > 10

    last = runs[36]
    sql_store.complete_runs(
        [Completion(run_id=last, fence=1, state=RunState.LOST, finished_at_ms=9_000)]
    )
    assert rows(sql_store, ROLLED) == rows(sql_store, DIRECT)
    counts = sql_store.outcome_counts(since_ms=0, bucket_ms=MINUTE, tenant="acme")
    assert sum(c.count for c in counts) == 18 + 1 + 5


def test_retention_drops_the_minutes_before_its_cutoff(sql_store: Store) -> None:
    sql_store.migrate()
    job = sql_store.submit_job(interval_job("j"))[0].job_id
    runs = [
        o.run_id
        for o in sql_store.claim_fires([claim(job, k * MINUTE, advance=False) for k in range(6)])
    ]
    assert None not in runs
    sql_store.complete_runs(
        [
            Completion(run_id=r, fence=1, state=RunState.SUCCEEDED, finished_at_ms=k * MINUTE + 5)
            for k, r in enumerate(runs)
            if r is not None
        ]
    )
    why = MissedReason.OVERLAP
    sql_store.record_missed(
        [MissedFire(job_id=job, scheduled_for=1, reason=why, recorded_at_ms=MINUTE + 9)]
    )
    # The runs that ended before the cutoff go (minutes 0 to 3) and the
    # missed fire; the minutes wholly before it go with them, and minute 3,
    # which the cutoff cuts, keeps its count until a later pass is past it.
    assert sql_store.purge_history(3 * MINUTE + 30_000) == 4 + 1
    got = sql_store.outcome_counts(since_ms=0, bucket_ms=MINUTE)
    assert [(c.bucket_ms, c.outcome, c.count) for c in got] == [
        (k * MINUTE, "succeeded", 1) for k in (3, 4, 5)
    ]
    assert rows(sql_store, ROLLED) - rows(sql_store, DIRECT) == {
        (3 * MINUTE, "acme", "succeeded", 1)
    }
    sql_store.purge_history(4 * MINUTE)
    assert rows(sql_store, ROLLED) == rows(sql_store, DIRECT)


def test_sqlite_reads_a_windows_minutes_through_the_key(tmp_path: Path) -> None:
    """The store never runs ANALYZE: this is the plan it runs with."""
    db = tmp_path / "plans.db"
    SQLiteStore(db).migrate()
    con = sqlite3.connect(db)
    try:
        for tenant in (False, True):
            args: list[object] = [MINUTE, MINUTE, 10 * MINUTE, *(["acme"] if tenant else [])]
            found = con.execute("EXPLAIN QUERY PLAN " + counts_sql("?", tenant=tenant), args)
            plan = "\n".join(str(r[-1]) for r in found)
            assert "SEARCH run_minutes USING PRIMARY KEY (minute_ms>?)" in plan, plan
    finally:
        con.close()


@pytest.mark.postgres
def test_two_postgresql_writers_on_one_slot_count_every_run_once(pg_dsn: str) -> None:
    """Two stores (two nodes) that picked the same slot end runs of the same
    minutes and tenants at once, in batches whose rows come in different
    orders: each adds to the same rows in key order, so neither deadlocks,
    and every run is counted once."""
    stores = [PostgresStore(pg_dsn), PostgresStore(pg_dsn)]
    try:
        stores[0].migrate()
        for s in stores:
            s._slot = 3
        tenants = ["acme", "globex", "initech"]
        jobs = [
            stores[0].submit_job(interval_job(f"j{k}", tenant=tenants[k % 3]))[0].job_id
            for k in range(6)
        ]
        claims = [claim(jobs[k % 6], (k + 1) * 1_000, advance=False) for k in range(1_200)]
        runs = [o.run_id or 0 for o in stores[0].claim_fires(claims)]
        ends = [
            Completion(
                run_id=r,
                fence=1,
                state=(RunState.SUCCEEDED, RunState.FAILED)[k % 7 == 0],
                finished_at_ms=(k * 7_919) % (5 * MINUTE),
            )
            for k, r in enumerate(runs)
        ]
        halves = [ends[0::2], ends[1::2][::-1]]  # the second in the other order
        errors: list[BaseException] = []

        def write(store: PostgresStore, part: list[Completion]) -> None:
            try:
                for i in range(0, len(part), 40):
                    assert all(o.applied for o in store.complete_runs(part[i : i + 40]))
            except BaseException as exc:
                errors.append(exc)

        threads = [
            threading.Thread(target=write, args=(s, half))
            for s, half in zip(stores, halves, strict=True)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors and not any(t.is_alive() for t in threads)
        assert rows(stores[0], ROLLED) == rows(stores[0], DIRECT)
        got = stores[1].outcome_counts(since_ms=0, bucket_ms=MINUTE)
        assert sum(c.count for c in got) == len(runs)
    finally:
        for s in stores:
            s.close()
