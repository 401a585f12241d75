"""The console's aggregates in both SQL stores (``OverviewStore``): jobs by
state, runs per time bucket by outcome, the feed of recent runs across jobs,
a job's last fires and its run statistics.

Runs by when they ended read ``executions_finished`` (schema 22), keyed by
``(finished_at_ms, state, job_id)`` where ``finished_at_ms`` is set. A claim
inserts a run without an end, so it writes nothing to that index; the
completion sets the end and the terminal state together, once, and adds one
entry at the index's newest end. Nothing changes a run's end or terminal
state afterwards, so the entry never moves. The index covers the count of
every tenant's runs; a tenant's count looks each run's job up by key.
Missed fires by when they were recorded read ``missed_fires_recorded``.
The feed pages runs by id (the primary key); a job's fires and its
statistics read the job's range of ``(job_id, scheduled_for, attempt)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from wheel.store._shared import RUN_COLUMNS_E, Executor, Queries, prefix_end, run_from_row
from wheel.store.base import FeedRun, FireMark, JobState, OutcomeCount, RunState, RunStats

T = TypeVar("T")

MISSED = "missed"


def percentile(sorted_values: Sequence[int], q: float) -> int | None:
    """The nearest-rank ``q`` percentile (0 < q <= 1) of ascending values."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[rank - 1]


def stats_of(rows: Sequence[tuple[str, int | None]]) -> RunStats:
    """``RunStats`` of ``(state, duration or None)`` rows."""
    durations = sorted(d for _, d in rows if d is not None)
    return RunStats(
        runs=len(rows),
        succeeded=sum(1 for s, _ in rows if s == RunState.SUCCEEDED.value),
        p50_ms=percentile(durations, 0.5),
        p99_ms=percentile(durations, 0.99),
    )


def merge_fires(runs: Sequence[FireMark], missed: Sequence[FireMark], limit: int) -> list[FireMark]:
    """A job's fires newest first: its runs' and its missed ones' (a fire
    with a run shows the run)."""
    by_fire = {m.scheduled_for: m for m in missed}
    by_fire.update({r.scheduled_for: r for r in runs})
    return [by_fire[f] for f in sorted(by_fire, reverse=True)[: max(0, limit)]]


class OverviewSQL:
    """The overview part of ``SQLStore``."""

    _queries: Queries

    def _read(self, fn: Callable[[Executor], T]) -> T:
        raise NotImplementedError

    def count_jobs_by_state(self, tenant: str | None = None) -> dict[JobState, int]:
        p = self._queries.dialect.param
        sql, args = "SELECT state, count(*) FROM jobs", tuple[str, ...]()
        if tenant is not None:
            sql, args = sql + f" WHERE tenant = {p}", (tenant,)
        sql += " GROUP BY state"
        rows = self._read(lambda cur: cur.execute(sql, args).fetchall())
        return {JobState(state): int(n) for state, n in rows}

    def outcome_counts(
        self, *, since_ms: int, bucket_ms: int, tenant: str | None = None
    ) -> list[OutcomeCount]:
        p = self._queries.dialect.param
        width = max(1, bucket_ms)
        join, where, args = "", "", list[int | str]([width, width, since_ms])
        if tenant is not None:
            join, where = " JOIN jobs AS j ON j.job_id = x.job_id", f" AND j.tenant = {p}"
            args.append(tenant)
        runs = (
            f"SELECT (x.finished_at_ms / {p}) * {p}, x.state, count(*) FROM executions AS x{join}"
            f" WHERE x.finished_at_ms >= {p}{where} GROUP BY 1, 2"
        )
        missed = (
            f"SELECT (x.recorded_at_ms / {p}) * {p}, count(*) FROM missed_fires AS x{join}"
            f" WHERE x.recorded_at_ms >= {p}{where} GROUP BY 1"
        )

        def op(cur: Executor) -> list[OutcomeCount]:
            got = [
                OutcomeCount(bucket_ms=int(b), outcome=str(s), count=int(n))
                for b, s, n in cur.execute(runs, args).fetchall()
            ]
            got += [
                OutcomeCount(bucket_ms=int(b), outcome=MISSED, count=int(n))
                for b, n in cur.execute(missed, args).fetchall()
            ]
            return sorted(got, key=lambda c: (c.bucket_ms, c.outcome))

        return self._read(op)

    def recent_runs(
        self,
        *,
        tenant: str | None = None,
        outcome: RunState | None = None,
        handler: str | None = None,
        job_name: str | None = None,
        before_run_id: int | None = None,
        limit: int = 50,
    ) -> list[FeedRun]:
        d = self._queries.dialect
        p = d.param
        where: list[str] = []
        args: list[Any] = []
        for clause, value in (
            (f"e.run_id < {p}", before_run_id),
            (f"e.state = {p}", None if outcome is None else outcome.value),
            (f"j.tenant = {p}", tenant),
            (f"{d.spec_handler} = {p}", handler),
        ):
            if value is not None:
                where.append(clause)
                args.append(value)
        if job_name:
            where.append(f"{d.name_order} >= {p} AND {d.name_order} < {p}")
            args += [job_name, prefix_end(job_name)]
        sql = (
            f"SELECT {RUN_COLUMNS_E}, j.tenant, j.name, {d.spec_handler} FROM executions AS e"
            " JOIN jobs AS j ON j.job_id = e.job_id JOIN job_specs AS s ON s.job_id = e.job_id"
        )
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += f" ORDER BY e.run_id DESC LIMIT {p}"
        args.append(max(1, limit))

        def op(cur: Executor) -> list[FeedRun]:
            return [
                FeedRun(run=run_from_row(r[:12]), tenant=r[12], job_name=r[13], handler=r[14])
                for r in cur.execute(sql, args).fetchall()
            ]

        return self._read(op)

    def recent_fires(self, job_id: int, limit: int = 100) -> list[FireMark]:
        p = self._queries.dialect.param
        runs = (
            "SELECT e.scheduled_for, e.attempt, e.state, e.run_id, e.error FROM executions AS e"
            f" WHERE e.job_id = {p} AND NOT EXISTS (SELECT 1 FROM executions AS n"
            " WHERE n.job_id = e.job_id AND n.scheduled_for = e.scheduled_for"
            f" AND n.attempt > e.attempt) ORDER BY e.scheduled_for DESC LIMIT {p}"
        )
        missed = (
            f"SELECT scheduled_for, reason FROM missed_fires WHERE job_id = {p}"
            f" ORDER BY scheduled_for DESC LIMIT {p}"
        )
        n = max(0, limit)

        def op(cur: Executor) -> list[FireMark]:
            ran = [
                FireMark(scheduled_for=f, outcome=s, attempt=a, run_id=r, detail=err)
                for f, a, s, r, err in cur.execute(runs, (job_id, n)).fetchall()
            ]
            skipped = [
                FireMark(scheduled_for=f, outcome=MISSED, attempt=0, run_id=None, detail=why)
                for f, why in cur.execute(missed, (job_id, n)).fetchall()
            ]
            return merge_fires(ran, skipped, n)

        return self._read(op)

    def run_stats(self, job_id: int, since_ms: int) -> RunStats:
        p = self._queries.dialect.param
        sql = (
            "SELECT state, finished_at_ms - started_at_ms FROM executions"
            f" WHERE job_id = {p} AND finished_at_ms >= {p}"
        )
        rows = self._read(lambda cur: cur.execute(sql, (job_id, since_ms)).fetchall())
        return stats_of([(str(s), None if d is None else int(d)) for s, d in rows])
