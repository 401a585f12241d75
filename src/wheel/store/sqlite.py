"""The embedded record of truth: one SQLite file in WAL mode.

Durability: by default the database runs in WAL mode with ``synchronous=FULL``,
so the WAL is fsynced before every commit returns. An acknowledged write then
survives a crash of the process (SIGKILL) and, as far as the disk honours
fsync, a power loss or kernel panic too. With ``synchronous=normal`` (URL
query ``?synchronous=normal``) commits are only fsynced at checkpoints: still
safe against process crashes and never corrupt, but the last transactions
before a power loss may roll back.

SQLite serializes writers, which this backend leans on: ids and the change
sequence come from counter rows bumped inside the write transaction, so they
are handed out in commit order and ``changes_since`` can use a plain
``change_seq > watermark``. The store is safe to call from several threads: one
connection guarded by a lock (the node calls it from worker threads, one call
at a time per call site).
"""

from __future__ import annotations

import functools
import json
import logging
import sqlite3
import threading
import time
import weakref
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from wheel.errors import (
    InvalidArgument,
    NotFound,
    StoreError,
    StoreUnavailable,
    WheelError,
)
from wheel.store._schema import (
    INFLIGHT_SQL,
    INFLIGHT_WHERE,
    JOB_COLUMNS,
    JOB_FROM,
    MISSED_COLUMNS,
    RETRY_WHERE,
    RUN_COLUMNS,
    RUN_COLUMNS_E,
    SQLITE_MIGRATIONS,
    batch_keys,
    created_record,
    job_from_row,
    key_conflict,
    missed_from_row,
    run_from_row,
    split_job_rows,
    wall_ms,
)
from wheel.store.base import (
    SHARD_COUNT,
    TERMINAL_RUN_STATES,
    BatchOutcome,
    ClaimOutcome,
    Completion,
    CompletionOutcome,
    ExecutionRecord,
    FireClaim,
    JobRecord,
    JobState,
    MissedFire,
    NewJob,
    RunStart,
    ScheduleAdvance,
    ShardLoad,
    WriteBatch,
    shard_of,
)

__all__ = ["SQLiteStore"]

log = logging.getLogger("wheel.store.sqlite")

_SYNCHRONOUS = {"off", "normal", "full", "extra"}
_TERMINAL_SQL = "(" + ", ".join(f"'{s.value}'" for s in sorted(TERMINAL_RUN_STATES)) + ")"


# A batch's writes of one kind go out as few statements: the rows are bound as
# multi-row ``VALUES`` lists, ``ROWS_PER_STATEMENT`` at a time and the rest in
# power-of-two pieces, so a batch of n rows is at most 10 + n // 1024 steps
# over at most 11 statement texts per kind (all in the connection's statement
# cache). Each step hands the GIL back and waits to take it again: 1,024 rows
# a statement rather than 256 took p99 at 28,000 dispatches/s from 539 and
# 282 ms to 259 and 116 ms (two runs each). ``executemany`` binds and steps
# row by row, giving up and taking back the GIL around every row: the node's
# store thread then queued behind its busy event loop for each row of a batch
# (measured: most of a batch's time at 13k dispatches/s). An earlier form
# sent the rows as one JSON text unpacked with json_each: json_extract parsed
# each row once per column, and encoding the JSON held the GIL (measured:
# 7.3 us a row inserted against 3.0 us with VALUES, and 7% of the node's GIL
# at 12,000 dispatches/s). In the UPDATE forms the rows drive the plan and
# each looks its target up by primary key; a unary ``+`` keeps the planner
# off the other indexes (with ``executions_inflight`` it scanned every
# in-flight run and probed the batch for each one);
# ``test_set_based_statements_look_rows_up_by_key`` checks it.
ROWS_PER_STATEMENT = 1024

