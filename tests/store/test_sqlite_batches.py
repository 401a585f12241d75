"""SQLite's set-based batch statements: rows looked up by key, one statement a batch."""

from __future__ import annotations

import contextlib
import gc
import sqlite3
import time
from pathlib import Path

import pytest

from tests.store.conftest import interval_job, once_job
from tests.store.test_contract import claim
from wheel.engine.model import SHARD_COUNT, shard_of
from wheel.errors import StoreError
from wheel.store._schema import SQLITE_MIGRATIONS
from wheel.store.base import Completion, RunStart, RunState, WriteBatch
from wheel.store.sqlite import SQLiteStore
from wheel.store.sqlite import _sql as sq
from wheel.store.sqlite._db import WRITER_CHECKPOINT_PAGES

SET_STATEMENTS = {
    "insert runs": sq.INSERT_RUNS,
    "advance": sq.ADVANCE_CAS,
    "claim end": sq.CLAIM_CAS_END,
    "mark running": sq.MARK_RUNNING,
    "complete": sq.COMPLETE,
}


@pytest.fixture
def sqlite_store(tmp_path: Path) -> SQLiteStore:
    store = SQLiteStore(tmp_path / "plans.db")
    store.migrate()
    return store


@pytest.mark.parametrize("name", sorted(SET_STATEMENTS))
@pytest.mark.parametrize("rows", [1, 3, sq.ROWS_PER_STATEMENT])
def test_set_based_statements_look_rows_up_by_key(
    sqlite_store: SQLiteStore, name: str, rows: int
) -> None:
    """The batch drives the loop and each target row is found by primary key.
    A plan that walks an index of the table instead costs a scan per batch
    row (the completion statement did that through the in-flight index)."""
    form = SET_STATEMENTS[name]
    sql = sq.statement(form, rows)
    params = [None] * (form.row.count("?") * rows)
    plan = [r[3] for r in sqlite_store._db.conn.execute("EXPLAIN QUERY PLAN " + sql, params)]
    if name == "insert runs":
        return  # a plain multi-row INSERT: nothing to look up
    scan = plan.index("SCAN t")
    assert "USING INTEGER PRIMARY KEY" in plan[scan + 1], plan


def test_a_batch_goes_out_in_full_statements_and_power_of_two_pieces() -> None:
    sizes = [len(p) for p in sq.pieces([(i,) for i in range(3 * sq.ROWS_PER_STATEMENT + 77)])]
    assert sizes == [sq.ROWS_PER_STATEMENT] * 3 + [64, 8, 4, 1]
    assert sum(sizes) == 3 * sq.ROWS_PER_STATEMENT + 77
    assert [len(p) for p in sq.pieces([])] == []


def test_a_batch_is_a_few_statements_however_many_rows(sqlite_store: SQLiteStore) -> None:
    """What the set-based forms are for: SQLite steps once per piece of a
    batch, not once per row (``executemany`` gives the GIL up around every
    row), and the result is the same as applying the rows one by one."""
    store = sqlite_store
    jobs = [store.submit_job(interval_job(f"j{i}", next_run_at=60_000))[0] for i in range(300)]
    statements: list[str] = []
    store._db.conn.set_trace_callback(statements.append)
    outcomes = store.claim_fires([claim(j.job_id, 60_000, fence=7, new=120_000) for j in jobs])
    assert all(o.run_id is not None and o.advanced for o in outcomes)
    runs = [o.run_id for o in outcomes if o.run_id is not None]
    starts = [RunStart(run_id=r, fence=7, worker_id="w", started_at_ms=60_010) for r in runs]
    assert store.mark_running(starts[:100]) == [True] * 100
    completions = [
        Completion(run_id=r, fence=7, state=RunState.SUCCEEDED, finished_at_ms=60_020) for r in runs
    ]
    assert all(c.applied for c in store.complete_runs(completions))
    store._db.conn.set_trace_callback(None)
    # The trace shows each row's run of a trigger (schema 20's permit
    # release) as its statement's text again, right after it: a repeat is
    # that statement still. Pieces of one batch differ in size, so text.
    ran = [s for i, s in enumerate(statements) if i == 0 or s != statements[i - 1]]
    writes = [" ".join(s.split()[0:3]) for s in ran if s.startswith(("INSERT", "UPDATE"))]
    pieces = {n: len(list(sq.pieces([()] * n))) for n in (100, 300)}
    assert pieces == {100: 3, 300: 4}  # 64 + 32 + 4; 256 + 32 + 8 + 4
    assert writes == [
        "UPDATE counters SET",  # run ids
        *["INSERT INTO executions"] * pieces[300],
        "UPDATE counters SET",  # change sequence
        *["UPDATE jobs SET"] * pieces[300],
        *["UPDATE executions SET"] * pieces[100],  # 100 starts
        *["UPDATE executions SET"] * pieces[300],  # 300 completions
        "INSERT INTO run_minutes",  # their minutes' counts: one statement
    ]
    assert {store.get_job(j.job_id).next_run_at for j in jobs} == {120_000}
    assert {store.get_run(r).state for r in runs} == {RunState.SUCCEEDED}
    assert store.get_run(runs[0]).started_at_ms == 60_010
    assert store.get_run(runs[-1]).started_at_ms is None


