"""``SQLStore``: the ``Store`` calls both SQL backends make alike, written
once over the two ways of running a transaction each backend provides.

A backend supplies ``_read`` and ``_write`` (run a function in one read or
write transaction, with whatever retries its driver allows), its
``Queries``, its migrations, and the calls it makes its own way: submits,
the batch writes, loading shards and reading the change feed.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from wheel.errors import InvalidArgument, NotFound, WheelError
from wheel.store._audit import AuditSQL
from wheel.store._calendars import CalendarsSQL
from wheel.store._limits import LimitsSQL
from wheel.store._overview import OverviewSQL
from wheel.store._rollup import MINUTE_MS, purge_sql
from wheel.store._schema import RETRY_WHERE
from wheel.store._secrets import SecretsSQL
from wheel.store._shared import (
    Executor,
    Queries,
    Row,
    apply_migrations,
    change_page,
    get_job,
    job_from_row,
    job_rows_of,
    missed_from_row,
    purge_range,
    run_from_row,
    valid_shards,
)
from wheel.store._tenancy import TenancySQL
from wheel.store._traces import TracesSQL
from wheel.store._updates import UpdateSQL, dead_letters, list_updates, update_job
from wheel.store.base import (
    AuditEntry,
    CalendarRecord,
    Changes,
    ExecutionRecord,
    FeedPage,
    FireMark,
    JobChange,
    JobRecord,
    JobState,
    LimitRecord,
    MissedFire,
    NewJob,
    OutcomeCount,
    RowChanges,
    RunState,
    RunStats,
    ShardLoad,
    SpecUpdate,
    Submitted,
    Updated,
)

T = TypeVar("T")


class SQLStore(TenancySQL, SecretsSQL):
    """The part of ``Store`` that reads the same in both SQL backends."""

    _queries: Queries
    _updates: UpdateSQL
    _migrations: Sequence[tuple[int, Sequence[str]]]
    # Taken first in the migration's transaction (None: the write
    # transaction alone keeps other migrators out).
    _migration_lock: str | None = None
    # An index hint for ``retry_candidates`` (follows "executions AS e").
    _retry_index = ""
    # Follows a SELECT of limit rows to lock them to the transaction's end
    # ("": the backend's writers are serialized anyway).
    _limit_lock = ""

    def _read(self, fn: Callable[[Executor], T]) -> T:
        raise NotImplementedError

    def _write(self, fn: Callable[[Executor], T]) -> T:
        raise NotImplementedError

    @property
    def _param(self) -> str:  # type: ignore[override]
        return self._queries.dialect.param

    # -- calendars (``CalendarsSQL``) ------------------------------------------

    @property
    def _calendars(self) -> CalendarsSQL:
        return CalendarsSQL(self._read, self._write, self._param)

    def set_calendar(self, tenant: str, name: str, body: str, now_ms: int) -> CalendarRecord:
        return self._calendars.set(tenant, name, body, now_ms)

    def get_calendar(self, tenant: str, name: str) -> CalendarRecord | None:
        return self._calendars.get(tenant, name)

    def list_calendars(self, tenant: str | None = None) -> list[CalendarRecord]:
        return self._calendars.list(tenant)

    def delete_calendar(self, tenant: str, name: str) -> bool:
        return self._calendars.delete(tenant, name)

    # -- the audit trail (``AuditSQL``) and jobs' trace contexts (``TracesSQL``) --

    @property
    def _audit(self) -> AuditSQL:
        return AuditSQL(self._read, self._write, self._param)

    def record_audit(self, entries: Sequence[AuditEntry]) -> None:
        self._audit.record_audit(entries)

    def list_audit(
        self,
        *,
        since_ms: int | None = None,
        job_id: int | None = None,
        tenant: str | None = None,
        before_id: int | None = None,
        limit: int = 100,
    ) -> list[AuditEntry]:
        return self._audit.list_audit(
            since_ms=since_ms, job_id=job_id, tenant=tenant, before_id=before_id, limit=limit
        )

    def purge_audit(self, before_ms: int) -> int:
        return self._audit.purge_audit(before_ms)

    def refresh_statistics(self) -> list[tuple[str, int]]:
        # SQLite plans without statistics unless ANALYZE ever ran, and then
        # takes an index over a scan wherever one applies: nothing lags.
        return []

    @property
    def _traces(self) -> TracesSQL:
        return TracesSQL(self._read, self._write, self._param)

    def record_job_traces(self, traces: Sequence[tuple[int, str]], now_ms: int) -> None:
        self._traces.record_job_traces(traces, now_ms)

    def job_traces(self, job_ids: Sequence[int]) -> dict[int, str]:
        return self._traces.job_traces(job_ids)

    # -- the console's aggregates (``OverviewSQL``) -----------------------------

    @property
    def _overview(self) -> OverviewSQL:
        return OverviewSQL(self._read, self._queries)

    def count_jobs_by_state(self, tenant: str | None = None) -> dict[JobState, int]:
        return self._overview.count_jobs_by_state(tenant)

    def outcome_counts(
        self, *, since_ms: int, bucket_ms: int, tenant: str | None = None
    ) -> list[OutcomeCount]:
        return self._overview.outcome_counts(since_ms=since_ms, bucket_ms=bucket_ms, tenant=tenant)

    def recent_runs(
        self,
        *,
        tenant: str | None = None,
        outcome: RunState | None = None,
        handler: str | None = None,
        job_name: str | None = None,
        before_run_id: int | None = None,
        limit: int = 50,
        scan: int = 20_000,
    ) -> FeedPage:
        return self._overview.recent_runs(
            tenant=tenant,
            outcome=outcome,
            handler=handler,
            job_name=job_name,
            before_run_id=before_run_id,
            limit=limit,
            scan=scan,
        )

    def recent_fires(self, job_id: int, limit: int = 100) -> list[FireMark]:
        return self._overview.recent_fires(job_id, limit)

    def run_stats(self, job_id: int, since_ms: int) -> RunStats:
        return self._overview.run_stats(job_id, since_ms)

    # -- lifecycle ------------------------------------------------------------

    def migrate(self) -> None:
        """Apply pending migrations; safe to run twice and concurrently (the
        second runner waits for the first, then finds nothing left to do)."""

        def op(cur: Executor) -> None:
            if self._migration_lock is not None:
                cur.execute(self._migration_lock)
            apply_migrations(cur, self._queries, self._migrations)

        self._write(op)

    def schema_version(self) -> int:
        row = self._read(lambda cur: cur.execute(self._queries.schema_version).fetchone())
        return int(row[0]) if row is not None and row[0] is not None else 0

    # -- limits ---------------------------------------------------------------

    @functools.cached_property
    def _limits(self) -> LimitsSQL:
        return LimitsSQL(self._read, self._write, self._param, self._limit_lock)

    def set_limit(self, limit: LimitRecord, now_ms: int) -> LimitRecord:
        return self._limits.set_limit(limit, now_ms)

    def list_limits(self, tenant: str | None = None, now_ms: int = 0) -> list[LimitRecord]:
        return self._limits.list_limits(tenant, now_ms)

    def delete_limit(self, tenant: str, key: str) -> int:
        return self._limits.delete_limit(tenant, key)

    def recount_limits(self) -> int:
        return self._limits.recount_limits()

    def release_returned(
        self, worker_id: str, runs: Sequence[tuple[int, int]], *, acked_only: bool = False
    ) -> int:
        return self._limits.release_returned(worker_id, runs, acked_only=acked_only)

    # -- jobs -----------------------------------------------------------------

    def submit_jobs(self, news: Sequence[NewJob]) -> list[Submitted | WheelError]:
        raise NotImplementedError

    def submit_job(self, new: NewJob) -> Submitted:
        (result,) = self.submit_jobs([new])
        if isinstance(result, WheelError):
            raise result
        return result

    def get_job(self, job_id: int) -> JobRecord:
        return self._read(lambda cur: get_job(cur, self._queries, job_id))

    def list_jobs(
        self,
        *,
        tenant: str | None = None,
        state: JobState | None = None,
        after_job_id: int = 0,
        limit: int = 100,
        name_prefix: str = "",
        after_name: str | None = None,
    ) -> list[JobRecord]:
        sql, params = self._queries.list_jobs(
            tenant=tenant,
            state=state,
            after_job_id=after_job_id,
            limit=limit,
            name_prefix=name_prefix,
            after_name=after_name,
        )
        rows = self._read(lambda cur: cur.execute(sql, params).fetchall())
        return [job_from_row(r) for r in rows]

    def _stamp(self, cur: Executor) -> tuple[str, tuple[Any, ...]]:
        """The SET clause that stamps a job with this write's change marker,
        and its parameters."""
        raise NotImplementedError

    def update_job(self, update: SpecUpdate, *, if_version: int | None = None) -> Updated:
        return self._write(
            lambda cur: update_job(cur, self._updates, update, self._stamp, if_version)
        )

    def list_job_updates(
        self, job_id: int, *, before_version: int | None = None, limit: int = 100
    ) -> list[JobChange]:
        return self._read(
            lambda cur: list_updates(cur, self._updates, job_id, before_version, limit)
        )

    def list_dead_letters(
        self,
        *,
        job_id: int | None = None,
        tenant: str | None = None,
        before_run_id: int | None = None,
        limit: int = 100,
    ) -> list[ExecutionRecord]:
        return self._read(
            lambda cur: dead_letters(cur, self._updates, job_id, tenant, before_run_id, limit)
        )

    # -- executions -----------------------------------------------------------

    def get_run(self, run_id: int) -> ExecutionRecord:
        row = self._read(lambda cur: cur.execute(self._queries.get_run, (run_id,)).fetchone())
        if row is None:
            raise NotFound(f"run {run_id} does not exist")
        return run_from_row(row)

    def list_runs(
        self, job_id: int, *, before_run_id: int | None = None, limit: int = 100
    ) -> list[ExecutionRecord]:
        q, n = self._queries, max(0, limit)

        def read(cur: Executor) -> list[Any]:
            if before_run_id is None:
                return cur.execute(q.list_runs, (job_id, n)).fetchall()
            place = cur.execute(q.run_place, (before_run_id, job_id)).fetchone()
            if place is None:
                gone = (job_id, before_run_id, n)
                return cur.execute(q.list_runs_claimed_before, gone).fetchall()
            fire, attempt = place
            return cur.execute(q.list_runs_below, (job_id, fire, fire, attempt, n)).fetchall()

        return [run_from_row(r) for r in self._read(read)]

    def list_missed(
        self, job_id: int, *, before_scheduled_for: int | None = None, limit: int = 100
    ) -> list[MissedFire]:
        before = before_scheduled_for if before_scheduled_for is not None else 2**63 - 1
        params = (job_id, before, max(0, limit))
        rows = self._read(lambda cur: cur.execute(self._queries.list_missed, params).fetchall())
        return [missed_from_row(r) for r in rows]

    def runs_of_fires(self, job_id: int, scheduled_for: Sequence[int]) -> list[ExecutionRecord]:
        if not scheduled_for:
            return []
        params = (job_id, self._queries.dialect.ints(scheduled_for))
        rows = self._read(lambda cur: cur.execute(self._queries.runs_of_fires, params).fetchall())
        return [run_from_row(r) for r in rows]

    def fires_exist(self, job_id: int, scheduled_for: Sequence[int]) -> set[int]:
        if not scheduled_for:
            return set()
        times = self._queries.dialect.ints(scheduled_for)
        params = (job_id, times, job_id, times)
        rows = self._read(lambda cur: cur.execute(self._queries.fires_exist, params).fetchall())
        return {int(r[0]) for r in rows}

    # -- ownership ------------------------------------------------------------

    def acquire_epochs(self, shards: Collection[int], owner: str) -> dict[int, int]:
        wanted = valid_shards(shards)
        if not wanted:
            return {}
        params = (owner, self._queries.dialect.ints(wanted))
        # A retry after an unknown commit bumps once more: still strictly increasing.
        rows = self._write(lambda cur: cur.execute(self._queries.acquire_epochs, params).fetchall())
        return {int(s): int(e) for s, e in rows}

    def fence_shards(self, epochs: Mapping[int, int], owner: str) -> dict[int, int]:
        wanted = valid_shards(epochs)
        if not wanted:
            return {}
        queries = self._queries
        shards = queries.dialect.ints(wanted)

        def fence(cur: Executor) -> dict[int, int]:
            self._raise_epochs(cur, {s: int(epochs[s]) for s in wanted}, owner)
            rows = cur.execute(queries.shard_epochs, (shards,)).fetchall()
            return {int(s): int(e) for s, e in rows}

        # Written again after an unknown commit: the same epochs, a no-op.
        return self._write(fence)

    def _raise_epochs(self, cur: Executor, epochs: Mapping[int, int], owner: str) -> None:
        """Raise each shard's stored epoch to ``epochs`` (never lower it),
        in shard order: one statement a shard."""
        for shard, epoch in sorted(epochs.items()):
            cur.execute(self._queries.fence_shard, (shard, epoch, owner))

    def release_unsent(self, shards: Collection[int], sent: Collection[int]) -> int:
        wanted = valid_shards(shards)
        if not wanted:
            return 0
        ints = self._queries.dialect.ints
        params = (ints(wanted), ints(sorted(sent)))
        sql = self._queries.release_unsent
        return self._write(lambda cur: int(cur.execute(sql, params).rowcount))

    def take_unsent(self, run_ids: Collection[int]) -> set[int]:
        if not run_ids:
            return set()
        params = (self._queries.dialect.ints(sorted(run_ids)),)
        sql = self._queries.take_unsent
        return self._write(lambda cur: {int(r[0]) for r in cur.execute(sql, params).fetchall()})

    def shard_epochs(self, shards: Collection[int]) -> dict[int, int]:
        params = (self._queries.dialect.ints(valid_shards(shards)),)
        rows = self._read(lambda cur: cur.execute(self._queries.shard_epochs, params).fetchall())
        return {int(s): int(e) for s, e in rows}

    def load_shards(
        self,
        shards: Collection[int],
        *,
        packed: bool = False,
        due_by: int | None = None,
        later_than: int | None = None,
    ) -> ShardLoad:
        if (due_by is not None or later_than is not None) and not packed:
            raise InvalidArgument("packed", "a load in two parts is packed")
        return self._load(valid_shards(shards), packed, due_by, later_than)

    def _load(
        self, shards: list[int], packed: bool, due_by: int | None, later_than: int | None
    ) -> ShardLoad:
        raise NotImplementedError

    def inflight_runs(self, shards: Collection[int]) -> list[ExecutionRecord]:
        return self._runs_of_shards(self._queries.inflight_runs, shards)

    def retry_candidates(self, shards: Collection[int]) -> list[ExecutionRecord]:
        return self._runs_of_shards(
            self._queries.runs_of_shards(RETRY_WHERE, self._retry_index), shards
        )

    def _runs_of_shards(self, sql: str, shards: Collection[int]) -> list[ExecutionRecord]:
        params = (self._queries.dialect.ints(valid_shards(shards)),)
        rows = self._read(lambda cur: cur.execute(sql, params).fetchall())
        return [run_from_row(r) for r in rows]

    def changes_since(
        self,
        watermark: int,
        shards: Collection[int],
        limit: int = 10_000,
        *,
        owner_moves: bool = True,
        exclude: Collection[int] = (),
    ) -> Changes:
        def page(cur: Executor) -> Changes:
            found, mark = self._page(cur, watermark, shards, limit, owner_moves, exclude, False)
            return Changes([job_from_row(r) for r in found], mark)

        return self._read(page)

    def changed_rows(
        self,
        watermark: int,
        shards: Collection[int],
        limit: int = 10_000,
        *,
        owner_moves: bool = True,
        exclude: Collection[int] = (),
    ) -> RowChanges:
        def page(cur: Executor) -> RowChanges:
            found, mark = self._page(cur, watermark, shards, limit, owner_moves, exclude, True)
            return replace(job_rows_of(cur, self._queries, found), watermark=mark)

        return self._read(page)

    def _page(
        self,
        cur: Executor,
        watermark: int,
        shards: Collection[int],
        limit: int,
        owner_moves: bool,
        exclude: Collection[int],
        rows: bool,
    ) -> tuple[list[Row], int]:
        """One page of the change feed in the read's transaction, and the
        watermark to read on from."""
        low, high = self._change_range(cur, watermark)
        found, mark = change_page(
            cur, self._queries, low, high, valid_shards(shards), limit, owner_moves, exclude,
            rows=rows,
        )  # fmt: skip
        return found, self._watermark_at(mark)

    def job_rows(self, job_ids: Collection[int]) -> RowChanges:
        ids = sorted(set(job_ids))
        if not ids:
            return RowChanges(rows=[], jobs=[], profiles={})
        q = self._queries
        return self._read(
            lambda cur: job_rows_of(
                cur, q, cur.execute(q.job_rows, (q.dialect.ints(ids),)).fetchall()
            )
        )

    def _change_range(self, cur: Executor, watermark: int) -> tuple[int, int]:
        """First thing in the feed's read transaction: the markers it may hand
        out after ``watermark``, as ``[low, high)``."""
        raise NotImplementedError

    def _watermark_at(self, mark: int) -> int:
        """The watermark to return when every marker below ``mark`` was read."""
        return mark

    # -- retention ------------------------------------------------------------

    def purge_history(self, finished_before_ms: int, batch: int = 10_000) -> int:
        """Delete terminal executions and missed records older than the
        cutoff, a range of ``batch`` of them by end time at a time, each
        range in one short transaction so no lock is held for long."""
        return sum(self.purge_steps(finished_before_ms, batch))

    def purge_steps(self, finished_before_ms: int, batch: int = 1_000) -> Iterator[int]:
        """One range of ``batch`` rows by end time per step (by when they
        were recorded for missed fires), executions first, then missed
        fires; each range is one transaction. The rows kept are never read,
        so a pass costs what it deletes, whatever the table holds. After
        the last, the counts of the minutes wholly before the cutoff go too
        (``_rollup``: a few rows a minute, one transaction), not counted in
        the steps, which count runs and missed fires."""
        batch = max(1, batch)
        for bound, delete in self._queries.purges:
            low: int | None = -(2**63)
            while low is not None:
                step = functools.partial(purge_range, bound, delete, low, batch, finished_before_ms)
                deleted, low = self._write(step)
                yield deleted
        minutes = purge_sql(self._queries.dialect.param)
        before = finished_before_ms // MINUTE_MS * MINUTE_MS
        self._write(lambda cur: cur.execute(minutes, (before,)))

    def ping(self) -> None:
        self._read(lambda cur: cur.execute("SELECT 1").fetchone())