_INSERT_RUNS = (
    "INSERT INTO executions (run_id, job_id, scheduled_for, attempt, state, fence,"
    " dispatched_at_ms) VALUES {rows} ON CONFLICT (job_id, scheduled_for, attempt) DO NOTHING",
    "(?, ?, ?, ?, 'dispatched', ?, ?)",
)
# The schedule compare-and-swap of a won claim (seed R4). ``IS`` so that a
# claim may also swap from "no next fire" (NULL). The common case leaves
# ``state`` out of the SET list: SQLite then skips the indexes that only
# depend on state.
_ADVANCE_CAS = (
    "UPDATE jobs SET next_run_at = t.column1, updated_at_ms = max(updated_at_ms, t.column2),"
    " move_seq = t.column3 FROM (VALUES {rows}) AS t"
    " WHERE jobs.job_id = t.column4 AND +jobs.next_run_at IS t.column5",
    "(?, ?, ?, ?, ?)",
)
# For batches with a claim that ends its schedule: a one-shot whose next fire
# is None becomes completed.
_CLAIM_CAS_END = (
    "UPDATE jobs SET next_run_at = t.column1,"
    " state = CASE WHEN t.column1 IS NULL AND one_shot = 1 AND state = 'active'"
    " THEN 'completed' ELSE state END,"
    " updated_at_ms = max(updated_at_ms, t.column2), move_seq = t.column3"
    " FROM (VALUES {rows}) AS t WHERE jobs.job_id = t.column4 AND +jobs.next_run_at IS t.column5",
    "(?, ?, ?, ?, ?)",
)
_MARK_RUNNING = (
    "UPDATE executions SET state = 'running', worker_id = t.column1, started_at_ms = t.column2"
    " FROM (VALUES {rows}) AS t WHERE executions.run_id = t.column3"
    " AND executions.fence = t.column4 AND +executions.state = 'dispatched'",
    "(?, ?, ?, ?)",
)
_COMPLETE = (
    "UPDATE executions SET state = t.column1, finished_at_ms = t.column2, error = t.column3,"
    " worker_id = coalesce(t.column4, executions.worker_id)"
    " FROM (VALUES {rows}) AS t WHERE executions.run_id = t.column5"
    f" AND executions.fence = t.column6 AND +executions.state IN {INFLIGHT_SQL}"
    " AND NOT EXISTS (SELECT 1 FROM executions AS newer"
    "  WHERE newer.job_id = executions.job_id"
    "  AND newer.scheduled_for = executions.scheduled_for"
    "  AND newer.fence > executions.fence)",
    "(?, ?, ?, ?, ?, ?)",
)
# (statement with a {rows} slot, one row's placeholders)
_SetStatement = tuple[str, str]


@functools.lru_cache(maxsize=128)
def _statement(form: _SetStatement, n: int) -> str:
    """``form`` for ``n`` rows."""
    sql, row = form
    return sql.format(rows=", ".join([row] * n))


def _pieces(rows: Sequence[tuple[Any, ...]]) -> Iterator[Sequence[tuple[Any, ...]]]:
    """``rows`` in full statements, then the rest in power-of-two pieces."""
    i, n = 0, len(rows)
    size = ROWS_PER_STATEMENT
    while i < n:
        while n - i < size:
            size //= 2
        yield rows[i : i + size]
        i += size


def _execute_rows(cur: sqlite3.Cursor, form: _SetStatement, rows: Sequence[tuple[Any, ...]]) -> int:
    """Apply ``form`` to ``rows``; returns the rows it changed."""
    changed = 0
    for piece in _pieces(rows):
        cur.execute(_statement(form, len(piece)), [v for row in piece for v in row])
        changed += cur.rowcount
    return changed


def _wrap(exc: sqlite3.Error) -> StoreError:
    text = str(exc).lower()
    if isinstance(exc, sqlite3.OperationalError) and any(
        word in text for word in ("locked", "busy", "unable to open", "disk i/o")
    ):
        return StoreUnavailable(f"sqlite: {exc}")
    return StoreError(f"sqlite: {exc}")


def _shard_list(shards: Collection[int]) -> str:
    for s in shards:
        if not 0 <= s < SHARD_COUNT:
            raise InvalidArgument("shards", f"shard {s} is outside [0, {SHARD_COUNT})")
    return json.dumps(sorted(set(shards)))


def _switch_to_wal(conn: sqlite3.Connection, busy_timeout_ms: int) -> None:
    """Put the file in WAL mode. SQLite answers "database is locked" at once,
    without waiting on busy_timeout, when another process holds the lock while
    it creates the file or switches it itself; so wait here, within the same
    limit."""
    deadline = time.monotonic() + busy_timeout_ms / 1000
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


# WAL pages past which a committing writer copies the WAL back into the
# database itself (SQLite's default does it every 1,000 pages).
WRITER_CHECKPOINT_PAGES = 20_000
# A WAL file left larger than this after a checkpoint is truncated back to it.
WAL_SIZE_LIMIT_BYTES = 64 << 20
# How often the checkpointer copies the WAL back into the database file.
CHECKPOINT_INTERVAL_S = 0.2


