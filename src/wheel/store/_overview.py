"""The console's aggregates in both SQL stores (``OverviewStore``): jobs by
state, runs per time bucket by outcome, the feed of recent runs across jobs,
a job's last fires and its run statistics.

Runs and missed fires by bucket add up the minutes' counts of
``run_minutes`` (schema 25, ``wheel.store._rollup``), which the writes that
end runs and record missed fires keep: a day costs its 1,440 minutes (times
the tenants and outcomes in them), however many runs ended in it. Only
what the minutes cannot give is read from the runs themselves: a bucket
width that is not a whole number of minutes, and the part of a minute a
window starts in (the node starts windows on a bucket's edge, so never).

Those runs by when they ended read ``executions_finished`` (schema 22), keyed by
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

import json
import math
from collections.abc import Sequence
from typing import Any, TypeVar

from wheel.store._rollup import MINUTE_MS, counts_sql
from wheel.store._shared import (
    RUN_COLUMNS_E,
    Executor,
    Queries,
    Transaction,
    prefix_end,
    run_from_row,
)
from wheel.store.base import (
    FeedPage,
    FeedRun,
    FireMark,
    JobState,
    OutcomeCount,
    RunState,
    RunStats,
)

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


def outcome_sql(p: str, *, tenant: bool) -> tuple[str, str]:
    """``outcome_counts``' two statements with the parameter marker ``p``:
    runs that ended in one bucket by state (parameters: its start and end,
    and the tenant if ``tenant``), and missed fires by bucket (the width
    twice, the start, and the tenant).

    Runs are counted a bucket at a time: SQLite groups by sorting, and
    sorting the states of one bucket's runs is cheap where sorting a day's
    runs by bucket and state cost more than reading them (measured with
    143,000 runs in a day: 56 ms in one statement, 23 ms a bucket at a
    time)."""
    join, where = "", ""
    if tenant:
        # CROSS JOIN: SQLite then reads the window's range first and looks
        # each row's job up (by its rules it went through the tenant's jobs
        # and read every run of each, however old); PostgreSQL plans it as
        # any inner join.
        join, where = " CROSS JOIN jobs AS j", f" AND j.job_id = x.job_id AND j.tenant = {p}"
    runs = (
        f"SELECT x.state, count(*) FROM executions AS x{join}"
        f" WHERE x.finished_at_ms >= {p} AND x.finished_at_ms < {p}{where} GROUP BY x.state"
    )
    missed = (
        f"SELECT (x.recorded_at_ms / {p}) * {p}, count(*) FROM missed_fires AS x{join}"
        f" WHERE x.recorded_at_ms >= {p}{where} GROUP BY 1"
    )
    return runs, missed


def missed_between_sql(p: str, *, tenant: bool) -> str:
    """Fires recorded missed in a range of time (parameters: its start and
    end, and the tenant if ``tenant``)."""
    join, where = "", ""
    if tenant:
        join, where = " CROSS JOIN jobs AS j", f" AND j.job_id = x.job_id AND j.tenant = {p}"
    return (
        f"SELECT count(*) FROM missed_fires AS x{join}"
        f" WHERE x.recorded_at_ms >= {p} AND x.recorded_at_ms < {p}{where}"
    )


def run_stats_sql(p: str) -> str:
    """The ended runs of a job's fires since a time (parameters: the job,
    the time): a range of that job's ``(job_id, scheduled_for, attempt)``
    from the time on, never the job's older runs nor the runs of every job
    that ended since. By fire time, not end time: a filter on the end read
    every run the job ever had (3,000 a job at 30 million runs: 100-300 ms
    a page), where the fires of a day are a range of the key."""
    return (
        "SELECT state, finished_at_ms - started_at_ms FROM executions"
        f" WHERE job_id = {p} AND scheduled_for >= {p} AND finished_at_ms IS NOT NULL"
    )


def handler_text(handler: str) -> str:
    """The text a spec's JSON holds for ``handler`` (sorted keys, no spaces,
    escaped as ``json.dumps`` escapes: ``JobSpec.to_json``)."""
    return '"handler":' + json.dumps(handler)


def next_start(
    cur: Executor, below: str, runs: Sequence[FeedRun], size: int, floor: int
) -> int | None:
    """Where the feed's next page starts: below the last run of a full page,
    else below the range just read, skipping ids no run has (purged)."""
    if len(runs) == size:
        return runs[-1].run.run_id
    row = cur.execute(below, (floor,)).fetchone()
    return None if row is None or row[0] is None else int(row[0]) + 1


class OverviewSQL:
    """The overview calls of ``SQLStore``: ``read`` runs a function in one
    read transaction; ``queries`` are the backend's."""

    __slots__ = ("_queries", "_read")

    def __init__(self, read: Transaction, queries: Queries) -> None:
        self._read = read
        self._queries = queries

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
        width = max(1, bucket_ms)
        if width % MINUTE_MS:
            return self._counted_from_runs(since_ms, width, tenant)
        p = self._queries.dialect.param
        mine: tuple[str, ...] = () if tenant is None else (tenant,)
        rolled = counts_sql(p, tenant=tenant is not None)
        runs, _ = outcome_sql(p, tenant=tenant is not None)
        missed = missed_between_sql(p, tenant=tenant is not None)
        first = -(-since_ms // MINUTE_MS) * MINUTE_MS  # the first whole minute

        def op(cur: Executor) -> list[OutcomeCount]:
            counts: dict[tuple[int, str], int] = {}
            if since_ms < first:  # the rest of the minute the window starts in
                bucket = since_ms // width * width
                part = cur.execute(runs, (since_ms, first, *mine)).fetchall()
                [(n_missed,)] = cur.execute(missed, (since_ms, first, *mine)).fetchall()
                for outcome, n in [*part, (MISSED, n_missed)]:
                    if n:
                        counts[bucket, str(outcome)] = int(n)
            for bucket, outcome, n in cur.execute(rolled, (width, width, first, *mine)).fetchall():
                key = (int(bucket), str(outcome))
                counts[key] = counts.get(key, 0) + int(n)
            return [
                OutcomeCount(bucket_ms=b, outcome=o, count=n)
                for (b, o), n in sorted(counts.items())
                if n
            ]

        got: list[OutcomeCount] = self._read(op)
        return got

    def _counted_from_runs(
        self, since_ms: int, width: int, tenant: str | None
    ) -> list[OutcomeCount]:
        """``outcome_counts`` read from the runs and missed fires themselves,
        a bucket at a time (for widths the minutes do not divide)."""
        runs, missed = outcome_sql(self._queries.dialect.param, tenant=tenant is not None)
        mine: tuple[str, ...] = () if tenant is None else (tenant,)
        p = self._queries.dialect.param
        newest = (
            f"SELECT finished_at_ms FROM executions WHERE finished_at_ms >= {p}"
            " ORDER BY finished_at_ms DESC LIMIT 1"
        )

        def op(cur: Executor) -> list[OutcomeCount]:
            # Every bucket up to the newest run's end (a bucket past it is empty).
            last = cur.execute(newest, (since_ms,)).fetchone()
            end = since_ms if last is None or last[0] is None else int(last[0]) + 1
            got = []
            start = since_ms
            while start < end:
                edge = (start // width + 1) * width  # the bucket's end
                got += [
                    OutcomeCount(bucket_ms=start // width * width, outcome=str(s), count=int(n))
                    for s, n in cur.execute(runs, (start, edge, *mine)).fetchall()
                ]
                start = edge
            got += [
                OutcomeCount(bucket_ms=int(b), outcome=MISSED, count=int(n))
                for b, n in cur.execute(missed, (width, width, since_ms, *mine)).fetchall()
            ]
            return sorted(got, key=lambda c: (c.bucket_ms, c.outcome))

        got: list[OutcomeCount] = self._read(op)
        return got

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
        d = self._queries.dialect
        p = d.param
        # Runs with ids in [floor, top): a range of the primary key, read
        # newest first; each run's job is looked up by its id (CROSS JOIN:
        # SQLite would otherwise go through a tenant's or a name's jobs and
        # sort every run of theirs, however old).
        where = [f"e.run_id < {p}", f"e.run_id >= {p}"]
        args: list[Any] = []
        for clause, values in (
            (f"e.state = {p}", None if outcome is None else (outcome.value,)),
            (f"j.tenant = {p}", None if tenant is None else (tenant,)),
            # The run's spec, by its job's id, in a subquery of its own:
            # PostgreSQL plans no join from it, so it cannot go through a
            # handler's every job and their runs (it did: 260 ms a page
            # with a million runs). The spec's text holds the handler as
            # the spec's JSON writes it (``JobSpec.to_json``): searched for
            # first, it leaves out the other handlers' runs before their
            # specs' JSON is parsed.
            (
                f"(SELECT {d.spec_handler} FROM job_specs AS s"
                f" WHERE s.job_id = e.job_id AND {d.spec_holds}) = {p}",
                None if handler is None else (handler_text(handler), handler),
            ),
        ):
            if values is not None:
                where.append(clause)
                args += values
        if job_name:
            where.append(f"{d.name_order} >= {p} AND {d.name_order} < {p}")
            args += [job_name, prefix_end(job_name)]
        sql = (
            f"SELECT {RUN_COLUMNS_E}, j.tenant, j.name,"
            f" (SELECT {d.spec_handler} FROM job_specs AS s WHERE s.job_id = e.job_id)"
            " FROM executions AS e CROSS JOIN jobs AS j"
            " WHERE j.job_id = e.job_id AND "
            + " AND ".join(where)
            + f" ORDER BY e.run_id DESC LIMIT {p}"
        )
        below = f"SELECT max(run_id) FROM executions WHERE run_id < {p}"
        size = max(1, limit)

        def op(cur: Executor) -> FeedPage:
            top = before_run_id
            if top is None:
                newest = cur.execute("SELECT max(run_id) FROM executions").fetchone()
                if newest is None or newest[0] is None:
                    return FeedPage(runs=[], next_before=None)
                top = int(newest[0]) + 1
            floor = max(0, top - max(1, scan))
            runs = [
                FeedRun(run=run_from_row(r[:12]), tenant=r[12], job_name=r[13], handler=r[14])
                for r in cur.execute(sql, (top, floor, *args, size)).fetchall()
            ]
            return FeedPage(runs=runs, next_before=next_start(cur, below, runs, size, floor))

        got: FeedPage = self._read(op)
        return got

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

        got: list[FireMark] = self._read(op)
        return got

    def run_stats(self, job_id: int, since_ms: int) -> RunStats:
        sql = run_stats_sql(self._queries.dialect.param)
        rows = self._read(lambda cur: cur.execute(sql, (job_id, since_ms)).fetchall())
        return stats_of([(str(s), None if d is None else int(d)) for s, d in rows])