def test_a_partly_applying_batch_falls_back_to_row_by_row(sqlite_store: SQLiteStore) -> None:
    """One stale compare-and-swap in a batch: the set form applies fewer rows
    than it got, so the batch is redone row by row and only that row fails."""
    store = sqlite_store
    jobs = [store.submit_job(interval_job(f"j{i}", next_run_at=60_000))[0] for i in range(50)]
    outcomes = store.claim_fires(
        [
            claim(j.job_id, 60_000, fence=7, expected=59_000 if i == 17 else 60_000, new=120_000)
            for i, j in enumerate(jobs)
        ]
    )
    assert [o.advanced for o in outcomes] == [i != 17 for i in range(50)]
    assert store.get_job(jobs[17].job_id).next_run_at == 60_000
    assert store.get_job(jobs[18].job_id).next_run_at == 120_000


def test_a_batch_is_written_all_or_nothing(sqlite_store: SQLiteStore, tmp_path: Path) -> None:
    """write_batch is one transaction: when its last kind fails, the kinds
    before it are rolled back with it, and the batch can be written again."""
    store = sqlite_store
    with contextlib.closing(sqlite3.connect(tmp_path / "plans.db")) as db:
        # A worker the store cannot mark running: the starts fail after the rest ran.
        db.execute(
            "CREATE TRIGGER poison BEFORE UPDATE ON executions"
            " WHEN NEW.worker_id = 'poison' BEGIN SELECT RAISE(ABORT, 'poisoned'); END"
        )
        db.commit()
    ran, _ = store.submit_job(interval_job("ran", next_run_at=60_000))
    due, _ = store.submit_job(interval_job("due", next_run_at=60_000))
    other, _ = store.submit_job(interval_job("other", next_run_at=60_000))
    [out, held] = store.claim_fires(
        [
            claim(ran.job_id, 60_000, fence=1, new=120_000),
            claim(other.job_id, 60_000, fence=3, new=120_000),
        ]
    )
    assert out.run_id is not None and held.run_id is not None
    batch = WriteBatch(
        completions=[
            Completion(run_id=out.run_id, fence=1, state=RunState.SUCCEEDED, finished_at_ms=1)
        ],
        claims=[claim(due.job_id, 60_000, fence=2, new=120_000)],
        starts=[RunStart(run_id=held.run_id, fence=3, worker_id="poison", started_at_ms=1)],
    )
    with pytest.raises(StoreError):
        store.write_batch(batch)
    assert store.get_run(out.run_id).state is RunState.DISPATCHED
    assert store.list_runs(due.job_id) == []
    assert store.get_job(due.job_id).next_run_at == 60_000
    outcome = store.write_batch(WriteBatch(completions=batch.completions, claims=batch.claims))
    assert [c.applied for c in outcome.completions] == [True]
    assert [(c.run_id is not None, c.advanced) for c in outcome.claims] == [(True, True)]


def database_at_schema(path: Path, schema: int) -> sqlite3.Connection:
    """A SQLite database as the code of schema ``schema`` left it."""
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE wheel_schema_version (version INTEGER NOT NULL)")
    for version, statements in SQLITE_MIGRATIONS:
        if version > schema:
            break
        for statement in statements:
            conn.execute(statement)
        conn.execute("INSERT INTO wheel_schema_version VALUES (?)", (version,))
    conn.commit()
    return conn


def test_a_database_of_schema_2_loses_the_due_index_nothing_reads(tmp_path: Path) -> None:
    """Every claim moved its job's entry in ``jobs_due`` and no query read it."""
    path = tmp_path / "old.db"
    conn = database_at_schema(path, 2)

    def indexes_on_next_run_at() -> list[str]:
        rows = conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'index'")
        return [name for name, sql in rows if sql and "next_run_at" in sql]

    assert indexes_on_next_run_at() == ["jobs_due"]
    store = SQLiteStore(path)
    store.migrate()
    job, _ = store.submit_job(interval_job())
    store.claim_fires([claim(job.job_id, 60_000, expected=60_000, new=120_000)])
    assert store.get_job(job.job_id).next_run_at == 120_000
    store.close()
    assert indexes_on_next_run_at() == []
    conn.close()