class _Checkpointer:
    """Copies the WAL back into the database file on its own thread and
    connection, so the writer never does it inside a commit.

    In WAL mode every commit appends the pages it changed to the log, and by
    default the committing connection copies the log back into the database
    every 1,000 pages, fsyncing both files, while it holds the write lock. A
    dispatch changes about two pages at random (its job's schedule row and an
    entry of the executions key index), so at 12,000 dispatches/s that was a
    checkpoint every few batches, each stalling the batch behind it (measured:
    p99 lag 1.2 s at 12,000/s with the writer checkpointing, 0.25 s without).
    A PASSIVE checkpoint takes no write lock: commits go on meanwhile. Pages
    written several times between two checkpoints are copied once."""

    def __init__(self, path: str, busy_timeout_ms: int) -> None:
        self._conn = sqlite3.connect(
            path, isolation_level=None, check_same_thread=False, timeout=busy_timeout_ms / 1000
        )
        self._stopping = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="wheel-sqlite-checkpoint", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stopping.wait(CHECKPOINT_INTERVAL_S):
                try:
                    self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                except sqlite3.Error as exc:
                    # The writer's own checkpoints (past WRITER_CHECKPOINT_PAGES)
                    # still bound the log; say why this one failed and go on.
                    log.warning("background WAL checkpoint failed: %s", exc)
        finally:
            self._conn.close()

    def stop(self) -> None:
        self._stopping.set()

    def close(self) -> None:
        self.stop()
        self._thread.join()


def _runs_of_shards_sql(where: str, index: str = "") -> str:
    """Executions matching ``where`` of jobs in the shards of a JSON list."""
    return (
        f"SELECT {RUN_COLUMNS_E} FROM executions AS e{index} JOIN jobs AS j ON j.job_id = e.job_id"
        f" WHERE {where} AND j.shard IN (SELECT value FROM json_each(?)) ORDER BY e.run_id"
    )


