"""The embedded record of truth: one SQLite file in WAL mode.

Durability: by default the database runs in WAL mode with ``synchronous=FULL``,
so the WAL is fsynced before every commit returns. An acknowledged write then
survives a crash of the process (SIGKILL) and, as far as the disk honours
fsync, a power loss or kernel panic too. With ``synchronous=normal`` (URL
query ``?synchronous=normal``) commits are only fsynced at checkpoints: still
safe against process crashes and never corrupt, but the last transactions
before a power loss may roll back.

SQLite serializes writers, which this backend leans on: ids and change
numbers come from counter rows bumped inside the write transaction, so they
are handed out in commit order and ``changes_since`` can use a plain
``change_seq > watermark``. The store is safe to call from several threads: one
connection guarded by a lock (the node calls it from worker threads, one call
at a time per call site).

The modules, along the same seams as the PostgreSQL store's: ``_sql`` (the
SQL text and the set-based batch forms), ``_db`` (the connection,
transactions, errors and the WAL checkpointer), ``_jobs`` (submits and job
changes), ``_runs`` (claims, starts, completions), ``_feed`` (loading shards
and the change feed), ``_store`` (the ``Store``).
"""

from wheel.store.sqlite._store import SQLiteStore

__all__ = ["SQLiteStore"]