def test_a_database_of_schema_14_loses_the_index_of_live_jobs_by_shard(tmp_path: Path) -> None:
    """A one-shot's end took its entry out of ``jobs_owned`` (shard first): a
    random page for each, most of what a batch wrote. The one node of a
    SQLite store loads its shards without it, by id or through ``jobs_state``."""
    path = tmp_path / "old.db"
    conn = database_at_schema(path, 14)

    def job_indexes_by_shard() -> list[str]:
        names = [r[1] for r in conn.execute("PRAGMA index_list(jobs)")]
        first = {n: conn.execute(f"PRAGMA index_info({n})").fetchone()[2] for n in names}
        return [n for n in names if first[n] == "shard"]

    assert job_indexes_by_shard() == ["jobs_owned"]
    store = SQLiteStore(path)
    store.migrate()
    assert job_indexes_by_shard() == []
    ids = store.import_jobs([once_job(50_000 + i) for i in range(600)])
    store.claim_fires([claim(j, 50_000 + i, new=None) for i, j in enumerate(ids[:300])])
    live = set(ids[300:])
    assert {j.job_id for j in store.load_shards(range(SHARD_COUNT)).jobs} == live
    some = {shard_of(j) for j in ids[:40]}
    assert {j.job_id for j in store.load_shards(some).jobs} == {
        j for j in live if shard_of(j) in some
    }
    store.close()
    conn.close()


def test_the_wal_is_copied_back_off_the_writers_thread(tmp_path: Path) -> None:
    """The writer's own checkpoints start only past WRITER_CHECKPOINT_PAGES;
    below that the background checkpointer copies committed pages into the
    database file, and closing the store stops its thread."""
    path = tmp_path / "ckpt.db"
    store = SQLiteStore(path)
    store.migrate()
    empty = path.stat().st_size
    store.submit_jobs([interval_job(f"j{i}", next_run_at=60_000) for i in range(2_000)])
    wal_pages = path.with_name("ckpt.db-wal").stat().st_size // 4096
    assert 0 < wal_pages < WRITER_CHECKPOINT_PAGES
    deadline = time.monotonic() + 5
    while path.stat().st_size < empty + 256 * 1024 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert path.stat().st_size >= empty + 256 * 1024
    checkpointer = store._db.checkpointer
    assert checkpointer is not None
    store.close()
    assert not checkpointer._thread.is_alive()
    # What the checkpointer copied is the data: it reads back without the log.
    reopened = SQLiteStore(path)
    assert reopened.get_job(1).spec.name == "j0"
    reopened.close()


def test_a_store_dropped_without_close_stops_its_checkpointer(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "dropped.db")
    checkpointer = store._db.checkpointer
    assert checkpointer is not None
    del store
    gc.collect()
    checkpointer._thread.join(timeout=5)
    assert not checkpointer._thread.is_alive()


def test_dead_letters_are_listed_through_their_index(sqlite_store: SQLiteStore) -> None:
    sql = sqlite_store._updates
    for statement, params in (
        (sql.dead_of_all, (2**63 - 1, 100)),
        (sql.dead_of_job, (1, 2**63 - 1, 100)),
        (sql.dead_of_tenant, ("acme", 2**63 - 1, 100)),
    ):
        plan = [
            r[3] for r in sqlite_store._db.conn.execute("EXPLAIN QUERY PLAN " + statement, params)
        ]
        assert any("executions_dead" in step for step in plan), plan
        assert not any(step.startswith("SCAN e") and "INDEX" not in step for step in plan), plan


def test_a_batch_reports_the_change_mark_it_committed_and_a_copy_from_before_has_a_lower_one(
    sqlite_store: SQLiteStore, tmp_path: Path
) -> None:
    """``BatchOutcome.change_mark`` is the store's change mark with the
    batch's commit in it: a copy of the file from before that commit (what a
    power loss leaves with ``synchronous=normal``) reads lower, which is how
    a restore tells the checkpoint is ahead of the store."""
    store = sqlite_store
    job = store.submit_job(interval_job("j", next_run_at=60_000))[0]
    before = store.change_mark()
    assert before > 0
    copy = tmp_path / "before.db"
    with contextlib.closing(sqlite3.connect(copy)) as target:
        store._db.conn.backup(target)
    outcome = store.write_batch(
        WriteBatch(claims=[claim(job.job_id, 60_000, fence=7, new=120_000)])
    )
    assert outcome.claims[0].advanced
    assert outcome.change_mark == store.change_mark() > before
    # A batch that moves no schedule leaves the mark where it was.
    run = outcome.claims[0].run_id
    assert run is not None
    done = Completion(run_id=run, fence=7, state=RunState.SUCCEEDED, finished_at_ms=60_020)
    assert store.write_batch(WriteBatch(completions=[done])).change_mark == outcome.change_mark
    older = SQLiteStore(copy)
    try:
        assert older.change_mark() == before
    finally:
        older.close()