class SQLiteStore:
    """``Store`` on one SQLite file (``:memory:`` works for throwaway use)."""

    def __init__(
        self,
        path: str | Path,
        *,
        synchronous: str = "full",
        busy_timeout_ms: int = 10_000,
    ) -> None:
        synchronous = synchronous.lower()
        if synchronous not in _SYNCHRONOUS:
            raise InvalidArgument("synchronous", f"must be one of {sorted(_SYNCHRONOUS)}")
        # Reentrant: write_batch runs several operations in one transaction.
        self._lock = threading.RLock()
        self._open: sqlite3.Cursor | None = None
        try:
            conn = sqlite3.connect(
                str(path),
                isolation_level=None,  # we issue BEGIN/COMMIT ourselves
                check_same_thread=False,  # guarded by self._lock
                timeout=busy_timeout_ms / 1000,
                cached_statements=256,
            )
            # busy_timeout first: switching to WAL needs a lock another process
            # may hold while it migrates.
            conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
            _switch_to_wal(conn, busy_timeout_ms)
            conn.execute(f"PRAGMA synchronous = {synchronous.upper()}")
            conn.execute("PRAGMA temp_store = MEMORY")
            conn.execute("PRAGMA cache_size = -65536")
            # Checkpoints run on their own thread (_Checkpointer); the writer
            # checkpoints itself only past this many WAL pages, should that
            # thread fall behind.
            conn.execute(f"PRAGMA wal_autocheckpoint = {WRITER_CHECKPOINT_PAGES}")
            conn.execute(f"PRAGMA journal_size_limit = {WAL_SIZE_LIMIT_BYTES}")
        except sqlite3.Error as exc:
            raise _wrap(exc) from exc
        self._conn = conn
        self._checkpointer: _Checkpointer | None = None
        if str(path) != ":memory:" and not str(path).startswith("file::memory:"):
            self._checkpointer = _Checkpointer(str(path), busy_timeout_ms)
            # A store dropped without close() stops its checkpointer too.
            weakref.finalize(self, self._checkpointer.stop)

    # -- plumbing -------------------------------------------------------------

    @contextmanager
    def _tx(self, write: bool) -> Iterator[sqlite3.Cursor]:
        """One transaction; sqlite3 errors come out as ``StoreError``. Inside
        another ``_tx`` of the same thread it joins that transaction."""
        with self._lock:
            if self._open is not None:
                yield self._open
                return
            try:
                cur = self._conn.cursor()
                # IMMEDIATE takes the write lock up front, so a transaction never
                # fails half-way with SQLITE_BUSY on its first write.
                cur.execute("BEGIN IMMEDIATE" if write else "BEGIN")
                self._open = cur
                try:
                    yield cur
                    cur.execute("COMMIT")
                except BaseException:
                    if self._conn.in_transaction:
                        self._conn.execute("ROLLBACK")
                    raise
                finally:
                    self._open = None
            except sqlite3.Error as exc:
                raise _wrap(exc) from exc

    @staticmethod
    def _bump(cur: sqlite3.Cursor, name: str, n: int) -> int:
        """Reserve ``n`` values of a counter; returns the first."""
        row = cur.execute(
            "UPDATE counters SET value = value + ?1 WHERE name = ?2 RETURNING value - ?1 + 1",
            (n, name),
        ).fetchone()
        return int(row[0])

    @staticmethod
    def _apply_each(
        cur: sqlite3.Cursor, form: _SetStatement, rows: list[tuple[Any, ...]]
    ) -> list[bool]:
        """Apply the set-based ``form`` to each row as if run once per row, in
        order; True where it changed a row.

        Fast path: once over all the rows. When every row applied, each
        changed a row of its own (an UPDATE ... FROM changes a row at most
        once), which is what running them in order does too. Else roll back
        to a savepoint and redo the rows one at a time to learn which ones
        applied (conflicts, or two rows for one key: rare).
        """
        if not rows:
            return []
        cur.execute("SAVEPOINT apply_each")
        if _execute_rows(cur, form, rows) == len(rows):
            cur.execute("RELEASE apply_each")
            return [True] * len(rows)
        cur.execute("ROLLBACK TO apply_each")
        one = _statement(form, 1)
        out = []
        for row in rows:
            cur.execute(one, row)
            out.append(cur.rowcount == 1)
        cur.execute("RELEASE apply_each")
        return out

    # -- lifecycle ------------------------------------------------------------

    def migrate(self) -> None:
        """Apply pending migrations under ``BEGIN IMMEDIATE`` (one writer at a time)."""
        with self._tx(write=True) as cur:
            cur.execute(
                "CREATE TABLE IF NOT EXISTS wheel_schema_version (version INTEGER NOT NULL)"
            )
            current = cur.execute("SELECT max(version) FROM wheel_schema_version").fetchone()[0]
            for version, statements in SQLITE_MIGRATIONS:
                if current is not None and version <= current:
                    continue
                for statement in statements:
                    cur.execute(statement)
                cur.execute("INSERT INTO wheel_schema_version (version) VALUES (?)", (version,))

    def schema_version(self) -> int:
        with self._tx(write=False) as cur:
            return int(cur.execute("SELECT max(version) FROM wheel_schema_version").fetchone()[0])

    def close(self) -> None:
        if self._checkpointer is not None:
            self._checkpointer.close()
        with self._lock:
            self._conn.close()

    # -- jobs -----------------------------------------------------------------

    def submit_job(self, new: NewJob) -> tuple[JobRecord, bool]:
        with self._tx(write=True) as cur:
            (result,) = self._submit_many(cur, [new])
        if isinstance(result, WheelError):
            raise result
        return result

    def submit_jobs(self, news: Sequence[NewJob]) -> list[tuple[JobRecord, bool] | WheelError]:
        """Many submits in one transaction (group commit); a key conflict is
        returned in that submit's place and does not affect the others."""
        if not news:
            return []
        with self._tx(write=True) as cur:
            return self._submit_many(cur, news)

    def _submit_many(
        self, cur: sqlite3.Cursor, news: Sequence[NewJob]
    ) -> list[tuple[JobRecord, bool] | WheelError]:
        """Set-based: one lookup of the batch's keys, one bump of each counter
        and one statement per table, instead of seven statements per job."""
        digests, first = batch_keys(news)
        held: dict[tuple[str, str], tuple[str, int]] = {}  # key -> (digest, job id)
        if first:
            for tenant, key, digest, job_id in cur.execute(
                "SELECT i.tenant, i.idempotency_key, i.body_hash, i.job_id"
                " FROM json_each(?) AS u JOIN idempotency_keys AS i"
                " ON i.tenant = json_extract(u.value, '$[0]')"
                " AND i.idempotency_key = json_extract(u.value, '$[1]')",
                (json.dumps(list(first)),),
            ):
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
        if made:
            base = self._bump(cur, "job_id", len(made))
            seq = self._bump(cur, "change_seq", len(made))
            ids = {i: base + k for k, i in enumerate(made)}
            cur.executemany(
                "INSERT INTO jobs (job_id, shard, tenant, name, state, next_run_at, one_shot,"
                " idempotency_key, created_at_ms, updated_at_ms, change_seq)"
                " VALUES (?, ?, ?, ?, 'active', ?, ?, ?, ?, ?, ?)",
                [
                    (
                        ids[i],
                        shard_of(ids[i]),
                        news[i].spec.tenant,
                        news[i].spec.name,
                        news[i].next_run_at,
                        0 if news[i].spec.recurring else 1,
                        news[i].idempotency_key,
                        news[i].created_at_ms,
                        news[i].created_at_ms,
                        seq + k,
                    )
                    for k, i in enumerate(made)
                ],
            )
            cur.executemany(
                "INSERT INTO job_specs (job_id, spec) VALUES (?, ?)",
                [(ids[i], news[i].spec.to_json()) for i in made],
            )
            cur.executemany(
                "INSERT INTO idempotency_keys (tenant, idempotency_key, body_hash, job_id,"
                " created_at_ms) VALUES (?, ?, ?, ?, ?)",
                [
                    (n.spec.tenant, n.idempotency_key, digests[i], ids[i], n.created_at_ms)
                    for i in made
                    if (n := news[i]).idempotency_key is not None
                ],
            )
        existing: dict[int, JobRecord] = {}
        if held:
            for row in cur.execute(
                f"SELECT {JOB_COLUMNS} FROM {JOB_FROM}"
                " WHERE j.job_id IN (SELECT value FROM json_each(?))",
                (json.dumps([job_id for _, job_id in held.values()]),),
            ):
                record = job_from_row(row)
                existing[record.job_id] = record
        out: list[tuple[JobRecord, bool] | WheelError] = []
        created: dict[int, JobRecord] = {}
        for i, n in enumerate(news):
            if i in ids:
                created[i] = record = created_record(ids[i], n)
                out.append((record, True))
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
                out.append((same, False))
        return out

    def import_jobs(self, news: Sequence[NewJob]) -> list[int]:
        """Bulk insert of jobs without idempotency keys, in one transaction
        (imports, benchmarks); returns their ids in order."""
        if not news:
            return []
        if any(n.idempotency_key is not None for n in news):
            raise InvalidArgument("idempotency_key", "import_jobs does not take keys")
        with self._tx(write=True) as cur:
            first = self._bump(cur, "job_id", len(news))
            seq = self._bump(cur, "change_seq", len(news))
            ids = list(range(first, first + len(news)))
            cur.executemany(
                "INSERT INTO jobs (job_id, shard, tenant, name, state, next_run_at, one_shot,"
                " created_at_ms, updated_at_ms, change_seq)"
                " VALUES (?, ?, ?, ?, 'active', ?, ?, ?, ?, ?)",
                [
                    (
                        job_id,
                        shard_of(job_id),
                        n.spec.tenant,
                        n.spec.name,
                        n.next_run_at,
                        0 if n.spec.recurring else 1,
                        n.created_at_ms,
                        n.created_at_ms,
                        seq + k,
                    )
                    for k, (job_id, n) in enumerate(zip(ids, news, strict=True))
                ],
            )
            cur.executemany(
                "INSERT INTO job_specs (job_id, spec) VALUES (?, ?)",
                [(job_id, n.spec.to_json()) for job_id, n in zip(ids, news, strict=True)],
            )
        return ids

    @staticmethod
    def _get_job(cur: sqlite3.Cursor, job_id: int) -> JobRecord:
        row = cur.execute(
            f"SELECT {JOB_COLUMNS} FROM {JOB_FROM} WHERE j.job_id = ?", (job_id,)
        ).fetchone()
        if row is None:
            raise NotFound(f"job {job_id} does not exist")
        return job_from_row(row)

    def get_job(self, job_id: int) -> JobRecord:
        with self._tx(write=False) as cur:
            return self._get_job(cur, job_id)

    def list_jobs(
        self,
        *,
        tenant: str | None = None,
        state: JobState | None = None,
        after_job_id: int = 0,
        limit: int = 100,
    ) -> list[JobRecord]:
        where = ["j.job_id > ?"]
        params: list[Any] = [after_job_id]
        if tenant is not None:
            where.append("j.tenant = ?")
            params.append(tenant)
        if state is not None:
            where.append("j.state = ?")
            params.append(state.value)
        params.append(max(0, limit))
        sql = (
            f"SELECT {JOB_COLUMNS} FROM {JOB_FROM} WHERE {' AND '.join(where)}"
            " ORDER BY j.job_id LIMIT ?"
        )
        with self._tx(write=False) as cur:
            return [job_from_row(r) for r in cur.execute(sql, params)]

    def set_job_state(
        self, job_id: int, state: JobState, *, next_run_at: int | None, now_ms: int
    ) -> JobRecord:
        with self._tx(write=True) as cur:
            seq = self._bump(cur, "change_seq", 1)
            cur.execute(
                "UPDATE jobs SET state = ?, next_run_at = ?, updated_at_ms = ?, change_seq = ?"
                " WHERE job_id = ?",
                (state.value, next_run_at, now_ms, seq, job_id),
            )
            return self._get_job(cur, job_id)

    # -- executions -----------------------------------------------------------

    def claim_fires(self, claims: Sequence[FireClaim]) -> list[ClaimOutcome]:
        n = len(claims)
        if n == 0:
            return []
        with self._tx(write=True) as cur:
            base = self._bump(cur, "run_id", n)
            inserted = _execute_rows(
                cur,
                _INSERT_RUNS,
                [
                    (base + i, c.job_id, c.scheduled_for, c.attempt, c.fence, c.dispatched_at_ms)
                    for i, c in enumerate(claims)
                ],
            )
            if inserted == n:
                won: list[bool] | None = None  # all of them
            else:
                # Ids are ours alone (the counter was bumped under the write
                # lock): the ones present in the range are the inserts that won.
                present = {
                    r[0]
                    for r in cur.execute(
                        "SELECT run_id FROM executions WHERE run_id BETWEEN ? AND ?",
                        (base, base + n - 1),
                    )
                }
                won = [base + i in present for i in range(n)]
            cas_idx = [i for i, c in enumerate(claims) if c.advance and (won is None or won[i])]
            advanced = [False] * n
            if cas_idx:
                seq = self._bump(cur, "change_seq", len(cas_idx))
                rows: list[tuple[Any, ...]] = []
                ending = False
                for k, i in enumerate(cas_idx):
                    c = claims[i]
                    ending = ending or c.new_next_run_at is None
                    rows.append(
                        (
                            c.new_next_run_at,
                            c.dispatched_at_ms,
                            seq + k,
                            c.job_id,
                            c.expected_next_run_at,
                        )
                    )
                # Batches that end a schedule take the statement that may set
                # state (it is a no-op on state when next_run_at stays set).
                sql = _CLAIM_CAS_END if ending else _ADVANCE_CAS
                applied = self._apply_each(cur, sql, rows)
                for i, ok in zip(cas_idx, applied, strict=True):
                    advanced[i] = ok
        if won is None:
            return [
                ClaimOutcome(claim=c, run_id=base + i, advanced=advanced[i])
                for i, c in enumerate(claims)
            ]
        return [
            ClaimOutcome(claim=c, run_id=base + i if won[i] else None, advanced=advanced[i])
            for i, c in enumerate(claims)
        ]

    def write_batch(self, batch: WriteBatch) -> BatchOutcome:
        """A loop iteration's writes in ONE transaction (one fsync), in the
        order the owner needs: completions, missed, advances, claims, starts."""
        with self._tx(write=True):
            completed = self.complete_runs(batch.completions)
            self.record_missed(batch.missed)
            self.advance_schedules(batch.advances)
            claimed = self.claim_fires(batch.claims)
            self.mark_running(batch.starts)
        return BatchOutcome(completions=completed, claims=claimed)

    def advance_schedules(self, advances: Sequence[ScheduleAdvance]) -> list[bool]:
        if not advances:
            return []
        now = wall_ms()
        with self._tx(write=True) as cur:
            seq = self._bump(cur, "change_seq", len(advances))
            rows: list[tuple[Any, ...]] = [
                (a.new_next_run_at, now, seq + k, a.job_id, a.expected_next_run_at)
                for k, a in enumerate(advances)
            ]
            return self._apply_each(cur, _ADVANCE_CAS, rows)

    def mark_running(self, starts: Sequence[RunStart]) -> list[bool]:
        if not starts:
            return []
        rows: list[tuple[Any, ...]] = [
            (s.worker_id, s.started_at_ms, s.run_id, s.fence) for s in starts
        ]
        with self._tx(write=True) as cur:
            return self._apply_each(cur, _MARK_RUNNING, rows)

    def complete_runs(self, completions: Sequence[Completion]) -> list[CompletionOutcome]:
        if not completions:
            return []
        for c in completions:
            if c.state not in TERMINAL_RUN_STATES:
                raise InvalidArgument("completion.state", f"{c.state} is not a terminal state")
        rows: list[tuple[Any, ...]] = [
            (c.state.value, c.finished_at_ms, c.error, c.worker_id, c.run_id, c.fence)
            for c in completions
        ]
        with self._tx(write=True) as cur:
            applied = self._apply_each(cur, _COMPLETE, rows)
        return [
            CompletionOutcome(run_id=c.run_id, applied=ok)
            for c, ok in zip(completions, applied, strict=True)
        ]

    def record_missed(self, missed: Sequence[MissedFire]) -> None:
        if not missed:
            return
        with self._tx(write=True) as cur:
            cur.executemany(
                "INSERT INTO missed_fires (job_id, scheduled_for, reason, recorded_at_ms)"
                " VALUES (?, ?, ?, ?) ON CONFLICT (job_id, scheduled_for) DO NOTHING",
                [(m.job_id, m.scheduled_for, m.reason.value, m.recorded_at_ms) for m in missed],
            )

    def get_run(self, run_id: int) -> ExecutionRecord:
        with self._tx(write=False) as cur:
            row = cur.execute(
                f"SELECT {RUN_COLUMNS} FROM executions WHERE run_id = ?", (run_id,)
            ).fetchone()
        if row is None:
            raise NotFound(f"run {run_id} does not exist")
        return run_from_row(row)

    def list_runs(
        self, job_id: int, *, before_run_id: int | None = None, limit: int = 100
    ) -> list[ExecutionRecord]:
        before = before_run_id if before_run_id is not None else 2**63 - 1
        with self._tx(write=False) as cur:
            rows = cur.execute(
                f"SELECT {RUN_COLUMNS} FROM executions WHERE job_id = ? AND run_id < ?"
                " ORDER BY run_id DESC LIMIT ?",
                (job_id, before, max(0, limit)),
            ).fetchall()
        return [run_from_row(r) for r in rows]

    def list_missed(
        self, job_id: int, *, before_scheduled_for: int | None = None, limit: int = 100
    ) -> list[MissedFire]:
        before = before_scheduled_for if before_scheduled_for is not None else 2**63 - 1
        with self._tx(write=False) as cur:
            rows = cur.execute(
                f"SELECT {MISSED_COLUMNS} FROM missed_fires"
                " WHERE job_id = ? AND scheduled_for < ? ORDER BY scheduled_for DESC LIMIT ?",
                (job_id, before, max(0, limit)),
            ).fetchall()
        return [missed_from_row(r) for r in rows]

    def fires_exist(self, job_id: int, scheduled_for: Sequence[int]) -> set[int]:
        if not scheduled_for:
            return set()
        times = json.dumps(list(scheduled_for))
        with self._tx(write=False) as cur:
            rows = cur.execute(
                "SELECT scheduled_for FROM executions WHERE job_id = ?1"
                " AND scheduled_for IN (SELECT value FROM json_each(?2))"
                " UNION SELECT scheduled_for FROM missed_fires WHERE job_id = ?1"
                " AND scheduled_for IN (SELECT value FROM json_each(?2))",
                (job_id, times),
            ).fetchall()
        return {r[0] for r in rows}

    # -- ownership ------------------------------------------------------------

    def acquire_epochs(self, shards: Collection[int], owner: str) -> dict[int, int]:
        wanted = json.loads(_shard_list(shards))
        if not wanted:
            return {}
        with self._tx(write=True) as cur:
            rows = cur.execute(
                "INSERT INTO shard_epochs (shard, epoch, owner)"
                " SELECT value, 1, ?1 FROM json_each(?2) WHERE true"
                " ON CONFLICT (shard) DO UPDATE SET epoch = epoch + 1, owner = excluded.owner"
                " RETURNING shard, epoch",
                (owner, json.dumps(wanted)),
            ).fetchall()
        return {int(s): int(e) for s, e in rows}

    def fence_shards(self, epochs: Mapping[int, int], owner: str) -> dict[int, int]:
        if not epochs:
            return {}
        with self._tx(write=True) as cur:
            cur.executemany(
                "INSERT INTO shard_epochs (shard, epoch, owner) VALUES (?, ?, ?)"
                " ON CONFLICT (shard) DO UPDATE SET epoch = excluded.epoch,"
                " owner = excluded.owner WHERE shard_epochs.epoch < excluded.epoch",
                [(int(s), int(e), owner) for s, e in epochs.items()],
            )
        return self.shard_epochs(epochs)

    def shard_epochs(self, shards: Collection[int]) -> dict[int, int]:
        with self._tx(write=False) as cur:
            rows = cur.execute(
                "SELECT shard, epoch FROM shard_epochs"
                " WHERE shard IN (SELECT value FROM json_each(?))",
                (_shard_list(shards),),
            ).fetchall()
        return {int(s): int(e) for s, e in rows}

    def load_shards(self, shards: Collection[int], *, unparsed: bool = False) -> ShardLoad:
        wanted = _shard_list(shards)
        with self._tx(write=False) as cur:
            # One read transaction: jobs, runs and the watermark are one snapshot.
            watermark = cur.execute(
                "SELECT value FROM counters WHERE name = 'change_seq'"
            ).fetchone()[0]
            # All shards (one node: always) read the table in job_id order;
            # through jobs_owned the rows came in shard order and were sorted,
            # 4x slower at a million jobs.
            every = len(set(shards)) == SHARD_COUNT  # validated by _shard_list
            jobs = cur.execute(
                f"SELECT {JOB_COLUMNS} FROM {JOB_FROM} WHERE j.state IN ('active', 'paused')"
                + ("" if every else " AND j.shard IN (SELECT value FROM json_each(?))")
                + " ORDER BY j.job_id",
                () if every else (wanted,),
            ).fetchall()
            runs = cur.execute(_runs_of_shards_sql(INFLIGHT_WHERE), (wanted,)).fetchall()
        parsed, raw = split_job_rows(jobs, unparsed)
        return ShardLoad(
            jobs=parsed,
            unparsed=raw,
            inflight=[run_from_row(r) for r in runs],
            watermark=int(watermark),
        )

    def inflight_runs(self, shards: Collection[int]) -> list[ExecutionRecord]:
        return self._runs_of_shards(INFLIGHT_WHERE, shards)

    def retry_candidates(self, shards: Collection[int]) -> list[ExecutionRecord]:
        # Without the hint the planner walks every execution in run_id order
        # to save a sort, rather than the few the partial index holds.
        return self._runs_of_shards(RETRY_WHERE, shards, index=" INDEXED BY executions_unwell")

    def _runs_of_shards(
        self, where: str, shards: Collection[int], index: str = ""
    ) -> list[ExecutionRecord]:
        with self._tx(write=False) as cur:
            rows = cur.execute(_runs_of_shards_sql(where, index), (_shard_list(shards),)).fetchall()
        return [run_from_row(r) for r in rows]

    def changes_since(
        self,
        watermark: int,
        shards: Collection[int],
        limit: int = 10_000,
        *,
        owner_moves: bool = True,
    ) -> tuple[list[JobRecord], int]:
        wanted = _shard_list(shards)
        # API changes take change_seq (indexed), owner moves move_seq (not
        # indexed: a restarting owner reads them with a scan of the table
        # for each page).
        last = "max(j.change_seq, coalesce(j.move_seq, 0))" if owner_moves else "j.change_seq"
        limit = max(1, limit)
        with self._tx(write=False) as cur:
            # Writers are serialized and bump change_seq inside their transaction,
            # so every committed change has a seq at most the counter's value and
            # no later commit can take a smaller one.
            top = cur.execute("SELECT value FROM counters WHERE name = 'change_seq'").fetchone()[0]
            rows = cur.execute(
                f"SELECT {JOB_COLUMNS}, {last} FROM {JOB_FROM} WHERE {last} > ?"
                " AND j.shard IN (SELECT value FROM json_each(?))"
                f" ORDER BY {last} LIMIT ?",
                (watermark, wanted, limit),
            ).fetchall()
        # change_seq is unique per job change, so a full page ends exactly at its
        # last row; otherwise everything up to the counter has been seen.
        new_watermark = int(rows[-1][-1]) if len(rows) == limit else max(int(top), watermark)
        return [job_from_row(r) for r in rows], new_watermark

    # -- retention ------------------------------------------------------------

    def purge_history(self, finished_before_ms: int, batch: int = 10_000) -> int:
        batch = max(1, batch)
        total = self._purge_ranges(
            "executions",
            "run_id",
            f"finished_at_ms < ? AND state IN {_TERMINAL_SQL}",
            finished_before_ms,
            batch,
        )
        total += self._purge_ranges(
            "missed_fires", "id", "recorded_at_ms < ?", finished_before_ms, batch
        )
        return total

    def _purge_ranges(self, table: str, key: str, cond: str, cutoff: int, batch: int) -> int:
        """Delete in key ranges of ``batch`` rows, one short transaction each, so
        the write lock is never held for long."""
        total = 0
        low = 0
        while True:
            with self._tx(write=True) as cur:
                row = cur.execute(
                    f"SELECT {key} FROM {table} WHERE {key} > ? ORDER BY {key} LIMIT 1 OFFSET ?",
                    (low, batch - 1),
                ).fetchone()
                high = int(row[0]) if row is not None else 2**63 - 1
                cur.execute(
                    f"DELETE FROM {table} WHERE {key} > ? AND {key} <= ? AND {cond}",
                    (low, high, cutoff),
                )
                total += cur.rowcount
            if row is None:
                return total
            low = high
