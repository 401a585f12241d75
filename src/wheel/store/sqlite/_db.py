"""The SQLite store's connection and transactions: one connection in WAL
mode, guarded by a lock; sqlite3's errors come out of here as
``wheel.errors.StoreError`` children. The WAL is copied back into the
database file on a thread of its own.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from wheel.errors import InvalidArgument, StoreError, StoreUnavailable

log = logging.getLogger("wheel.store.sqlite")

SYNCHRONOUS = {"off", "normal", "full", "extra"}
# WAL pages past which a committing writer copies the WAL back into the
# database itself (SQLite's default does it every 1,000 pages).
WRITER_CHECKPOINT_PAGES = 20_000
# A WAL file left larger than this after a checkpoint is truncated back to it.
WAL_SIZE_LIMIT_BYTES = 64 << 20
# How often the checkpointer copies the WAL back into the database file.
CHECKPOINT_INTERVAL_S = 0.2


def wrap(exc: sqlite3.Error) -> StoreError:
    text = str(exc).lower()
    if isinstance(exc, sqlite3.OperationalError) and any(
        word in text for word in ("locked", "busy", "unable to open", "disk i/o")
    ):
        return StoreUnavailable(f"sqlite: {exc}")
    return StoreError(f"sqlite: {exc}")


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


class Database:
    """One SQLite file (``:memory:`` works for throwaway use). Safe to call
    from several threads: one connection guarded by a lock."""

    def __init__(self, path: str | Path, *, synchronous: str, busy_timeout_ms: int) -> None:
        synchronous = synchronous.lower()
        if synchronous not in SYNCHRONOUS:
            raise InvalidArgument("synchronous", f"must be one of {sorted(SYNCHRONOUS)}")
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
            raise wrap(exc) from exc
        self.conn = conn
        self.checkpointer: _Checkpointer | None = None
        if str(path) != ":memory:" and not str(path).startswith("file::memory:"):
            self.checkpointer = _Checkpointer(str(path), busy_timeout_ms)
            # A store dropped without close() stops its checkpointer too.
            weakref.finalize(self, self.checkpointer.stop)

    @contextmanager
    def tx(self, write: bool) -> Iterator[sqlite3.Cursor]:
        """One transaction; sqlite3 errors come out as ``StoreError``. Inside
        another ``tx`` of the same thread it joins that transaction."""
        with self._lock:
            if self._open is not None:
                yield self._open
                return
            try:
                cur = self.conn.cursor()
                # IMMEDIATE takes the write lock up front, so a transaction never
                # fails half-way with SQLITE_BUSY on its first write.
                cur.execute("BEGIN IMMEDIATE" if write else "BEGIN")
                self._open = cur
                try:
                    yield cur
                    cur.execute("COMMIT")
                except BaseException:
                    if self.conn.in_transaction:
                        self.conn.execute("ROLLBACK")
                    raise
                finally:
                    self._open = None
            except sqlite3.Error as exc:
                raise wrap(exc) from exc

    def close(self) -> None:
        if self.checkpointer is not None:
            self.checkpointer.close()
        with self._lock:
            self.conn.close()


def bump(cur: sqlite3.Cursor, name: str, n: int = 1) -> int:
    """Reserve ``n`` values of a counter; returns the first. SQLite serializes
    writers, so values are handed out in commit order."""
    row = cur.execute(
        "UPDATE counters SET value = value + ?1 WHERE name = ?2 RETURNING value - ?1 + 1",
        (n, name),
    ).fetchone()
    return int(row[0])
