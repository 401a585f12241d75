"""``PostgresStore``: each ``Store`` call as one transaction of the database
(or, for ``write_batch``, one per kind of write), with the retry rule it
allows."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import psycopg

from wheel.errors import WheelError
from wheel.store import _rollup
from wheel.store._schema import PG_MIGRATIONS
from wheel.store._shared import (
    Executor,
    check_importable,
    check_terminal,
    read_payloads,
    wall_ms,
)
from wheel.store._sqlstore import SQLStore
from wheel.store._updates import UpdateSQL
from wheel.store.base import (
    BatchOutcome,
    ClaimOutcome,
    Completion,
    CompletionOutcome,
    FireClaim,
    JobRecord,
    JobState,
    MissedFire,
    NewJob,
    RunStart,
    ScheduleAdvance,
    ShardLoad,
    Submitted,
    WriteBatch,
)
from wheel.store.postgres import _feed, _jobs, _runs
from wheel.store.postgres import _sql as sql
from wheel.store.postgres._db import Database
from wheel.store.postgres._sql import QUERIES

T = TypeVar("T")
# A health probe waits this long for a pooled connection at most.
PING_TIMEOUT_S = 2.0

# How long the server lets a batch transaction with epochs wait on its
# client, once it holds its shards' epoch rows FOR SHARE, before it ends the
# session (0: no limit). A node paused or cut off in the middle of a batch
# would otherwise hold up the next owner's ``fence_shards`` until it woke.
# The transaction's statements go out back to back, so a wait this long
# means a node that stopped. The cluster coordinator's safety margin is the
# same second: a node starts no batch later than that before its lease
# expires, so a paused node's locks go about when its lease does (a lease
# lasts 2 s at least). Only those transactions: a shard load, for one,
# parses rows between its statements for longer on a large store.
IDLE_IN_TRANSACTION_TIMEOUT_MS = 1_000

# ``refresh_statistics``: the tables whose plans the dispatch path and a
# gain depend on, when their statistics count as stale, and how long an
# ANALYZE waits for its lock.
ANALYZED_TABLES = ("jobs", "executions", "missed_fires")
STALE_MIN_ROWS = 1_000
STALE_SHARE = 0.1
ANALYZE_LOCK_WAIT_MS = 200


class PostgresStore(SQLStore):
    """``Store`` on PostgreSQL (tables in the connection's ``search_path``)."""

    _queries = QUERIES
    _updates = UpdateSQL(QUERIES, lock_job="SELECT 1 FROM jobs WHERE job_id = %s FOR UPDATE")
    _migrations = PG_MIGRATIONS
    # Keyed by the schema: concurrent migrators of one schema wait for each other.
    _migration_lock = "SELECT pg_advisory_xact_lock(hashtext('wheel.migrate:' || current_schema()))"
    # Two writers of one secret: the second waits, then sees the first's version.
    _secret_lock = "SELECT pg_advisory_xact_lock(hashtext('wheel.secret:' || %s))"
    _limit_lock = " FOR UPDATE"

    def __init__(
        self,
        dsn: str,
        *,
        min_size: int = 1,
        max_size: int = 6,
        retries: int = 8,
        pool_timeout_s: float = 10.0,
        idle_in_transaction_timeout_ms: int = IDLE_IN_TRANSACTION_TIMEOUT_MS,
    ) -> None:
        self._db = Database(
            dsn,
            min_size=min_size,
            max_size=max_size,
            retries=retries,
            pool_timeout_s=pool_timeout_s,
        )
        self._idle_ms = max(0, idle_in_transaction_timeout_ms)
        # ``write_batch`` commits a batch's completions here, on a connection
        # of their own, while the calling thread commits the rest.
        self._side = ThreadPoolExecutor(1, thread_name_prefix="wheel-store-side")
        self._last_held: _runs.Held | None = None
        # This store's row of each minute's counts (``wheel.store._rollup``).
        self._slot = secrets.randbelow(_rollup.SLOTS)

    def clock_ms(self) -> int:
        row = self._read(
            lambda cur: cur.execute(
                "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::int8"
            ).fetchone()
        )
        return int(row[0])

    def change_mark(self) -> int:
        return 0  # commits are flushed on the server before they return

    def _read(self, fn: Callable[[Executor], T]) -> T:
        return self._db.run(lambda conn, _: fn(conn), idempotent=True)

    # Every shared write is safe to run again after an unknown commit.
    _write = _read

    def close(self) -> None:
        self._side.shutdown(wait=True)
        self._db.close()

    def ping(self) -> None:
        """Once, on a pooled connection, waiting at most ``PING_TIMEOUT_S``
        for one: the retries every other call makes would hide an outage
        from a health probe for seconds."""
        self._db.ping(PING_TIMEOUT_S)

    def refresh_statistics(self) -> list[tuple[str, int]]:
        """``ANALYZE`` of each table in ``ANALYZED_TABLES`` whose rows changed
        since its last analysis by more than ``STALE_MIN_ROWS`` and
        ``STALE_SHARE`` of its live rows (autovacuum's own rule, with its
        default share): with statistics of a table that was nearly empty the
        planner read a gain's few due jobs through the index of every active
        job (0.6 s at 800,000 jobs, seconds at millions, on the failover's
        critical path) instead of the due index (0.7 ms)."""

        def refresh(conn: Any, _: Any) -> list[tuple[str, int]]:
            params = (list(ANALYZED_TABLES), STALE_MIN_ROWS, STALE_SHARE)
            stale = conn.execute(sql.STALE_TABLES, params).fetchall()
            done = []
            for table, changed in stale:
                try:
                    with conn.transaction():  # a savepoint: a lock not had ends only this
                        conn.execute(f"SET LOCAL lock_timeout = {ANALYZE_LOCK_WAIT_MS}")
                        # One of ANALYZED_TABLES: the query returns no other name.
                        conn.execute(f"ANALYZE {table}")
                except psycopg.errors.LockNotAvailable:
                    continue  # being analyzed or vacuumed by another session
                done.append((table, int(changed)))
            return done

        return self._db.run(refresh, idempotent=True)

    # -- jobs -----------------------------------------------------------------

    def submit_jobs(self, news: Sequence[NewJob]) -> list[Submitted | WheelError]:
        """Many submits in one transaction (group commit); a key conflict is
        returned in that submit's place and does not affect the others."""
        if not news:
            return []
        # With keys a retry after an unknown commit finds its own jobs again.
        return self._db.run(
            lambda conn, _: _jobs.submit_many(conn, news),
            idempotent=all(n.idempotency_key is not None for n in news),
        )

    def import_jobs(self, news: Sequence[NewJob]) -> list[int]:
        """Bulk insert of jobs without idempotency keys in one transaction
        (imports, benchmarks); returns their ids in order."""
        if not news:
            return []
        check_importable(news)
        return self._db.run(lambda conn, _: _jobs.import_jobs(conn, news), idempotent=False)

    def set_job_state(
        self, job_id: int, state: JobState, *, next_run_at: int | None, now_ms: int
    ) -> JobRecord:
        return self._db.run(
            lambda conn, _: _jobs.set_state(conn, job_id, state, next_run_at, now_ms),
            idempotent=True,
        )

    def _stamp(self, cur: Executor) -> tuple[str, tuple[Any, ...]]:
        return "change_xid = pg_current_xact_id()", ()

    # -- executions -----------------------------------------------------------

    def claim_fires(self, claims: Sequence[FireClaim]) -> list[ClaimOutcome]:
        return self._claim(claims, None)[0]

    def write_batch(self, batch: WriteBatch) -> BatchOutcome:
        """A loop iteration's writes, each kind in its own transaction (each
        retried on its own when the connection drops, which keeps the retry
        rules per operation), each checking the writer's epochs first: the
        missed fires, advances, claims and starts one after another on the
        calling thread, and the completions at the same time on a second
        connection (``_side``); it returns once all have committed. A
        failure may leave some kinds committed and others not; writing the
        batch again covers it (``Store.write_batch``). Measured at 18,000
        dispatches/s the two took 40% and 37% of the store thread, mostly
        waiting on the server, which has cores to spare.

        Why the completions may commit beside the rest: they only end runs
        that are in flight already, while the other kinds insert new runs,
        record missed fires, move schedules and start runs the same batch does
        not complete (the caller leaves such starts out). The one pair that
        would depend on the order is a completion and a claim of another
        attempt of the same fire, and the owner never forms it: it claims a
        new attempt only once the store has answered that the older one
        ended, so that completion was in an earlier batch, and batches are
        written one after another. So every answer is what one transaction in
        the order of ``Store.write_batch`` would have given, and the owner,
        which feeds the answers back in the batch's order, cannot tell the
        difference. Put in one batch anyway, either may commit first, and
        when the claim does, the fence check reports the completion
        superseded.

        The epoch check is a ``SELECT ... FOR SHARE`` of the rows
        ``fence_shards`` updates, so whichever takes its lock first makes the
        other wait for its commit. A batch transaction that locked first
        commits before the fence does, and the new owner's load, which
        follows its fence, sees what it wrote; one that comes second reads
        the new epoch and is refused. Both take the rows in shard order, so
        they cannot deadlock. A fence that commits while a batch is being
        written refuses the kinds whose transactions check after it and not
        those that committed before. The lock's price is that a fence waits
        for a writer that stopped in the middle of a batch (paused, or cut
        off from the store): the server ends such a transaction once it has
        waited on its client for 1 s (``idle_in_transaction_timeout_ms``),
        and the fence goes on. A write's shard, when it must be worked out,
        is read back from the rows a completion or start changed.

        Retries: each kind's transaction again on a lost connection, with
        backoff; when the connection died during COMMIT (outcome unknown)
        every kind but the schedule advances, which raise
        ``StoreUnavailable`` instead (an advance that applied would then
        read as not applied)."""
        held = None if batch.epochs is None else self._held(batch.epochs)
        rest = batch.claims or batch.advances or batch.missed or batch.starts
        # Keyed claims (``wheel.store._limits``) may wait for the permits the
        # batch's own completions give back: then the completions commit
        # first, as on SQLite, and the claims find them.
        if not (batch.completions and rest) or _keyed(batch.claims):
            completed, refused = self._complete(batch.completions, held)
            claimed, more = self._write_rest(batch, held)
        else:
            completing = self._side.submit(self._complete, batch.completions, held)
            try:
                claimed, more = self._write_rest(batch, held)
            finally:
                completed, refused = completing.result()  # never left running past the batch
        return BatchOutcome(completions=completed, claims=claimed, fenced=frozenset(refused | more))

    def _held(self, epochs: Mapping[int, int]) -> _runs.Held:
        """The check of a writer's epochs, built again only when they change
        (a comparison of two dicts costs far less than building it)."""
        last = self._last_held
        if last is None or last.epochs != epochs:
            last = self._last_held = _runs.Held(dict(epochs), self._idle_ms)
        return last

    def _write_rest(
        self, batch: WriteBatch, held: _runs.Held | None
    ) -> tuple[list[ClaimOutcome], set[int]]:
        """A batch's writes other than completions, in order: missed records
        before the advances that move past them, then claims and starts;
        and the shards they refused."""
        refused = self._record_missed(batch.missed, held)
        refused |= self._advance(batch.advances, held)[1]
        claimed, more = self._claim(batch.claims, held)
        refused |= more
        refused |= self._mark_running(batch.starts, held)[1]
        return claimed, refused

    def _claim(
        self, claims: Sequence[FireClaim], held: _runs.Held | None
    ) -> tuple[list[ClaimOutcome], set[int]]:
        if not claims:
            return [], set()
        run_ids, advanced, refused, waiting = self._db.run(
            lambda conn, attempt: _runs.claim(conn, attempt, claims, held), idempotent=True
        )
        outcomes = [
            ClaimOutcome(claim=c, run_id=run_ids[i], advanced=advanced[i], waiting=i in waiting)
            for i, c in enumerate(claims)
        ]
        if any(c.payload for c in claims):
            self._db.run(lambda conn, _: read_payloads(conn, QUERIES, outcomes), idempotent=True)
        return outcomes, refused

    def advance_schedules(self, advances: Sequence[ScheduleAdvance]) -> list[bool]:
        return self._advance(advances, None)[0]

    def _advance(
        self, advances: Sequence[ScheduleAdvance], held: _runs.Held | None
    ) -> tuple[list[bool], set[int]]:
        if not advances:
            return [], set()
        now = wall_ms()
        # Not retried after an unknown commit: a CAS that applied would then
        # report False. A lost connection before commit is still retried.
        return self._db.run(
            lambda conn, _: _runs.advance(conn, advances, now, held), idempotent=False
        )

    def mark_running(self, starts: Sequence[RunStart]) -> list[bool]:
        return self._mark_running(starts, None)[0]

    def _mark_running(
        self, starts: Sequence[RunStart], held: _runs.Held | None
    ) -> tuple[list[bool], set[int]]:
        if not starts:
            return [], set()
        return self._db.run(lambda conn, _: _runs.mark_running(conn, starts, held), idempotent=True)

    def complete_runs(self, completions: Sequence[Completion]) -> list[CompletionOutcome]:
        return self._complete(completions, None)[0]

    def _complete(
        self, completions: Sequence[Completion], held: _runs.Held | None
    ) -> tuple[list[CompletionOutcome], set[int]]:
        if not completions:
            return [], set()
        check_terminal(completions)
        applied, refused = self._db.run(
            lambda conn, _: _runs.complete(conn, completions, held, self._slot), idempotent=True
        )
        outcomes = [
            CompletionOutcome(run_id=c.run_id, applied=applied[i])
            for i, c in enumerate(completions)
        ]
        return outcomes, refused

    def record_missed(self, missed: Sequence[MissedFire]) -> None:
        self._record_missed(missed, None)

    def _record_missed(self, missed: Sequence[MissedFire], held: _runs.Held | None) -> set[int]:
        if not missed:
            return set()
        return self._db.run(
            lambda conn, _: _runs.record_missed(conn, missed, held, self._slot), idempotent=True
        )

    # -- ownership ------------------------------------------------------------

    def _raise_epochs(self, cur: Executor, epochs: Mapping[int, int], owner: str) -> None:
        order = sorted(epochs)
        cur.execute(sql.FENCE_SHARDS_SQL, (owner, order, [epochs[s] for s in order]))

    def _load(
        self, shards: list[int], packed: bool, due_by: int | None, later_than: int | None
    ) -> ShardLoad:
        return self._db.run(
            lambda conn, _: _feed.load_shards(conn, shards, packed, due_by, later_than),
            idempotent=True,
        )

    def _change_range(self, cur: Executor, watermark: int) -> tuple[int, int]:
        # Transactions below the snapshot's xmin have all ended (see _feed).
        cur.execute(_feed.ONE_SNAPSHOT)
        return watermark, max(watermark, _feed.safe_xid(cur))


def _keyed(claims: Sequence[FireClaim]) -> bool:
    return any(c.concurrency_key for c in claims)
