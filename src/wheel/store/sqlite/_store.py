"""``SQLiteStore``: each ``Store`` call as one transaction of the file (and
``write_batch`` as ONE for the whole batch: one fsync)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from wheel.errors import WheelError
from wheel.store._fence import write_checked
from wheel.store._schema import SQLITE_MIGRATIONS
from wheel.store._shared import Executor, check_importable, check_terminal
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
    write_in_order,
)
from wheel.store.sqlite import _feed, _jobs, _runs
from wheel.store.sqlite._db import Database, bump
from wheel.store.sqlite._sql import LAST_CHANGE, QUERIES

T = TypeVar("T")


class SQLiteStore(SQLStore):
    """``Store`` on one SQLite file (``:memory:`` works for throwaway use)."""

    _queries = QUERIES
    _updates = UpdateSQL(QUERIES, lock_job=None)  # the write lock serializes updates
    _migrations = SQLITE_MIGRATIONS
    # Without the hint the planner walks every execution in run_id order to
    # save a sort, rather than the few the partial index holds.
    _retry_index = " INDEXED BY executions_unwell"

    def __init__(
        self,
        path: str | Path,
        *,
        synchronous: str = "full",
        busy_timeout_ms: int = 10_000,
    ) -> None:
        self._db = Database(path, synchronous=synchronous, busy_timeout_ms=busy_timeout_ms)

    def clock_ms(self) -> int:
        return time.time_ns() // 1_000_000  # the file's host is the node's

    def change_mark(self) -> int:
        return self._read(lambda cur: int(cur.execute(LAST_CHANGE).fetchone()[0]))

    def _read(self, fn: Callable[[Executor], T]) -> T:
        with self._db.tx(write=False) as cur:
            return fn(cur)

    def _write(self, fn: Callable[[Executor], T]) -> T:
        # BEGIN IMMEDIATE: one writer at a time (migrations wait here too).
        with self._db.tx(write=True) as cur:
            return fn(cur)

    def close(self) -> None:
        self._db.close()

    # -- jobs -----------------------------------------------------------------

    def submit_jobs(self, news: Sequence[NewJob]) -> list[Submitted | WheelError]:
        """Many submits in one transaction (group commit); a key conflict is
        returned in that submit's place and does not affect the others."""
        if not news:
            return []
        with self._db.tx(write=True) as cur:
            return _jobs.submit_many(cur, news)

    def import_jobs(self, news: Sequence[NewJob]) -> list[int]:
        """Bulk insert of jobs without idempotency keys, in one transaction
        (imports, benchmarks); returns their ids in order."""
        if not news:
            return []
        check_importable(news)
        with self._db.tx(write=True) as cur:
            return _jobs.import_jobs(cur, news)

    def set_job_state(
        self, job_id: int, state: JobState, *, next_run_at: int | None, now_ms: int
    ) -> JobRecord:
        with self._db.tx(write=True) as cur:
            return _jobs.set_state(cur, job_id, state, next_run_at, now_ms)

    def _stamp(self, cur: Executor) -> tuple[str, tuple[Any, ...]]:
        return "change_seq = ?", (bump(cur, "change_seq"),)  # type: ignore[arg-type]

    # -- executions -----------------------------------------------------------

    def claim_fires(self, claims: Sequence[FireClaim]) -> list[ClaimOutcome]:
        if not claims:
            return []
        with self._db.tx(write=True) as cur:
            return _runs.Writes(cur).claim_fires(claims)

    def write_batch(self, batch: WriteBatch) -> BatchOutcome:
        """A loop iteration's writes in ONE transaction (one fsync), all of
        it or none, in the order ``Store.write_batch`` gives, after the
        writer's epochs are checked in it. The transaction is handed to each
        kind's write (``_runs.Writes``). BEGIN IMMEDIATE takes the write lock
        at its start, which keeps ``fence_shards`` out until it ends: a batch
        that checked an epoch commits before any fence of that shard. It
        waits up to the busy timeout for the lock and is not retried."""
        with self._db.tx(write=True) as cur:
            writes = _runs.Writes(cur)
            if batch.epochs is None:
                outcome = write_in_order(writes, batch)
            else:
                outcome = write_checked(
                    batch,
                    _runs.stale_shards(cur, batch.epochs),
                    lambda run_ids: _runs.job_ids(cur, run_ids),
                    lambda part: write_in_order(writes, part),
                )
            mark = int(cur.execute(LAST_CHANGE).fetchone()[0])
        return replace(outcome, change_mark=mark)

    def advance_schedules(self, advances: Sequence[ScheduleAdvance]) -> list[bool]:
        if not advances:
            return []
        with self._db.tx(write=True) as cur:
            return _runs.Writes(cur).advance_schedules(advances)

    def mark_running(self, starts: Sequence[RunStart]) -> list[bool]:
        if not starts:
            return []
        with self._db.tx(write=True) as cur:
            return _runs.Writes(cur).mark_running(starts)

    def complete_runs(self, completions: Sequence[Completion]) -> list[CompletionOutcome]:
        if not completions:
            return []
        check_terminal(completions)  # before the write lock is taken
        with self._db.tx(write=True) as cur:
            return _runs.Writes(cur).complete_runs(completions)

    def record_missed(self, missed: Sequence[MissedFire]) -> None:
        if missed:
            with self._db.tx(write=True) as cur:
                _runs.Writes(cur).record_missed(missed)

    # -- ownership ------------------------------------------------------------

    def _load(
        self, shards: list[int], packed: bool, due_by: int | None, later_than: int | None
    ) -> ShardLoad:
        # One read transaction: jobs, runs and the watermark are one snapshot.
        with self._db.tx(write=False) as cur:
            return _feed.load_shards(cur, shards, packed, due_by, later_than)

    def _change_range(self, cur: Executor, watermark: int) -> tuple[int, int]:
        # The watermark is inclusive here (see _feed): the markers after it,
        # up to the last one handed out.
        top = int(cur.execute(LAST_CHANGE).fetchone()[0])
        return watermark + 1, max(top, watermark) + 1

    def _watermark_at(self, mark: int) -> int:
        return mark - 1
