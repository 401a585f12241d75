"""Connections, transactions and retries of the PostgreSQL store; psycopg's
errors come out of here as ``wheel.errors.StoreError`` children.

Every operation is one transaction run by ``Database.run``. A lost connection
is retried with backoff for every operation whose retry is safe. When the
connection died while COMMIT was in flight, the first attempt may have
committed: only an operation that recognises its own earlier work (see
``wheel.store.base``, rule 3) is retried then, and it is told so.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeAlias, TypeVar

import psycopg
from psycopg import Connection
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import ConnectionPool

from wheel._retry import Backoff, Jitter
from wheel.errors import StoreError, StoreUnavailable
from wheel.store.postgres._arrays import register as register_arrays

T = TypeVar("T")

# Between the tries of a transaction whose connection was lost: on average
# 50 ms doubling up to 1 s, each wait spread over its upper half so that the
# pool's connections do not come back all at once.
RETRY_BACKOFF = Backoff(initial=0.07, max=1.35, jitter=Jitter.EQUAL)
Conn: TypeAlias = Connection[tuple[Any, ...]]


class Attempt:
    """Per-attempt facts the operation may use: is this a retry after a commit
    whose outcome is unknown?"""

    __slots__ = ("after_unknown_commit",)

    def __init__(self, after_unknown_commit: bool) -> None:
        self.after_unknown_commit = after_unknown_commit


def without_rows(exc: psycopg.Error) -> str:
    """The server's message of ``exc`` and its SQLSTATE, without the DETAIL
    PostgreSQL adds to a constraint failure ("Failing row contains (...)"):
    that quotes the row, a job's payload among its values, and a store error
    reaches logs and callers. (Hence ``from None`` where it is raised: the
    chained psycopg error would print the DETAIL in a traceback.)"""
    primary = exc.diag.message_primary
    if primary:
        return f"{primary} (SQLSTATE {exc.sqlstate})"
    return str(exc).split("\nDETAIL:", 1)[0]


class Database:
    """A pool of connections to one database (tables in its ``search_path``)."""

    def __init__(
        self,
        dsn: str,
        *,
        min_size: int,
        max_size: int,
        retries: int,
        pool_timeout_s: float,
    ) -> None:
        params = conninfo_to_dict(dsn)
        kwargs: dict[str, Any] = {"autocommit": False}
        if "application_name" not in params:
            kwargs["application_name"] = "wheel"
        if "connect_timeout" not in params:
            kwargs["connect_timeout"] = 5
        self.retries = max(1, retries)
        # Test seam: runs inside the commit phase right after COMMIT returned, so
        # a test can lose the connection "while the commit was acknowledged".
        self.after_commit: Callable[[Conn], None] | None = None
        self.pool: ConnectionPool[Conn] = ConnectionPool(
            dsn,
            min_size=min_size,
            max_size=max(min_size, max_size),
            kwargs=kwargs,
            timeout=pool_timeout_s,
            configure=self._configure,
            name="wheel-store",
            open=True,
        )

    @staticmethod
    def _configure(conn: Conn) -> None:
        # psycopg prepares statements it sees repeatedly; a generic plan for an
        # unnest() of a parameter array guesses its size and picked sequential
        # scans (measured: 6 ms instead of 0.1 ms for a one-row completion).
        # Plan each execution for its real arrays instead.
        conn.execute("SET plan_cache_mode = force_custom_plan")
        # Every statement of the store is a batch of keyed lookups. Statistics
        # lag behind fast-growing tables (executions gains a row per fire), and
        # with stale ones the planner seq-scanned executions or merge-joined the
        # whole jobs_pkey for a 1000-row batch. Make those plans a last resort.
        conn.execute("SET enable_seqscan = off")
        conn.execute("SET enable_mergejoin = off")
        conn.commit()
        # Batch arrays go out through the C-speed encoders of _arrays.
        register_arrays(conn.adapters)

    def run(self, op: Callable[[Conn, Attempt], T], *, idempotent: bool) -> T:
        """Run ``op`` in one transaction, retrying lost connections with backoff.

        A failure before COMMIT rolled everything back: always safe to retry. A
        failure during COMMIT has an unknown outcome: retried only for
        ``idempotent`` operations, which then get ``after_unknown_commit``.
        """
        attempt = Attempt(after_unknown_commit=False)
        delays = RETRY_BACKOFF.delays()
        last: Exception | None = None
        for n in range(self.retries):
            committing = False
            try:
                with self.pool.connection() as conn:
                    result = op(conn, attempt)
                    committing = True
                    conn.commit()
                    if self.after_commit is not None:
                        self.after_commit(conn)
                    return result
            except psycopg.OperationalError as exc:
                # Lost connections, server shutdown, pool timeouts, deadlocks and
                # serialization failures all land here.
                last = exc
                if committing:
                    if not idempotent:
                        raise StoreUnavailable(
                            f"postgresql: connection lost during commit (outcome unknown): {exc}"
                        ) from exc
                    attempt = Attempt(after_unknown_commit=True)
                if n + 1 < self.retries:
                    time.sleep(delays.wait())
            except psycopg.Error as exc:
                raise StoreError(f"postgresql: {without_rows(exc)}") from None
        raise StoreUnavailable(f"postgresql unavailable: {last}") from last

    def ping(self, timeout_s: float) -> None:
        """``SELECT 1`` once, waiting at most ``timeout_s`` for a connection
        (the pool reconnects in the background while the server is away)."""
        try:
            with self.pool.connection(timeout=timeout_s) as conn:
                conn.execute("SELECT 1")
                conn.rollback()
        except psycopg.Error as exc:  # PoolTimeout is an OperationalError
            raise StoreUnavailable(f"postgresql unavailable: {exc}") from exc

    def close(self) -> None:
        self.pool.close()
